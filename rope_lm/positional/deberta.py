"""DeBERTa disentangled attention (He et al., 2021, ICLR; log buckets from
DeBERTa-v2/v3):

    A_ij = q_i . k_j + q_i . K^r_{delta(i,j)} + k_j . Q^r_{delta(j,i)},  all / sqrt(3 d)

delta(i, j) = bucket(i - j) + k indexes a table P of 2k relative embeddings
(k = position_buckets) shared by all layers; K^r = P W_{k,r} and
Q^r = P W_{q,r} with per-layer projections (DeBERTa-v1's separate position
projections). bucket() is exact for |i - j| <= k/2 and log-spaced up to
max_relative_positions, clipped to the table beyond.

The 1/sqrt(3d) scale: the attention kernel divides q.k by sqrt(d) itself,
so this scheme's rotate hook divides q by sqrt(3) (content term
q.k/sqrt(3d)) and the two position terms are divided by sqrt(3d) here,
exactly DeBERTa's scale for c2c + c2p + p2c.

``p2c``: which relative position the position-to-content term reads.
``paper`` (default) is eq. (4)'s delta(j, i); ``released`` is delta(i, j),
what Microsoft's DeBERTa code and transformers' DisentangledSelfAttention
compute (they gather p2c at -r(j, i) = r(i, j)). The default and the reason
are in docs/schemes.md. Not implemented: DeBERTa-v2's
LayerNorm on P and its option to share the content projections.
"""

import math

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import distinct_distances
from rope_lm.positional.base import PositionalScheme


def log_bucket(distance: torch.Tensor, position_buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's make_log_bucket_position for non-negative distances (float)."""
    mid = position_buckets // 2
    d = distance.to(torch.float64)
    far = torch.ceil(torch.log(d.clamp(min=mid) / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(d <= mid, d.floor(), far).long()


P2C = ("paper", "released")


@SCHEMES.register("deberta")
class DeBERTa(PositionalScheme):
    family = "relative"
    has_content_terms = True

    def __init__(
        self,
        dims,
        position_buckets: int = 256,
        max_relative_positions: int = 512,
        init_std: float = 0.02,
        p2c: str = "paper",
    ):
        super().__init__(dims)
        if p2c not in P2C:
            raise ConfigError(
                f"pos.p2c={p2c!r}: use paper (delta(j, i), eq. 4) or released (delta(i, j), as "
                f"Microsoft's code and transformers)."
            )
        self.p2c = p2c
        if not isinstance(position_buckets, int) or position_buckets < 4:
            raise ConfigError(f"pos.position_buckets={position_buckets!r} must be an integer >= 4.")
        if not isinstance(max_relative_positions, int) or max_relative_positions <= position_buckets // 2 + 1:
            raise ConfigError(
                f"pos.max_relative_positions={max_relative_positions!r} must be an integer above "
                f"position_buckets/2 + 1 = {position_buckets // 2 + 1}."
            )
        self.k, self.max_position = position_buckets, max_relative_positions
        D = dims.d_model
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.k, D) * init_std)
        self.w_kr = nn.Parameter(torch.randn(dims.n_layer, D, dims.n_head * dims.head_dim) * init_std)
        self.w_qr = nn.Parameter(torch.randn(dims.n_layer, D, dims.n_head * dims.head_dim) * init_std)

    def rotate(self, q, k, q_pos, k_pos, layer, ctx):
        return q / math.sqrt(3.0), k

    def indices(self, q_pos, k_pos):
        """c2p row delta(i, j) and p2c row (delta(j, i), or delta(i, j) when
        p2c=released), each (Tq, Tk)."""
        values, index = distinct_distances(q_pos, k_pos)
        bucket = log_bucket(values, self.k, self.max_position)[index]
        top = 2 * self.k - 1
        c2p = (bucket + self.k).clamp(0, top)
        return c2p, c2p if self.p2c == "released" else (self.k - bucket).clamp(0, top)

    def projected(self, weight, layer, dtype):
        H, D = self.dims.n_head, self.dims.head_dim
        return (self.rel_embeddings @ weight[layer]).view(2 * self.k, H, D).transpose(0, 1).to(dtype)  # (H, 2k, D)

    def content_scores(self, layer, q, k, q_pos, k_pos, ctx):
        c2p_row, p2c_row = self.indices(q_pos, k_pos)
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        c2p = (q @ self.projected(self.w_kr, layer, q.dtype).transpose(-1, -2)).gather(-1, c2p_row.expand(B, H, Tq, Tk))
        p2c_all = k @ self.projected(self.w_qr, layer, k.dtype).transpose(-1, -2)  # (B, H, Tk, 2k)
        p2c = p2c_all.gather(-1, p2c_row.t().expand(B, H, Tk, Tq)).transpose(-1, -2)
        return (c2p + p2c) / math.sqrt(3.0 * D)
