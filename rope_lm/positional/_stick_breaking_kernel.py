"""The fast path of stick-breaking attention (rope_lm/positional/stick_breaking.py)
for one block of queries, with its backward written out.

Keys come nearest first (column 0 the nearest key a query may see). With
sp = softplus(z) on the keys the query sees and S its running sum from the
nearest key outward,

    log w = z - S,    rem = exp(-S[last]),    y = w @ v + rem * v_own.

Backward, with g = dy . v_j and gw = g * w (zero on keys not seen):

    dz_j = gw_j - sigmoid(z_j) * (sum of gw over key j and every farther key + rem * (dy . v_own)),

because softplus(z_j) sits in S of key j and of every key farther than it, and
in the remainder; d softplus / dz = sigmoid. The farther keys' sum is the
total less the running sum of the nearer ones: every term is a weight times g,
the weights sum to at most 1, so the difference loses nothing at long lengths
(unlike the sums of softplus, which grow with the length and are therefore
only ever taken from the near side).

Measured on the CPU (one thread of a busy 2-core machine, forward and
backward of one block, keys nearest first; best of 7 and 5 interleaved rounds):
at (B, H, T, D) = (16, 6, 64, 32), the tiny preset's shape, 25 ms against 30 ms
for the same formula left to autograd and 37 ms for the explicit path's
formula; at (2, 6, 512, 32), 187 ms against 223 ms and 262 ms. The running sum
by a matmul with a triangular matrix instead of cumsum was slower in every
case (medians: 19.4 against 17.5 ms at T = 64, 199 against 150 ms at T = 512).
"""

import math

import torch
import torch.nn.functional as F


def wide(x):
    """x in float32 at least (float64 stays float64): the sums of the stick never run in half precision."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _floor(dtype) -> float:
    """The lowest log weight kept: exp of it is still a normal number. The CPU
    computes exp, sigmoid and softplus tens of times slower where the result is
    subnormal (measured: exp of a block whose results are subnormal took 70x
    as long), so logits and log weights stop here; a weight of 1e-38 in
    place of a smaller one changes nothing a float32 sum can see."""
    return math.log(torch.finfo(dtype).tiny) + 0.5


def _weights(q, k, seen, scale):
    """(w, z, rem): weights (B, H, tq, n), logits, remainder (B, H, tq), float32 at least."""
    z = wide(q @ k.transpose(-1, -2)).mul_(scale)
    floor = _floor(z.dtype)
    z.clamp_(min=floor)
    running = F.softplus(z).masked_fill_(~seen, 0.0).cumsum_(-1)
    rem = running[..., -1].neg().clamp_(min=floor).exp_()
    # log w = z - S, in S's storage (at most 0: S holds softplus(z) >= z); a key not seen gets exactly 0
    w = running.neg_().add_(z).clamp_(floor, 0.0).exp_().masked_fill_(~seen, 0.0)
    return w, z, rem


def _forward(q, k, v, own, seen, scale):
    w, z, rem = _weights(q, k, seen, scale)
    y = w.to(v.dtype) @ v
    if own is not None:
        y = y + rem.to(v.dtype)[..., None] * own
    return y, w, z, rem


class _StickBreakingBlock(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, own, seen, scale):
        y, w, z, rem = _forward(q, k, v, own, seen, scale)
        ctx.save_for_backward(q, k, v, own, seen, w, z, rem)
        ctx.scale = scale
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        q, k, v, own, seen, w, z, rem = ctx.saved_tensors
        dy32 = dy.to(w.dtype)
        gw = (dy32 @ v.to(w.dtype).transpose(-1, -2)).mul_(w)
        farther = gw.sum(-1, keepdim=True)
        if own is not None:
            farther = farther + (rem * (dy32 * own.to(w.dtype)).sum(-1))[..., None]
        # gw over key j and every farther key (plus the remainder's share): total - nearer ones
        share = gw.cumsum(-1).neg_().add_(farther).add_(gw)
        dz = gw.sub_(share.mul_(torch.sigmoid(z))).masked_fill_(~seen, 0.0).mul_(ctx.scale)
        dq = (dz @ k.to(w.dtype)).to(q.dtype)
        dk = (dz.transpose(-1, -2) @ q.to(w.dtype)).to(k.dtype)
        dv = (w.transpose(-1, -2) @ dy32).to(v.dtype)
        down = None if own is None else (rem[..., None] * dy32).to(own.dtype)
        return dq, dk, dv, down, None, None


def stick_breaking_block(q, k, v, own, seen, scale):
    """q (B, H, tq, D); k, v (B, H, n, D), nearest key first; own (B, H, tq,
    D), each query's own value that takes the remainder, or None; seen (tq, n)
    boolean, the keys each query sees. Returns (B, H, tq, D) in v's dtype."""
    tensors = (q, k, v) if own is None else (q, k, v, own)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _StickBreakingBlock.apply(q, k, v, own, seen, scale)
    return _forward(q, k, v, own, seen, scale)[0]
