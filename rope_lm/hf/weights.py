"""Transformers' Llama-family tensor names <-> rope-lm parameters, and streaming
safetensors I/O.

rope-lm fuses q, k and v into one `qkv` projection (rows: q heads, k heads,
v heads), so each HF q/k/v tensor fills a row range of it; every other
tensor is one rope-lm parameter under another name.

Loading reads each tensor's bytes from the file straight into the model's
own storage (a dtype conversion goes through one tensor-sized buffer), so at
no point do two copies of the weights exist. The file is read, not mapped:
safetensors' safe_open maps the file, and every page it touches counts in the
process's resident memory until the file is closed, which measured at twice
the weights' size for a 400 MB model. The format is an 8-byte little-endian
header length, a JSON header of {name: {dtype, shape, data_offsets}}, then
the data (github.com/huggingface/safetensors, "Format").
"""

import json
import os
import struct

import torch

from rope_lm.core.errors import ConfigError

# HF tensors a checkpoint may carry that rope-lm recomputes (older Llama
# checkpoints saved the rotary inverse frequencies).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def layout(cfg, mlp_prefix: str = "mlp") -> dict[str, tuple[str, slice | None]]:
    """HF tensor name -> (rope-lm parameter name, row slice or None);
    mlp_prefix is the family's name of the MLP module (Llama 4: feed_forward)."""
    H, Hkv, D = cfg.n_head, cfg.kv_heads, cfg.head_size
    rows = {"q": slice(0, H * D), "k": slice(H * D, (H + Hkv) * D), "v": slice((H + Hkv) * D, (H + 2 * Hkv) * D)}
    qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    out = {"model.embed_tokens.weight": ("wte.weight", None), "model.norm.weight": ("norm.weight", None)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", None)
    # transformers' names of the norms after input_layernorm: with post norms (Gemma)
    # post_attention_layernorm is the attention's output norm, not the MLP's input norm
    if cfg.post_norms:
        norms = {
            "post_attention_layernorm": "attn_post_norm",
            "pre_feedforward_layernorm": "norm2",
            "post_feedforward_layernorm": "mlp_post_norm",
        }
    else:
        norms = {} if cfg.parallel else {"post_attention_layernorm": "norm2"}
    if cfg.qk_norm:
        norms.update({"self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"})
    from rope_lm.model.layout import layer_specs
    from rope_lm.model.transformer import layer_softmax

    layers = layer_specs(cfg.layout, {}, cfg.n_layer)
    for i in range(cfg.n_layer):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        out[hf + "input_layernorm.weight"] = (ours + "norm1.weight", None)
        for theirs, mine in norms.items():
            out[hf + theirs + ".weight"] = (ours + mine + ".weight", None)
        if layer_softmax(cfg, i, layers).sink_logits:
            out[hf + "self_attn.sinks"] = (ours + "attn.sinks", None)
        for name, part in rows.items():
            out[hf + f"self_attn.{name}_proj.weight"] = (ours + "attn.qkv.weight", part)
            if qkv_bias:
                out[hf + f"self_attn.{name}_proj.bias"] = (ours + "attn.qkv.bias", part)
        pairs = {"self_attn.o_proj": "attn.proj"}
        if cfg.mlp == "moe":  # gpt-oss's experts, tensors as transformers lays them out (rope_lm/model/experts.py)
            experts = {
                "router.weight": "router.weight",
                "router.bias": "router.bias",
                "experts.gate_up_proj": "gate_up",
                "experts.gate_up_proj_bias": "gate_up_bias",
                "experts.down_proj": "down",
                "experts.down_proj_bias": "down_bias",
            }
            for theirs, mine in experts.items():
                out[hf + f"{mlp_prefix}.{theirs}"] = (ours + f"mlp.{mine}", None)
        else:
            pairs.update(
                {
                    f"{mlp_prefix}.gate_proj": "mlp.gate",
                    f"{mlp_prefix}.up_proj": "mlp.fc",
                    f"{mlp_prefix}.down_proj": "mlp.proj",
                }
            )
        for theirs, mine in pairs.items():
            out[hf + theirs + ".weight"] = (ours + mine + ".weight", None)
            if cfg.bias:
                out[hf + theirs + ".bias"] = (ours + mine + ".bias", None)
    return out


def weight_files(directory: str) -> list[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(directory, n) for n in names]
    single = os.path.join(directory, "model.safetensors")
    if os.path.exists(single):
        return [single]
    found = sorted(n for n in os.listdir(directory) if n.endswith((".bin", ".pt", ".pth")))
    raise ConfigError(
        f"{directory} has no model.safetensors (or sharded index); rope-lm reads safetensors only"
        + (
            f" and found {', '.join(found)}: convert them with transformers' save_pretrained (safe_serialization=True)."
            if found
            else "."
        )
    )


DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_header(f) -> tuple[dict, int]:
    """({name: entry}, byte offset of the data) of an open safetensors file."""
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def read_into(f, entry: dict, data_start: int, dest: torch.Tensor) -> None:
    """Copy one tensor from the file into dest (same shape, contiguous)."""
    start, end = entry["data_offsets"]
    f.seek(data_start + start)
    dtype = DTYPES[entry["dtype"]]
    if dtype == dest.dtype:
        target = dest.view(-1).view(torch.uint8).numpy()
        if f.readinto(target) != end - start:
            raise ConfigError(f"{f.name} ends inside a tensor; the file is truncated.")
        return
    buffer = torch.empty(tuple(entry["shape"]), dtype=dtype)
    f.readinto(buffer.view(-1).view(torch.uint8).numpy())
    dest.copy_(buffer)


@torch.no_grad()
def load_weights(model, directory: str, mlp_prefix: str = "mlp") -> None:
    """Fill every parameter of `model` (allocated, uninitialised) from the
    safetensors files, one tensor at a time, checking that each HF tensor
    lands on a slot of the right shape and that every slot is filled."""
    slots = layout(model.cfg, mlp_prefix)
    params = dict(model.named_parameters())
    filled, tied_head = set(), model.cfg.tie_embeddings
    for path in weight_files(directory):
        with open(path, "rb") as f:
            header, data_start = read_header(f)
            for name, entry in header.items():
                if name.endswith(IGNORED_SUFFIXES) or (tied_head and name == "lm_head.weight"):
                    continue  # a tied head is the embedding; the saved copy adds nothing
                if name not in slots:
                    raise ConfigError(
                        f"{path}: tensor {name!r} has no place in the rope-lm model (unsupported architecture option?)."
                    )
                if entry["dtype"] not in DTYPES:
                    raise ConfigError(
                        f"{path}: tensor {name!r} is {entry['dtype']}; rope-lm reads "
                        f"{', '.join(DTYPES)} weights (quantized checkpoints are not supported)."
                    )
                target, rows = slots[name]
                # a row block of a contiguous matrix is itself contiguous
                dest = params[target] if rows is None else params[target][rows]
                if tuple(entry["shape"]) != tuple(dest.shape):
                    raise ConfigError(
                        f"{path}: tensor {name!r} has shape {tuple(entry['shape'])}, but config.json "
                        f"implies {tuple(dest.shape)}."
                    )
                read_into(f, entry, data_start, dest)
                filled.add(name)
    missing = sorted(set(slots) - filled)
    if missing:
        raise ConfigError(
            f"{directory}: the weights lack {len(missing)} tensor(s) config.json implies, e.g. "
            f"{', '.join(missing[:3])}."
        )


def hf_state_dict(model, mlp_prefix: str = "mlp") -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, contiguous and not
    sharing storage (safetensors refuses shared tensors). Only the q/k/v row
    blocks are copies; the other tensors are the parameters themselves."""
    params = dict(model.named_parameters())
    out = {}
    for hf_name, (name, rows) in layout(model.cfg, mlp_prefix).items():
        p = params[name].detach()
        out[hf_name] = p if rows is None else p[rows].clone()
    return out
