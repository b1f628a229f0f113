"""DAPE (Zheng et al., 2024, NeurIPS, "DAPE: Data-Adaptive Positional Encoding
for Length Extrapolation"): a bias scheme's logits corrected by a small MLP that
reads the attention scores of all heads beside the bias of all heads, pair by
pair:

    logits(i, j) = S(i, j) + B(i, j) + f([S(i, j); B(i, j)]),   S = q k^T / sqrt(D)

with S and B the H heads' values at the pair, [.;.] their concatenation (2H
numbers) and f, per layer, Linear(2H, width) -> LeakyReLU(0.01) ->
Linear(width, H): the authors' code (DAPE.py, ``mlp2``, width 32). f sees the
scores before the causal mask, as there (the mask comes after, with the
softmax); being pointwise in (i, j) it cannot carry anything across pairs, so
this changes nothing the mask keeps. B is the bias of ``pos.bias`` (alibi,
kerple, fire), built with its own settings from ``pos.bias_options``; kerple
is the default, the paper's headline DAPE-Kerple. f's weights start from
nn.Linear's default (uniform +-1/sqrt(fan_in)), as in the authors' code, kept
in plain parameters so the model's normal(0.02) init of nn.Linear does not
replace it (as FIRE's MLP).

family "bias": the positions reach DAPE only through B, whose ids it reads, so
training-time position methods (PoSE, randomized) apply; rotary frequency
methods do not (no method acts on the bias family), and the methods that act on
every scheme (window, log-n) do: their window and sink tokens mask pairs, log-n
scales the queries (so S, also as f's input).

Kernels: ``explicit`` evaluates the formula as written, block of queries by
block (scores, concatenation, the MLP over the last axis, mask, softmax). The
fast path splits f's first layer, W1 [S; B] = W1s S + W1b B: the bias half
(and b1) is computed once per block for the whole batch instead of once per
sequence, and at inference the hidden layer is updated in place (the MLP
measured 2x faster than written out, at 512 tokens on the CPU). Neither holds
more than a block's scores and hidden units; no fused kernel applies (the
logits are not q.k plus something independent of q and k). A KV cache keeps
raw keys and values; each step scores its queries against all of them.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.core.typed import signature_annotations, typed
from rope_lm.positional import SCHEMES
from rope_lm.positional._content import allowed_pairs, masked_softmax, query_blocks
from rope_lm.positional.base import PositionalScheme

BIASES = ("alibi", "kerple", "fire")
NEGATIVE_SLOPE = 0.01  # nn.LeakyReLU's default, as in the authors' code


class DapeMLP(nn.Module):
    """f of one layer: (2H -> width -> H), weights as nn.Linear's default init."""

    def __init__(self, n_head: int, width: int):
        super().__init__()
        bound1, bound2 = (2 * n_head) ** -0.5, width**-0.5
        self.w1 = nn.Parameter(torch.empty(width, 2 * n_head).uniform_(-bound1, bound1))
        self.b1 = nn.Parameter(torch.empty(width).uniform_(-bound1, bound1))
        self.w2 = nn.Parameter(torch.empty(n_head, width).uniform_(-bound2, bound2))
        self.b2 = nn.Parameter(torch.empty(n_head).uniform_(-bound2, bound2))


@SCHEMES.register("dape")
class DAPE(PositionalScheme):
    family = "bias"
    owns_attention = True
    serves_sink_logits = True

    def __init__(self, dims, bias: str = "kerple", mlp_width: int = 32, bias_options: dict | None = None):
        super().__init__(dims)
        if bias not in BIASES:
            raise ConfigError(
                f"pos.bias={bias!r} is not a bias DAPE builds on; use one of {', '.join(BIASES)} "
                f"(its own settings go in pos.bias_options)."
            )
        if isinstance(mlp_width, bool) or not isinstance(mlp_width, int) or mlp_width < 1:
            raise ConfigError(f"pos.mlp_width={mlp_width!r} must be a positive integer (DAPE's hidden units).")
        cls = SCHEMES.get(bias)
        knobs, _ = signature_annotations(cls.__init__, skip=2)
        options = typed(dict(bias_options or {}), knobs, "pos.bias_options.", f"DAPE bias {bias!r}")
        self.bias_name = bias
        self.mlp_width = mlp_width
        try:
            self.bias_scheme = cls(dims, **options)
        except ConfigError as e:  # its settings are pos.bias_options.* here, not pos.*
            raise ConfigError(str(e).replace("pos.", "pos.bias_options.")) from None
        self.mlps = nn.ModuleList(DapeMLP(dims.n_head, mlp_width) for _ in range(dims.n_layer))

    def validate(self, seq_len, scaling):
        self.bias_scheme.validate(seq_len, scaling)

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        B, H, t, D = q.shape
        T = k.shape[2]
        q0 = T - t
        if plan.alt_from is not None:
            raise ConfigError(
                "DAPE has no rotation for a two-pass plan (ReRoPE, Self-Extend) to repeat; those methods act on "
                "rotary schemes."
            )
        block = self._explicit_block if kernel == "explicit" else self._fast_block
        # The largest per-block tensor is f's hidden layer, width floats a pair (H scores' worth each).
        per_pair = 3 + math.ceil(self.mlp_width / H)
        out = []
        for s, e in query_blocks(B, H, q0, T, per_pair):
            scores = (q[:, :, s - q0 : e - q0] @ k[:, :, :e].transpose(-1, -2)) / math.sqrt(D)
            bias = self.bias_scheme.bias(layer, pos[s:e], pos[:e], ctx).to(scores.dtype)
            logits = block(layer, scores, bias)
            allowed = allowed_pairs(torch.arange(s, e, device=q.device), torch.arange(e, device=q.device), plan)
            probs = masked_softmax(logits.float(), allowed, plan.sink_logits)
            out.append(probs.to(v.dtype) @ v[:, :, :e])
        return torch.cat(out, dim=2)

    def _explicit_block(self, layer, scores, bias):
        """S + B + f([S; B]) as the paper writes it: the 2H features of each
        pair on the last axis, through Linear, LeakyReLU, Linear."""
        f = self.mlps[layer]
        features = torch.cat((scores, bias.expand_as(scores)), dim=1).permute(0, 2, 3, 1)  # (B, tq, tk, 2H)
        hidden = F.leaky_relu(F.linear(features, f.w1, f.b1), NEGATIVE_SLOPE)
        return scores + bias + F.linear(hidden, f.w2, f.b2).permute(0, 3, 1, 2)

    def _fast_block(self, layer, scores, bias):
        """The same with W1 split into its score and bias halves, the bias half
        (and b1) computed once for the whole batch; in place where no gradient
        is asked for."""
        f = self.mlps[layer]
        H, dtype = scores.shape[1], scores.dtype
        w1 = f.w1.to(dtype)
        shared = F.linear(bias.permute(1, 2, 0), w1[:, H:], f.b1.to(dtype))  # (tq, tk, width)
        hidden = F.linear(scores.permute(0, 2, 3, 1), w1[:, :H])  # (B, tq, tk, width)
        w2, b2 = f.w2.to(dtype), f.b2.to(dtype)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (scores, bias, f.w1, f.b1, f.w2, f.b2)):
            hidden = F.leaky_relu(hidden + shared, NEGATIVE_SLOPE)
            return scores + bias + F.linear(hidden, w2, b2).permute(0, 3, 1, 2)
        hidden += shared
        F.leaky_relu(hidden, NEGATIVE_SLOPE, inplace=True)
        logits = F.linear(hidden, w2, b2).permute(0, 3, 1, 2)
        logits += scores
        logits += bias
        return logits
