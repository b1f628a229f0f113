"""Hierarchical decomposition of a learned absolute position table (Su, 2020,
"层次分解位置编码": extending BERT's position table to n^2 positions).

With the trained rows p_0 .. p_{n-1} (n = table rows) and alpha in (0, 1):

    u_i = (p_i - alpha p_0) / (1 - alpha)
    q_{i n + j} = alpha u_i + (1 - alpha) u_j      (0 <= i, j < n)

so q_j = p_j for j < n (the trained range is reproduced exactly) and within
every block of n rows q_{i n + j} - q_{i n + j'} = p_j - p_j': the local
structure of the trained table repeats, offset by a coarse block vector.
alpha = 0.4 as in Su's post. n is the number of *trained* rows,
min(table rows, training length): rows past the training length never get a
gradient, so positions from L on come from the decomposition rather than from
them (with a table of exactly L rows, n is the table size). The learned scheme
asks for the extended table through
``ctx.scaling.absolute_table(weight, needed_rows, ctx)``; at most n^2
positions can be served.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.scaling.base import METHODS, ScalingMethod


def hierarchical_table(table: torch.Tensor, rows: int, alpha: float = 0.4) -> torch.Tensor:
    n = table.shape[0]
    if rows > n * n:
        raise ConfigError(
            f"Hierarchical decomposition extends a {n}-row position table to at most {n * n} positions; "
            f"{rows} were asked for. Evaluate at shorter lengths or use scaling=pi."
        )
    u = (table - alpha * table[0]) / (1 - alpha)
    idx = torch.arange(rows, device=table.device)
    return alpha * u[idx // n] + (1 - alpha) * u[idx % n]


@METHODS.register("hierarchical")
class Hierarchical(ScalingMethod):
    applies_to = frozenset({"absolute"})
    extends_position_table = True

    def __init__(self, alpha: float = 0.4, **common):
        super().__init__(**common)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ConfigError(f"scaling.alpha={alpha!r} must lie strictly between 0 and 1 (Su uses 0.4).")
        self.alpha = float(alpha)

    @classmethod
    def applies(cls, scheme) -> bool:
        # Only a trained table can be decomposed: a scheme declares one with table_rows.
        return super().applies(scheme) and scheme.table_rows is not None

    @classmethod
    def acts_on(cls) -> str:
        return "absolute schemes with a learned position table (e.g. learned)"

    def validate(self, seq_len, scheme, train_len):
        n = min(scheme.table_rows or train_len, train_len)
        if seq_len > n * n:
            hierarchical_table(torch.zeros(n, 1), seq_len, self.alpha)  # raises the one refusal message

    def absolute_table(self, table, needed_rows, ctx):
        trained = min(table.shape[0], ctx.train_len)
        if needed_rows <= trained:
            return table
        return hierarchical_table(table[:trained], needed_rows, self.alpha)

    def describe(self, scheme, ctx):
        return {**super().describe(scheme, ctx), "alpha": self.alpha}
