"""The 2025 families whose layers differ: config.json <-> rope-lm settings
with a per-layer layout (model.layout, rope_lm/model/layout.py).

Each family is one Family record: the model options every model of it has,
where its config keeps the activation and epsilon, how it rotates, and which
layers have no RoPE. Everything per layer is read from `layer_types`
(full_attention / sliding_attention; derived as transformers derives it when
the file predates the field), `sliding_window`, and the per-type RoPE
parameters: layer i gets its scheme (rope with its type's base, or nope), its
window, and the method where its type's rope_type asks for one.

    SmolLM3    Llama's block; no_rope_layers[i] = 0 marks a NoPE layer
    Qwen3      Llama's block with an RMSNorm over each head's q and k
    Gemma 3    (1 + w) RMSNorms, q/k norms, norms before and after each
               sublayer, tanh-GELU gate, embeddings times sqrt(hidden_size),
               softmax scale query_pre_attn_scalar^-1/2; local layers
               (sliding, their own base) and global ones; a method acts on
               the global layers only, where Gemma 3's own rope_scaling sits,
               also when the config asks for none (Family.method_types)
    Cohere2    bias-free LayerNorm, one norm feeding attention and MLP in
               parallel, interleaved RoPE on the sliding layers only, NoPE
               global layers, logits times logit_scale
    gpt-oss    Llama's layers with q/k/v/o biases, learned sink logits, a
               mixture of experts (rope_lm/model/experts.py), sliding and full
               layers alternating
    Llama 4    its dense form: SmolLM3's layers with interleaved RoPE and
               the query temperature on the NoPE layers
"""

from dataclasses import dataclass, field
import math

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.hf.rope_params import refuse as _refuse
from rope_lm.hf.rope_params import rope_parameters, scaling_from_hf
from rope_lm.hf.rope_params import rope_scaling_to_hf as _rope_scaling_to_hf

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Family:
    name: str
    arch: str
    model_type: str
    model: dict  # options every model of the family has (norm, qk_norm, post_norms, parallel, mlp)
    act: str = "silu"  # the MLP gate's activation, read from `act_key`
    act_key: str = "hidden_act"
    eps_key: str = "rms_norm_eps"
    pairing: str = "half"
    pattern_default: int | None = None  # layer i is full when (i + 1) % pattern == 0 (sliding_window_pattern)
    nope: str | None = None  # which layers have no RoPE: 'no_rope_layers', 'full' (the global layers) or None
    per_type_rope: bool = False  # rope parameters nested by layer type (global / local bases)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    attn_scalar_key: str | None = None  # softmax scale = config[key] ** -0.5
    logit_scale_key: str | None = None
    mlp_bias_key: str | None = None  # the config key of MLP biases, where the family has them
    sliding_flag: bool = False  # config.json switches windows on with use_sliding_window
    mlp_prefix: str = "mlp"  # the MLP module's name in the tensor names
    has_windows: bool = True  # the family has sliding-window layers at all
    # config key switching on Llama 4's query temperature on the NoPE layers (floor_scale, attn_scale beside it)
    temperature_key: str | None = None
    sinks: bool = False  # a learned sink logit per head on every layer (gpt-oss)
    experts: bool = False  # the MLP is gpt-oss's mixture of experts (rope_lm/model/experts.py)
    width_key: str = "intermediate_size"  # the config key of the (dense) MLP's width
    derived_head_dim: bool = False  # transformers takes head_dim as hidden_size / num_attention_heads
    # The layer types a method acts on where the config asks for none: where the model makers put their own
    # rope_scaling (Gemma 3's larger models: linear x8 on the global layers only). None: every RoPE layer.
    method_types: frozenset | None = None
    # config fields whose only mapped value is the one given, anything else refused by name:
    # {key: (mapped value, transformers' value where the file lacks the key, what any other value means)}
    fixed: dict = field(default_factory=dict)


LLAMA_BLOCK = {"norm": "rms", "qk_norm": False, "post_norms": False, "parallel": False, "mlp": "swiglu"}

