"""SDPA for a run of queries at an offset in the sequence over every key
before them: a KV cache's step (queries after the cached ones) and, under
context parallelism, each contiguous chunk of a device's share of the
sequence (rope_lm/kernels/sharded_sequence.py). Queries are taken in blocks
so that no block's scores pass MAX_SCORE_ELEMENTS."""

import math

import torch
import torch.nn.functional as F

from rope_lm.core.visible_keys import block_keys, key_index, pair_mask
from rope_lm.kernels.sdpa_parts import with_sink_key

# Largest score block (elements) held at once; beyond it queries are processed
# in blocks so that long evaluations never allocate a T x T tensor.
MAX_SCORE_ELEMENTS = 1 << 24


def query_blocks(B, H, T, min_queries=1, offset=0):
    """(start, end) of query blocks over absolute indices offset..offset+T-1,
    each small enough that its scores over keys 0..end fit MAX_SCORE_ELEMENTS."""
    end = offset + T
    block = max(min_queries, min(T, MAX_SCORE_ELEMENTS // max(1, B * H * end)))
    return [(s, min(end, s + block)) for s in range(offset, end, block)]


def allowed_block(T_q0, T_q1, T_k, plan, device, k0=0):
    """Boolean mask of allowed pairs for queries T_q0..T_q1-1 over keys k0..T_k-1."""
    return pair_mask(
        torch.arange(T_q0, T_q1, device=device), torch.arange(k0, T_k, device=device), plan.window, plan.sink_tokens
    )


def window_keys(s, e, plan, device):
    """The keys a block of queries s..e-1 can see: (first key, index tensor
    or None). Under a window, keys before the first query's window are
    dropped (a sliding-window layer costs T x (window + block), not T x T);
    with sink tokens the first ones are kept too, as an index tensor."""
    k0, sinks = block_keys(s, plan.window, plan.sink_tokens)
    return k0, key_index(k0, sinks, e, device)


def offset_sdpa(q, k, v, scheme, layer, pos, plan, ctx, q0):
    """SDPA for queries q0..q0+t-1 over keys 0..q0+t-1 (q rotated and
    scaled; k, v rotated, Hkv heads); grouped heads are folded into the query
    rows, (B, Hkv, G * t, D), so the keys are never repeated. Without a bias
    the masks are made once per forward and shared by every layer (ctx.memo):
    each layer's SDPA keeps its mask for backward, so in training one copy
    serves them all."""
    B, H, t, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    out = []
    sinks = plan.sink_logits is not None
    for s, e in query_blocks(B, H, t, offset=q0):
        qb = q[:, :, s - q0 : e - q0].reshape(B, Hkv, G * (e - s), D)
        # Under a window only its keys (and the sink tokens): a sliding layer's step reads its last
        # `window` keys, not every key the cache holds.
        k0, keys = window_keys(s, e, plan, q.device)
        if keys is None:
            kb, vb, kpos = k[:, :, k0:e], v[:, :, k0:e], pos[k0:e]
        else:
            kb, vb, kpos = k[:, :, keys], v[:, :, keys], pos[keys]
        n = kb.shape[2]
        if sinks:  # per query head, so per (group, query) row of the folded layout
            col = plan.sink_logits.reshape(1, Hkv, G, 1, 1).expand(1, Hkv, G, e - s, 1)
            qb, kb, vb = with_sink_key(qb, kb, vb, col.reshape(1, Hkv, G * (e - s), 1))
        mask = None
        if scheme.has_bias:
            mask = _float_mask(s, e, k0, keys, plan, q.dtype, q.device)
            mask = mask + scheme.bias(layer, pos[s:e], kpos, ctx).to(q.dtype)  # (H, tq, n)
            # 4-D: torch's CPU SDPA takes its fused kernel for 2-D and 4-D masks but falls back to the
            # slow math path for a 3-D (H, Tq, Tk) one (7x slower measured at T=128).
            mask = mask.reshape(1, Hkv, G * (e - s), n)
            if sinks:
                mask = F.pad(mask, (1, 0))
        elif plan.window or e - s > 1:
            key = ("offset_sdpa_mask", s, e, G, sinks, plan.window, plan.sink_tokens, q.dtype, str(q.device))
            if key not in ctx.memo:
                shared = _float_mask(s, e, k0, keys, plan, q.dtype, q.device).repeat(G, 1)
                ctx.memo[key] = F.pad(shared, (1, 0)) if sinks else shared
            mask = ctx.memo[key]
        y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=1 / math.sqrt(D) if sinks else None)
        out.append(y.reshape(B, H, e - s, D))
    return torch.cat(out, dim=2)


def _float_mask(s, e, k0, keys, plan, dtype, device):
    """0 where query s.. sees a key, -inf elsewhere, over the keys window_keys
    gave: k0..e-1, or the index tensor `keys`."""
    allowed = (
        allowed_block(s, e, e, plan, device, k0) if keys is None else allowed_block(s, e, e, plan, device)[:, keys]
    )
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
