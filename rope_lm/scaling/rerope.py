"""ReRoPE (Su, 2023): `scaling=rerope`. Pairs at least the window w apart sit
at exactly w (alt_q = w, alt_k = 0); nearer ones keep exact RoPE. The
two-pass plan is TwoPassMap's (_two_pass_map.py)."""

import torch

from rope_lm.scaling._two_pass_map import TwoPassMap
from rope_lm.scaling.base import METHODS


@METHODS.register("rerope")
class ReRoPE(TwoPassMap):
    def alt_positions(self, pos, w, ctx):
        return torch.full(pos.shape, float(w), device=pos.device), torch.zeros(pos.shape, device=pos.device)

    def max_relative(self, T, w, ctx):
        return float(min(T - 1, w))
