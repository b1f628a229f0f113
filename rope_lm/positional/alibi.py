"""ALiBi (Press et al., 2022, "Train Short, Test Long"): a fixed per-head
linear penalty -m_h * (i - j) on the logits.

Slopes form a geometric sequence starting at 2^(-8/H) with that same ratio.
For H not a power of two the paper takes the 2^k slopes of the closest power
of two below H, then every other slope of the 2^(k+1) sequence for the rest.
"""

import math

import torch

from rope_lm.positional import SCHEMES
from rope_lm.positional._common import PairwiseBias


def alibi_slopes(n_head: int) -> list[float]:
    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_head & (n_head - 1) == 0:
        return power_of_two(n_head)
    closest = 2 ** int(math.floor(math.log2(n_head)))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n_head - closest]


@SCHEMES.register("alibi")
class ALiBi(PairwiseBias):
    distance_bias_shared = True

    def __init__(self, dims):
        super().__init__(dims)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(dims.n_head), dtype=torch.float32), persistent=False)

    def coefficients(self, layer, ctx):
        return (self.slopes,)

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        (slopes,) = coefs
        return -slopes[h] * (q_pos - k_pos).clamp(min=0)
