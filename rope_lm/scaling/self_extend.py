"""Self-Extend (Jin et al., 2024, "LLM Maybe LongLM"): `scaling=self_extend`.
Far pairs use grouped positions alt_q = floor(i/G) + W - floor(W/G),
alt_k = floor(j/G); the shift W - floor(W/G) makes the grouped relative
position start near W where the neighbour window ends, so the two regions
join. A group of 1 is plain causal attention. The two-pass plan is
TwoPassMap's (_two_pass_map.py)."""

import torch

from rope_lm.kernels.attention import AttnPlan
from rope_lm.scaling._two_pass_map import TwoPassMap, window_for
from rope_lm.scaling.base import METHODS, positive_int


@METHODS.register("self_extend")
class SelfExtend(TwoPassMap):
    """`window` is the neighbour window W; `group` the group size G, or auto:
    the smallest G that keeps every relative position below the training
    length at the current sequence length."""

    def __init__(self, window="auto", group="auto", **common):
        super().__init__(window, **common)
        self.group = positive_int(group, "group")

    def group_size(self, T: int, w: int, ctx) -> int:
        if self.group != "auto":
            return self.group
        G = 1
        # G >= T puts every key in group 0; a window >= L can never fit, so stop there.
        while G < T and self._max_grouped(T, w, G) > ctx.train_len - 1:
            G += 1
        return G

    @staticmethod
    def _max_grouped(T, w, G) -> int:
        return (T - 1) // G + w - w // G

    def plan(self, pos, ctx):
        if self.group_size(ctx.seq_len, window_for(self.window, ctx), ctx) == 1:
            return AttnPlan()  # floor(i/1) + W - W = i: the far pass would repeat the near one
        return super().plan(pos, ctx)

    def alt_positions(self, pos, w, ctx):
        G = self.group_size(ctx.seq_len, w, ctx)
        grouped = torch.div(pos, G, rounding_mode="floor")
        return grouped + (w - w // G), grouped

    def max_relative(self, T, w, ctx):
        if T - 1 < w:
            return float(T - 1)
        return float(max(w - 1, self._max_grouped(T, w, self.group_size(T, w, ctx))))

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        out["group"] = self.group_size(ctx.seq_len, out["window"], ctx)
        return out
