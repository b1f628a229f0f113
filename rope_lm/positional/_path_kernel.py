"""PaTH attention's two kernels (rope_lm/positional/path.py is the scheme).

Per head, token s carries H_s = I - beta_s w_s w_s^T, and the logit of query
i on key j <= i is

    q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D)   (+ G_i - G_j with the gate)

(the identity for j = i), G the running sum of the per-token log forget gate.
Both kernels take q (B, H, t, D), the last t of T queries; k, v, w (B, H, T, D);
beta and the gate (B, H, T). They compute in float32 at least (float64 stays
float64) and return v's dtype.

* ``explicit``: the formula as written. Keys are carried forward in time:
  after token t every held key j < t has had H_t applied, so query t reads
  q_t . (H_t ... H_{j+1} k_j) off the carried keys. O(T^2 D), one token at a
  time; blocked over queries, so a forward holds the T carried keys and one
  block of scores.
* ``chunked``: the same logits from chunks of C tokens in matrix products (the
  UT / WY representation of Householder products that the paper's blockwise
  algorithm uses): within a chunk, the coefficients that carry a query back
  to the chunk's start and a key to the chunk's end solve unit triangular
  C x C systems; between chunks, a chunk's whole product is I - U^T W
  (U = (I + tril(diag(beta) W W^T, -1))^-1 diag(beta) W), applied to every
  query chunk at once, one key chunk back per step.
"""

import math

import torch
import torch.nn.functional as F

from rope_lm.positional._content import MAX_SCORE_ELEMENTS, allowed_pairs, masked_softmax, query_blocks

CHUNK = 64


def _compute_dtype(*tensors) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _gate_bias(cum, s: int, e: int, k0: int, k1: int):
    """(B, H, e - s, k1 - k0): G_i - G_j, the sum of the log gates of tokens
    j+1..i, from the float64 running sum (a float32 difference of two long
    sums would lose the short ones)."""
    return cum[:, :, s:e, None] - cum[:, :, None, k0:k1]


def _softmax_values(scores, v, mask, sink_logits, out_dtype):
    """Masked softmax (learned sink logits joining the denominator) times v."""
    return (masked_softmax(scores, mask, sink_logits) @ v).to(out_dtype)


def explicit(q, k, v, w, beta, gate, plan=None, sink_logits=None):
    """The reference: keys carried forward through every H_t, one token at a time."""
    B, H, t, D = q.shape
    T = k.shape[2]
    q0 = T - t
    cd = _compute_dtype(q, k, v, w)
    q = q.to(cd) / math.sqrt(D)
    k, w, beta, vv = k.to(cd), w.to(cd), beta.to(cd), v.to(cd)
    cum = None if gate is None else gate.double().cumsum(-1)
    carried = k[:, :, :0]  # keys 0..step-1, each as H_{step-1} ... H_{j+1} k_j
    out, step = [], 0
    for s, e in query_blocks(B, H, q0, T):
        rows = []
        while step < e:
            if step:
                ws = w[:, :, step]
                carried = carried - beta[:, :, step, None, None] * (carried @ ws[..., None]) * ws[:, :, None, :]
            carried = torch.cat((carried, k[:, :, step : step + 1]), 2)
            if step >= s:
                row = (carried @ q[:, :, step - q0, :, None])[..., 0]  # (B, H, step + 1)
                rows.append(F.pad(row, (0, e - step - 1)))
            step += 1
        scores = torch.stack(rows, 2)
        if cum is not None:
            scores = scores + _gate_bias(cum, s, e, 0, e).to(cd)
        mask = allowed_pairs(torch.arange(s, e, device=q.device), torch.arange(e, device=q.device), plan)
        out.append(_softmax_values(scores, vv[:, :, :e], mask, sink_logits, v.dtype))
    return torch.cat(out, 2)


