"""Multi-digit addition: `a + b` -> the digits of a + b.

size = the digits of each operand (both have `size` digits, no leading zero
past the first). reversed=true writes operands and sum least significant
digit first, the order in which carries are produced (Lee et al., 2023,
"Teaching Arithmetic to Small Transformers"); false is the usual order, where
the first answer digit depends on every carry.
"""

from rope_lm.tasks.synthetic.base import DIGITS, SYNTHETIC_TASKS, Task


@SYNTHETIC_TASKS.register("addition")
class Addition(Task):
    symbols = (*DIGITS, "+")

    def __init__(self, reversed: bool = True):
        self.reversed = reversed

    def max_tokens(self, size: int) -> int:
        return (2 * size + 1) + (size + 1) + 3

    def operand(self, rng, size: int) -> int:
        return rng.randint(10 ** (size - 1) if size > 1 else 0, 10**size - 1)

    def instance(self, rng, size):
        a, b = self.operand(rng, size), self.operand(rng, size)
        # Carries in reversed order are a little-endian walk; the carry chain is computed digit by digit
        # here (not with int +) so the tests' int arithmetic is an independent check.
        da, db = str(a)[::-1], str(b)[::-1]
        out, carry = [], 0
        for i in range(max(len(da), len(db))):
            s = int(da[i] if i < len(da) else 0) + int(db[i] if i < len(db) else 0) + carry
            out.append(str(s % 10))
            carry = s // 10
        if carry:
            out.append(str(carry))
        if self.reversed:
            return [*da, "+", *db], out
        return [*str(a), "+", *str(b)], out[::-1]