FAMILIES = {
    f.arch: f
    for f in (
        Family(
            "smollm3",
            "SmolLM3ForCausalLM",
            "smollm3",
            LLAMA_BLOCK,
            nope="no_rope_layers",
            mlp_bias_key="mlp_bias",
            sliding_flag=True,
            derived_head_dim=True,
        ),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3", {**LLAMA_BLOCK, "qk_norm": True}, sliding_flag=True),
        Family(
            "gemma3",
            "Gemma3ForCausalLM",
            "gemma3_text",
            {"norm": "rms_offset", "qk_norm": True, "post_norms": True, "parallel": False, "mlp": "geglu"},
            act="gelu_pytorch_tanh",
            act_key="hidden_activation",
            pattern_default=6,
            per_type_rope=True,
            embed_scale=True,
            attn_scalar_key="query_pre_attn_scalar",
            method_types=frozenset({FULL}),
            fixed={
                "attn_logit_softcapping": (None, None, "soft-capped attention logits"),
                "final_logit_softcapping": (None, None, "soft-capped output logits"),
                "use_bidirectional_attention": (False, False, "attention that is not causal"),
            },
        ),
        Family(
            "cohere2",
            "Cohere2ForCausalLM",
            "cohere2",
            {"norm": "layer", "qk_norm": False, "post_norms": False, "parallel": True, "mlp": "swiglu"},
            eps_key="layer_norm_eps",
            pairing="interleaved",
            pattern_default=4,
            nope="full",
            logit_scale_key="logit_scale",
            derived_head_dim=True,
        ),
        # gpt-oss: Llama's block with q/k/v/o biases, sink logits and experts; sliding and full layers alternate
        Family(
            "gpt_oss",
            "GptOssForCausalLM",
            "gpt_oss",
            {**LLAMA_BLOCK, "mlp": "moe"},
            pattern_default=2,
            sinks=True,
            experts=True,
        ),
        # Llama 4 text in its dense form only: SmolLM3's layers with interleaved RoPE
        Family(
            "llama4",
            "Llama4ForCausalLM",
            "llama4_text",
            LLAMA_BLOCK,
            pairing="interleaved",
            nope="no_rope_layers",
            mlp_prefix="feed_forward",
            width_key="intermediate_size_mlp",
            has_windows=False,
            temperature_key="attn_temperature_tuning",
            fixed={
                "moe_layers": (
                    [],
                    None,
                    "Llama 4's mixture of experts on these layers (a routed expert beside a "
                    "shared one, not the gpt-oss form of model.mlp=moe); a missing "
                    "moe_layers means every layer",
                ),
                "attention_chunk_size": (
                    None,
                    8192,
                    "chunked attention on the RoPE layers (a query sees only "
                    "its own chunk's keys, not a sliding window)",
                ),
                "use_qk_norm": (False, True, "an L2 norm of q and k after the rotation on the RoPE layers"),
            },
        ),
    )
}


def _layer_types(config: dict, family: Family, n: int) -> list[str]:
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", family.pattern_default)
        if pattern is not None:
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
        elif config.get("use_sliding_window") and config.get("sliding_window"):
            raise ConfigError(
                f"config.json sets use_sliding_window without layer_types: which {family.arch} layers "
                f"slide depends on the transformers version that wrote it; save it again with "
                f"transformers >= 5 (which writes layer_types) to load it."
            )
        else:
            types = [FULL] * n
    if len(types) != n or set(types) - {SLIDING, FULL}:
        raise ConfigError(
            f"config.json has layer_types={types!r}: rope-lm maps {n} entries (num_hidden_layers) "
            f"of {FULL!r} or {SLIDING!r}."
        )
    return list(types)


def _type_rope(config: dict, family: Family) -> dict:
    """{layer type: flat rope parameters}."""
    params = config.get("rope_parameters") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        return {
            t: {**p, "rope_theta": float(p.get("rope_theta", 10000.0)), "rope_type": p.get("rope_type", "default")}
            for t, p in params.items()
        }
    flat = rope_parameters(config)
    if family.per_type_rope:  # transformers 4.x Gemma 3: rope_theta (+ rope_scaling) global, rope_local_base_freq local
        local = {"rope_type": "default", "rope_theta": float(config.get("rope_local_base_freq", 10000.0))}
        return {FULL: flat, SLIDING: local}
    return {FULL: flat, SLIDING: flat}


