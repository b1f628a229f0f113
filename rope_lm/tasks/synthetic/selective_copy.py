"""Selective copy (Gu and Dao, 2023, "Mamba"; one of CoPE's tasks,
Golovneva et al., 2024): symbols scattered among blanks; the
answer is the symbols alone, in their order.

    3 _ _ 7 _ 1 _ _ 7   ->   3 7 1 7

size = the symbols to copy; ``blanks`` (blanks per symbol, rounded) sets how
many blanks share the prompt, at places drawn uniformly. CoPE's in-distribution
split has as many blanks as symbols (128 / 128: blanks 1.0); its dense and
sparse splits change that ratio, which here is a setting of its own, while
the task runner's longer sizes test longer prompts at the trained ratio.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS, Task, digits
from rope_lm.tasks.synthetic.sequence import LETTERS

BLANK = "_"


@SYNTHETIC_TASKS.register("selective_copy")
class SelectiveCopy(Task):
    def __init__(self, alphabet: int = 10, blanks: float = 1.0):
        if not 2 <= alphabet <= 26:
            raise ConfigError(f"task.alphabet={alphabet} must be within [2, 26] (symbols drawn per position).")
        if not 0 <= blanks <= 64:
            raise ConfigError(
                f"task.blanks={blanks} must be within [0, 64] (blanks per symbol to copy; CoPE's in-distribution "
                f"split has 1.0)."
            )
        self.alphabet, self.blanks = alphabet, float(blanks)
        self.letters = tuple("0123456789")[:alphabet] if alphabet <= 10 else LETTERS[:alphabet]
        self.symbols = (*self.letters, BLANK)

    def blank_count(self, size: int) -> int:
        return int(round(self.blanks * size))

    def max_tokens(self, size: int) -> int:
        return 2 * size + self.blank_count(size) + 3

    def instance(self, rng, size):
        kept = digits(rng, size, self.letters)
        length = size + self.blank_count(size)
        places = set(rng.sample(range(length), size))
        prompt, it = [], iter(kept)
        for n in range(length):
            prompt.append(next(it) if n in places else BLANK)
        return prompt, kept
