"""Randomized positional encodings (Ruoss et al., ACL 2023).

Each training sequence of T tokens reads an ordered random subset of
[0, L_max): T distinct ids drawn uniformly without replacement and sorted, so
every id below L_max, and every gap between ids, is seen in training while
the window stays T. Evaluation reads plain positions 0..T-1 (rope-lm's
choice: the paper also randomizes at test time).
"""

import numpy as np

from rope_lm.train_positions.base import TRAIN_POSITIONS, TrainPositions, check_factor


@TRAIN_POSITIONS.register("randomized")
class RandomizedPositions(TrainPositions):
    """factor: L_max = round(factor * L)."""

    def __init__(self, factor: float = 16.0):
        self.factor = check_factor(self.name, factor)

    @property
    def label(self) -> str:
        return f"randomized-x{self.factor:g}"

    def span(self, length):
        return max(length, int(round(self.factor * length)))

    def sample(self, rng, length):
        return np.sort(rng.choice(self.span(length), size=length, replace=False)).astype(np.int64)

    def describe(self, length):
        return {**super().describe(length), "factor": self.factor}
