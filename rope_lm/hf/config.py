"""config.json of a Llama-family model <-> rope-lm's model / pos / scaling
settings.

What maps: LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM are the
same pre-norm decoder as rope-lm's with mlp=swiglu: RMSNorm, fused-here q/k/v
projections with grouped key/value heads, rotate_half RoPE (pos.pairing=half)
on every channel, SiLU-gated MLP, final RMSNorm, optionally tied head.
Mistral's sliding window is rope-lm's `window` method (query i sees key j
iff i - j < w, transformers' sliding-window mask); Qwen2 always has q/k/v
biases and none on the output projection (qkv_bias=true, bias=false).

HF rope_type -> rope-lm method with the same fixed factor (docs/methods.md,
"Matching Hugging Face"): default -> none, linear -> pi, dynamic ->
dynamic_ntk, yarn -> yarn, llama3 -> llama3, longrope -> longrope.
"""

import math

import torch

from rope_lm.errors import ConfigError
from rope_lm.softmax_options import SoftmaxOptions

FAMILIES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}

# Architectures people ask for that this mapping cannot express, with the
# piece rope-lm's block lacks.
UNSUPPORTED = {
    "GPTNeoXForCausalLM": "parallel residual (attention and MLP read the same input), partial rotary of a "
                          "quarter of each head, LayerNorm with bias and a GELU MLP",
    "PhiForCausalLM": "parallel attention/MLP residual, LayerNorm with bias, partial rotary and a GELU MLP",
    "Phi3ForCausalLM": "fused qkv_proj / gate_up_proj tensors (a different weight layout; not mapped yet)",
    "GemmaForCausalLM": "RMSNorm scaled by (1 + weight), embeddings multiplied by sqrt(hidden_size) and a "
                        "GELU-gated MLP",
    "Gemma2ForCausalLM": "logit soft-capping, pre- and post-norms around each sublayer and alternating "
                         "sliding/global layers",
    "Gemma3ForCausalLM": "q/k RMSNorm, pre- and post-norms and alternating sliding/global layers with two RoPE bases",
    "Qwen3ForCausalLM": "RMSNorm on queries and keys (q_norm / k_norm)",
    "MixtralForCausalLM": "a mixture-of-experts MLP",
    "OlmoForCausalLM": "non-parametric LayerNorm",
    "GPT2LMHeadModel": "learned absolute positions, LayerNorm with bias and a GELU MLP on a fused Conv1D layout",
}

# HF rope_type -> rope-lm method
ROPE_TYPES = {"default": "none", "linear": "pi", "dynamic": "dynamic_ntk", "yarn": "yarn", "llama3": "llama3",
              "longrope": "longrope"}
HF_TYPE = {v: k for k, v in ROPE_TYPES.items()}


def rope_parameters(config: dict) -> dict:
    """One flat dict with rope_type and rope_theta, from transformers 5's
    `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = dict(config.get("rope_parameters") or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError("config.json has per-layer-type RoPE parameters (rope_parameters nested by layer type); "
                          "rope-lm models use one RoPE for every layer.")
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
        out.update(beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                   attention_factor=_yarn_attention_factor(params, factor),
                   truncate=bool(params.get("truncate", True)))
    elif rope_type == "llama3":
        out.update(low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]))
    else:  # longrope
        out.update(long_factor=[float(v) for v in params["long_factor"]],
                   short_factor=[float(v) for v in params["short_factor"]],
                   attention_factor=params.get("attention_factor"))
    return out, train_len


def _window(config: dict, family: str, sliding_window: str) -> int | None:
    """The sliding window every layer uses, or None."""
    window = config.get("sliding_window")
    if family == "qwen2":
        if not config.get("use_sliding_window"):
            return None
        if config.get("max_window_layers", 0) < config["num_hidden_layers"]:
            raise ConfigError("Qwen2 with use_sliding_window=true windows only some layers (max_window_layers); "
                              "rope-lm applies one attention pattern to every layer.")
    if family == "llama" or window is None or sliding_window == "ignore":
        return None
    return int(window)


SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings")


def _check_shape(config: dict):
    """The model's shape in config.json's own field names: rope-lm's checks
    would name model.n_head / model.n_kv_head, which the user never wrote."""
    def positive(key):
        value = config.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    missing = [k for k in SHAPE_FIELDS if not positive(k)]
    if missing:
        raise ConfigError("config.json needs positive integers for " + ", ".join(
            f"{k} (has {config[k]!r})" if k in config else f"{k} (missing)" for k in missing) + ".")
    H, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    if kv is not None and (not positive("num_key_value_heads") or H % kv):
        raise ConfigError(f"config.json has num_key_value_heads={kv!r}, which does not divide "
                          f"num_attention_heads={H}: each key/value head serves a whole group of query heads.")
    head_dim = config.get("head_dim")
    if head_dim is None and config["hidden_size"] % H:
        raise ConfigError(f"config.json has hidden_size={config['hidden_size']}, not divisible by "
                          f"num_attention_heads={H}, and no head_dim.")
    if head_dim is not None and not positive("head_dim"):
        raise ConfigError(f"config.json has head_dim={head_dim!r}; it must be a positive integer.")


def settings_from_hf(config: dict, sliding_window: str = "auto") -> dict:
    """{'model', 'pos', 'scaling', 'train_len', 'vocab_size', 'family',
    'max_position_embeddings'} for a config.json dict, or ConfigError
    naming what does not map."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in FAMILIES:
        why = UNSUPPORTED.get(arch)
        raise ConfigError(
            f"Architecture {arch!r} cannot be loaded into rope-lm"
            + (f": rope-lm's block has no {why}." if why else ".")
            + f" Supported: {', '.join(FAMILIES)}."
        )
    family = FAMILIES[arch]
    if config.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={config['hidden_act']!r}: rope-lm's gated MLP is SwiGLU (silu) only.")
    bias = qkv_bias = False
    if family == "qwen2":
        qkv_bias = True
    elif family == "llama":
        attn_bias, mlp_bias = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
        if attn_bias != mlp_bias:
            raise ConfigError(f"attention_bias={attn_bias} with mlp_bias={mlp_bias}: rope-lm's `bias` covers the "
                              f"output projection and the MLP together (qkv_bias is separate).")
        bias = qkv_bias = attn_bias
    _check_shape(config)
    params = rope_parameters(config)
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError(f"partial_rotary_factor={params['partial_rotary_factor']}: {arch} rotates whole heads.")
    H = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // H
    max_pos = int(config["max_position_embeddings"])
    scaling, train_len = scaling_from_hf(params, max_pos, config)
    window = _window(config, family, sliding_window)
    if window is not None:
        if scaling["name"] != "none":
            raise ConfigError(f"{arch} has sliding_window={window} and rope_type={params['rope_type']}: rope-lm runs "
                              f"one method at a time; load with sliding_window='ignore' (full attention, exact up "
                              f"to {window} tokens).")
        scaling = {"name": "window", "window": window}
    eps = config.get("rms_norm_eps", 1e-6)
    model = {
        "name": f"hf-{family}", "n_layer": config["num_hidden_layers"], "n_head": H,
        "n_kv_head": config.get("num_key_value_heads") or H, "d_model": config["hidden_size"], "head_dim": head_dim,
        "mlp": "swiglu", "mlp_hidden": config["intermediate_size"], "norm_eps": float(eps), "dropout": 0.0,
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)), "bias": bias, "qkv_bias": qkv_bias,
        "attention": "auto",
    }
    pos = {"name": "rope", "base": params["rope_theta"], "rotary_fraction": 1.0, "pairing": "half"}
    return {"model": model, "pos": pos, "scaling": scaling, "train_len": train_len,
            "vocab_size": config["vocab_size"], "family": family, "max_position_embeddings": max_pos}


