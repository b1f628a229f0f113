"""Multiplicative absolute encoding: token embeddings modulated element-wise
by a sinusoidal position vector, x * (offset + amplitude * p) (the
multiplicative counterpart of Vaswani et al.'s additive x + p; cf. Wang et
al., 2020, "Encoding word order in complex embeddings").

Why the offset: the pure product x * p (offset 0, amplitude 1) zeroes every
sine channel at position 0 and every channel where the slow frequencies sit
near a zero, so token identity is lost there and training stalls. The default
x * (1 + 0.5 p) keeps each channel's gain in [0.5, 1.5] (never zero, never a
sign flip), so tokens stay recoverable while every position still gets a
distinct modulation pattern. offset=0, amplitude=1 gives the literal x * p.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import check_positive, sinusoid
from rope_lm.positional.base import PositionalScheme


@SCHEMES.register("multiplicative")
class Multiplicative(PositionalScheme):
    family = "absolute"

    def __init__(self, dims, base: float = 10000.0, offset: float = 1.0, amplitude: float = 0.5):
        super().__init__(dims)
        check_positive("base", base, "multiplicative")
        if amplitude == 0:
            raise ConfigError("pos.amplitude=0 removes the position signal of 'multiplicative'; use pos=nope for that.")
        self.base, self.offset, self.amplitude = float(base), float(offset), float(amplitude)

    def embed(self, x, pos, ctx):
        p = sinusoid(pos, self.dims.d_model, self.base).to(x.dtype)
        return x * (self.offset + self.amplitude * p)
