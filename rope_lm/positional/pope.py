"""PoPE (Gopalakrishnan, Csordás, Schmidhuber & Mozer, 2025, "Decoupling the
"What" and "Where" With Polar Coordinate Positional Embeddings").

Every one of a head's D query/key channels becomes one complex number whose
magnitude is the softplus of the channel (the "what", never negative, so the
content cannot turn the phase) and whose phase is the position times the
channel's own frequency (the "where"); the keys' phases carry a learned bias
delta per layer, head and channel. The logit is Re[conj(q~_i) . k~_j]:

    a(i, j) = sum_c softplus(q_ic) softplus(k_jc) cos((p_j - p_i) theta_c + delta_hc) / sqrt(D)

with theta_c = base^(-c/D), c = 0..D-1: D frequencies where RoPE has D/2,
the ladder RoPE would lay over 2D channels. delta starts at zero and is
clamped to [-2 pi, 0], as in PoPE-pytorch (lucidrains), the public
implementation followed where the paper leaves room (a delta pushed past a
bound stays there, as in it). With grouped key/value heads the keys are
repeated to the query heads first, so delta is per query head. It is left out of weight
decay: a phase has no natural size to shrink towards.

Extrapolation methods act through ``rotary = RotarySpec(2D, base, "half")``:
``scaling.rope_frequencies(2D, base)`` returns base^(-2i/2D) = theta_i for
i = 0..D-1, exactly PoPE's frequencies, so PI, NTK, YaRN, LongRoPE (D
factors), ... move them by the same formulas as RoPE's; the attention factor
multiplies both expansions, the logits by its square, as for RoPE. Two-pass
plans (ReRoPE, Self-Extend) take the phases of their second positions where
i - j >= alt_from; log-n multiplies the logits.

Why PoPE computes its own attention (owns_attention) instead of rotating q and
k through the ``rotate`` hook: the polar vectors q~ = |q| (cos, sin) are 2D wide
while values stay D wide, and the shared kernels read the head size from
different tensors (the explicit path from the raw queries, SDPA from the
rotated ones, the KV cache's offset SDPA reshapes its output to the queries'
width, CPU flash attention needs one head size), so the paths would disagree.
Here the fast path pads the values to 2D (zeros) so that fused SDPA serves q~,
k~, v with the scale 1/sqrt(D), and the explicit path evaluates the formula
above, one phase per pair and channel. A KV cache keeps raw keys (as for
every scheme that owns its attention) and each step expands all of them
again: O(T D) per layer and step, the order of the step's attention itself.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._content import allowed_pairs, masked_softmax, query_blocks
from rope_lm.positional.base import PositionalScheme, RotarySpec

PHASE_RANGE = (-2 * math.pi, 0.0)


@SCHEMES.register("pope")
class PoPE(PositionalScheme):
    family = "rotary"
    owns_attention = True
    serves_sink_logits = True
    serves_chunked_passes = True
    no_weight_decay = ("phase_bias",)

    def __init__(self, dims, base: float = 10000.0, phase_bias: bool = True):
        super().__init__(dims)
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not (1 < base < math.inf):
            raise ConfigError(f"pos.base={base!r} must be a finite number greater than 1 (PoPE's frequency base).")
        if not isinstance(phase_bias, bool):
            raise ConfigError(f"pos.phase_bias={phase_bias!r} must be true or false (PoPE's learned key phase).")
        self.base = float(base)
        self.rotary = RotarySpec(2 * dims.head_dim, self.base, "half")
        self.phase_bias = nn.Parameter(torch.zeros(dims.n_layer, dims.n_head, dims.head_dim)) if phase_bias else None

    def frequencies(self, ctx):
        """(theta (D,), attention factor) under the run's extrapolation method."""
        key = ("pope_freq", self.rotary.rot_dim, self.base)
        if key not in ctx.memo:
            ctx.memo[key] = ctx.scaling.rope_frequencies(self.rotary.rot_dim, self.base, ctx)
        return ctx.memo[key]

    def delta(self, layer: int, device) -> torch.Tensor:
        """(H, D) phase bias of the keys, float32."""
        if self.phase_bias is None:
            return torch.zeros(self.dims.n_head, self.dims.head_dim, device=device)
        return self.phase_bias[layer].float().clamp(*PHASE_RANGE)

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        T, t = pos.shape[0], q.shape[2]
        gain = None
        if plan.q_scale is not None:
            # Log-n multiplies the logits. scheme_attention put its scale on the raw queries, which
            # here pass through a softplus, so it comes off them and goes on the logits instead.
            gain = plan.q_scale[T - t :].to(q.dtype)[:, None]
            q = q / gain
        if kernel == "explicit":
            return self._explicit(layer, q, k, v, pos, plan, ctx, gain)
        return self._fast(layer, q, k, v, pos, plan, ctx, gain)

    # --- the paper's formula -------------------------------------------------------

    def _explicit(self, layer, q, k, v, pos, plan, ctx, gain):
        B, H, t, D = q.shape
        T = k.shape[2]
        q0 = T - t
        inv_freq, factor = self.frequencies(ctx)
        theta = inv_freq.to(device=q.device, dtype=torch.float32)
        delta = self.delta(layer, q.device)
        mq, mk = F.softplus(q), F.softplus(k)
        out = []
        for s, e in query_blocks(B, H, q0, T, per_pair=2 * D):
            rows = slice(s - q0, e - q0)
            logits = polar_logits(mq[:, :, rows], mk[:, :, :e], pos[s:e], pos[:e], theta, delta)
            if plan.alt_from is not None:
                far = _far_pairs(s, e, plan, q.device)
                alt = polar_logits(mq[:, :, rows], mk[:, :, :e], plan.alt_q_pos[s:e], plan.alt_k_pos[:e], theta, delta)
                logits = torch.where(far, alt, logits)
            logits = logits * (factor**2 / math.sqrt(D))
            if gain is not None:
                logits = logits * gain[rows]
            allowed = allowed_pairs(torch.arange(s, e, device=q.device), torch.arange(e, device=q.device), plan)
            probs = masked_softmax(logits.float(), allowed, plan.sink_logits)
            out.append(probs.to(v.dtype) @ v[:, :, :e])
        return torch.cat(out, dim=2)

    # --- polar vectors on SDPA -----------------------------------------------------

    def polar(self, x, positions, layer, ctx, keys: bool):
        """(B, H, n, D) channels at positions (n,) -> (B, H, n, 2D): softplus
        magnitudes times (cos, sin) of position x theta (+ delta for keys),
        times the method's attention factor."""
        inv_freq, factor = self.frequencies(ctx)
        angles = positions.to(torch.float32)[:, None] * inv_freq.to(device=x.device, dtype=torch.float32)
        if keys:
            angles = angles[None] + self.delta(layer, x.device)[:, None, :]  # (H, n, D)
        mag = F.softplus(x)
        return torch.cat((mag * angles.cos().to(x.dtype), mag * angles.sin().to(x.dtype)), dim=-1) * factor

    def _fast(self, layer, q, k, v, pos, plan, ctx, gain):
        B, H, t, D = q.shape
        T = k.shape[2]
        q0 = T - t
        qp = self.polar(q, pos[q0:], layer, ctx, keys=False)
        if gain is not None:
            qp = qp * gain
        kp = self.polar(k, pos, layer, ctx, keys=True)
        # Values padded to the polar width: fused SDPA kernels need one head size for q, k and v.
        vp = F.pad(v, (0, D))
        scale = 1.0 / math.sqrt(D)
        two_pass = plan.alt_from is not None
        plain = not (plan.window or two_pass or plan.sink_logits is not None)
        if plain and t == T:
            return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)[..., :D]
        if plain and t == 1:  # one query sees every key
            return F.scaled_dot_product_attention(qp, kp, vp, scale=scale)[..., :D]
        if two_pass:
            q2 = self.polar(q, plan.alt_q_pos[q0:], layer, ctx, keys=False)
            q2 = q2 if gain is None else q2 * gain
            k2 = self.polar(k, plan.alt_k_pos, layer, ctx, keys=True)
        out = []
        for s, e in query_blocks(B, H, q0, T):
            rows = slice(s - q0, e - q0)
            allowed = allowed_pairs(torch.arange(s, e, device=q.device), torch.arange(e, device=q.device), plan)
            if not (two_pass or plan.sink_logits is not None):
                y = F.scaled_dot_product_attention(qp[:, :, rows], kp[:, :, :e], vp[:, :, :e], allowed, scale=scale)
                out.append(y[..., :D])
                continue
            logits = (qp[:, :, rows] @ kp[:, :, :e].transpose(-1, -2)) * scale
            if two_pass:
                far = _far_pairs(s, e, plan, q.device)
                logits = torch.where(far, (q2[:, :, rows] @ k2[:, :, :e].transpose(-1, -2)) * scale, logits)
            probs = masked_softmax(logits.float(), allowed, plan.sink_logits)
            out.append(probs.to(v.dtype) @ v[:, :, :e])
        return torch.cat(out, dim=2)


def polar_logits(mq, mk, q_pos, k_pos, theta, delta):
    """sum_c mq_ic mk_jc cos((p_j - p_i) theta_c + delta_hc), (B, H, tq, tk),
    from magnitudes mq (B, H, tq, D), mk (B, H, tk, D): one phase per pair
    and channel, as the paper writes it."""
    gap = k_pos.to(torch.float32)[None, :] - q_pos.to(torch.float32)[:, None]  # (tq, tk)
    phase = gap[None, :, :, None] * theta + delta[:, None, None, :]  # (H, tq, tk, D)
    return (mq[:, :, :, None, :] * mk[:, :, None, :, :] * phase.cos().to(mq.dtype)).sum(-1)


def _far_pairs(s, e, plan, device):
    """(e - s, e) pairs of query indices s..e-1 and key indices 0..e-1 that
    take the second phases: i - j >= alt_from (ReRoPE, Self-Extend), and with
    Dual Chunk Attention's per-query boundary also j < alt_below[i]."""
    i = torch.arange(s, e, device=device)[:, None]
    j = torch.arange(e, device=device)[None, :]
    far = i - j >= plan.alt_from
    if plan.alt_below is not None:
        far = far & (j < plan.alt_below[s:e].to(device)[:, None])
    return far
