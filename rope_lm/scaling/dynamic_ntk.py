"""Dynamic NTK (transformers' "dynamic"): `scaling=dynamic_ntk`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import FrequencyMethod
from rope_lm.scaling.base import METHODS


@METHODS.register("dynamic_ntk")
class DynamicNTK(FrequencyMethod):
    """Dynamic NTK: NTK-aware at the scale the current length needs,
    factor * T/L - (factor - 1) (transformers' "dynamic"). Here `factor` is
    that formula's slope, not a fixed scale; auto means 1, so s = max(1, T/L)."""

    factor_tag = "slope"

    def __init__(self, factor="auto", **common):
        super().__init__(factor, **common)
        self.slope = 1.0 if self.factor == "auto" else self.factor

    def scale(self, ctx):
        T = max(ctx.seq_len, ctx.train_len)
        return self.slope * T / ctx.train_len - (self.slope - 1)

    def compute(self, rot_dim, base, ctx):
        return F.dynamic_ntk(rot_dim, base, ctx.train_len, ctx.seq_len, self.slope)
