"""The extrapolation-method interface (docs/methods.md).

A method may act at four points of a forward pass, each an identity here:
RoPE frequencies, the position tensor, a learned absolute position table, and
the attention plan (log-n logit scale, sliding window, a second rotary pass for
ReRoPE-like maps). A method declares the scheme families it applies to;
``check`` refuses the others before any work starts.

Log-n scaling composes with every method: ``logn=True`` multiplies the logits
of the query at 0-based index i by max(1, log n / log L), where L is the
training length and n = i + 1 is the number of keys that query attends to,
itself included (min(i + 1, w + k) under a sliding window of w keys with k
sink tokens). n <= L is
therefore the identity, so the whole training window is untouched.

By default log-n acts only at evaluation: in a forward of a model in eval
mode (``ctx.training`` is the model's ``.training``; Lightning switches it for
validation, rope_lm.eval.evaluation sets eval mode), whether or not autograd
records. ``logn_in_training=True`` applies it to every forward, e.g. during a
fine-tune at a longer length.
"""

import math

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.registry import Registry
from rope_lm.kernels.attention import AttnPlan
from rope_lm.positional.frequencies import default_inv_freq

# The registry lives with the interface, so the interface never imports the package that imports it.
METHODS = Registry("extrapolation method", "rope_lm.scaling", "scaling.name")


def methods_for(scheme) -> list[str]:
    return [n for n in METHODS.names() if METHODS.get(n).applies(scheme)]


class ScalingMethod:
    name: str = "?"  # set by the registry
    applies_to: frozenset[str] | None = None  # scheme families; None: every scheme
    # True where the method lets a learned/absolute table serve positions past
    # its rows (position interpolation, hierarchical decomposition); schemes
    # with a bounded table consult it in validate().
    extends_position_table: bool = False
    # True where attention_plan may ask for a second rotary pass (AttnPlan.two_pass)
    # at some lengths; a growing KV cache then keeps raw keys for it.
    far_pass: bool = False

    def __init__(self, logn: bool = False, logn_in_training: bool = False):
        for key, value in (("logn", logn), ("logn_in_training", logn_in_training)):
            if not isinstance(value, bool):
                raise ConfigError(f"scaling.{key}={value!r} must be true or false.")
        self.logn = logn
        self.logn_in_training = logn_in_training

    @property
    def label(self) -> str:
        """The method's name in tables and plots, e.g. ``ntk+logn``."""
        return f"{self.name}+logn" if self.logn and self.name != "logn" else self.name

    def check(self, scheme) -> None:
        if not self.applies(scheme):
            raise ConfigError(
                f"Extrapolation method {self.name!r} (setting `scaling`) does not apply to positional "
                f"scheme {scheme.name!r}, whose family is {scheme.family!r}; it acts on "
                f"{self.acts_on()}. Methods that apply to {scheme.name!r}: {', '.join(methods_for(scheme))}."
            )

    @classmethod
    def table_extenders(cls) -> list[str]:
        """Names of the installed methods that let a position table serve
        positions past its rows (for a scheme's refusal message)."""
        return [n for n in METHODS.names() if METHODS.get(n).extends_position_table]

    @classmethod
    def applies(cls, scheme) -> bool:
        return cls.applies_to is None or scheme.family in cls.applies_to

    @classmethod
    def acts_on(cls) -> str:
        return "every scheme" if cls.applies_to is None else f"{', '.join(sorted(cls.applies_to))} schemes"

    # --- the hooks the model, the schemes and attention call -------------------

    def rope_frequencies(self, rot_dim: int, base: float, ctx) -> tuple[torch.Tensor, float]:
        """(inverse frequencies, attention factor) for the current forward; the
        factor multiplies cos and sin (rope.rotate), so logits scale by its square."""
        return default_inv_freq(rot_dim, base), 1.0

    def validate(self, seq_len: int, scheme, train_len: int) -> None:
        """Raise ConfigError if the method cannot serve seq_len (called before any work)."""

    def map_positions(self, pos: torch.Tensor, scheme, ctx) -> torch.Tensor:
        return pos

    def absolute_table(self, table: torch.Tensor, needed_rows: int, ctx) -> torch.Tensor:
        """A learned position table (rows, C) extended to serve needed_rows
        positions; the default returns it unchanged."""
        return table

    def attention_plan(self, pos: torch.Tensor, ctx) -> AttnPlan:
        plan = self.plan(pos, ctx)
        if self.logn_active(ctx):
            scale = logn_scale(pos.shape[0], ctx.train_len, plan.window, pos.device, plan.sink_tokens)
            plan.q_scale = scale if plan.q_scale is None else plan.q_scale * scale
        return plan

    def plan(self, pos: torch.Tensor, ctx) -> AttnPlan:
        """The method's own attention plan, before log-n scaling is added."""
        return AttnPlan()

    # --- helpers -----------------------------------------------------------------

    def logn_active(self, ctx) -> bool:
        if not self.logn:
            return False
        return self.logn_in_training or not ctx.training

    def describe(self, scheme, ctx) -> dict:
        """The realized settings at ctx.seq_len, for the results JSON."""
        out = {"method": self.name, "label": self.label, "at_length": ctx.seq_len, "train_len": ctx.train_len}
        if self.logn:
            plan = self.plan(torch.arange(ctx.seq_len), ctx)
            scale = logn_scale(ctx.seq_len, ctx.train_len, plan.window, sinks=plan.sink_tokens)
            out["logn"] = {"in_training": self.logn_in_training, "max_logit_scale": float(scale[-1])}
        return out


def logn_scale(T: int, train_len: int, window: int | None = None, device=None, sinks: int = 0) -> torch.Tensor:
    """max(1, log n / log L) for the queries at 0-based indices 0..T-1, with
    n = i + 1 keys in view (capped at the window and its sink tokens)."""
    n = torch.arange(1, T + 1, device=device, dtype=torch.float32)
    if window:
        n = n.clamp(max=window + sinks)
    if train_len <= 1:  # log 1 = 0: no length to be invariant to
        return torch.ones_like(n)
    return (n.log() / math.log(train_len)).clamp(min=1.0)


def positive_int(value, key: str, allow_auto: bool = True):
    """Validate an integer knob that may also be 'auto'."""
    if allow_auto and value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"scaling.{key}={value!r} must be a positive integer{' or auto' if allow_auto else ''}.")
    return value
