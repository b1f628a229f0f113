"""Transformer-XL relative attention (Dai et al., 2019, Sec. 3.3):

    A_ij = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}

R is the sinusoidal encoding (size d_model) of the distance, W_R a per-layer
projection to the heads, u and v learned vectors per head shared by all
layers (the paper's global biases). Values carry no positional term. All
four terms are divided by sqrt(head_dim) like the content term.
"""

import math

import torch
from torch import nn

from rope_lm.positional import SCHEMES
from rope_lm.positional._common import check_positive, distinct_distances, sinusoid
from rope_lm.positional.base import PositionalScheme


@SCHEMES.register("transformer_xl")
class TransformerXL(PositionalScheme):
    family = "relative"
    has_content_terms = True

    def __init__(self, dims, base: float = 10000.0, init_std: float = 0.02):
        super().__init__(dims)
        check_positive("base", base, "transformer_xl")
        self.base = float(base)
        H, D = dims.n_head, dims.head_dim
        self.u = nn.Parameter(torch.randn(H, D) * init_std)
        self.v = nn.Parameter(torch.randn(H, D) * init_std)
        self.w_r = nn.Parameter(torch.randn(dims.n_layer, dims.d_model, H * D) * init_std)

    def relative_keys(self, layer, distances):
        """W_R R_d for the given distances: (H, n, D)."""
        r = sinusoid(distances, self.dims.d_model, self.base, layout="halves") @ self.w_r[layer]
        return r.view(len(distances), self.dims.n_head, self.dims.head_dim).transpose(0, 1)

    def content_scores(self, layer, q, k, q_pos, k_pos, ctx):
        values, index = distinct_distances(q_pos, k_pos)
        rel = self.relative_keys(layer, values).to(q.dtype)
        position = (q + self.v[:, None, :].to(q.dtype)) @ rel.transpose(-1, -2)  # (B, H, Tq, n)
        position = position.gather(-1, index.expand(*q.shape[:2], *index.shape))
        global_content = self.u[:, None, :].to(q.dtype) @ k.transpose(-1, -2)  # (B, H, 1, Tk)
        return (position + global_content) / math.sqrt(q.shape[-1])
