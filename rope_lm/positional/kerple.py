"""KERPLE (Chi et al., 2022, "Kernelized Relative Positional Embedding for
Length Extrapolation"): conditionally positive definite kernels of the
distance as logit biases, with learnable per-head parameters in every layer.

    log:   -r1 * log(1 + r2 * |i - j|)     r1, r2 > 0
    power: -r1 * |i - j|^r2                r1 > 0, 0 < r2 <= 2

Positivity is kept by construction (r = softplus(raw); the power exponent
is 2 * sigmoid(raw)) instead of the reference code's clamp after each step,
so a parameter can never get stuck at its bound. Initial values follow the
reference code: uniform draws, r1 ~ U(0, 2) and r2 ~ U(0, 1) for log,
r1 ~ U(0, 1) and r2 ~ U(0, 2) for power (floored at 0.01).
"""

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import PairwiseBias, inverse_softplus

VARIANTS = ("log", "power")
EPS = 0.01


@SCHEMES.register("kerple")
class Kerple(PairwiseBias):
    def __init__(self, dims, variant: str = "log"):
        super().__init__(dims)
        if variant not in VARIANTS:
            raise ConfigError(f"pos.variant={variant!r} is not a KERPLE variant; use one of {', '.join(VARIANTS)}.")
        self.variant = variant
        H, L = dims.n_head, dims.n_layer
        hi1, hi2 = (2.0, 1.0) if variant == "log" else (1.0, 2.0)

        def draw(hi):
            return (torch.rand(H) * hi).clamp(min=EPS, max=hi - EPS)

        self.raw_r1 = nn.ParameterList(nn.Parameter(inverse_softplus(draw(hi1))) for _ in range(L))
        if variant == "log":
            self.raw_r2 = nn.ParameterList(nn.Parameter(inverse_softplus(draw(hi2))) for _ in range(L))
        else:
            self.raw_r2 = nn.ParameterList(nn.Parameter(torch.logit(draw(hi2) / 2)) for _ in range(L))

    def parameters_of(self, layer):
        r1 = nn.functional.softplus(self.raw_r1[layer])
        raw2 = self.raw_r2[layer]
        r2 = nn.functional.softplus(raw2) if self.variant == "log" else 2 * torch.sigmoid(raw2)
        return r1, r2

    def coefficients(self, layer, ctx):
        r1, r2 = self.parameters_of(layer)
        return r1, r2, self.variant == "log"

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        r1, r2, log = coefs
        d = (q_pos - k_pos).clamp(min=0)
        if log:
            return -r1[h] * torch.log1p(r2[h] * d)
        return -r1[h] * d ** r2[h]
