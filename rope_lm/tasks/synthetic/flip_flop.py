"""Flip-flop language modelling (Liu et al., 2023, "Exposing Attention
Glitches with Flip-Flop Language Modeling"; one of CoPE's tasks, Golovneva et
al., 2024): instructions, each followed by a bit, ``w`` (write),
``i`` (ignore), ``r`` (read); a read's bit is the bit of the last write.

    w 1 i 0 i 1 r 1 w 0 i 1 i 1 r   ->   0

As FFL(p_i): the first instruction is a write, the last a read (whose bit is
the answer), and each one between is ``i`` with probability ``ignore``
(Liu et al.'s p_i = 0.8; CoPE's sparse and dense splits change it), else
``w`` or ``r`` alike; written and ignored bits are fair coins, and reads in the
prompt carry their right bit, as in the flip-flop language itself.

size = the instructions before the final read (the first write included), so
an instance is 2 size + 1 prompt tokens; the task runner's longer sizes are
the longer sequences of the paper's out-of-distribution tests, at the trained
density.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS, Task


@SYNTHETIC_TASKS.register("flip_flop")
class FlipFlop(Task):
    symbols = ("w", "r", "i", "0", "1")

    def __init__(self, ignore: float = 0.8):
        if not 0 <= ignore < 1:
            raise ConfigError(
                f"task.ignore={ignore} must be within [0, 1): the probability of an ignore instruction between "
                f"the first write and the final read (Liu et al.'s p_i; 0.8 in-distribution, 0.98 sparse, 0.1 dense)."
            )
        self.ignore = float(ignore)

    def max_tokens(self, size: int) -> int:
        return 2 * size + 1 + 1 + 3

    def instance(self, rng, size):
        bit = rng.choice("01")
        prompt = ["w", bit]
        for _ in range(size - 1):
            u = rng.random()
            if u < self.ignore:
                prompt += ["i", rng.choice("01")]
            elif u < self.ignore + (1 - self.ignore) / 2:
                bit = rng.choice("01")
                prompt += ["w", bit]
            else:
                prompt += ["r", bit]
        return [*prompt, "r"], [bit]
