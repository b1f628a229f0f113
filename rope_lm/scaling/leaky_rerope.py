"""Leaky ReRoPE: `scaling=leaky_rerope`. Pairs at least the window w apart sit
at w + (i - j - w) / k (alt_q = i/k + w(1 - 1/k), alt_k = j/k); nearer ones
keep exact RoPE. The two-pass plan is TwoPassMap's (_two_pass_map.py)."""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.scaling._two_pass_map import TwoPassMap
from rope_lm.scaling.base import METHODS


@METHODS.register("leaky_rerope")
class LeakyReRoPE(TwoPassMap):
    def __init__(self, window="auto", k: float = 16.0, **common):
        super().__init__(window, **common)
        if isinstance(k, bool) or not isinstance(k, (int, float)) or k < 1:
            raise ConfigError(f"scaling.k={k!r} must be a number >= 1 (the slope beyond the window is 1/k).")
        self.k = float(k)

    def alt_positions(self, pos, w, ctx):
        p = pos.to(torch.float32) / self.k
        return p + w * (1 - 1 / self.k), p

    def max_relative(self, T, w, ctx):
        return float(T - 1) if T - 1 <= w else w + (T - 1 - w) / self.k

    def describe(self, scheme, ctx):
        return {**super().describe(scheme, ctx), "k": self.k}
