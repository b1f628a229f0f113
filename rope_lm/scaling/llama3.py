"""Llama 3.1's RoPE scaling: `scaling=llama3`.

Factor auto or fixed, the label and describe() come from FrequencyMethod
(_frequency.py); the formula is rope_lm/positional/frequencies.py's."""

from rope_lm.core.errors import ConfigError
import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import FrequencyMethod
from rope_lm.scaling.base import METHODS


@METHODS.register("llama3")
class Llama3(FrequencyMethod):
    """Llama 3.1 scaling with original_max_position = the training length."""

    def __init__(self, factor="auto", low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, **common):
        super().__init__(factor, **common)
        if not (
            isinstance(low_freq_factor, (int, float))
            and isinstance(high_freq_factor, (int, float))
            and 0 < low_freq_factor < high_freq_factor
        ):
            raise ConfigError(
                f"llama3 needs 0 < scaling.low_freq_factor < scaling.high_freq_factor "
                f"(got {low_freq_factor!r} and {high_freq_factor!r})."
            )
        self.low_freq_factor, self.high_freq_factor = float(low_freq_factor), float(high_freq_factor)

    def compute(self, rot_dim, base, ctx):
        return F.llama3(rot_dim, base, ctx.train_len, self.target_len(ctx), self.low_freq_factor, self.high_freq_factor)

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        out["kept_below_wavelength"] = ctx.train_len / self.high_freq_factor
        out["interpolated_above_wavelength"] = ctx.train_len / self.low_freq_factor
        return out
