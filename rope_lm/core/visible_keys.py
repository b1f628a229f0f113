"""Which keys a query sees: causal, then within a sliding window whose first
keys (sink tokens) stay visible. Written once for every reader: the attention
kernels (rope_lm/kernels/), the schemes that compute their own attention
(rope_lm/positional/_content.py and their kernels) and FlexAttention's block
mask (rope_lm/core/flex.py), which sit in layers that cannot import one
another."""

import torch


def visible(i, j, window: int | None = None, sink_tokens: int = 0):
    """Whether query index i sees key index j: tensors that broadcast (a
    (Tq, 1) column against a (1, Tk) row gives the (Tq, Tk) mask) or
    FlexAttention's per-pair indices in a mask_mod."""
    allowed = j <= i
    if window:
        near = i - j < window
        allowed = allowed & ((near | (j < sink_tokens)) if sink_tokens else near)
    return allowed


def pair_mask(q_idx: torch.Tensor, k_idx: torch.Tensor, window: int | None = None, sink_tokens: int = 0):
    """Boolean (Tq, Tk): key index k_idx[b] visible to query index q_idx[a]."""
    return visible(q_idx[:, None], k_idx[None, :], window, sink_tokens)


def block_keys(s: int, window: int | None = None, sink_tokens: int = 0) -> tuple[int, int]:
    """(k0, sinks): queries from s on see no key below k0 but the first
    `sinks` (a window's start, its sink tokens). (0, 0) without a window, or
    where the sinks run into the window (every key from the first); a block of
    queries s..e-1 then costs its keys k0..e-1 (and the sinks), not 0..e-1."""
    if not window:
        return 0, 0
    k0 = max(0, s - window + 1)
    return (0, 0) if k0 <= sink_tokens else (k0, sink_tokens)


def key_index(k0: int, sinks: int, e: int, device) -> torch.Tensor | None:
    """The ascending indices of block_keys' keys below e: None where they are
    the plain range k0..e-1, else the sinks then k0..e-1."""
    if not sinks:
        return None
    return torch.cat((torch.arange(sinks, device=device), torch.arange(k0, e, device=device)))
