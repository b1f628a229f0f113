"""What the schemes that compute their own attention (owns_attention: FoX,
Cable, stick-breaking, CoPE, PaTH, DAPE) share: which pairs a plan lets a
query see, and query blocks small enough to hold their scores.

The leading underscore keeps the registry from importing this module as a
scheme. Which keys a query sees is core's rule (rope_lm/core/visible_keys.py),
the one the attention kernels read too.
"""

import torch

from rope_lm.core.visible_keys import block_keys, key_index, pair_mask

# Largest (B, H, queries, keys) block of scores a scheme's reference or blocked path holds at once.
MAX_SCORE_ELEMENTS = 1 << 24


def allowed_pairs(q_idx: torch.Tensor, k_idx: torch.Tensor, plan) -> torch.Tensor:
    """Boolean (Tq, Tk): key index j visible to query index i (causal, then
    the plan's window with its sink tokens)."""
    if plan is None:
        return pair_mask(q_idx, k_idx)
    return pair_mask(q_idx, k_idx, plan.window, plan.sink_tokens)


def block_key_range(s: int, e: int, plan, device) -> tuple[int, torch.Tensor | None]:
    """The keys queries s..e-1 can see at all under the plan, as (first key k0,
    index or None): None where they are keys k0..e-1, else an ascending index
    with the window's sink tokens first (core/visible_keys.block_keys)."""
    if plan is None:
        return 0, None
    k0, sinks = block_keys(s, plan.window, plan.sink_tokens)
    return k0, key_index(k0, sinks, e, device)


def query_blocks(B: int, H: int, q0: int, T: int, per_pair: int = 1) -> list[tuple[int, int]]:
    """(start, end) absolute query indices q0..T-1 in blocks whose scores over
    keys 0..end, times per_pair floats a pair, fit MAX_SCORE_ELEMENTS."""
    block = max(1, min(T - q0, MAX_SCORE_ELEMENTS // max(1, B * H * T * per_pair)))
    return [(s, min(T, s + block)) for s in range(q0, T, block)]


def refuse_sink_logits(scheme, plan) -> None:
    """One paragraph for a softmax option a scheme without a softmax cannot serve
    (run settings meet it before any work: model/transformer.check_fit)."""
    scheme.check_sink_logits(plan is not None and plan.sink_logits is not None)


def masked_softmax(logits, allowed, sink_logits):
    """Probabilities of (B, H, tq, tk) logits over the allowed pairs, in the
    logits' dtype, with gpt-oss's sink logits (H,) in the denominator where given."""
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sink_logits is None:
        return torch.softmax(logits, dim=-1)
    sink = sink_logits.to(logits.dtype).reshape(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    return torch.softmax(torch.cat((logits, sink), -1), dim=-1)[..., :-1]