def _reach(plan, n_chunks: int, C: int) -> int:
    """How many key chunks back from its own a query chunk can see: all of
    them, unless a window without sink tokens hides the far ones (a pair in
    chunks d apart is at least (d - 1) C + 1 tokens apart)."""
    if plan is not None and plan.window and not plan.sink_tokens:
        return min(n_chunks - 1, (plan.window - 2) // C + 1)
    return n_chunks - 1


def _pad_tokens(x, before: int, after: int):
    """x (B, H, T, ...) with zero tokens before and after (no copy when none)."""
    if not (before or after):
        return x
    return F.pad(x, (0, 0) * (x.dim() - 3) + (before, after))


def chunked(q, k, v, w, beta, gate, plan=None, sink_logits=None, chunk: int = CHUNK):
    """The same attention from chunks of `chunk` tokens in matrix products."""
    B, H, t, D = q.shape
    T = k.shape[2]
    q0 = T - t
    C = chunk
    N = -(-T // C)
    pad = N * C - T
    cd = _compute_dtype(q, k, v, w)
    dev = q.device
    # Padding tokens come after every real one: w = 0, beta = 0 (H = I), keys masked by causality.
    k, w, vv = (_pad_tokens(x.to(cd), 0, pad) for x in (k, w, v))
    beta = _pad_tokens(beta.to(cd)[..., None], 0, pad)[..., 0]
    first = q0 // C  # the first chunk holding a query
    # Query rows from the first chunk's start: rows before q0 are zeros, computed and dropped.
    qp = _pad_tokens(q.to(cd) / math.sqrt(D), q0 - first * C, pad)
    Wc, Kc = w.view(B, H, N, C, D), k.view(B, H, N, C, D)
    bc = beta.view(B, H, N, C)
    Qc = qp.view(B, H, N - first, C, D)
    eye = torch.eye(C, dtype=cd, device=dev)

    # Within a query chunk (local m, rows i): a_mi = beta_m w_m . (H_{m+1} ... H_i q_i) solve
    # (I + diag(beta) triu(W W^T, 1)) a_i = beta * (W q_i) [m <= i]; then the query carried back
    # to its chunk's start is q_i - sum_m a_mi w_m, and the logit on key j of the same chunk is
    # q_i . k_j - sum_{m > j} a_mi (w_m . k_j).
    Wq, bq, Kq = Wc[:, :, first:], bc[:, :, first:], Kc[:, :, first:]
    upper = eye + bq[..., :, None] * (Wq @ Wq.mT).triu(1)
    rhs = ((Wq @ Qc.mT) * bq[..., :, None]).triu()  # rows m, columns i
    coef = torch.linalg.solve_triangular(upper, rhs, upper=True, unitriangular=True).mT  # rows i, columns m
    local = Qc @ Kq.mT - coef @ (Wq @ Kq.mT).tril(-1)

    reach = _reach(plan, N, C)
    cum = None if gate is None else _pad_tokens(gate.double()[..., None], 0, pad)[..., 0].cumsum(-1)
    n_q = N - first
    if N == 1:
        # One chunk holds every token: its own logits are all there is.
        mask = allowed_pairs(torch.arange(C, device=dev), torch.arange(C, device=dev), plan)
        scores = local[:, :, 0]
        if cum is not None:
            scores = scores + _gate_bias(cum, 0, C, 0, C).to(cd)
        return _softmax_values(scores, vv, mask, sink_logits, v.dtype)[:, :, q0:T]
    qhat = Qc - coef @ Wq

    if reach:
        # Every key chunk (local m, rows j): c_mj = beta_m w_m . (H_{m-1} ... H_{j+1} k_j) for m > j
        # solve (I + diag(beta) tril(W W^T, -1)) c_j = beta * (W k_j) [m > j]; the key carried to
        # its chunk's end is k_j - sum_m c_mj w_m. The chunk's whole product H_first ... H_last is
        # I - U^T W with (I + diag(beta) tril(W W^T, -1)) U = diag(beta) W.
        lower = eye + bc[..., :, None] * (Wc @ Wc.mT).tril(-1)
        rhs_k = ((Wc @ Kc.mT) * bc[..., :, None]).tril(-1)  # rows m, columns j: m > j
        ck = torch.linalg.solve_triangular(
            lower, torch.cat((rhs_k, bc[..., None] * Wc), -1), upper=False, unitriangular=True
        )
        khat = Kc - ck[..., :C].mT @ Wc
        U = ck[..., C:]

    per_block = max(1, MAX_SCORE_ELEMENTS // max(1, 2 * B * H * C * N * C))
    out = []
    for b0 in range(0, n_q, per_block):
        I0, I1 = first + b0, min(N, first + b0 + per_block)
        nb = I1 - I0
        band = [local[:, :, b0 : b0 + nb]]  # band[d][r]: query chunk I0 + r on key chunk I0 + r - d
        carried = qhat[:, :, b0 : b0 + nb]
        last = min(reach, I1 - 1)
        for d in range(1, last + 1):
            lo = max(I0, d)  # chunks before d have no key chunk d back
            sub = carried[:, :, lo - I0 :]
            band.append(F.pad(sub @ khat[:, :, lo - d : I1 - d].mT, (0, 0, 0, 0, lo - I0, 0)))
            if d < last:  # carry the queries back through key chunk I - d
                moved = sub - (sub @ Wc[:, :, lo - d : I1 - d].mT) @ U[:, :, lo - d : I1 - d]
                carried = torch.cat((carried[:, :, : lo - I0], moved), 2)
        band = torch.stack(band, 3)  # (B, H, nb, last + 1, C, C)
        J0 = max(0, I0 - last)
        r = torch.arange(nb, device=dev)[:, None]
        dist = I0 + r - torch.arange(J0, I1, device=dev)[None, :]
        inside = (dist >= 0) & (dist <= last)
        blocks = band[:, :, r, dist.clamp(0, last)]  # (B, H, nb, I1 - J0, C, C)
        scores = blocks.permute(0, 1, 2, 4, 3, 5).reshape(B, H, nb * C, (I1 - J0) * C)
        qi = torch.arange(I0 * C, I1 * C, device=dev)
        kj = torch.arange(J0 * C, I1 * C, device=dev)
        mask = allowed_pairs(qi, kj, plan) & inside.repeat_interleave(C, 0).repeat_interleave(C, 1)
        if cum is not None:
            scores = scores + _gate_bias(cum, I0 * C, I1 * C, J0 * C, I1 * C).to(cd)
        y = _softmax_values(scores, vv[:, :, J0 * C : I1 * C], mask, sink_logits, v.dtype)
        lo_row, hi_row = max(q0, I0 * C), min(T, I1 * C)
        out.append(y[:, :, lo_row - I0 * C : hi_row - I0 * C])
    return torch.cat(out, 2)
