"""multiquery: several words, each with its number, all asked for."""

from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, WORDS, Instance, RetrievalTask, keyed_needles


@RETRIEVAL_TASKS.register("multiquery")
class MultiQuery(RetrievalTask):
    battery_order = 40
    max_needles = len(WORDS)

    def instance(self, rng, depth):
        words, values, needles = keyed_needles(rng, self.n, depth)
        listed = ", ".join(words[:-1]) + f" and {words[-1]}"
        return Instance(
            needles,
            f" What are the special magic numbers for {listed}? The special magic numbers for {listed} are",
            values,
        )
