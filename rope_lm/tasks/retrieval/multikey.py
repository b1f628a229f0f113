"""multikey: several "special magic number for <word>" needles, one queried."""

from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, WORDS, Instance, RetrievalTask, keyed_needles


@RETRIEVAL_TASKS.register("multikey")
class MultiKey(RetrievalTask):
    battery_order = 20
    max_needles = len(WORDS)  # a distinct word per key

    def instance(self, rng, depth):
        words, values, needles = keyed_needles(rng, self.n, depth)
        return Instance(
            needles,
            f" What is the special magic number for {words[0]}? The special magic number for {words[0]} is",
            [values[0]],
        )