def _no_rope(config: dict, family: Family, types: list[str]) -> list[bool]:
    n = len(types)
    if family.nope == "full":
        return [t == FULL for t in types]
    if family.nope == "no_rope_layers":
        flags = config.get("no_rope_layers")
        if flags is None:
            interval = config.get("no_rope_layer_interval", 4)
            flags = [int((i + 1) % interval != 0) for i in range(n)]
        if len(flags) != n:
            raise ConfigError(f"config.json has no_rope_layers of {len(flags)} entries for num_hidden_layers={n}.")
        return [not f for f in flags]
    return [False] * n


def _method(type_params: dict, used: set[str], max_pos: int, config: dict) -> tuple[dict, int, set[str]]:
    """(scaling, train_len, layer types it acts on): the one RoPE method of the
    types in use, where several types ask for one they must ask for the same."""
    methods = {t: scaling_from_hf(type_params[t], max_pos, config) for t in sorted(used)}
    asked = {t: m for t, m in methods.items() if m[0]["name"] != "none"}
    if not asked:
        return {"name": "none"}, max_pos, set()
    distinct = {repr(m) for m in asked.values()}
    if len(distinct) > 1:
        raise ConfigError(
            f"config.json's rope_parameters ask for different scalings per layer type "
            f"({', '.join(f'{t}: {m[0]}' for t, m in asked.items())}); rope-lm runs one method, on "
            f"the layers it fits."
        )
    scaling, train_len = next(iter(asked.values()))
    return scaling, train_len, set(asked)


def _experts(config: dict) -> dict:
    """model.experts from gpt-oss's fields (transformers' defaults where the file has none)."""
    return {
        "count": config.get("num_local_experts", 128),
        "top_k": config.get("num_experts_per_tok", 4),
        "limit": float(config.get("swiglu_limit", 7.0)),
        "alpha": float(config.get("swiglu_alpha", 1.702)),
    }


def _temperature(config: dict) -> dict:
    """Llama 4's query temperature (transformers' defaults where the file has none)."""
    return {"floor_scale": float(config.get("floor_scale", 8192)), "attn_scale": float(config.get("attn_scale", 0.1))}


def _compact(entries: list) -> dict | None:
    """{'pattern': the shortest unit the layers repeat (cut where they end, as
    Gemma 3 1B's 6 over 26)}, else {'layers': entries}; None (no layout) where
    every layer is one full-attention entry the method may act on."""
    n = len(entries)
    p = next(p for p in range(1, n + 1) if all(entries[i] == entries[i % p] for i in range(n)))
    if p == 1 and entries[0]["window"] is None and "scaling" not in entries[0]:
        return None
    return {"pattern": entries[:p]} if p < n else {"layers": entries}


def _refuse_fields(config: dict, family: Family):
    for key, (value, absent, meaning) in family.fixed.items():
        found = config.get(key, absent)
        if found != value:
            raise ConfigError(
                f"config.json has {key}={found!r}"
                + ("" if key in config else " (its default)")
                + f": {meaning}, which rope-lm's model has no equivalent of; {family.arch} maps "
                f"with {key}={value!r} only."
            )
    act = config.get(family.act_key, family.act)
    if act != family.act:
        raise ConfigError(
            f"config.json has {family.act_key}={act!r}; {family.arch}'s MLP maps with "
            f"{family.act_key}={family.act!r} only."
        )


