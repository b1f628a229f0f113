"""Attention of one device's share of a sequence over the keys and values of
every device in its context-parallel group (trainer.context_parallel;
rope_lm/core/sequence_shards.py says how the sequence is split).

The queries and keys are rotated here, on the device that holds them, at
their positions in the whole sequence; then the keys and values are
all-gathered, put back in the sequence's order, and each query is scored
against the keys with the mask, the bias and the per-query scale of its
global index. On CPU each contiguous run of a device's queries (two under
head-tail shards) goes through SDPA over the keys up to its last query, as a
KV cache's step does (rope_lm/kernels/offset_sdpa.py); on CUDA through
FlexAttention, whose block mask skips the pairs the causal mask (and any
window) removes: PyTorch's FlexAttention form of context parallelism. torch
has no FlexAttention backward on CPU, so CPU training takes SDPA; both paths
equal one process's attention over the whole sequence
(tests/test_context_parallel.py).

Served: every scheme whose logit is a rotation or a bias of the two tokens'
positions (RoPE and its variants, ALiBi, T5, Kerple, FIRE, NoPE, absolute
tables; FIRE's scalar parameters keep it from FSDP2, so training refuses it),
windows and sink tokens, gpt-oss's sink logits, and the methods that change
frequencies, positions or per-query scales. Not served, refused before any
work (rope_lm/train/context_parallel.check_served): schemes that compute
their own attention or add content terms, and two-pass methods."""

import torch

from rope_lm.core import flex as flex_kernel
from rope_lm.core.visible_keys import visible
from rope_lm.kernels.offset_sdpa import offset_sdpa
from rope_lm.kernels.sdpa_parts import match_heads


def attention(q, k, v, scheme, layer, pos, plan, ctx, kernel: str = "auto"):
    """q (B, H, T/K, D), k and v (B, Hkv, T/K, D): this device's tokens,
    unrotated; pos (T,) the positions of the whole sequence in its order
    (what one process would use), ctx.shards the split. Returns this
    device's (B, H, T/K, D)."""
    shards = ctx.shards
    q_idx = shards.q_index.to(q.device)
    q_pos = pos[q_idx]
    q, k = scheme.rotate(q, k, q_pos, q_pos, layer, ctx)
    if plan.q_scale is not None:
        q = q * plan.q_scale[q_idx].to(q.dtype)[:, None]
    # Gathered before the heads are repeated (Hkv heads travel, not H), then in the sequence's order.
    k, v = (shards.in_order(t) for t in shards.gather(k, v))
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    use_flex = kernel == "flex" or (kernel == "auto" and q.device.type == "cuda")
    if use_flex and not (needs_grad and q.device.type == "cpu"):
        out = _flex(q, k, v, scheme, layer, pos, plan, ctx, compiled=q.device.type == "cuda")
        if out is not None:
            return out
    runs = []
    for first, end, start in shards.runs():
        stop = start + end - first  # keys past this run's last query are masked for all of it
        runs.append(
            offset_sdpa(q[:, :, first:end], k[:, :, :stop], v[:, :, :stop], scheme, layer, pos[:stop], plan, ctx, start)
        )
    return torch.cat(runs, dim=2)


def _flex(q, k, v, scheme, layer, pos, plan, ctx, compiled: bool):
    """FlexAttention over every key in the sequence's order: the scheme's
    score_mod and the causal (windowed) mask read query row i at its index
    in the sequence, q_index[i]. None where the scheme offers no score_mod
    for these positions (the caller takes SDPA)."""
    k, v = match_heads(q, k, v)
    t, T = q.shape[2], k.shape[2]
    q_idx = ctx.shards.q_index.to(q.device)
    score_mod = None
    if scheme.has_bias:
        inner = scheme.score_mod(layer, pos, ctx)
        if inner is None:
            return None

        def score_mod(score, b, h, q_i, kv_i):
            return inner(score, b, h, q_idx[q_i], kv_i)

    key = ("sharded_block_mask", plan.window, plan.sink_tokens, str(q.device))
    if key not in ctx.memo:
        from torch.nn.attention.flex_attention import create_block_mask

        window, sink_tokens = plan.window, plan.sink_tokens

        def mask_mod(b, h, q_i, kv_i):
            return visible(q_idx[q_i], kv_i, window, sink_tokens)

        ctx.memo[key] = create_block_mask(mask_mod, None, None, t, T, device=q.device)
    return flex_kernel.with_sinks(flex_kernel.flex_fn(compiled), q, k, v, score_mod, ctx.memo[key], plan.sink_logits)
