"""PoSE, positional skip-wise training (Zhu et al., ICLR 2024, eq. 3-4).

A window of L tokens is cut into N chunks c_0..c_{N-1} of lengths l_i >= 1
(sum L); chunk i starts at st_i = l_0 + ... + l_{i-1} and reads the ids
u_i + st_i, ..., u_i + st_i + l_i - 1. The skips satisfy
0 = u_0 <= u_1 <= ... <= u_{N-1} <= L_t - L, so the ids increase strictly,
stay contiguous inside a chunk, and reach at most L_t - 1: relative distances
up to L_t - 1 are trained while the window stays L. The text of the window
stays contiguous (the paper's v_i = 0 ablation); only the ids skip.
"""

from typing import Literal

import numpy as np

from rope_lm.core.errors import ConfigError
from rope_lm.train_positions.base import TRAIN_POSITIONS, TrainPositions, check_factor

SKIPS = ("paper", "uniform")


@TRAIN_POSITIONS.register("pose")
class PoSE(TrainPositions):
    """factor: L_t = round(factor * L). chunks: N. skips: 'paper' draws
    u_i ~ U{u_{i-1}, ..., L_t - L} one after the other (eq. 4, the released
    code's u_0 = 0); 'uniform' takes u_1..u_{N-1} as the sorted values of N - 1
    independent draws from U{0, ..., L_t - L}. The two agree for N = 2; for
    N > 2 'paper' pushes the later skips towards the end of the range. The chunk
    lengths come from N - 1 distinct cut points drawn uniformly from
    {1, ..., L - 1}, so every split into N non-empty chunks is equally likely."""

    def __init__(self, factor: float = 16.0, chunks: int = 2, skips: Literal["paper", "uniform"] = "paper"):
        self.factor = check_factor(self.name, factor)
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 2:
            raise ConfigError(
                f"train_pos.chunks={chunks!r} must be an integer >= 2 (method 'pose'): with one chunk "
                f"and u_0 = 0 the ids are plain positions."
            )
        if skips not in SKIPS:
            raise ConfigError(
                f"train_pos.skips={skips!r} is not a skip distribution of 'pose'; use one of {', '.join(SKIPS)}."
            )
        self.chunks, self.skips = chunks, skips

    @property
    def label(self) -> str:
        label = f"pose-x{self.factor:g}"
        if self.chunks != 2:
            label += f"-c{self.chunks}"
        return label + ("-uniform" if self.skips == "uniform" else "")

    def span(self, length):
        return max(length, int(round(self.factor * length)))

    def check(self, length):
        super().check(length)
        if length < self.chunks:
            raise ConfigError(
                f"train_pos.chunks={self.chunks} needs windows of at least {self.chunks} tokens (one "
                f"per chunk), but data.seq_len={length}."
            )

    def chunk_lengths(self, rng, length: int) -> np.ndarray:
        cuts = np.sort(rng.choice(np.arange(1, length), size=self.chunks - 1, replace=False))
        return np.diff(np.concatenate(([0], cuts, [length])))

    def skip_values(self, rng, length: int) -> np.ndarray:
        """u_0..u_{N-1}, non-decreasing, u_0 = 0."""
        room = self.span(length) - length
        if self.skips == "uniform":
            later = np.sort(rng.integers(0, room + 1, size=self.chunks - 1))
        else:
            later, low = [], 0
            for _ in range(self.chunks - 1):
                low = int(rng.integers(low, room + 1))
                later.append(low)
        return np.concatenate(([0], np.asarray(later, dtype=np.int64)))

    def sample(self, rng, length):
        self.check(length)
        lengths = self.chunk_lengths(rng, length)
        skips = self.skip_values(rng, length)
        return np.arange(length, dtype=np.int64) + np.repeat(skips, lengths)

    def describe(self, length):
        return {**super().describe(length), "factor": self.factor, "chunks": self.chunks, "skips": self.skips}
