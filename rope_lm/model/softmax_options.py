"""Options on an attention layer's softmax (``model.softmax``, and per layer a
layout entry's ``softmax``), as the long-context models of 2025 use them:

* ``temperature: {floor_scale, attn_scale}``: Llama 4's position-dependent
  query temperature (transformers' ``attn_temperature_tuning``). The query
  at 0-based index i is multiplied by
  ``log(floor((i + 1) / floor_scale) + 1) * attn_scale + 1``, so logits grow
  slowly with position once i + 1 reaches floor_scale.
* ``ssmax: {init}``: Scalable-Softmax (Nakanishi 2025). The query at index i
  is multiplied by ``s_h * log n``, n the number of keys it sees (i + 1, or
  min(i + 1, window + sinks) under a sliding window) and s_h a learned
  scalar per head (parameter ``attn.ssmax``); ``init: auto`` starts every
  s_h at 1 / log L, L the training length, where log n / log L is 1.
* ``sink_logits: true``: a learned logit per head (parameter ``attn.sinks``)
  that joins every query's softmax denominator and carries no value, as in
  gpt-oss: attention weights sum to less than one, and a head may attend to
  nothing. Initialised at 0 (a null key of logit 0).

Temperature and SSMax are per-query scales on q before any rotation, so they
reach every kernel and a KV cache's steps unchanged; like log-n scaling
(rope_lm/scaling/base.py) they scale q.k, not an additive position bias
(ALiBi, T5, ...). Sink logits travel in the attention plan
(AttnPlan.sink_logits); each kernel adds them (rope_lm/kernels/attention.py).
"""

from dataclasses import dataclass
import math

import torch

from rope_lm.core.errors import ConfigError

KEYS = ("temperature", "ssmax", "sink_logits")


@dataclass(frozen=True)
class SoftmaxOptions:
    floor_scale: float | None = None  # temperature on where set
    attn_scale: float = 0.0
    ssmax_init: float | None = None  # SSMax on where set: the initial s of every head
    sink_logits: bool = False

    @property
    def temperature(self) -> bool:
        return self.floor_scale is not None


def merged(model_level: dict | None, layer: dict | None) -> dict:
    """A layer's settings: its own keys replace the model's."""
    if model_level is not None and not isinstance(model_level, dict):
        raise ConfigError(f"model.softmax={model_level!r} must be a mapping with any of {', '.join(KEYS)}, or null.")
    return {**(model_level or {}), **(layer or {})}


def _number(value, where: str, positive: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise ConfigError(f"{where}={value!r} must be a {'positive ' if positive else ''}finite number.")
    return float(value)


def parse(settings: dict | None, train_len: int, where: str = "model.softmax") -> SoftmaxOptions:
    """Checked options; ``where`` names the setting in messages."""
    settings = settings or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}={settings!r} must be a mapping with any of {', '.join(KEYS)}, or null.")
    unknown = set(settings) - set(KEYS)
    if unknown:
        raise ConfigError(
            f"{where} has unknown key(s) {', '.join(sorted(unknown))}; it takes temperature "
            f"({{floor_scale, attn_scale}}, Llama 4), ssmax ({{init: auto or a number}}, "
            f"Scalable-Softmax) and sink_logits (true/false, gpt-oss)."
        )
    out = {}
    temperature = settings.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, dict) or set(temperature) != {"floor_scale", "attn_scale"}:
            raise ConfigError(
                f"{where}.temperature={temperature!r} must be a mapping with floor_scale (tokens, "
                f"e.g. 8192) and attn_scale (e.g. 0.1), or null for none."
            )
        out["floor_scale"] = _number(temperature["floor_scale"], f"{where}.temperature.floor_scale", True)
        out["attn_scale"] = _number(temperature["attn_scale"], f"{where}.temperature.attn_scale", False)
    ssmax = settings.get("ssmax")
    if ssmax is not None:
        if not isinstance(ssmax, dict) or set(ssmax) - {"init"}:
            raise ConfigError(
                f"{where}.ssmax={ssmax!r} must be a mapping {{init: auto}} (or init: a number, the "
                f"starting s of every head), or null for none."
            )
        init = ssmax.get("init", "auto")
        if init == "auto":
            init = 1.0 / math.log(train_len) if train_len > 1 else 1.0
        out["ssmax_init"] = _number(init, f"{where}.ssmax.init", True)
    sinks = settings.get("sink_logits", False)
    if sinks is None:
        sinks = False
    if not isinstance(sinks, bool):
        raise ConfigError(f"{where}.sink_logits={sinks!r} must be true (a learned sink logit per head) or false.")
    return SoftmaxOptions(**out, sink_logits=sinks)


def keys_in_view(index: torch.Tensor, plan) -> torch.Tensor:
    """How many keys the queries at 0-based indices ``index`` attend to."""
    n = index + 1
    if plan.window:
        n = n.clamp(max=plan.window + plan.sink_tokens)
    return n


def temperature_scale(index: torch.Tensor, floor_scale: float, attn_scale: float) -> torch.Tensor:
    """Llama 4's multiplier on the queries at 0-based indices ``index``."""
    return torch.log1p(torch.floor((index.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def query_scale(
    opts: SoftmaxOptions, ssmax: torch.Tensor | None, total: int, new: int, plan, device, index=None
) -> torch.Tensor | None:
    """Float32 multiplier on the last ``new`` of ``total`` queries (or on the
    queries at 0-based indices ``index``), (1 or H, new, 1) to broadcast over
    (B, H, new, D); None when the layer has none."""
    if not opts.temperature and ssmax is None:
        return None
    if index is None:
        index = torch.arange(total - new, total, device=device)
    scale = torch.ones(new, device=device)
    if opts.temperature:
        scale = temperature_scale(index, opts.floor_scale, opts.attn_scale)
    scale = scale[None, :, None]
    if ssmax is not None:
        scale = scale * (ssmax.float()[:, None, None] * keys_in_view(index, plan).float().log()[None, :, None])
    return scale
