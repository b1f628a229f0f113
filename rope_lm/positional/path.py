"""PaTH (Yang et al., 2025, NeurIPS, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations"): position as a product of
data-dependent Householder-like transformations along the path from key to
query,

    logit_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D),   H_s = I - beta_s w_s w_s^T,

the empty product (j = i) being I; equivalently k_j^T (H_{j+1} ... H_i) q_i, the
paper's form. Softmax otherwise, and no other position encoding. Per head and
token s, from the layer's normed input x_s (flash-linear-attention's PaTH layer,
which the paper points to):

* w_s: a low-rank projection (C -> rank -> H * D, no bias; rank 32), a causal
  depthwise convolution over the last ``conv_size`` tokens (3) with SiLU, and L2
  normalisation per head (x / sqrt(|x|^2 + 1e-6));
* beta_s = 2 sigmoid(u_h . x_s + b_h) in (0, 2): beta > 1 gives H_s a negative
  eigenvalue, which the paper keeps for state tracking.

``forget_gate: true`` is PaTH-FoX: every logit also gets FoX's data-dependent
bias sum_{s=j+1..i} log sigmoid(f_s), f_s = w_f . x_s + b_f per head, added
after the 1/sqrt(D) scale as in FoX (Lin et al., 2025); flash-linear-attention's
PaTH kernels scale it by 1/sqrt(D) with the dot product.

Each query head has its own w, beta and gate (key/value heads shared by grouped
query heads are repeated before the scheme sees them); flash-linear-attention
gives grouped heads one w per key/value head instead.

The scheme computes its attention itself (owns_attention): ``kernel="explicit"``
carries every key through each H_t token by token, the formula as written; any
other kernel runs the chunked UT-transform path (rope_lm/positional/
_path_kernel.py), which tests/test_path.py holds equal to it and to an
independent float64 product of D x D matrices. A KV cache keeps each token's
projected w before the convolution, beta and the gate beside its raw key and
value; every step recomputes the convolution and the transformed keys from all
held tokens ("recompute": O(T C D) a step with chunks of C = 64, instead of
updating the held keys in place as flash-linear-attention's decoding does).
Window and sink tokens of a plan are honoured as a mask on these logits; the
path from a sink to a query still runs through every token between them.
Learned sink logits (model.sink_logits) join the softmax's denominator.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES, _path_kernel
from rope_lm.positional.base import PositionalScheme

NORM_EPS = 1e-6


class PathLayer(nn.Module):
    """One layer's parameters. Plain parameters, not nn.Linear: the model's
    own init (normal 0.02 for every nn.Linear) would make the low-rank
    projection's output tiny against the normalisation's epsilon."""

    def __init__(self, d_model: int, n_head: int, head_dim: int, rank: int, conv_size: int, forget_gate: bool):
        super().__init__()
        self.w_down = nn.Parameter(torch.randn(d_model, rank) / math.sqrt(d_model))
        self.w_up = nn.Parameter(torch.randn(rank, n_head * head_dim) / math.sqrt(rank))
        # nn.Conv1d's default bound for a depthwise kernel (fan-in conv_size).
        bound = 1 / math.sqrt(conv_size)
        self.conv = nn.Parameter(torch.empty(n_head, head_dim, conv_size).uniform_(-bound, bound))
        # beta = 2 sigmoid(0) = 1 at the start, as flash-linear-attention's zero bias gives.
        self.beta_w = nn.Parameter(torch.randn(n_head, d_model) * 0.02)
        self.beta_b = nn.Parameter(torch.zeros(n_head))
        if forget_gate:
            self.gate_w = nn.Parameter(torch.randn(n_head, d_model) * 0.02)
            self.gate_b = nn.Parameter(torch.zeros(n_head))


@SCHEMES.register("path")
class PaTH(PositionalScheme):
    family = "content"
    owns_attention = True
    reads_input = True
    serves_sink_logits = True
    chunk = _path_kernel.CHUNK  # tokens per chunk of the fast path (tests shrink it)

    def __init__(self, dims, forget_gate: bool = False, rank: int = 32, conv_size: int = 3):
        super().__init__(dims)
        if not isinstance(forget_gate, bool):
            raise ConfigError(f"pos.forget_gate={forget_gate!r} must be true (PaTH-FoX) or false (PaTH).")
        for key, value in (("rank", rank), ("conv_size", conv_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"pos.{key}={value!r} must be a positive integer (PaTH's defaults: rank 32 for the "
                    f"projection of w, conv_size 3 tokens for its causal convolution; conv_size 1 is no "
                    f"mixing across tokens)."
                )
        self.forget_gate = forget_gate
        self.conv_size = conv_size
        self.layers = nn.ModuleList(
            PathLayer(dims.d_model, dims.n_head, dims.head_dim, rank, conv_size, forget_gate)
            for _ in range(dims.n_layer)
        )

    def token_terms(self, layer, x, ctx):
        p = self.layers[layer]
        B, T, _ = x.shape
        H, D = self.dims.n_head, self.dims.head_dim
        # Before the convolution: it reads earlier tokens, so a KV-cached step redoes it over the held ones.
        w = ((x @ p.w_down) @ p.w_up).view(B, T, H, D).transpose(1, 2)
        beta = 2 * torch.sigmoid(x @ p.beta_w.t() + p.beta_b)
        terms = {"w": w, "beta": beta.transpose(1, 2)[..., None]}
        if self.forget_gate:
            terms["gate"] = F.logsigmoid(x @ p.gate_w.t() + p.gate_b).transpose(1, 2)[..., None]
        return terms

    def directions(self, layer, w_raw):
        """(B, H, T, D) unit w_s: causal depthwise convolution over tokens
        s - conv_size + 1 .. s (zeros before the first), SiLU, L2 norm."""
        p = self.layers[layer]
        K, T = self.conv_size, w_raw.shape[2]
        cd = torch.promote_types(w_raw.dtype, torch.float32)
        padded = F.pad(w_raw.to(cd), (0, 0, K - 1, 0))
        conv = p.conv.to(cd)
        mixed = sum(conv[None, :, None, :, i] * padded[:, :, i : i + T] for i in range(K))
        w = F.silu(mixed)
        return w * torch.rsqrt((w * w).sum(-1, keepdim=True) + NORM_EPS)

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        if plan is not None and plan.alt_from is not None:
            raise ConfigError(
                "PaTH has no rotation to redo at other positions, so a two-pass plan (ReRoPE, "
                "Self-Extend, StreamingLLM's cache positions) cannot apply to it."
            )
        w = self.directions(layer, terms["w"])
        beta = terms["beta"][..., 0]
        gate = terms["gate"][..., 0] if self.forget_gate else None
        sinks = None if plan is None else plan.sink_logits
        if kernel == "explicit":
            return _path_kernel.explicit(q, k, v, w, beta, gate, plan, sinks)
        return _path_kernel.chunked(q, k, v, w, beta, gate, plan, sinks, chunk=self.chunk)
