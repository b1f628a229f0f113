"""Positional schemes, one module per family, registered by name."""

from rope_lm.core.registry import Registry
from rope_lm.positional.base import Dims, PosContext, PositionalScheme

SCHEMES = Registry("positional scheme", __name__, "pos.name")


def build_scheme(options: dict, dims: Dims) -> PositionalScheme:
    return SCHEMES.build(options, dims)


__all__ = ["SCHEMES", "build_scheme", "Dims", "PosContext", "PositionalScheme"]
