"""Attention under a cumulative per-token log-gate, the kernels FoX and Cable
share (rope_lm/positional/fox.py, cable.py).

Each token s of head h carries a log-gate g_s <= 0 (FoX: log sigmoid of a
linear function of the layer's input; Cable: minus its softplus), and query i
on key j gets

    logit_ij = q_i . k_j / sqrt(D) + sum_{s=j+1..i} g_s = q_i . k_j / sqrt(D) + c_i - c_j,

c the cumulative sum of g, before a causal softmax (a window and sink tokens of
the plan mask pairs out; learned sink logits join the denominator). Three
paths compute it:

* ``explicit``: the formula as written, blocked over queries (the reference);
* ``masked_sdpa``: c_i - c_j as SDPA's float mask (B, H, tq, tk), built one
  query block at a time with the causal/window -inf in it, so the fused kernel
  does the rest (its backward gives the mask's gradient, hence the gates');
* ``flex``: FlexAttention with a score_mod that reads c at the query's and at
  the key's index (CUDA; no T x T tensor at all).

Precision. c is a running sum: at 64k tokens of gates near 1/2 it reaches
-45000, where a float32 holds steps of 0.004, so c_i - c_j of two float32
cumsums is off by that much for neighbouring tokens (and the rounding of
every step between them adds up). Here c is summed in float64 (float32 on
MPS, which has no float64) and never used as a float32 absolute: the
explicit path takes the difference in float64; the masked path subtracts the
block's first query's c from every c it reads, in float64, before rounding,
so a near pair's bias is as exact as its own size allows and a far pair's
error stays relative to a bias that already drives its weight to zero; the
flex path splits c into a float32 head and the float32 remainder, and adds
the heads' difference (exact where the two are within a factor of two) to the
remainders'.
"""

import math

import torch
import torch.nn.functional as F

from rope_lm.core import flex as flex_kernel
from rope_lm.positional._content import allowed_pairs, block_key_range, masked_softmax, query_blocks

TERM = "log_gate"  # the per-token term, (B, H, T, 1) float32, that token_terms gives and a KV cache keeps


def cumulative(log_gate: torch.Tensor) -> torch.Tensor:
    """c (B, H, N): c_i = g_0 + ... + g_i, in float64 where the device has it."""
    dtype = torch.float32 if log_gate.device.type == "mps" else torch.float64
    return log_gate[..., 0].to(dtype).cumsum(-1)


def explicit(q, k, v, log_gate, plan) -> torch.Tensor:
    """The reference: q (B, H, t, D), the last t of N queries; k, v (B, H, N, D);
    log_gate (B, H, N, 1). Scores, the cumulative gate, mask, softmax, values,
    one block of queries at a time."""
    B, H, t, D = q.shape
    N = k.shape[2]
    q0 = N - t
    c = cumulative(log_gate)
    out = []
    for s, e in query_blocks(B, H, q0, N, per_pair=3):
        scores = (q[:, :, s - q0 : e - q0] @ k[:, :, :e].transpose(-1, -2)).float() / math.sqrt(D)
        scores = scores + (c[:, :, s:e, None] - c[:, :, None, :e]).float()
        allowed = allowed_pairs(torch.arange(s, e, device=q.device), torch.arange(e, device=q.device), plan)
        probs = masked_softmax(scores, allowed, plan.sink_logits)
        out.append(probs.to(v.dtype) @ v[:, :, :e])
    return torch.cat(out, dim=2)


def masked_sdpa(q, k, v, log_gate, plan) -> torch.Tensor:
    """The fast path on SDPA: what ``explicit`` computes, with c_i - c_j (and
    -inf where the plan masks a pair) as a float mask per query block."""
    B, H, t, D = q.shape
    N = k.shape[2]
    q0 = N - t
    c = cumulative(log_gate)
    sinks = plan.sink_logits
    out = []
    for s, e in query_blocks(B, H, q0, N, per_pair=2):
        k0, index = block_key_range(s, e, plan, q.device)
        keys = torch.arange(k0, e, device=q.device) if index is None else index
        kb, vb = (k[:, :, k0:e], v[:, :, k0:e]) if index is None else (k[:, :, index], v[:, :, index])
        ref = c[:, :, s : s + 1]  # per-block offset: near pairs keep their own precision
        cq = (c[:, :, s:e] - ref).float()
        ck = (c[:, :, k0:e] if index is None else c[:, :, index]) - ref
        mask = cq[..., :, None] - ck.float()[..., None, :]
        allowed = allowed_pairs(torch.arange(s, e, device=q.device), keys, plan)
        mask = mask.masked_fill(~allowed, float("-inf")).to(q.dtype)
        if sinks is not None:
            # A key of zeros in front: its logit is the mask's value there, the sink; its value adds nothing.
            kb = torch.cat((kb.new_zeros(B, H, 1, D), kb), 2)
            vb = torch.cat((vb.new_zeros(B, H, 1, vb.shape[3]), vb), 2)
            column = sinks.to(q.dtype).reshape(1, H, 1, 1).expand(B, H, e - s, 1)
            mask = torch.cat((column, mask), -1)
        out.append(F.scaled_dot_product_attention(q[:, :, s - q0 : e - q0], kb, vb, attn_mask=mask))
    return torch.cat(out, dim=2)


def flex(q, k, v, log_gate, plan, ctx, compiled: bool = True) -> torch.Tensor:
    """FlexAttention over a full sequence (q, k, v all (B, H, T, D)): the
    score_mod adds c[b, h, q_idx] - c[b, h, kv_idx], c split into a float32
    head (no gradient) and the float32 remainder (which carries it). The
    remainder is read through two tensors, one at the query's index and one,
    negated, at the key's, so that each tensor whose gradient flex computes is
    read at one index only."""
    c = cumulative(log_gate)
    head = c.float().detach()
    rest_q = (c - head.to(c.dtype)).float()
    rest_k = -rest_q

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (head[b, h, q_idx] - head[b, h, kv_idx]) + (rest_q[b, h, q_idx] + rest_k[b, h, kv_idx])

    mask = flex_kernel.block_mask(q.shape[2], plan.window, plan.sink_tokens, q.device, ctx.memo)
    return flex_kernel.with_sinks(flex_kernel.flex_fn(compiled), q, k, v, score_mod, mask, plan.sink_logits)


def attention(scheme, q, k, v, log_gate, plan, ctx, kernel: str) -> torch.Tensor:
    """The path a kernel request takes: ``explicit`` the reference; ``flex``
    (and ``auto`` on CUDA) FlexAttention over a full sequence where it can
    run (compiled; not for training unless the scheme's flex_trains, and a
    failed compile is remembered on the scheme instance); the masked SDPA
    path otherwise, KV-cached steps included."""
    if kernel == "explicit":
        return explicit(q, k, v, log_gate, plan)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, log_gate))
    wants_flex = kernel == "flex" or (kernel == "auto" and q.device.type == "cuda")
    if (
        wants_flex
        and q.shape[2] == k.shape[2]
        and not flex_kernel.failed_on(scheme, q.device)
        and not (needs_grad and (q.device.type == "cpu" or not scheme.flex_trains))
    ):
        try:
            return flex(q, k, v, log_gate, plan, ctx)
        except Exception as e:
            if torch.compiler.is_compiling():
                raise
            flex_kernel.remember_failure(scheme, q.device, e)
    return masked_sdpa(q, k, v, log_gate, plan)
