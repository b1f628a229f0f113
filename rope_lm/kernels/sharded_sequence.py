"""Attention of one device's share of a sequence over the keys and values of
every device in its context-parallel group (trainer.context_parallel;
rope_lm/core/sequence_shards.py says how the sequence is split).

The queries and keys are rotated here, on the device that holds them, at
their positions in the whole sequence; then the keys and values are
all-gathered and each query is scored against every key with the mask, the
bias and the per-query scale of its global index. On CPU the scores go
through SDPA with the mask (and bias) as a float mask, one block of queries
at a time; on CUDA through FlexAttention, whose block mask skips the pairs
the causal mask (and any window) removes: PyTorch's FlexAttention form of
context parallelism. torch has no FlexAttention backward on CPU, so CPU
training takes SDPA; both paths equal the explicit attention of one process
over the whole sequence (tests/test_context_parallel.py).

Served: every scheme whose logit is a rotation or a bias of the two tokens'
positions (RoPE and its variants, ALiBi, T5, Kerple, FIRE, NoPE, absolute
tables; FIRE's scalar parameters keep it from FSDP2, so training refuses it),
windows and sink tokens, gpt-oss's sink logits, and the methods
that change frequencies, positions or per-query scales. Not served, refused
before any work (rope_lm/train/context_parallel.check_served): schemes that
compute their own attention or add content terms, and two-pass methods."""

import math

import torch
import torch.nn.functional as F

from rope_lm.core import flex as flex_kernel
from rope_lm.core.visible_keys import pair_mask, visible
from rope_lm.kernels.sdpa_parts import match_heads, sink_column, with_sink_key

# Largest score block (elements) held at once, as attention.MAX_SCORE_ELEMENTS.
MAX_SCORE_ELEMENTS = 1 << 24


def attention(q, k, v, scheme, layer, pos, plan, ctx, kernel: str = "auto"):
    """q (B, H, T/K, D), k and v (B, Hkv, T/K, D): this device's tokens,
    unrotated; pos (T,) the positions of the whole sequence in its original
    order (what one process would use), ctx.shards the split. Returns this
    device's (B, H, T/K, D)."""
    shards = ctx.shards
    q_idx = shards.q_index.to(q.device)
    q_pos = pos[q_idx]
    q, k = scheme.rotate(q, k, q_pos, q_pos, layer, ctx)
    if plan.q_scale is not None:
        q = q * plan.q_scale[q_idx].to(q.dtype)[:, None]
    k, v = shards.gather(k, v)  # before the heads are repeated: Hkv heads travel, not H
    k, v = match_heads(q, k, v)
    k_idx = shards.k_index.to(q.device)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    use_flex = kernel == "flex" or (kernel == "auto" and q.device.type == "cuda")
    if use_flex and not (needs_grad and q.device.type == "cpu"):
        out = _flex(q, k, v, scheme, layer, pos, plan, ctx, compiled=q.device.type == "cuda")
        if out is not None:
            return out
    return _sdpa(q, k, v, scheme, layer, q_pos, pos[k_idx], q_idx, k_idx, plan, ctx)


def _sdpa(q, k, v, scheme, layer, q_pos, k_pos, q_idx, k_idx, plan, ctx):
    B, H, t, D = q.shape
    T = k.shape[2]
    sinks = plan.sink_logits is not None
    block = max(1, min(t, MAX_SCORE_ELEMENTS // max(1, B * H * T)))
    out = []
    for s in range(0, t, block):
        e = min(t, s + block)
        allowed = pair_mask(q_idx[s:e], k_idx, plan.window, plan.sink_tokens)
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
        if scheme.has_bias:
            mask = mask + scheme.bias(layer, q_pos[s:e], k_pos, ctx).to(q.dtype)
        mask = mask.expand(B, H, e - s, T)  # 4-D: CPU SDPA's fused kernel (a 3-D mask takes the math path)
        qb, kb, vb = q[:, :, s:e], k, v
        if sinks:
            qb, kb, vb = with_sink_key(qb, kb, vb, sink_column(plan, H))
            mask = F.pad(mask, (1, 0))
        out.append(
            F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=1 / math.sqrt(D) if sinks else None)
        )
    return torch.cat(out, dim=2)


def _flex(q, k, v, scheme, layer, pos, plan, ctx, compiled: bool):
    """FlexAttention over the gathered keys: the scheme's score_mod and the
    causal (windowed) mask read each pair at its global indices. Query row i
    of this device is gathered row own + i, so a score_mod made for the
    gathered order serves it shifted by own. None where the scheme offers no
    score_mod for these positions (the caller takes SDPA)."""
    shards = ctx.shards
    t, T = q.shape[2], k.shape[2]
    own = shards.rank * t  # this device's first token among the gathered keys
    k_idx = shards.k_index.to(q.device)
    score_mod = None
    if scheme.has_bias:
        inner = scheme.score_mod(layer, pos[k_idx], ctx)
        if inner is None:
            return None

        def score_mod(score, b, h, q_i, kv_i):
            return inner(score, b, h, q_i + own, kv_i)

    key = ("sharded_block_mask", plan.window, plan.sink_tokens, str(q.device))
    if key not in ctx.memo:
        from torch.nn.attention.flex_attention import create_block_mask

        window, sink_tokens = plan.window, plan.sink_tokens

        def mask_mod(b, h, q_i, kv_i):
            return visible(k_idx[q_i + own], k_idx[kv_i], window, sink_tokens)

        ctx.memo[key] = create_block_mask(mask_mod, None, None, t, T, device=q.device)
    return flex_kernel.with_sinks(flex_kernel.flex_fn(compiled), q, k, v, score_mod, ctx.memo[key], plan.sink_logits)