def settings(config: dict, family: Family, sliding_window: str = "auto") -> dict:
    """settings_from_hf's answer for a family of FAMILIES; sliding_window
    'ignore' gives the sliding layers full attention."""
    _refuse_fields(config, family)
    n, H = config["num_hidden_layers"], config["num_attention_heads"]
    attn_bias = bool(config.get("attention_bias", family.experts))  # gpt-oss's default is true
    mlp_bias = bool(config.get(family.mlp_bias_key)) if family.mlp_bias_key else False
    if attn_bias != mlp_bias and not family.experts:  # experts carry their own biases; `bias` is o_proj's there
        raise ConfigError(
            f"config.json has attention_bias={attn_bias} with "
            + (f"{family.mlp_bias_key}={mlp_bias}" if family.mlp_bias_key else f"no MLP biases in {family.arch}")
            + ": rope-lm's `bias` covers the output projection and the MLP together."
        )
    types = _layer_types(config, family, n)
    type_params = _type_rope(config, family)
    nope = _no_rope(config, family, types)
    for t in set(types):
        if t not in type_params:
            raise ConfigError(f"config.json's rope_parameters has no entry for layer type {t!r}.")
        partial = float(type_params[t].get("partial_rotary_factor", 1.0))
        if partial != 1.0:
            raise ConfigError(f"partial_rotary_factor={partial}: {family.arch} rotates whole heads.")
    rope_types = {t for t, off in zip(types, nope) if not off}
    max_pos = int(config["max_position_embeddings"])
    scaling, train_len, scaled_types = _method(type_params, rope_types, max_pos, config)
    if not scaled_types and family.method_types is not None:
        # no method asked for: one given later (set_scaling, scaling=) acts where the family's own would
        scaled_types = (set(family.method_types) & rope_types) or rope_types
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if sliding_window == "ignore":
        window = None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"config.json has sliding_window={window!r}; it must be a positive number of keys.")
    entries = []
    for t, off in zip(types, nope):
        pos = (
            {"name": "nope"}
            if off
            else {
                "name": "rope",
                "base": type_params[t]["rope_theta"],
                "rotary_fraction": 1.0,
                "pairing": family.pairing,
            }
        )
        entry = {"pos": pos, "window": window if t == SLIDING else None}
        if (scaling["name"] != "none" or family.method_types is not None) and not off and t not in scaled_types:
            entry["scaling"] = False
        if off and family.temperature_key and config.get(family.temperature_key, True):
            entry["softmax"] = {"temperature": _temperature(config)}
        entries.append(entry)
    first_rope = next((e["pos"] for e in entries if e["pos"]["name"] == "rope"), {"name": "nope"})
    head_dim = config.get("head_dim") or config["hidden_size"] // H
    model = {
        "name": f"hf-{family.name}",
        "n_layer": n,
        "n_head": H,
        "n_kv_head": config.get("num_key_value_heads") or H,
        "d_model": config["hidden_size"],
        "head_dim": head_dim,
        "mlp_hidden": config[family.width_key],
        "norm_eps": float(config.get(family.eps_key, 1e-6)),
        "dropout": 0.0,
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
        "bias": attn_bias,
        "qkv_bias": attn_bias,
        "attention": "auto",
        **family.model,
        "embed_scale": config["hidden_size"] ** 0.5 if family.embed_scale else None,
        "attn_scale": float(config[family.attn_scalar_key]) ** -0.5 if family.attn_scalar_key else None,
        "logit_scale": float(config[family.logit_scale_key]) if family.logit_scale_key else None,
        "layout": _compact(entries),
        "softmax": {"sink_logits": True} if family.sinks else None,
        "experts": _experts(config) if family.experts else None,
    }
    return {
        "model": model,
        "pos": dict(first_rope),
        "scaling": scaling,
        "train_len": train_len,
        "vocab_size": config["vocab_size"],
        "family": family.name,
        "max_position_embeddings": max_pos,
        "mlp_prefix": family.mlp_prefix,
    }


# --- export ------------------------------------------------------------------


def exporting_family(model) -> Family | None:
    """The family a rope-lm model is written as: the one whose block options
    it has, Llama's block going to SmolLM3 only when it has a layout (without
    one it is a Llama / Qwen2, rope_lm/hf/config.py)."""
    options = {k: getattr(model.cfg, k) for k in LLAMA_BLOCK}
    found = [
        f for f in FAMILIES.values() if f.model == options and (options != LLAMA_BLOCK or model.layout is not None)
    ]
    pairings = {getattr(s, "pairing", None) for s in model._layer_schemes} - {None}
    # of families with the same block, the one that rotates as the model does
    return next((f for f in found if {f.pairing} == pairings), found[0] if found else None)


