"""The task interface and the symbol vocabulary every task builds for itself.

A sequence is  <bos> prompt <sep> answer <eos>,  one token per symbol; the
loss and the exact-match score cover the answer and <eos> (the model must
also know where its answer ends). Positions start at 0 for every sequence and
padding goes on the right, so a causal model never sees it.
"""

import random

from rope_lm.core.errors import ConfigError
from rope_lm.core.registry import Registry

# The registry lives with the interface, so a task module never imports the package that loads it.
SYNTHETIC_TASKS = Registry("task", "rope_lm.tasks.synthetic", "task.name")

PAD, BOS, SEP, EOS = "<pad>", "<bos>", "<sep>", "<eos>"
SPECIALS = (PAD, BOS, SEP, EOS)
DIGITS = tuple("0123456789")


class Vocabulary:
    def __init__(self, symbols):
        self.symbols = list(SPECIALS) + [s for s in dict.fromkeys(symbols) if s not in SPECIALS]
        self.index = {s: i for i, s in enumerate(self.symbols)}

    def __len__(self):
        return len(self.symbols)

    def encode(self, symbols) -> list[int]:
        return [self.index[s] for s in symbols]

    def decode(self, ids) -> list[str]:
        return [self.symbols[i] for i in ids]

    @property
    def pad(self) -> int:
        return self.index[PAD]


class Task:
    """A subclass is registered with @SYNTHETIC_TASKS.register("name"); its constructor
    knobs are typed (the schema `task.*` is checked against), and it gives
    `symbols` (its alphabet) and `instance(rng, size)`."""

    name = "?"
    symbols: tuple[str, ...] = ()
    min_size = 1  # the smallest size the task can draw

    def instance(self, rng: random.Random, size: int) -> tuple[list[str], list[str]]:
        raise NotImplementedError

    def vocabulary(self) -> Vocabulary:
        return Vocabulary(self.symbols)

    def sequence(self, prompt: list[str], answer: list[str]) -> list[str]:
        return [BOS, *prompt, SEP, *answer, EOS]

    def max_tokens(self, size: int) -> int:
        """An upper bound on the tokens of an instance of this size, for
        checking before any work that the scheme serves the longest test."""
        raise NotImplementedError

    def check_size(self, size: int, setting: str):
        if size < self.min_size:
            raise ConfigError(
                f"{setting}={size} is below the smallest size task {self.name!r} can draw ({self.min_size})."
            )


def digits(rng: random.Random, n: int, alphabet=DIGITS) -> list[str]:
    return [rng.choice(alphabet) for _ in range(n)]
