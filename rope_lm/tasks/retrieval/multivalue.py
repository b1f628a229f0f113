"""multivalue: one word with several numbers, all asked for in order."""

from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, WORDS, Instance, Needle, RetrievalTask, depths_after, number


@RETRIEVAL_TASKS.register("multivalue")
class MultiValue(RetrievalTask):
    battery_order = 30

    def instance(self, rng, depth):
        word = rng.choice(WORDS)
        values = [number(rng) for _ in range(self.n)]
        # The first value at `depth`, the rest after it, so the order of the answer is the order in the text.
        depths = [depth] + depths_after(rng, depth, self.n - 1)
        needles = [Needle(f" One of the special magic numbers for {word} is {v}.", d) for v, d in zip(values, depths)]
        return Instance(
            needles,
            f" What are all the special magic numbers for {word}? The special magic numbers for {word} are",
            values,
        )
