"""RULER-style aggregation (Hsieh et al., 2024):

  cwe  common words extraction: a few words listed three times each among
       words listed once; which are the common ones?
  fwe  frequent words extraction: coded words listed 4, 3 and 2 times among
       codes listed once; the three most frequent?

One module for the two because they place their mentions the same way
(_mentions: the first word's first mention at the depth, the rest after it,
shuffled), and the order the battery places them in is what cwe's answer reads."""

import random
import string

from rope_lm.tasks.retrieval.base import (
    RETRIEVAL_TASKS,
    WORDS,
    Instance,
    Needle,
    RetrievalTask,
    one_of,
    other_depths,
)


def _mentions(
    rng: random.Random, counts: list[tuple[str, int]], depth: float, template: str
) -> tuple[list[Needle], list[str]]:
    """Every word listed `count` times: the first word's first mention at
    `depth` (the target), the others after it in a shuffled order (so that
    at depth 1, where all depths tie, a word's mentions are not side by
    side). Returns the needles and the word each one names."""
    words = [w for w, c in counts for _ in range(c)]
    rest = words[1:]
    rng.shuffle(rest)
    words = words[:1] + rest
    depths = [depth] + [depth + (1 - depth) * x for x in other_depths(rng, len(rest))]
    return [Needle(template.format(w), d) for w, d in zip(words, depths)], words


def _placed_order(needles: list[Needle]) -> list[int]:
    """The order Haystacks places needles in: by depth, ties in list order."""
    return sorted(range(len(needles)), key=lambda i: (needles[i].depth, i))


@RETRIEVAL_TASKS.register("cwe")
class CommonWords(RetrievalTask):
    """cwe. `top` words listed `repeats` times, `needles` words once; the
    answer names the common words in the order of their first mention, so
    teacher forcing has one right answer; greedy scoring takes them in any
    order (RULER's all-words match)."""

    battery_order = 80
    top, repeats = 3, 3
    pattern = one_of(WORDS)
    max_needles = len(WORDS) - top
    ordered = False
    template = " Word: {}."

    def instance(self, rng, depth):
        words = rng.sample(WORDS, self.top + self.n)
        needles, named = _mentions(
            rng,
            [(w, self.repeats) for w in words[: self.top]] + [(w, 1) for w in words[self.top :]],
            depth,
            self.template,
        )
        common = set(words[: self.top])
        first = list(dict.fromkeys(named[i] for i in _placed_order(needles) if named[i] in common))
        return Instance(
            needles, f" Which {self.top} words are listed most often? In order of first mention, they are", first
        )


@RETRIEVAL_TASKS.register("fwe")
class FrequentWords(RetrievalTask):
    """fwe. Coded words (4 random letters) listed 4, 3 and 2 times, and
    `needles` codes once; the answer ranks the three by frequency (greedy
    scoring: in any order, as RULER scores it)."""

    battery_order = 90
    counts = (4, 3, 2)
    pattern = r"\b[a-z]{4}\b"
    ordered = False
    template = " Code: {}."

    def instance(self, rng, depth):
        k = len(self.counts) + self.n
        codes = []
        while len(codes) < k:
            c = "".join(rng.choices(string.ascii_lowercase, k=4))
            if c not in codes:
                codes.append(c)
        ranked = codes[: len(self.counts)]
        needles, _ = _mentions(
            rng, list(zip(ranked, self.counts)) + [(c, 1) for c in codes[len(self.counts) :]], depth, self.template
        )
        return Instance(
            needles,
            f" Which {len(self.counts)} codes are listed most often? From most to least often, they are",
            ranked,
        )
