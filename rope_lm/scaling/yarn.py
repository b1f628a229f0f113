"""YaRN (Peng et al., 2023): `scaling=yarn`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

from rope_lm.core.errors import ConfigError
import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import RampMethod
from rope_lm.scaling.base import METHODS


@METHODS.register("yarn")
class YaRN(RampMethod):
    """YaRN (Peng et al., 2023): NTK-by-parts frequencies and the attention
    factor 0.1 ln s + 1 on cos and sin, so on q and k each; the logits are
    scaled by its square (transformers does the same). attention_factor
    overrides it."""

    def __init__(
        self,
        factor="auto",
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        attention_factor: float | None = None,
        truncate: bool = True,
        **common,
    ):
        super().__init__(factor, beta_fast, beta_slow, **common)
        if not isinstance(truncate, bool):
            raise ConfigError(f"scaling.truncate={truncate!r} must be true or false.")
        self.truncate = truncate
        if attention_factor is not None and (
            isinstance(attention_factor, bool)
            or not isinstance(attention_factor, (int, float))
            or attention_factor <= 0
        ):
            raise ConfigError(
                f"scaling.attention_factor={attention_factor!r} must be a positive number or null (YaRN's 0.1 ln s + 1)."
            )
        self.attention_factor = attention_factor

    def compute(self, rot_dim, base, ctx):
        return F.yarn(
            rot_dim,
            base,
            ctx.train_len,
            self.target_len(ctx),
            self.beta_fast,
            self.beta_slow,
            self.attention_factor,
            self.truncate,
        )
