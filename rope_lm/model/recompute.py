"""Activation checkpointing: a block's activations are recomputed in backward
instead of kept (model.activation_checkpointing).

Without it, training keeps every block's intermediate tensors (attention
inputs and outputs, the MLP's hidden layer, norms) from forward to backward,
so memory grows with seq_len x layers x width. With it, only each block's
input is kept; backward runs the block's forward again, one block at a time,
at the cost of about one more forward pass.

The one subtlety is the per-forward memo, ``PosContext.memo`` (RoPE
frequencies, a flex block mask, a shared bias table), that the layers of one
forward fill and read. Non-reentrant checkpointing requires the recomputation
to save exactly the tensors the first pass saved, so a block must see in
backward the memo it saw in forward: each checkpointed block runs on a copy of
the memo as it stood before the block. What the block adds is passed on to
the later blocks only when no part of it needs a gradient (frequencies,
masks); a memoised tensor that depends on parameters (a learned bias table)
is computed again by each block, so its gradient flows through each block's
own recomputation.
"""

from dataclasses import replace

import torch
from torch.utils.checkpoint import checkpoint

# The model setting. It changes how much memory training keeps, never a weight or a loss: a run
# resumed or fine-tuned with it switched is the same model (checkpointing.check_resumable,
# finetune, run_settings.BOOKKEEPING leave it out of their comparisons).
SETTING = "activation_checkpointing"


def run_block(block, x, scheme, pos, plan, ctx, cache, enabled: bool):
    """block(x, scheme, pos, plan, ctx, cache), its activations recomputed in
    backward when `enabled` and autograd records this call. A KV-cached call
    (decoding) is never recomputed: a second pass would append its keys twice."""
    if not (enabled and cache is None and torch.is_grad_enabled()):
        return block(x, scheme, pos, plan, ctx, cache)
    before = dict(ctx.memo)
    added = {}

    def forward(x):
        memo = dict(before)
        out = block(x, scheme, pos, plan, replace(ctx, memo=memo), None)
        added.update((k, v) for k, v in memo.items() if k not in before)
        return out

    out = checkpoint(forward, x, use_reentrant=False)
    ctx.memo.update((k, v) for k, v in added.items() if k not in ctx.memo and not _needs_grad(v))
    return out


def _needs_grad(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, (tuple, list)):
        return any(_needs_grad(v) for v in value)
    if isinstance(value, dict):
        return any(_needs_grad(v) for v in value.values())
    return False
