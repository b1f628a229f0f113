"""Attention with a bias that depends only on the distance i - j, on SDPA's
fused kernel, without building the (Tq, Tk) bias.

A scheme whose bias is a function of p_i - p_j (ALiBi, T5, Kerple, Sandwich,
FIRE while every query is within its L) offers ``distance_bias``: one (H, T)
row of values per head, computed once per forward pass (once for all layers
where the scheme's parameters are shared) and kept in ``ctx.memo``.

The (Tq, Tk) bias of a block of queries is then a Toeplitz matrix: entry
(i, j) reads table[i - j]. With the keys in reverse order, entry (i, c) reads
table[i + c + const], so the whole block is an ``as_strided`` view of one
padded 1-D row per head, strides (1, 1): no T x T tensor, no per-block
bias arithmetic. Softmax does not care about the order of the keys, so
reversing k and v (O(T D)) changes nothing but the summation order. The
padding holds -inf for negative distances (the causal mask) and for
distances at or beyond a sliding window, so mask and bias are one view.

Memory: the padded row is 2T - 1 values per head (per layer where the
parameters are per layer); SDPA's flash kernel reads the view block by
block.
"""

import torch
import torch.nn.functional as F

# Queries per SDPA call. A call over queries s..e-1 sees keys 0..e-1 and
# computes every one of them (the kernel does not know the view is causal),
# so smaller blocks waste less above the diagonal (about block / (2 T) of
# the work) at the cost of more calls.
QUERY_BLOCK = 1024


def arithmetic(pos: torch.Tensor) -> bool:
    """Whether p_i - p_j depends only on i - j (a constant positive step)."""
    if pos.numel() < 2:
        return True
    steps = pos[1:] - pos[:-1]
    if not pos.is_floating_point():
        return bool((steps == steps[0]).all() and steps[0] > 0)
    return bool(steps[0] > 0 and torch.allclose(steps, steps[0].expand_as(steps), rtol=1e-6, atol=1e-6))


def padded_table(scheme, layer, pos, plan, ctx, dtype):
    """(H, 2T - 1) row per head: entry T - 1 + d is the bias at index
    distance d, -inf where d < 0 or d >= window; None when the scheme's bias
    is not a function of the distance for these positions."""
    shared = scheme.distance_bias_shared
    key = ("distance_bias", id(scheme), None if shared else layer, plan.window, dtype)
    if key in ctx.memo:
        return ctx.memo[key]
    table = scheme.distance_bias(layer, pos, ctx) if arithmetic(pos) else None
    if table is not None:
        H, T = table.shape
        table = table.to(dtype)
        if plan.window and plan.window < T:
            table = torch.cat((table[:, : plan.window], table.new_full((H, T - plan.window), float("-inf"))), 1)
        table = torch.cat((table.new_full((H, T - 1), float("-inf")), table), 1)
    ctx.memo[key] = table
    return table


def toeplitz_attention(q, k, v, table, plan):
    """Causal attention of q, k, v (B, H, T, D) with bias table[:, T-1+i-j]."""
    B, H, T, D = q.shape
    width = table.shape[1]
    k, v = k.flip(2), v.flip(2)  # flipped key c is key T - 1 - c
    out = []
    for s in range(0, T, QUERY_BLOCK):
        e = min(T, s + QUERY_BLOCK)
        lo = max(0, s - plan.window + 1) if plan.window else 0  # keys before lo are out of every window
        # Query s + r, flipped key T - e + c (original key e - 1 - c): index
        # distance s + r - e + 1 + c, at offset T - 1 of the padded row.
        mask = table.as_strided((B, H, e - s, e - lo), (0, width, 1, 1), table.storage_offset() + T - e + s)
        out.append(
            F.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, T - e : T - lo], v[:, :, T - e : T - lo], attn_mask=mask
            )
        )
    return torch.cat(out, dim=2)
