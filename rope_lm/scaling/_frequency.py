"""What the RoPE frequency methods share (pi.py, ntk.py, dynamic_ntk.py,
ntk_by_parts.py, yarn.py, llama3.py, longrope.py): FrequencyMethod, and
RampMethod for NTK-by-parts and YaRN. The leading underscore keeps the
registry from importing this module as a method.

The formulas are the pure functions of rope_lm/positional/frequencies.py; the
classes choose the target length for each forward:

* ``factor: auto`` (the default): s = max(1, T / L) for the current sequence
  length T and the training length L, so every evaluated length gets the
  scale it needs and lengths <= L run plain RoPE. After a fine-tune at L'
  (init_from), s = max(L', T) / L: the fine-tuned scale on shorter sequences,
  growing with T past L'.
* ``factor: <number>`` (>= 1): a static scale, as in a Hugging Face config's
  ``rope_scaling.factor``, applied at every length, including during training.

Attention factors (YaRN's 0.1 ln s + 1, LongRoPE's sqrt(1 + ln s / ln L)):
rope.py multiplies both cos and sin by the factor, so q and k are each scaled
by it and the attention logits by its square, exactly as transformers does.
"""

import math

import torch

from rope_lm.core.errors import ConfigError
import rope_lm.positional.frequencies as F
from rope_lm.scaling.base import ScalingMethod

ROTARY = frozenset({"rotary"})


def parse_factor(factor, key: str = "factor"):
    if factor == "auto":
        return factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
        raise ConfigError(
            f"scaling.{key}={factor!r} must be `auto` (s = max(1, seq_len / train_len) at each length) "
            f"or a number >= 1 (a fixed scale)."
        )
    return float(factor)


def summarize(inv_freq: torch.Tensor, plain: torch.Tensor, first: int = 4) -> dict:
    """A small, JSON-friendly picture of a set of inverse frequencies."""
    ratio = (plain / inv_freq.double()).tolist()
    return {
        "pairs": int(inv_freq.numel()),
        "inv_freq_max": float(inv_freq.max()),
        "inv_freq_min": float(inv_freq.min()),
        "inv_freq_first": [float(v) for v in inv_freq[:first]],
        "inv_freq_last": [float(v) for v in inv_freq[-first:]],
        # per-pair division of the plain frequency: 1 = untouched, s = interpolated
        "stretch_first": [round(v, 6) for v in ratio[:first]],
        "stretch_last": [round(v, 6) for v in ratio[-first:]],
    }


class FrequencyMethod(ScalingMethod):
    """Shared by the methods that act through rope_frequencies."""

    applies_to = ROTARY

    def __init__(self, factor="auto", **common):
        super().__init__(**common)
        self.factor = parse_factor(factor)

    @property
    def label(self) -> str:
        """``pi`` for factor auto, ``pi-x2`` for a fixed factor 2 (``pi-x2+logn`` with log-n),
        so tables never merge a fixed scale with the per-length one."""
        base = super().label
        if self.factor == "auto":
            return base
        head, plus, tail = base.partition("+")
        return f"{head}-{self.factor_tag}{self.factor:g}{plus}{tail}"

    factor_tag = "x"  # dynamic NTK's factor is a slope, not a scale

    def scale(self, ctx) -> float:
        if self.factor == "auto":
            return max(1.0, max(ctx.seq_len, ctx.tuned_len or 0) / ctx.train_len)
        return self.factor

    def target_len(self, ctx) -> float:
        return self.scale(ctx) * ctx.train_len

    def compute(self, rot_dim: int, base: float, ctx):
        raise NotImplementedError

    def rope_frequencies(self, rot_dim, base, ctx):
        return self.compute(rot_dim, base, ctx)

    def check(self, scheme):
        super().check(scheme)
        spec = scheme.rotary
        if spec is not None:  # surface e.g. NTK's d > 2 requirement before any work
            from rope_lm.positional.base import PosContext

            probe = PosContext(seq_len=4, train_len=2, scaling=self)
            self.rope_frequencies(spec.rot_dim, spec.base, probe)

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        out["factor"] = self.factor
        out["scale"] = self.scale(ctx)
        spec = scheme.rotary
        if spec is not None:
            inv_freq, attention_factor = self.rope_frequencies(spec.rot_dim, spec.base, ctx)
            out["attention_factor"] = attention_factor
            out["logit_scale_from_attention_factor"] = attention_factor**2
            out.update(summarize(inv_freq, F.plain_inv_freq(spec.rot_dim, spec.base)))
        return out


class RampMethod(FrequencyMethod):
    def __init__(self, factor="auto", beta_fast: float = 32.0, beta_slow: float = 1.0, **common):
        super().__init__(factor, **common)
        for key, v in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ConfigError(f"scaling.{key}={v!r} must be a positive number of rotations.")
        if beta_fast <= beta_slow:
            raise ConfigError(
                f"scaling.beta_fast={beta_fast} must exceed scaling.beta_slow={beta_slow}: pairs turning more than "
                f"beta_fast times in the training length are kept, fewer than beta_slow interpolated."
            )
        self.beta_fast, self.beta_slow = float(beta_fast), float(beta_slow)

    def describe(self, scheme, ctx):
        out = super().describe(scheme, ctx)
        spec = scheme.rotary
        if spec is not None:
            lo = F.correction_dim(spec.rot_dim, spec.base, ctx.train_len, self.beta_fast)
            hi = F.correction_dim(spec.rot_dim, spec.base, ctx.train_len, self.beta_slow)
            out["ramp_pairs"] = [max(math.floor(lo), 0), min(math.ceil(hi), spec.rot_dim - 1)]
        return out
