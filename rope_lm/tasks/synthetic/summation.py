"""Parity and modular summation: the sum of the input digits mod m, one
answer token. Parity (bits, m = 2) needs every input position at once, which
is where the papers find every scheme fails past the training length without
scratchpads; summation (digits, m = 10) is its ten-symbol relative."""

from rope_lm.tasks.synthetic.base import DIGITS, SYNTHETIC_TASKS, Task, digits


class _Modular(Task):
    modulus = 2

    def __init__(self):
        self.symbols = DIGITS[: self.modulus]

    def max_tokens(self, size: int) -> int:
        return size + 4

    def instance(self, rng, size):
        x = digits(rng, size, self.symbols)
        total = 0
        for s in x:
            total = (total + self.symbols.index(s)) % self.modulus
        return x, [self.symbols[total]]


@SYNTHETIC_TASKS.register("parity")
class Parity(_Modular):
    modulus = 2


@SYNTHETIC_TASKS.register("summation")
class Summation(_Modular):
    modulus = 10
