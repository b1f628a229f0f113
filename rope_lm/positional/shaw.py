"""Relative position representations (Shaw et al., 2018, "Self-Attention
with Relative Position Representations"):

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d),   z_i = sum_j alpha_ij (v_j + a^V_ij),
    a_ij = w_clip(j - i, -k, k)

with a^K, a^V learned per layer and shared by the heads, as in the paper.
A causal model only ever sees j <= i, so only the k + 1 rows for
j - i in [-k, 0] exist (the paper's other k rows would never be trained).
"""

import math

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import causal_distance
from rope_lm.positional.base import PositionalScheme


@SCHEMES.register("shaw")
class Shaw(PositionalScheme):
    family = "relative"
    has_content_terms = True

    def __init__(self, dims, max_relative_position: int = 16, values: bool = True, init_std: float = 0.02):
        super().__init__(dims)
        if not isinstance(max_relative_position, int) or max_relative_position < 1:
            raise ConfigError(f"pos.max_relative_position={max_relative_position!r} must be a positive integer (k).")
        self.k = max_relative_position
        shape = (dims.n_layer, self.k + 1, dims.head_dim)
        self.rel_key = nn.Parameter(torch.randn(shape) * init_std)
        self.rel_value = nn.Parameter(torch.randn(shape) * init_std) if values else None

    def clipped(self, q_pos, k_pos):
        return causal_distance(q_pos, k_pos).clamp(max=self.k).long()  # (Tq, Tk) row of a^K / a^V

    def content_scores(self, layer, q, k, q_pos, k_pos, ctx):
        index = self.clipped(q_pos, k_pos)
        per_row = q @ self.rel_key[layer].to(q.dtype).t()  # (B, H, Tq, k+1)
        return per_row.gather(-1, index.expand(*q.shape[:2], *index.shape)) / math.sqrt(q.shape[-1])

    def value_term(self, layer, probs, q_pos, k_pos, ctx):
        if self.rel_value is None:
            return None
        index = self.clipped(q_pos, k_pos).expand_as(probs)
        # Attention mass per clipped distance, then one small matmul.
        mass = probs.new_zeros(*probs.shape[:-1], self.k + 1).scatter_add_(-1, index, probs)
        return mass @ self.rel_value[layer].to(probs.dtype)