# --- export ------------------------------------------------------------------


def _refuse(reason: str):
    raise ConfigError(f"This model cannot be written as a transformers model: {reason}")


def _rope_scaling_to_hf(method, L: int) -> tuple[dict, int]:
    """(HF rope parameters without rope_theta, max_position_embeddings)."""
    name = method.name
    if name == "window" or name not in HF_TYPE:
        _refuse(f"extrapolation method {name!r} has no transformers rope_type (mapped: {', '.join(HF_TYPE)}).")
    if method.logn:
        _refuse("log-n logit scaling has no transformers equivalent.")
    if name == "none":
        return {"rope_type": "default"}, L
    factor = getattr(method, "slope", None) if name == "dynamic_ntk" else method.factor
    if factor == "auto":
        _refuse("scaling.factor=auto (a scale that follows each sequence length) has no transformers "
                f"equivalent; set a fixed factor, e.g. scaling.factor=4.")
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


def hf_config(model) -> dict:
    """config.json for a rope-lm TransformerLM, or ConfigError with the reason."""
    cfg, scheme = model.cfg, model.pos_scheme
    if scheme.name != "rope":
        _refuse(f"positional scheme {scheme.name!r}; transformers' Llama/Qwen2 use RoPE.")
    if scheme.pairing != "half":
        _refuse("pos.pairing=interleaved; transformers' Llama rotates halves (pos.pairing=half).")
    if scheme.rot_dim != cfg.head_size:
        _refuse(f"pos.rotary_fraction rotates {scheme.rot_dim} of {cfg.head_size} channels; Llama rotates all.")
    if cfg.mlp != "swiglu":
        _refuse(f"model.mlp={cfg.mlp}; transformers' Llama has a SwiGLU MLP (model.mlp=swiglu).")
    tuned = [b.attn.layer for b in model.blocks if b.attn.softmax != SoftmaxOptions()]
    if tuned:
        _refuse(f"model.softmax (query temperature, SSMax or sink logits) acts on layers {tuned}; transformers' "
                f"Llama and Qwen2 have plain softmax attention.")
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    if qkv_bias and not cfg.bias:
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
        if cfg.head_dim is not None and cfg.head_dim * cfg.n_head != cfg.d_model:
            _refuse("Qwen2 derives head_dim from hidden_size / num_attention_heads; model.head_dim differs.")
    elif qkv_bias == cfg.bias:
        arch, model_type = "LlamaForCausalLM", "llama"
    else:
        _refuse("bias=true with qkv_bias=false: no transformers family has biases on the output projection "
                "and MLP but not on q/k/v.")
    rope, max_pos = _rope_scaling_to_hf(model.scaling, cfg.train_len)
    rope["rope_theta"] = scheme.base
    # torch's RMSNorm default eps is finfo(float32).eps; write it out explicitly.
    eps = cfg.norm_eps if cfg.norm_eps is not None else torch.finfo(torch.float32).eps
    out = {
        "architectures": [arch], "model_type": model_type, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.hidden_size, "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_size,
        "hidden_act": "silu", "max_position_embeddings": max_pos, "rms_norm_eps": eps,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_parameters": rope, "attention_dropout": 0.0,
        "dtype": str(model.wte.weight.dtype).removeprefix("torch."),
    }
    if model_type == "llama":
        out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias)
    else:
        out.update(use_sliding_window=False, sliding_window=None)
    return out
