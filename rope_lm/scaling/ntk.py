"""NTK-aware RoPE scaling: `scaling=ntk`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import FrequencyMethod
from rope_lm.scaling.base import METHODS


@METHODS.register("ntk")
class NTKAware(FrequencyMethod):
    """NTK-aware scaling: base' = base * s^(d/(d-2))."""

    def compute(self, rot_dim, base, ctx):
        return F.ntk_aware(rot_dim, base, ctx.train_len, self.target_len(ctx))

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        if "pairs" in out:
            out["effective_base"] = (
                F.ntk_base(scheme.rot_dim, float(scheme.base), out["scale"]) if out["scale"] > 1 else float(scheme.base)
            )
        return out
