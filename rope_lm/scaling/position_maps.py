"""Relative-position maps for rotary schemes: rerope, leaky_rerope, self_extend.

Each keeps exact RoPE for nearby pairs (i - j < w) and gives far pairs a
smaller relative position, through attention.py's two-pass plan: for
i - j >= alt_from the logit is q rotated at alt_q_pos[i] against k rotated at
alt_k_pos[j], whose relative position is alt_q_pos[i] - alt_k_pos[j].

* rerope (Su, 2023): far pairs sit at exactly w: alt_q = w, alt_k = 0.
* leaky_rerope: far pairs at w + (i - j - w) / k: alt_q = i/k + w(1 - 1/k),
  alt_k = j/k.
* self_extend (Jin et al., 2024, "LLM Maybe LongLM"): far pairs use grouped
  positions alt_q = floor(i/G) + W - floor(W/G), alt_k = floor(j/G); the shift
  W - floor(W/G) makes the grouped relative position start near W where the
  neighbour window ends, so the two regions join.

Where no pair is far (w > T - 1), or Self-Extend's group is 1 (its grouped
positions are the true ones), the plan is plain causal attention, which
keeps those lengths on the plain kernel. Other plans take the two-pass kernel
(rope_lm/kernels/two_pass.py): near band and far region each over only its keys.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.scaling import METHODS
from rope_lm.scaling.base import ScalingMethod, positive_int

ROTARY = frozenset({"rotary"})


def _window(value, ctx) -> int:
    return max(1, ctx.train_len // 2) if value == "auto" else value


class TwoPassMap(ScalingMethod):
    applies_to = ROTARY
    far_pass = True

    def __init__(self, window="auto", **common):
        super().__init__(**common)
        self.window = positive_int(window, "window")

    def alt_positions(self, pos: torch.Tensor, w: int, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def plan(self, pos, ctx):
        w = _window(self.window, ctx)
        # ctx.seq_len, not len(pos): a planned KV cache sees only the tokens so far.
        if w > ctx.seq_len - 1:
            return AttnPlan()
        alt_q, alt_k = self.alt_positions(pos, w, ctx)
        return AttnPlan(alt_q_pos=alt_q, alt_k_pos=alt_k, alt_from=w)

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        w = _window(self.window, ctx)
        out.update(window=w, max_relative_position=self.max_relative(ctx.seq_len, w, ctx))
        return out

    def max_relative(self, T: int, w: int, ctx) -> float:
        """The largest relative position any pair sees at length T."""
        raise NotImplementedError


@METHODS.register("rerope")
class ReRoPE(TwoPassMap):
    def alt_positions(self, pos, w, ctx):
        return torch.full(pos.shape, float(w), device=pos.device), torch.zeros(pos.shape, device=pos.device)

    def max_relative(self, T, w, ctx):
        return float(min(T - 1, w))


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
        if self.group_size(ctx.seq_len, _window(self.window, ctx), ctx) == 1:
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
