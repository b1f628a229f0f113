"""The retrieval battery's task interface and what several tasks share.

A task is a RetrievalTask subclass in a module of this package,
registered with ``@RETRIEVAL_TASKS.register("name")`` (the name `tasks=[...]`
takes); `instance(rng, depth)` gives its needles, the question and the values
the answer must give. `battery_order` places it in the battery's order
(rope_lm.tasks.retrieval.task_names): the built-in tasks take 10 ... 100, a
task without an order comes after them, by name. Plain strings and random
draws only: this package imports no torch.

The registry lives here with the interface, so a task module imports this
module and never the package that loads it.
"""

from dataclasses import dataclass
import random
import re

from rope_lm.core.registry import Registry

RETRIEVAL_TASKS = Registry("retrieval task", "rope_lm.tasks.retrieval", "tasks")

WORDS = (
    "apple",
    "river",
    "candle",
    "mountain",
    "violin",
    "harbor",
    "pencil",
    "garden",
    "falcon",
    "marble",
    "lantern",
    "meadow",
    "copper",
    "thunder",
    "island",
    "saddle",
    "orchid",
    "glacier",
    "compass",
    "velvet",
    "anchor",
    "meteor",
    "puzzle",
    "walnut",
    "blossom",
    "engine",
    "feather",
    "quartz",
    "tunnel",
    "whistle",
)
# Names for the stories of qa1, qa2 (bAbI's four people) and factqa, and four more for longer stories.
PEOPLE = ("Mary", "John", "Sandra", "Daniel", "Emma", "Oliver", "Lucas", "Sofia")


@dataclass
class Needle:
    text: str
    depth: float


@dataclass
class Instance:
    needles: list[Needle]
    question: str
    values: list[str]  # what the answer must give, in order

    @property
    def answer(self) -> str:
        return " " + ", ".join(self.values)


def number(rng: random.Random) -> str:
    """A five-digit value."""
    return str(rng.randint(10000, 99999))


def other_depths(rng: random.Random, n: int) -> list[float]:
    """n depths anywhere in [0, 1): needles other than the target."""
    return [rng.random() for _ in range(n)]


def depths_after(rng: random.Random, depth: float, n: int) -> list[float]:
    """n depths in [depth, 1], sorted: needles that come after the target."""
    return sorted(depth + (1 - depth) * x for x in other_depths(rng, n))


def one_of(words) -> str:
    """A `pattern` matching any of the words, longest first."""
    return r"\b(?:" + "|".join(sorted(words, key=len, reverse=True)) + r")\b"


def keyed_needles(rng: random.Random, n: int, depth: float) -> tuple[list[str], list[str], list[Needle]]:
    """n words, a number each, their needles: the first at `depth`, the rest anywhere."""
    words = rng.sample(WORDS, n)
    values = [number(rng) for _ in words]
    depths = [depth] + other_depths(rng, n - 1)
    return (
        words,
        values,
        [Needle(f" The special magic number for {w} is {v}.", d) for w, v, d in zip(words, values, depths)],
    )


class RetrievalTask:
    """A task of the battery; `needles` sizes it (keys, values, facts, words listed once, ...)."""

    pattern = r"\d+"  # what a value looks like in decoded text (greedy scoring)
    max_needles: int | None = None  # None: as many as the prompt length allows
    ordered = True  # greedy scoring: the values must come in order (False: any order, RULER's all-words match)
    battery_order = 1000  # place in task_names(), the battery's order: the built-in tasks take 10 ... 100

    def __init__(self, needles: int = 4):
        self.n = needles

    def instance(self, rng: random.Random, depth: float) -> Instance:
        raise NotImplementedError

    def parse(self, text: str) -> list[str]:
        return re.findall(self.pattern, text)

    def judge(self, found: list[str], values: list[str]) -> tuple[bool, float]:
        """(all values given, share given) for the values parsed from a greedy answer."""
        if self.ordered:
            found = found[: len(values)]
            return found == values, sum(a == b for a, b in zip(found, values)) / len(values)
        # Order-free: the first len(values) distinct words the answer names, each expected one counted once.
        named = list(dict.fromkeys(found))[: len(values)]
        right = len(set(named) & set(values))
        return right == len(values), right / len(values)
