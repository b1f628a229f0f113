"""What every Hugging Face family shares: config.json's RoPE parameters <->
rope-lm's extrapolation methods, and the model's shape in config.json's own
field names. config.py (the Llama family) and families.py (the families
whose layers differ) both build on it.
"""

import math

from rope_lm.core.errors import ConfigError

# HF rope_type -> rope-lm method
ROPE_TYPES = {
    "default": "none",
    "linear": "pi",
    "dynamic": "dynamic_ntk",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
}
HF_TYPE = {v: k for k, v in ROPE_TYPES.items()}
# p-RoPE (Barbero et al., 2025): pos.p_rope, not a method. transformers keeps int(p * head_dim // 2) frequency
# pairs and zeroes the rest, and divides them all by `factor` (position interpolation, scaling=pi).
PROPORTIONAL = "proportional"


def p_rope_from_hf(params: dict, head_dim: int) -> tuple[float, dict]:
    """(pos.p_rope, rope parameters of the method) for rope_type "proportional":
    p_rope = kept / pairs with transformers' own count of kept pairs, so
    rope-lm's round(p_rope * pairs) keeps the same ones; the method is its
    linear factor."""
    p = float(params.get("partial_rotary_factor", 1.0))
    kept = int(p * head_dim // 2)
    if kept < 1:
        raise ConfigError(
            f"rope_type=proportional with partial_rotary_factor={p} rotates no frequency of a {head_dim}-channel "
            f"head; that is pos=nope, which this import does not write for a rotary checkpoint."
        )
    factor = float(params.get("factor", 1.0))
    method = {"rope_type": "default"} if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    return kept / (head_dim // 2), {**params, **method}


def p_rope_to_hf(kept: int, head_dim: int) -> float:
    """partial_rotary_factor that makes transformers keep exactly `kept` pairs."""
    p = kept / (head_dim // 2)
    while int(p * head_dim // 2) < kept:  # a float just below kept / pairs would floor one pair short
        p = math.nextafter(p, 2.0)
    return p


def rope_parameters(config: dict) -> dict:
    """One flat dict with rope_type and rope_theta, from transformers 5's
    `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(
            "config.json has per-layer-type RoPE parameters (rope_parameters nested by layer type); "
            "rope-lm models use one RoPE for every layer."
        )
    legacy = config.get("rope_scaling") or {}
    for key, value in legacy.items():
        params.setdefault(key, value)
    params.setdefault("rope_type", params.pop("type", "default"))
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_theta"] = float(theta)
    if "partial_rotary_factor" in config:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    return params


def _yarn_attention_factor(params: dict, factor: float):
    """transformers' default YaRN attention factor, including DeepSeek's
    mscale / mscale_all_dim ratio; None where it equals rope-lm's default."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:

        def get(s, m):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        return get(factor, mscale) / get(factor, mscale_all_dim)
    return None


def scaling_from_hf(params: dict, max_pos: int, config: dict) -> tuple[dict, int]:
    """(rope-lm scaling options, train_len) for a flat rope parameter dict."""
    rope_type = params["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"rope_type={rope_type!r} has no rope-lm method; mapped types: {', '.join(ROPE_TYPES)}.")
    name = ROPE_TYPES[rope_type]
    original = params.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
    if rope_type == "default":
        return {"name": "none"}, max_pos
    if rope_type in ("linear", "dynamic"):
        # HF's dynamic scales relative to max_position_embeddings; linear does
        # not read a length, so the pretraining length is the natural L.
        train_len = max_pos if rope_type == "dynamic" else int(original or max_pos)
        return {"name": name, "factor": float(params["factor"])}, train_len
    train_len = int(original or max_pos)
    factor = params.get("factor")
    # transformers: a missing factor is max_position_embeddings / original (Phi-3, DeepSeek)
    factor = float(max_pos / train_len if factor is None else factor)
    if factor < 1:
        raise ConfigError(f"rope_scaling factor {factor} is below 1; rope-lm's fixed factors are >= 1.")
    out = {"name": name, "factor": factor}
    if rope_type == "yarn":
        out.update(
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            attention_factor=_yarn_attention_factor(params, factor),
            truncate=bool(params.get("truncate", True)),
        )
    elif rope_type == "llama3":
        out.update(low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]))
    else:  # longrope
        out.update(
            long_factor=[float(v) for v in params["long_factor"]],
            short_factor=[float(v) for v in params["short_factor"]],
            attention_factor=params.get("attention_factor"),
        )
    return out, train_len


SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)


def check_shape(config: dict):
    """The model's shape in config.json's own field names: rope-lm's checks
    would name model.n_head / model.n_kv_head, which the user never wrote."""

    def positive(key):
        value = config.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    missing = [k for k in SHAPE_FIELDS if not positive(k)]
    if missing:
        raise ConfigError(
            "config.json needs positive integers for "
            + ", ".join(f"{k} (has {config[k]!r})" if k in config else f"{k} (missing)" for k in missing)
            + "."
        )
    H, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    if kv is not None and (not positive("num_key_value_heads") or H % kv):
        raise ConfigError(
            f"config.json has num_key_value_heads={kv!r}, which does not divide "
            f"num_attention_heads={H}: each key/value head serves a whole group of query heads."
        )
    head_dim = config.get("head_dim")
    if head_dim is None and config["hidden_size"] % H:
        raise ConfigError(
            f"config.json has hidden_size={config['hidden_size']}, not divisible by "
            f"num_attention_heads={H}, and no head_dim."
        )
    if head_dim is not None and not positive("head_dim"):
        raise ConfigError(f"config.json has head_dim={head_dim!r}; it must be a positive integer.")


def refuse(reason: str):
    raise ConfigError(f"This model cannot be written as a transformers model: {reason}")


def rope_scaling_to_hf(method, L: int) -> tuple[dict, int]:
    """(HF rope parameters without rope_theta, max_position_embeddings)."""
    name = method.name
    if name == "window" or name not in HF_TYPE:
        refuse(f"extrapolation method {name!r} has no transformers rope_type (mapped: {', '.join(HF_TYPE)}).")
    if method.logn:
        refuse("log-n logit scaling has no transformers equivalent.")
    if name == "none":
        return {"rope_type": "default"}, L
    factor = getattr(method, "slope", None) if name == "dynamic_ntk" else method.factor
    if factor == "auto":
        refuse(
            "scaling.factor=auto (a scale that follows each sequence length) has no transformers "
            "equivalent; set a fixed factor, e.g. scaling.factor=4."
        )
    out = {"rope_type": HF_TYPE[name], "factor": float(factor)}
    if name in ("pi", "dynamic_ntk"):
        return out, L
    out["original_max_position_embeddings"] = L
    if name == "yarn":
        out.update(beta_fast=method.beta_fast, beta_slow=method.beta_slow, truncate=method.truncate)
        if method.attention_factor is not None:
            out["attention_factor"] = float(method.attention_factor)
    elif name == "llama3":
        out.update(low_freq_factor=method.low_freq_factor, high_freq_factor=method.high_freq_factor)
    else:
        short = method.short_factor if method.short_factor is not None else [1.0] * len(method.long_factor)
        out.update(long_factor=[float(v) for v in method.long_factor], short_factor=[float(v) for v in short])
        if method.attention_factor is not None:
            out["attention_factor"] = float(method.attention_factor)
    return out, int(round(factor * L))
