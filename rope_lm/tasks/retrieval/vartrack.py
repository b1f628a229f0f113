"""vartrack: a chain VAR A = n, VAR B = A, ...: which variables hold n? (a second
chain with another value distracts)."""

import string

from rope_lm.tasks.retrieval.base import RETRIEVAL_TASKS, Instance, Needle, RetrievalTask, number, other_depths


@RETRIEVAL_TASKS.register("vartrack")
class VariableTracking(RetrievalTask):
    battery_order = 50
    pattern = r"[A-Z]{5}"

    def instance(self, rng, depth):
        names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        while len(set(names)) < len(names):
            names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(2 * self.n)]
        value, other = number(rng), number(rng)
        chain, decoy = names[: self.n], names[self.n :]

        def hops(vars_, start_value, first_depth, later):
            texts = [f" VAR {vars_[0]} = {start_value}."] + [f" VAR {b} = {a}." for a, b in zip(vars_, vars_[1:])]
            depths = [first_depth] + sorted(first_depth + (1 - first_depth) * x for x in later)
            return [Needle(t, d) for t, d in zip(texts, depths)]

        needles = hops(chain, value, depth, other_depths(rng, self.n - 1))
        needles += hops(decoy, other, rng.random() * 0.5, other_depths(rng, self.n - 1))
        return Instance(needles, f" Find all variables that are assigned the value {value}. Answer: they are", chain)
