"""Helpers shared by several schemes (the leading underscore keeps the
registry from importing this module as a scheme)."""

import math

import torch

from rope_lm.positional.base import PositionalScheme
from rope_lm.positional.frequencies import inverse_frequencies


def sinusoid(pos: torch.Tensor, dim: int, base: float = 10000.0, layout: str = "interleaved") -> torch.Tensor:
    """Sinusoidal vectors (T, dim) of (possibly fractional) positions.

    'interleaved' is Vaswani's PE(p, 2i) = sin, PE(p, 2i+1) = cos; 'halves' puts
    all sines first (Transformer-XL). The layout does not change inner products.
    """
    angles = pos.to(torch.float32)[:, None] * inverse_frequencies(dim, base, pos.device).float()[None, :]
    if layout == "interleaved":
        out = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    else:
        out = torch.cat((angles.sin(), angles.cos()), dim=-1)
    return out[:, :dim]


def integer_valued(*positions: torch.Tensor) -> bool:
    return all(not p.is_floating_point() or torch.equal(p, p.round()) for p in positions)


def causal_distance(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """max(i - j, 0) as float32, (Tq, Tk). Pairs with j > i are masked out by
    every kernel; clamping keeps their (discarded) values finite, since a NaN
    under a -inf mask would still poison the softmax."""
    return (q_pos.to(torch.float32)[:, None] - k_pos.to(torch.float32)[None, :]).clamp(min=0)


def distinct_distances(q_pos: torch.Tensor, k_pos: torch.Tensor):
    """(values, index): the distinct causal distances of all pairs, float (n,),
    and for every pair its index into them, long (Tq, Tk).

    Functions of the distance that are costly per pair (a projected sinusoid, a
    bucket map) are evaluated once per distinct value and gathered. Integer
    positions give n <= the position span; rescaled (float) positions use
    torch.unique.
    """
    d = causal_distance(q_pos, k_pos)
    if integer_valued(q_pos, k_pos):
        index = d.long()
        values = torch.arange(int(index.max()) + 1 if index.numel() else 1, device=d.device, dtype=torch.float32)
        return values, index
    values, index = torch.unique(d, return_inverse=True)
    return values, index


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class PairwiseBias(PositionalScheme):
    """A bias scheme whose logit bias is one pointwise formula of
    (head, query position, key position).

    The same ``formula`` serves bias() (broadcast over (H, Tq, Tk)) and the
    flex-attention score_mod (scalars), so the two kernels agree by
    construction; tests/test_attention.py still checks it. ``coefficients``
    returns the tensors the formula reads (per layer), so that score_mod
    captures plain tensors, which torch.compile lowers into the kernel.
    Formulas must stay pointwise (no reductions): compiled flex attention
    cannot lower a reduction inside a score_mod.
    """

    family = "bias"
    has_bias = True
    # The formula reads q_pos and k_pos only through q_pos - k_pos.
    distance_only = True

    def coefficients(self, layer: int, ctx) -> tuple:
        raise NotImplementedError

    @staticmethod
    def formula(coefs: tuple, h, q_pos, k_pos):
        raise NotImplementedError

    def bias(self, layer, q_pos, k_pos, ctx):
        coefs = self.coefficients(layer, ctx)
        h = torch.arange(self.dims.n_head, device=q_pos.device)[:, None, None]
        qp = q_pos.to(torch.float32)[None, :, None]
        kp = k_pos.to(torch.float32)[None, None, :]
        return self.formula(coefs, h, qp, kp).expand(self.dims.n_head, q_pos.numel(), k_pos.numel())

    def distance_bias(self, layer, pos, ctx):
        if not self.distance_only:
            return None
        h = torch.arange(self.dims.n_head, device=pos.device)[:, None]
        p = pos.to(torch.float32)
        return self.formula(self.coefficients(layer, ctx), h, p[None, :], p[None, :1]).expand(
            self.dims.n_head, p.numel()
        )

    def score_mod(self, layer, pos, ctx):
        # Contiguous: compiled flex on CPU cannot lower reads of stride-0
        # (expanded) captured tensors.
        coefs = tuple(c.contiguous() if isinstance(c, torch.Tensor) else c for c in self.coefficients(layer, ctx))
        pos = pos.to(torch.float32)
        formula = self.formula

        def mod(score, b, h, q_idx, kv_idx):
            return score + formula(coefs, h, pos[q_idx], pos[kv_idx]).to(score.dtype)

        return mod


def check_positive(name: str, value, scheme: str):
    from rope_lm.core.errors import ConfigError

    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ConfigError(f"pos.{name}={value!r} must be a positive number (positional scheme {scheme!r}).")
