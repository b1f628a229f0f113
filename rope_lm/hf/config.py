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

The families whose layers differ (SmolLM3, Qwen3, Gemma 3, Cohere2, gpt-oss,
Llama 4 dense) are mapped in families.py; both build on rope_params.py (the
RoPE parameters and the shape checks), and settings_from_hf and hf_config
hand those families over.
"""

import dataclasses

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.hf.families import FAMILIES as LAYERED
from rope_lm.hf.families import exporting_family, settings
from rope_lm.hf.families import hf_config as layered_hf_config
from rope_lm.hf.rope_params import PROPORTIONAL, p_rope_from_hf, p_rope_to_hf, rope_parameters, scaling_from_hf
from rope_lm.hf.rope_params import check_shape as _check_shape
from rope_lm.hf.rope_params import refuse as _refuse
from rope_lm.hf.rope_params import rope_scaling_to_hf as _rope_scaling_to_hf
from rope_lm.model.softmax_options import SoftmaxOptions

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
    "MixtralForCausalLM": "a mixture-of-experts MLP",
    "OlmoForCausalLM": "non-parametric LayerNorm",
    "GPT2LMHeadModel": "learned absolute positions, LayerNorm with bias and a GELU MLP on a fused Conv1D layout",
}


def _window(config: dict, family: str, sliding_window: str) -> int | None:
    """The sliding window every layer uses, or None."""
    window = config.get("sliding_window")
    if family == "qwen2":
        if not config.get("use_sliding_window"):
            return None
        if config.get("max_window_layers", 0) < config["num_hidden_layers"]:
            raise ConfigError(
                "Qwen2 with use_sliding_window=true windows only some layers (max_window_layers); "
                "rope-lm applies one attention pattern to every layer."
            )
    if family == "llama" or window is None or sliding_window == "ignore":
        return None
    return int(window)


def settings_from_hf(config: dict, sliding_window: str = "auto") -> dict:
    """{'model', 'pos', 'scaling', 'train_len', 'vocab_size', 'family',
    'max_position_embeddings'} for a config.json dict, or ConfigError
    naming what does not map."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch in LAYERED:
        _check_shape(config)
        return settings(config, LAYERED[arch], sliding_window)
    if arch not in FAMILIES:
        why = UNSUPPORTED.get(arch)
        raise ConfigError(
            f"Architecture {arch!r} cannot be loaded into rope-lm"
            + (f": rope-lm's block has no {why}." if why else ".")
            + f" Supported: {', '.join([*FAMILIES, *LAYERED])}."
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
            raise ConfigError(
                f"attention_bias={attn_bias} with mlp_bias={mlp_bias}: rope-lm's `bias` covers the "
                f"output projection and the MLP together (qkv_bias is separate)."
            )
        bias = qkv_bias = attn_bias
    _check_shape(config)
    params = rope_parameters(config)
    H = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // H
    p_rope = 1.0
    if params["rope_type"] == PROPORTIONAL:
        p_rope, params = p_rope_from_hf(params, head_dim)
    elif float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConfigError(f"partial_rotary_factor={params['partial_rotary_factor']}: {arch} rotates whole heads.")
    max_pos = int(config["max_position_embeddings"])
    scaling, train_len = scaling_from_hf(params, max_pos, config)
    window = _window(config, family, sliding_window)
    if window is not None:
        if scaling["name"] != "none":
            raise ConfigError(
                f"{arch} has sliding_window={window} and rope_type={params['rope_type']}: rope-lm runs "
                f"one method at a time; load with sliding_window='ignore' (full attention, exact up "
                f"to {window} tokens)."
            )
        scaling = {"name": "window", "window": window}
    eps = config.get("rms_norm_eps", 1e-6)
    model = {
        "name": f"hf-{family}",
        "n_layer": config["num_hidden_layers"],
        "n_head": H,
        "n_kv_head": config.get("num_key_value_heads") or H,
        "d_model": config["hidden_size"],
        "head_dim": head_dim,
        "mlp": "swiglu",
        "mlp_hidden": config["intermediate_size"],
        "norm_eps": float(eps),
        "dropout": 0.0,
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "bias": bias,
        "qkv_bias": qkv_bias,
        "attention": "auto",
    }
    pos = {"name": "rope", "base": params["rope_theta"], "rotary_fraction": 1.0, "pairing": "half"}
    if p_rope != 1.0:
        pos["p_rope"] = p_rope
    return {
        "model": model,
        "pos": pos,
        "scaling": scaling,
        "train_len": train_len,
        "vocab_size": config["vocab_size"],
        "family": family,
        "max_position_embeddings": max_pos,
    }


# --- export ------------------------------------------------------------------


def hf_config(model) -> dict:
    """config.json for a rope-lm TransformerLM, or ConfigError with the reason."""
    family = exporting_family(model)
    if family is not None:
        return layered_hf_config(model, family)
    cfg, scheme = model.cfg, model.pos_scheme
    if model.layout is not None:
        _refuse(
            f"a per-layer layout with model.norm={cfg.norm}, qk_norm={cfg.qk_norm}, post_norms={cfg.post_norms}, "
            f"parallel={cfg.parallel}, mlp={cfg.mlp}: no transformers family has that block (mapped: "
            f"{', '.join(LAYERED)}, and Llama / Qwen2 without a layout)."
        )
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for key in ("norm", "qk_norm", "post_norms", "parallel", "embed_scale", "attn_scale", "logit_scale"):
        if getattr(cfg, key) != defaults[key]:
            _refuse(
                f"model.{key}={getattr(cfg, key)} in a block no transformers family has (mapped: "
                f"{', '.join(LAYERED)}, Llama, Qwen2)."
            )
    if scheme.name != "rope":
        _refuse(f"positional scheme {scheme.name!r}; transformers' Llama/Qwen2 use RoPE.")
    if scheme.pairing != "half":
        _refuse("pos.pairing=interleaved; transformers' Llama rotates halves (pos.pairing=half).")
    if scheme.rot_dim != cfg.head_size:
        _refuse(f"pos.rotary_fraction rotates {scheme.rot_dim} of {cfg.head_size} channels; Llama rotates all.")
    if scheme.p_rope != 1.0 and model.scaling.name not in ("none", "pi"):
        _refuse(
            f"pos.p_rope={scheme.p_rope} under scaling={model.scaling.name}: transformers' p-RoPE (rope_type "
            f"proportional) carries only a linear factor (scaling=pi or none)."
        )
    if cfg.mlp != "swiglu":
        _refuse(f"model.mlp={cfg.mlp}; transformers' Llama has a SwiGLU MLP (model.mlp=swiglu).")
    tuned = [b.attn.layer for b in model.blocks if b.attn.softmax != SoftmaxOptions()]
    if tuned:
        _refuse(
            f"model.softmax (query temperature, SSMax or sink logits) acts on layers {tuned}; transformers' "
            f"Llama and Qwen2 have plain softmax attention."
        )
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    if qkv_bias and not cfg.bias:
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
        if cfg.head_dim is not None and cfg.head_dim * cfg.n_head != cfg.d_model:
            _refuse("Qwen2 derives head_dim from hidden_size / num_attention_heads; model.head_dim differs.")
    elif qkv_bias == cfg.bias:
        arch, model_type = "LlamaForCausalLM", "llama"
    else:
        _refuse(
            "bias=true with qkv_bias=false: no transformers family has biases on the output projection "
            "and MLP but not on q/k/v."
        )
    rope, max_pos = _rope_scaling_to_hf(model.scaling, cfg.train_len)
    rope["rope_theta"] = scheme.base
    if scheme.p_rope != 1.0:
        rope["rope_type"] = PROPORTIONAL  # its `factor` is linear's, which pi already wrote
        rope["partial_rotary_factor"] = p_rope_to_hf(scheme.kept_pairs, cfg.head_size)
    # torch's RMSNorm default eps is finfo(float32).eps; write it out explicitly.
    eps = cfg.norm_eps if cfg.norm_eps is not None else torch.finfo(torch.float32).eps
    out = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden_size,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_size,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": rope,
        "attention_dropout": 0.0,
        "dtype": str(model.wte.weight.dtype).removeprefix("torch."),
    }
    if model_type == "llama":
        out.update(attention_bias=cfg.bias, mlp_bias=cfg.bias)
    else:
        out.update(use_sliding_window=False, sliding_window=None)
    return out
