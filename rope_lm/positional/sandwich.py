"""Sandwich (Chi et al., 2023, "Dissecting Transformer Length Extrapolation
via the Lens of Receptive Field Analysis", ACL): the parameter-free bias
left from sinusoidal embeddings' inner product,

    p_i . p_j = sum_k cos((i - j) w_k),   w_k = base^(-2k/d),  k < d/2,

shifted by d/2 so the diagonal is 0 (it is <= 0 everywhere), and divided per
head by the compression ratio r_h = 8h/H (h = 1..H), the ALiBi-like spread of
decay rates across heads of the paper's implementation. d defaults to
d_model (the sinusoidal embedding size).
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import PairwiseBias, check_positive, distinct_distances, integer_valued
from rope_lm.positional.frequencies import inverse_frequencies


@SCHEMES.register("sandwich")
class Sandwich(PairwiseBias):
    distance_bias_shared = True  # parameter-free

    def __init__(self, dims, dim: int | None = None, base: float = 10000.0, per_head_compression: bool = True):
        super().__init__(dims)
        dim = dims.d_model if dim is None else dim
        if not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ConfigError(f"pos.dim={dim!r} must be an even integer >= 2 (sinusoid size of 'sandwich').")
        check_positive("base", base, "sandwich")
        self.dim, self.base = dim, float(base)
        self.register_buffer("inv_freq", inverse_frequencies(dim, self.base).float(), persistent=False)
        H = dims.n_head
        ratio = torch.arange(1, H + 1, dtype=torch.float32) * 8.0 / H if per_head_compression else torch.ones(H)
        self.register_buffer("ratio", ratio, persistent=False)

    def of_distance(self, d: torch.Tensor) -> torch.Tensor:
        """(H, n) bias at distances d (n,)."""
        inner = torch.cos(d[:, None] * self.inv_freq[None, :]).sum(-1) - self.dim / 2
        return inner[None, :] / self.ratio[:, None]

    def bias(self, layer, q_pos, k_pos, ctx):
        values, index = distinct_distances(q_pos, k_pos)
        return self.of_distance(values)[:, index]

    def distance_bias(self, layer, pos, ctx):
        p = pos.to(torch.float32)
        return self.of_distance(p - p[0])

    def coefficients(self, layer, ctx):
        return self.inv_freq, self.ratio, self.dim

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        # Pointwise form (the sum unrolled) for fractional positions.
        inv_freq, ratio, dim = coefs
        d = (q_pos - k_pos).clamp(min=0)
        inner = -dim / 2
        for k in range(inv_freq.shape[0]):
            inner = inner + torch.cos(d * inv_freq[k])
        return inner / ratio[h]

    def score_mod(self, layer, pos, ctx):
        if not integer_valued(pos):
            return super().score_mod(layer, pos, ctx)
        # Integer positions: one lookup per score instead of d/2 cosines.
        pos = pos.long()
        table = self.of_distance(torch.arange(int(pos.max() - pos.min()) + 1, device=pos.device, dtype=torch.float32))
        top = table.shape[-1] - 1

        def mod(score, b, h, q_idx, kv_idx):
            return score + table[h, (pos[q_idx] - pos[kv_idx]).clamp(min=0, max=top)].to(score.dtype)

        return mod
