"""What the relative-position maps for rotary schemes share (rerope.py,
leaky_rerope.py, self_extend.py): TwoPassMap. The leading underscore keeps
the registry from importing this module as a method.

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

from rope_lm.kernels.attention import AttnPlan
from rope_lm.scaling.base import ScalingMethod, positive_int

ROTARY = frozenset({"rotary"})


def window_for(value, ctx) -> int:
    """The near window w: the setting, or half the training length for auto."""
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
        w = window_for(self.window, ctx)
        # ctx.seq_len, not len(pos): a planned KV cache sees only the tokens so far.
        if w > ctx.seq_len - 1:
            return AttnPlan()
        alt_q, alt_k = self.alt_positions(pos, w, ctx)
        return AttnPlan(alt_q_pos=alt_q, alt_k_pos=alt_k, alt_from=w)

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        w = window_for(self.window, ctx)
        out.update(window=w, max_relative_position=self.max_relative(ctx.seq_len, w, ctx))
        return out

    def max_relative(self, T: int, w: int, ctx) -> float:
        """The largest relative position any pair sees at length T."""
        raise NotImplementedError