def _layer_rope(model, family: Family) -> list[dict | None]:
    """Each layer's RoPE as {'base'} or None for NoPE, refusing any other scheme."""
    out = []
    for i, scheme in enumerate(model._layer_schemes):
        if scheme.name == "nope":
            out.append(None)
            continue
        if scheme.name != "rope":
            _refuse(f"layer {i} uses positional scheme {scheme.name!r}; {family.arch} layers use RoPE or NoPE.")
        if scheme.pairing != family.pairing:
            _refuse(f"layer {i} has pos.pairing={scheme.pairing}; {family.arch} rotates with pairing={family.pairing}.")
        if scheme.rot_dim != model.cfg.head_size or scheme.p_rope != 1.0:
            _refuse(
                f"layer {i} rotates {scheme.rot_dim} of {model.cfg.head_size} channels with p_rope="
                f"{scheme.p_rope}; {family.arch} rotates whole heads at every frequency."
            )
        out.append({"base": scheme.base})
    return out


def _check_options(cfg, family: Family):
    expected = {
        "embed_scale": cfg.d_model**0.5 if family.embed_scale else None,
        "attn_scale": cfg.attn_scale if family.attn_scalar_key else None,
        "logit_scale": cfg.logit_scale if family.logit_scale_key else None,
    }
    for key, value in expected.items():
        if getattr(cfg, key) != value:
            _refuse(
                f"model.{key}={getattr(cfg, key)}; {family.arch} has "
                + (f"{key}={value}." if value is not None else f"no {key}.")
            )
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    if qkv_bias != cfg.bias or (cfg.bias and not family.mlp_bias_key and not family.experts):
        _refuse(
            f"bias={cfg.bias} with qkv_bias={qkv_bias}: {family.arch}'s attention_bias covers q, k, v and the "
            f"output projection"
            + (
                f", and {family.mlp_bias_key} the MLP."
                if family.mlp_bias_key
                else " and its MLP has none; set both false."
            )
        )
    if family.derived_head_dim and cfg.head_size * cfg.n_head != cfg.d_model:
        _refuse(
            f"model.head_dim={cfg.head_size}: {family.arch} derives head_dim as hidden_size / "
            f"num_attention_heads = {cfg.d_model / cfg.n_head:g}."
        )


def _softmax_to_hf(model, family: Family, nope: list[bool]) -> dict:
    """The config fields of the layers' softmax options: Llama 4's temperature
    on exactly its NoPE layers, one setting for all; anything else refused."""
    opts = [block.attn.softmax for block in model.blocks]
    for i, o in enumerate(opts):
        if o.ssmax_init is not None or o.sink_logits != family.sinks:
            what = "SSMax" if o.ssmax_init is not None else "learned sink logits" if o.sink_logits else "no sink logits"
            _refuse(
                f"layer {i} has {what}; {family.arch} has "
                + ("sink logits on every layer and no SSMax." if family.sinks else "neither.")
            )
    tuned = [o.temperature for o in opts]
    if not any(tuned):
        return {family.temperature_key: False} if family.temperature_key else {}
    settings = {(o.floor_scale, o.attn_scale) for o in opts if o.temperature}
    if not family.temperature_key or tuned != nope or len(settings) > 1:
        _refuse(
            f"the query temperature is on layers {[i for i, t in enumerate(tuned) if t]}"
            + (f" with settings {sorted(settings)}" if len(settings) > 1 else "")
            + f"; {family.arch} "
            + (
                "tunes exactly its NoPE layers, with one floor_scale and attn_scale."
                if family.temperature_key
                else "has no query temperature."
            )
        )
    floor_scale, attn_scale = settings.pop()
    if floor_scale != int(floor_scale):
        _refuse(f"temperature floor_scale={floor_scale} is not a whole number; {family.arch} writes it as an integer.")
    return {family.temperature_key: True, "floor_scale": int(floor_scale), "attn_scale": attn_scale}


def _attn_scalar(cfg, family: Family) -> int:
    """The whole number s whose s^-1/2 is the model's softmax scale (transformers types it int)."""
    if cfg.attn_scale is None:
        return cfg.head_size
    scalar = round(cfg.attn_scale**-2)
    if scalar < 1 or not math.isclose(scalar**-0.5, cfg.attn_scale, rel_tol=1e-12):
        _refuse(
            f"model.attn_scale={cfg.attn_scale} is not s^-1/2 for a whole number s; {family.arch} writes "
            f"{family.attn_scalar_key}=s as an integer."
        )
    return scalar


