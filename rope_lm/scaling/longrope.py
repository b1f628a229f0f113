"""LongRoPE-style per-pair rescale factors (Ding et al., 2024; Phi-3).

Each rotary pair i has its inverse frequency divided by lambda_i: the
`long_factor` list when the current sequence is longer than the training
length L, `short_factor` (default all 1, i.e. plain RoPE) otherwise; this is
transformers' "longrope" behaviour. LongRoPE finds the factors by search, so
they are inputs here: lists in the config, or a JSON file
``{"short_factor": [...], "long_factor": [...]}`` named by `factors_file`
(a list given in the config wins over the file). Each list has rot_dim / 2
entries.

Attention factor sqrt(1 + ln s / ln L) (transformers' default), with s from
`factor` (auto: max(1, T / L) per length); like YaRN's it multiplies cos and
sin, so the logits by its square.
"""

import json
import os

from rope_lm.core.errors import ConfigError
import rope_lm.positional.frequencies as F
from rope_lm.scaling._frequency import FrequencyMethod
from rope_lm.scaling.base import METHODS


def _factor_list(value, key: str):
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"scaling.{key} must be a list of positive numbers, one per rotary pair (got {value!r}).")
    return [float(v) for v in value]


@METHODS.register("longrope")
class LongRoPE(FrequencyMethod):
    def __init__(
        self,
        factor="auto",
        short_factor=None,
        long_factor=None,
        factors_file: str | None = None,
        attention_factor: float | None = None,
        **common,
    ):
        super().__init__(factor, **common)
        from_file = {}
        if factors_file:
            if not os.path.isfile(factors_file):
                raise ConfigError(
                    f"scaling.factors_file={factors_file!r} does not exist; give a JSON file with "
                    f"short_factor and long_factor lists."
                )
            try:
                with open(factors_file) as f:
                    from_file = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise ConfigError(f"scaling.factors_file={factors_file!r} is not readable JSON ({e}).") from None
            if not isinstance(from_file, dict):
                raise ConfigError(
                    f"scaling.factors_file={factors_file!r} must hold a JSON object with short_factor / long_factor."
                )
        self.factors_file = factors_file
        self.long_factor = _factor_list(
            long_factor if long_factor is not None else from_file.get("long_factor"), "long_factor"
        )
        self.short_factor = _factor_list(
            short_factor if short_factor is not None else from_file.get("short_factor"), "short_factor"
        )
        if self.long_factor is None:
            raise ConfigError(
                "longrope needs its searched per-pair factors: set scaling.long_factor (a list of rot_dim/2 numbers, "
                "e.g. scaling.long_factor=[1.0,1.2,...]) or scaling.factors_file=<json with long_factor "
                "(and optionally short_factor)>."
            )
        if self.short_factor is not None and len(self.short_factor) != len(self.long_factor):
            raise ConfigError(
                f"scaling.short_factor has {len(self.short_factor)} entries but scaling.long_factor "
                f"{len(self.long_factor)}; both need one per rotary pair."
            )
        if attention_factor is not None and (
            isinstance(attention_factor, bool)
            or not isinstance(attention_factor, (int, float))
            or attention_factor <= 0
        ):
            raise ConfigError(f"scaling.attention_factor={attention_factor!r} must be a positive number or null.")
        self.attention_factor = attention_factor

    def compute(self, rot_dim, base, ctx):
        short = self.short_factor if self.short_factor is not None else [1.0] * len(self.long_factor)
        return F.longrope(
            rot_dim,
            base,
            ctx.train_len,
            self.target_len(ctx),
            short,
            self.long_factor,
            seq_len=ctx.seq_len,
            attention_factor=self.attention_factor,
        )

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        out["uses"] = "long_factor" if ctx.seq_len > ctx.train_len else "short_factor"
        out["factors_file"] = self.factors_file
        return out
