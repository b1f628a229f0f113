"""What the schemes that compute their own attention (owns_attention: FoX,
Cable, stick-breaking, CoPE, PaTH, DAPE) share: which pairs a plan lets a
query see, and query blocks small enough to hold their scores.

The leading underscore keeps the registry from importing this module as a
scheme. The kernels' own mask (rope_lm/kernels/attention.py) sits in a layer
above the schemes, so the rule is written here once for the schemes; a test
holds the two equal.
"""

import torch

from rope_lm.core.errors import ConfigError

# Largest (B, H, queries, keys) block of scores a scheme's reference or blocked path holds at once.
MAX_SCORE_ELEMENTS = 1 << 24


def allowed_pairs(q_idx: torch.Tensor, k_idx: torch.Tensor, plan) -> torch.Tensor:
    """Boolean (Tq, Tk): key index j visible to query index i (causal, then
    the plan's window with its sink tokens)."""
    i, j = q_idx[:, None], k_idx[None, :]
    allowed = j <= i
    if plan is not None and plan.window:
        near = i - j < plan.window
        allowed = allowed & ((near | (j < plan.sink_tokens)) if plan.sink_tokens else near)
    return allowed


def query_blocks(B: int, H: int, q0: int, T: int, per_pair: int = 1) -> list[tuple[int, int]]:
    """(start, end) absolute query indices q0..T-1 in blocks whose scores over
    keys 0..end, times per_pair floats a pair, fit MAX_SCORE_ELEMENTS."""
    block = max(1, min(T - q0, MAX_SCORE_ELEMENTS // max(1, B * H * T * per_pair)))
    return [(s, min(T, s + block)) for s in range(q0, T, block)]


def refuse_sink_logits(scheme, plan) -> None:
    """One paragraph for a softmax option a scheme without a softmax cannot serve."""
    if plan is not None and plan.sink_logits is not None and not scheme.serves_sink_logits:
        raise ConfigError(
            f"Positional scheme {scheme.name!r} computes its attention without a softmax denominator, so "
            f"learned sink logits (model.sink_logits) have nothing to join; turn model.sink_logits off for "
            f"its layers, or use a softmax scheme (fox, cable, cope, rope, alibi, ...)."
        )


def masked_softmax(logits, allowed, sink_logits):
    """float32 probabilities of (B, H, tq, tk) logits over the allowed pairs,
    with gpt-oss's sink logits (H,) in the denominator where given."""
    logits = logits.float().masked_fill(~allowed, float("-inf"))
    if sink_logits is None:
        return torch.softmax(logits, dim=-1)
    sink = sink_logits.float().reshape(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    return torch.softmax(torch.cat((logits, sink), -1), dim=-1)[..., :-1]
