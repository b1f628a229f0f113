"""NTK-by-parts (bloc97; YaRN paper sec. 3.2): `scaling=ntk_by_parts`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import RampMethod
from rope_lm.scaling.base import METHODS


@METHODS.register("ntk_by_parts")
class NTKByParts(RampMethod):
    """NTK-by-parts (bloc97; YaRN paper sec. 3.2): keep fast pairs, interpolate
    slow ones, ramp between beta_slow and beta_fast rotations; no attention factor."""

    def compute(self, rot_dim, base, ctx):
        return F.ntk_by_parts(rot_dim, base, ctx.train_len, self.target_len(ctx), self.beta_fast, self.beta_slow)
