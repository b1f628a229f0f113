"""CoPE (Golovneva et al., 2024, "Contextual Position Encoding: Learning to
Count What's Important"): positions counted by gates that read the content.

For query i and key j <= i, with D the head dimension and e a learned table of
npos_max vectors of D channels (one table per layer, shared by its heads):

    g_ik   = sigmoid(q_i . k_k / sqrt(D))                  gate: does key k count for query i
    p_ij   = min(sum_{k=j..i} g_ik, npos_max - 1)          contextual position of j seen from i
    e[p]   = (1 - w) e[floor p] + w e[ceil p],  w = p - floor p
    a_ij   = softmax_j(q_i . k_j / sqrt(D) + q_i . e[p_ij])

Conventions (the paper's Appendix B code, which x-transformers' ``CoPE`` follows,
and facebookresearch/RAM projects/cope, the authors' experiments):

* gates read the scaled logits q.k / sqrt(D) (the equations write sigmoid(q.k);
  both codes scale), and a key a query cannot see counts 0 (RAM multiplies the
  gates by the mask; x-transformers fills the masked logits with -max first);
* the position term q.e[p] is added after the 1/sqrt(D) scaling, as Appendix B
  and x-transformers do; RAM's default adds it before dividing (its
  ``--cope-nodiv`` is Appendix B's form): ``scale_positions: true`` gives that,
  the same model with e measured sqrt(D) larger;
* one (npos_max, D) table per layer shared by the heads (RAM and Appendix B
  batch heads over one ``pos_emb``; x-transformers likewise), zero at start;
* npos_max defaults to L + 1 (RAM's default ``block_size + 1``: positions run
  0..L, "position 0 is possible"; x-transformers' fixed default is 16). Past L
  the counts of a query that counts every token exceed the table and are
  clamped at its last row, which is what the paper evaluates past its context.

Windows (``scaling=window``, StreamingLLM's sinks): a key outside the window
is invisible, so it counts for nothing; p_ij sums the gates of the keys from j
to i the query still sees (its sinks included), as RAM's masked gates do.

Kernels. ``explicit`` is the formula written out: per block of queries the
vectors e[p_ij] themselves, (B, H, queries, keys, D), dotted with q_i. Every
other kernel: the (B, H, queries, npos_max) products q_i . e[n] once, and
each pair reads its floor row and the step to the next,
q.e[p] = z[floor p] + w (z[floor p + 1] - z[floor p]); keys taken in
descending order so that p is a plain cumulative sum. Neither holds more than
a block's (B, H, queries, keys) scores (rope_lm/positional/_content.py).

KV cache: nothing of CoPE's own; a cached step's queries read every held raw
key (positions are recounted from the content for each query).
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.core.visible_keys import block_keys
from rope_lm.positional import SCHEMES
from rope_lm.positional._content import allowed_pairs, masked_softmax, query_blocks
from rope_lm.positional.base import PositionalScheme

# float32 (B, H, queries, keys) tensors the fast path holds per pair at once.
FAST_PAIR_FLOATS = 6


@SCHEMES.register("cope")
class CoPE(PositionalScheme):
    family = "content"
    owns_attention = True
    serves_sink_logits = True  # a softmax: learned sinks join its denominator
    # The high rows are reached by few counts in training, so decay would outweigh their updates; the
    # last one serves every count past the table at evaluation.
    no_weight_decay = ("table",)

    def __init__(self, dims, npos_max: int | None = None, scale_positions: bool = False):
        super().__init__(dims)
        if npos_max is None:
            npos_max = dims.train_len + 1
        if isinstance(npos_max, bool) or not isinstance(npos_max, int) or npos_max < 2:
            raise ConfigError(
                f"pos.npos_max={npos_max!r} must be an integer of at least 2 (the rows of CoPE's position table, "
                f"positions 0..npos_max-1; one row would give every key the same position), or null for the "
                f"training length + 1 ({dims.train_len + 1})."
            )
        self.npos_max = npos_max
        self.scale_positions = bool(scale_positions)
        self.table = nn.Parameter(torch.zeros(dims.n_layer, npos_max, dims.head_dim))

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        B, H, t, D = q.shape
        T = k.shape[2]
        q0 = T - t
        explicit = kernel == "explicit"
        out = []
        for s, e in query_blocks(B, H, q0, T, per_pair=D if explicit else FAST_PAIR_FLOATS):
            qb = q[:, :, s - q0 : e - q0]
            block = self._explicit_block if explicit else self._fast_block
            out.append(block(layer, qb, k, v, s, e, plan))
        return torch.cat(out, dim=2)

    def _position_scale(self, D):
        return 1.0 / math.sqrt(D) if self.scale_positions else 1.0

    def _softmax_values(self, logits, allowed, vb, plan):
        probs = masked_softmax(logits, allowed, None if plan is None else plan.sink_logits)
        return probs.to(vb.dtype) @ vb

    def _explicit_block(self, layer, qb, k, v, s, e, plan):
        """Queries s..e-1 over keys 0..e-1, from the formula: every e[p_ij] vector built."""
        D = qb.shape[-1]
        device = qb.device
        allowed = allowed_pairs(torch.arange(s, e, device=device), torch.arange(e, device=device), plan)
        acc = _accumulation(qb)
        scores = (qb @ k[:, :, :e].transpose(-1, -2)).to(acc) / math.sqrt(D)
        gates = torch.sigmoid(scores) * allowed
        # p_ij = sum of g_ik over k = j..i: a sum from the right along the keys.
        p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)
        lo, hi = p.floor(), p.ceil()
        w = (p - lo)[..., None]
        table = self.table[layer].to(acc)
        e_vec = table[lo.long()] * (1 - w) + table[hi.long()] * w  # (B, H, tq, e, D)
        term = (qb.to(acc)[:, :, :, None, :] * e_vec).sum(-1) * self._position_scale(D)
        return self._softmax_values(scores + term, allowed, v[:, :, :e], plan)

    def _fast_block(self, layer, qb, k, v, s, e, plan):
        """Queries s..e-1 over the keys their window leaves, taken in descending
        order (p is then a cumulative sum), the position term interpolated
        from the (B, H, tq, npos_max) products q . e[n]."""
        D = qb.shape[-1]
        device = qb.device
        k0, sinks = (0, 0) if plan is None else block_keys(s, plan.window, plan.sink_tokens)
        kb, vb = _descending(k, k0, e, sinks), _descending(v, k0, e, sinks)
        keys = _descending(torch.arange(e, device=device)[None, None, :, None], k0, e, sinks)[0, 0, :, 0]
        allowed = allowed_pairs(torch.arange(s, e, device=device), keys, plan)
        acc = _accumulation(qb)
        # The scale on the (t, D) queries, not on the (t, keys) scores.
        scores = ((qb / math.sqrt(D)) @ kb.transpose(-1, -2)).to(acc)
        p = torch.where(allowed, torch.sigmoid(scores), 0.0).cumsum(-1).clamp(max=self.npos_max - 1)
        table = self.table[layer] * self._position_scale(D)
        z = (qb @ table.to(qb.dtype).t()).to(acc)  # (B, H, tq, npos_max)
        # z[n + 1] - z[n], 0 at the last row, where clamped positions sit (w = 0 there).
        step = F.pad(z[..., 1:] - z[..., :-1], (0, 1))
        lo = p.detach().floor()
        idx = lo.long()
        term = z.gather(-1, idx) + (p - lo) * step.gather(-1, idx)
        return self._softmax_values(scores + term, allowed, vb, plan)


def _descending(x, k0, e, sinks):
    """x's keys e-1 down to k0, then sinks-1 down to 0, along dim 2."""
    near = x[:, :, k0:e].flip(2)
    return near if not sinks else torch.cat((near, x[:, :, :sinks].flip(2)), 2)


def _accumulation(q):
    """Gates, counts and softmax in float32 at least (a bf16 sum of a few
    hundred gates is off by whole positions); float64 stays float64."""
    return torch.promote_types(q.dtype, torch.float32)
