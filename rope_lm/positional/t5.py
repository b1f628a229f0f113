"""T5 relative bias (Raffel et al., 2020): a learned scalar per head and
bucket of the causal distance n = i - j, one table shared by all layers.

Buckets (one direction, as in T5's decoder): n < num_buckets/2 exact; then
log-spaced up to max_distance; everything farther shares the last bucket:
    b(n) = e + floor(log(n/e) / log(max_distance/e) * (num_buckets - e)),  e = num_buckets // 2.
With num_buckets=16, max_distance=128 (T5's 32 bidirectional buckets, one
side) this is the survey's table: 0-7 exact, 8-11 -> 8, 12-15 -> 9,
16-22 -> 10, 23-31 -> 11, ... Fractional distances use their floor.

Both settings are lengths, so by default they scale with the training length
L: T5 trained at 512 tokens with 32 causal buckets (16 exact distances) up to
distance 128, i.e. num_buckets = L/16 and max_distance = L/4. Absolute numbers
from the paper at a smaller L would leave the far buckets untrained (at
L = 64, distances 64-128 never occur in training).
"""

import math

import torch
from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional._common import PairwiseBias, integer_valued


def causal_bucket(n: int, num_buckets: int, max_distance: int) -> int:
    exact = num_buckets // 2
    if n < exact:
        return n
    # The epsilon puts distances that land exactly on a boundary (n = 16 gives
    # log(2)/log(16)*8 = 2) in the upper bucket, as exact arithmetic does;
    # rounding would otherwise decide it.
    log_bucket = exact + math.floor(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact) + 1e-9)
    return min(log_bucket, num_buckets - 1)


def scaled_buckets(train_len: int, num_buckets: int | None, max_distance: int | None) -> tuple[int, int]:
    """A setting left unset (None) is T5's at 512 scaled to train_len: L/16
    buckets (at least 2) and max_distance L/4 (above the exact half, which the
    bucketing needs); a number given is kept (checkpoints hold theirs)."""
    if num_buckets is None:
        num_buckets = max(2, round(train_len / 16))
    if max_distance is None and isinstance(num_buckets, int):
        max_distance = max(num_buckets // 2 + 1, round(train_len / 4))
    return num_buckets, max_distance


@SCHEMES.register("t5")
class T5Bias(PairwiseBias):
    distance_bias_shared = True  # one table for all layers

    def __init__(self, dims, num_buckets: int | None = None, max_distance: int | None = None):
        super().__init__(dims)
        num_buckets, max_distance = scaled_buckets(dims.train_len, num_buckets, max_distance)
        if not isinstance(num_buckets, int) or num_buckets < 2:
            raise ConfigError(f"pos.num_buckets={num_buckets!r} must be an integer >= 2.")
        if not isinstance(max_distance, int) or max_distance <= num_buckets // 2:
            raise ConfigError(
                f"pos.max_distance={max_distance!r} must be an integer above num_buckets/2={num_buckets // 2}."
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        # Every distance >= max_distance falls in the last bucket, so a lookup
        # over 0..max_distance covers all of them.
        lut = [causal_bucket(n, num_buckets, max_distance) for n in range(max_distance + 1)]
        self.register_buffer("bucket_of_distance", torch.tensor(lut), persistent=False)
        self.table = nn.Parameter(torch.randn(num_buckets, dims.n_head) * dims.d_model**-0.5)

    def coefficients(self, layer, ctx):
        return (self.table[self.bucket_of_distance].t(),)  # (H, max_distance + 1)

    def distance_bias(self, layer, pos, ctx):
        # Buckets floor the distance: pos[d] - pos[0] equals p_i - p_j exactly
        # only for integer positions.
        return super().distance_bias(layer, pos, ctx) if integer_valued(pos) else None

    @staticmethod
    def formula(coefs, h, q_pos, k_pos):
        (by_distance,) = coefs
        n = (q_pos - k_pos).clamp(min=0, max=by_distance.shape[-1] - 1).long()
        return by_distance[h, n]