def hf_config(model, family: Family) -> dict:
    """config.json for a model of `family`, or ConfigError with the reason."""
    cfg = model.cfg
    _check_options(cfg, family)
    n = cfg.n_layer
    windows = [spec.window for spec in model.layout] if model.layout is not None else [None] * n
    if len({w for w in windows if w is not None}) > 1:
        _refuse(
            f"the layout's sliding windows differ ({sorted({w for w in windows if w})}); {family.arch} has one "
            f"sliding_window."
        )
    window = next((w for w in windows if w is not None), None)
    if window is not None and not family.has_windows:
        _refuse(f"the layout has sliding windows; {family.arch} has none.")
    types = [SLIDING if w else FULL for w in windows]
    ropes = _layer_rope(model, family)
    nope = [r is None for r in ropes]
    if nope != _no_rope({}, family, types) and family.nope != "no_rope_layers":
        rule = "NoPE on exactly its global (full-attention) layers" if family.nope == "full" else "RoPE on every layer"
        _refuse(f"the layout has NoPE on layers {[i for i, x in enumerate(nope) if x]}; {family.arch} has {rule}.")
    temperature = _softmax_to_hf(model, family, nope)
    rope, max_pos = _rope_scaling_to_hf(model.scaling, cfg.train_len)
    scaled = set(model.scaled_layers)
    type_rope = {}
    for t in sorted(set(types)):
        layers = [i for i, (lt, r) in enumerate(zip(types, ropes)) if lt == t and r is not None]
        bases = {ropes[i]["base"] for i in layers}
        if len(bases) > 1:
            _refuse(f"the {t} layers have RoPE bases {sorted(bases)}; {family.arch} has one base per layer type.")
        if not layers:
            continue  # a NoPE type reads no rope parameters
        acted = {i in scaled for i in layers}
        if len(acted) > 1:
            _refuse(
                f"the method acts on some {t} layers and not on others; transformers applies a layer type's "
                f"rope_type to all of its layers."
            )
        base = bases.pop()
        type_rope[t] = {**rope, "rope_theta": base} if True in acted else {"rope_type": "default", "rope_theta": base}
    eps = cfg.norm_eps if cfg.norm_eps is not None else torch.finfo(torch.float32).eps
    out = {
        "architectures": [family.arch],
        "model_type": family.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        family.width_key: cfg.hidden_size,
        "num_hidden_layers": n,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_size,
        family.act_key: family.act,
        "max_position_embeddings": max_pos,
        family.eps_key: eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.bias,
        "attention_dropout": 0.0,
        "layer_types": types,
        "sliding_window": window,
        # rope-lm keeps no special-token ids; the families' defaults name tokens of their own vocabularies
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": str(model.wte.weight.dtype).removeprefix("torch."),
    }
    if family.per_type_rope:
        out["rope_parameters"] = type_rope
    else:
        if len({repr(v) for v in type_rope.values()}) > 1:
            _refuse(f"the layer types' RoPE differ ({type_rope}); {family.arch} has one RoPE for every layer.")
        out["rope_parameters"] = next(iter(type_rope.values()), {"rope_type": "default", "rope_theta": 10000.0})
    if family.sliding_flag:
        out["use_sliding_window"] = window is not None
    if family.mlp_bias_key:
        out[family.mlp_bias_key] = cfg.bias
    if family.nope == "no_rope_layers":
        out["no_rope_layers"] = [int(not x) for x in nope]
    if family.attn_scalar_key:
        out[family.attn_scalar_key] = _attn_scalar(cfg, family)
    if family.logit_scale_key:
        out[family.logit_scale_key] = 1.0 if cfg.logit_scale is None else cfg.logit_scale
    out.update({key: value for key, (value, _, _) in family.fixed.items()})
    out.update(temperature)
    if family.experts:
        e = cfg.experts
        out.update(
            num_local_experts=e["count"],
            num_experts_per_tok=e["top_k"],
            swiglu_limit=float(e.get("limit", 7.0)),
            swiglu_alpha=float(e.get("alpha", 1.702)),
        )
    return out
