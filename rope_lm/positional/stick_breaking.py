"""Stick-breaking attention (Tan, Yang, Courville, Panda and Shen, ICLR 2025,
arXiv 2410.17980, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study"): no softmax and no position encoding;
order comes from how the weights are drawn.

Each query breaks a stick of length 1, nearest key first:

    z_ij = q_i . k_j / sqrt(D),    beta_ij = sigmoid(z_ij),
    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik),      j < i,
    o_i  = sum_{j<i} A_ij v_j  +  (1 - sum_{j<i} A_ij) v_i.

As in the paper ("for each token before the current") and its reference code
(shawntan/stickbreaking-attention, ``attend_current=False``), a query does not
break the stick at its own key; no offset is added to z and the scale is
1/sqrt(D). The weights sum to at most 1; the rest of the stick,
prod_{j<i} (1 - beta_ij), goes to the query's own value (``remainder:
current``: the reference code's ``o + rem[..., None] * v``, in its tests and
its first model code). ``remainder: none`` drops it (the bare formula);
``attend_current: true`` lets the query's own key take the first break (k runs
over j < k <= i), as the reference kernel's option does. Later model code
(IBM's dolomite-engine) gives the remainder to a learned per-head vector
followed by a group norm, parameters outside attention that this scheme does
not add.

Computed in log space:

    log A_ij = logsigmoid(z_ij) + sum_{j<k<i} logsigmoid(-z_ik)

(the explicit reference, ``kernel="explicit"``, exactly this: a reverse
cumulative sum over each query's keys). The fast path uses the same sum
written with softplus, logsigmoid(z) = z - softplus(z) and
logsigmoid(-z) = -softplus(z):

    log A_ij = z_ij - sum_{j <= k <= i, seen} softplus(z_ik),
    log rem_i = -sum_{k seen} softplus(z_ik),

with the keys laid out nearest first, so one forward cumulative sum adds the
small terms of the near keys first (their weights, the large ones, keep full
float32 precision at any length) and the remainder is the last column, never
1 - sum. Its backward (rope_lm/positional/_stick_breaking_kernel.py) is
written out from the logits and weights the forward keeps.

Window and sinks (a plan's window, StreamingLLM's sink tokens): a key the
query does not see gets weight 0 and breaks no stick. Every key out of the
window is farther than every key in it, so dropping it changes no visible
key's product: a window of w keeps exactly the w - 1 nearest breaks (w with
attend_current). Sink tokens (the first tokens, kept in view under a window)
are the farthest keys a query sees: they take what the window's keys leave,
in order, and what they leave goes to the remainder. Log-n scaling multiplies
the queries, so it sharpens every break point. Learned sink logits
(model.sink_logits) join a softmax's denominator, which this scheme has none
of: refused.

KV cache: the generic cache keeps raw keys and values (no per-token terms) and
hands every held key to each step; a step's queries are the last rows of the
full forward's, so a cached reading equals a full one.
"""

import math
from typing import Literal

import torch
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._content import allowed_pairs, block_key_range, query_blocks, refuse_sink_logits
from rope_lm.positional._stick_breaking_kernel import stick_breaking_block, wide
from rope_lm.positional.base import PositionalScheme

REMAINDERS = ("current", "none")


@SCHEMES.register("stick_breaking")
class StickBreaking(PositionalScheme):
    family = "content"
    owns_attention = True

    def __init__(self, dims, attend_current: bool = False, remainder: Literal["current", "none"] = "current"):
        super().__init__(dims)
        if not isinstance(attend_current, bool):
            raise ConfigError(f"pos.attend_current={attend_current!r} must be true or false.")
        if remainder not in REMAINDERS:
            raise ConfigError(
                f"pos.remainder={remainder!r} is not a way to spend the rest of the stick; valid are "
                f"'current' (it goes to the query's own value, as in the paper's reference code) and 'none' "
                f"(it is dropped)."
            )
        self.attend_current = attend_current
        self.remainder = remainder

    def visible(self, q_idx, k_idx, plan):
        """Boolean (Tq, Tk): the keys that take part of query i's stick."""
        seen = allowed_pairs(q_idx, k_idx, plan)
        return seen if self.attend_current else seen & (k_idx[None, :] != q_idx[:, None])

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        refuse_sink_logits(self, plan)
        if kernel == "explicit":
            return self._explicit(q, k, v, pos.shape[0], plan)
        return self._fast(q, k, v, pos.shape[0], plan)

    def _explicit(self, q, k, v, T, plan):
        """The paper's formula in log space, over keys 0..e-1 of each query block."""
        B, H, t, D = q.shape
        q0 = T - t
        out = []
        for s, e in query_blocks(B, H, q0, T, per_pair=6):
            i = torch.arange(s, e, device=q.device)
            seen = self.visible(i, torch.arange(e, device=q.device), plan)
            z = wide(q[:, :, s - q0 : e - q0] @ k[:, :, :e].transpose(-1, -2)) / math.sqrt(D)
            log_beta = F.logsigmoid(z)
            # Only keys the query sees break its stick; the others count as log(1) = 0.
            log_keep = F.logsigmoid(-z).masked_fill(~seen, 0.0)
            # sum over k > j (inclusive from the right), shifted one key left so k = j is out
            behind = log_keep.flip(-1).cumsum(-1).flip(-1)
            after = F.pad(behind[..., 1:], (0, 1))
            weights = (log_beta + after).masked_fill(~seen, float("-inf")).exp()
            y = weights.to(v.dtype) @ v[:, :, :e]
            if self.remainder == "current":
                rest = 1.0 - weights.sum(-1, keepdim=True)
                y = y + rest.to(v.dtype) * v[:, :, s:e]
            out.append(y)
        return torch.cat(out, dim=2)

    def _fast(self, q, k, v, T, plan):
        B, H, t, D = q.shape
        q0 = T - t
        out = []
        for s, e in query_blocks(B, H, q0, T, per_pair=3):
            k0, index = block_key_range(s, e, plan, q.device)
            keys = (torch.arange(k0, e, device=q.device) if index is None else index).flip(0)  # nearest first
            i = torch.arange(s, e, device=q.device)
            seen = self.visible(i, keys, plan)
            own = v[:, :, s:e] if self.remainder == "current" else None
            out.append(
                stick_breaking_block(
                    q[:, :, s - q0 : e - q0],
                    k.index_select(2, keys),
                    v.index_select(2, keys),
                    own,
                    seen,
                    1.0 / math.sqrt(D),
                )
            )
        return torch.cat(out, dim=2)
