"""Copy, reverse and sort a sequence of symbols (Kazemnejad et al., 2023).

size = the number of input symbols; the answer has as many. Sort orders the
symbols by their place in the alphabet (digits: numerically).
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS, Task, digits

LETTERS = tuple("abcdefghijklmnopqrstuvwxyz")


class _SequenceTask(Task):
    def __init__(self, alphabet: int = 10):
        if not 2 <= alphabet <= 26:
            raise ConfigError(f"task.alphabet={alphabet} must be within [2, 26] (symbols drawn per position).")
        self.alphabet = alphabet
        # Digits for <= 10 symbols so that sort's order is the numeric one a reader expects.
        self.symbols = tuple("0123456789")[:alphabet] if alphabet <= 10 else LETTERS[:alphabet]

    def max_tokens(self, size: int) -> int:
        return 2 * size + 3

    def instance(self, rng, size):
        x = digits(rng, size, self.symbols)
        return x, self.transform(x)

    def transform(self, x: list[str]) -> list[str]:
        raise NotImplementedError


@SYNTHETIC_TASKS.register("copy")
class Copy(_SequenceTask):
    def transform(self, x):
        return list(x)


@SYNTHETIC_TASKS.register("reverse")
class Reverse(_SequenceTask):
    def transform(self, x):
        return x[::-1]


@SYNTHETIC_TASKS.register("sort")
class Sort(_SequenceTask):
    def transform(self, x):
        order = {s: i for i, s in enumerate(self.symbols)}
        return sorted(x, key=order.__getitem__)
