"""Learned absolute position embeddings (a trainable table; GPT-2 style,
Radford et al., 2019; as in Vaswani et al., 2017, Sec. 3.5).

Row p is added to the token embedding at position p. Fractional positions
(from an extrapolation method that rescales them) interpolate linearly
between neighbouring rows. A table cannot be read past its last row: such a
length is refused up front unless the extrapolation method extends the table
(``extends_position_table``, through its ``absolute_table`` hook).
"""

import math

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional.base import PositionalScheme


def lookup(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rows of table at pos (T,), linearly interpolated for fractional positions.
    Positions in (n-1, n) for n rows read the last row: position interpolation
    maps T positions onto [0, L - L/T], just past row L-1 of an L-row table."""
    if not pos.is_floating_point():
        return table[pos]
    lo = pos.floor()
    w = (pos - lo).to(table.dtype)[:, None]
    lo = lo.long()
    hi = (lo + 1).clamp(max=table.shape[0] - 1)
    return table[lo] * (1 - w) + table[hi] * w


@SCHEMES.register("learned")
class LearnedAbsolute(PositionalScheme):
    family = "absolute"
    no_weight_decay = ("weight",)  # rows past L get no gradient: they keep their initial values

    def __init__(self, dims, max_positions: int = 2048, init_std: float = 0.02):
        super().__init__(dims)
        if not isinstance(max_positions, int) or max_positions < 1:
            raise ConfigError(
                f"pos.max_positions={max_positions!r} must be a positive integer (rows of the learned table)."
            )
        self.max_positions = max_positions
        self.table_rows = max_positions
        self.weight = nn.Parameter(torch.randn(max_positions, dims.d_model) * init_std)

    def _refusal(self, needed: int, scaling) -> str:
        # The method in use knows which installed methods extend a table; a scheme imports none.
        methods = scaling.table_extenders() if scaling is not None else []
        helpers = (
            f"an extrapolation method that extends the table (scaling={'|'.join(methods)})"
            if methods
            else "an extrapolation method that extends the table (position interpolation or hierarchical "
            "decomposition; none is installed in rope_lm/scaling yet)"
        )
        return (
            f"Positional scheme 'learned' has a table of pos.max_positions={self.max_positions} rows, but "
            f"{needed} positions are needed. Raise pos.max_positions (rows past the training length "
            f"{self.dims.train_len} are never trained), evaluate shorter lengths (eval.multipliers / eval.lengths), "
            f"or use {helpers}."
        )

    def validate(self, seq_len, scaling):
        if seq_len > self.max_positions and not scaling.extends_position_table:
            raise ConfigError(self._refusal(seq_len, scaling))

    def embed(self, x, pos, ctx):
        if pos.numel() == 0:
            return x
        if pos.min() < 0:
            raise ConfigError(f"Positional scheme 'learned' got negative positions (min {float(pos.min())}).")
        needed = int(math.floor(float(pos.max()))) + 1
        table = self.weight
        table = ctx.scaling.absolute_table(table, needed, ctx)
        if needed > table.shape[0]:
            raise ConfigError(self._refusal(needed, ctx.scaling))
        return x + lookup(table, pos).to(x.dtype)
