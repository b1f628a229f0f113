"""Position interpolation (Chen et al., 2023): `scaling=pi`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

import torch

import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import FrequencyMethod
from rope_lm.scaling.base import METHODS, ScalingMethod


@METHODS.register("pi")
class PositionInterpolation(FrequencyMethod):
    """Position interpolation (Chen et al., 2023). Rotary: every inverse
    frequency / s. Absolute: positions x 1/s as floats (sinusoidal evaluates
    them, a learned table interpolates its rows)."""

    applies_to = frozenset({"rotary", "absolute"})
    extends_position_table = True

    def compute(self, rot_dim, base, ctx):
        return F.linear(rot_dim, base, ctx.train_len, self.target_len(ctx))

    def map_positions(self, pos, scheme, ctx):
        if scheme.family != "absolute":
            return pos  # rotary schemes get the same effect from rope_frequencies
        s = self.scale(ctx)
        return pos if s == 1.0 else pos.to(torch.float32) / s

    def describe(self, scheme, ctx):
        if scheme.family != "absolute":
            return super().describe(scheme, ctx)
        out = ScalingMethod.describe(self, scheme, ctx)
        s = self.scale(ctx)
        return {**out, "factor": self.factor, "scale": s, "max_position": (ctx.seq_len - 1) / s}
