"""The interface of a training-time position method, and the id stream.

A method maps a window of T tokens to T strictly increasing integer position
ids, drawn from a numpy Generator. The stream of a run is counter-based: the
ids of the n-th training batch on rank r come from a Generator seeded by
(seed, r, n) alone, so a run resumed from a checkpoint (which records n)
draws exactly the ids the uninterrupted run would have drawn, and ranks of a
data-parallel run draw different ids without sharing a state.
"""

import numpy as np

from rope_lm.core.errors import ConfigError
from rope_lm.core.registry import Registry

TRAIN_POSITIONS = Registry("training-time position method", "rope_lm.train_positions", "train_pos.name")

# Scheme families whose forward pass reads position ids; 'none' (NoPE, the
# recurrent encoding) sees only the order of the tokens, which ids never change.
READS_IDS = frozenset({"absolute", "rotary", "bias", "relative"})


class TrainPositions:
    name: str = "?"  # set by the registry
    active: bool = True  # False for plain positions: the batch goes through the model unchanged

    @property
    def label(self) -> str:
        """The method's name in run folders, tables and plots, e.g. ``pose-x16``."""
        return self.name

    def span(self, length: int) -> int:
        """How many positions the ids of a window of `length` tokens may reach
        (the largest id is below it)."""
        return length

    def check(self, length: int) -> None:
        """Raise ConfigError if windows of `length` tokens cannot be served. An active method
        whose ids cannot reach past the window trains plain positions under another name."""
        if self.active and self.span(length) <= length:
            factor = getattr(self, "factor", None)
            raise ConfigError(
                f"train_pos={self.name} with train_pos.factor={factor!r} gives windows of data.seq_len={length} "
                f"tokens ids over {self.span(length)} positions: no id past the window, so its ids are plain "
                f"positions 0..{length - 1} and the run would be a plain run under another name. Use a factor "
                f"that reaches past the window (e.g. train_pos.factor=16), or train_pos=none."
            )

    def sample(self, rng: np.random.Generator, length: int) -> np.ndarray:
        """Position ids (length,) int64, strictly increasing, below span(length)."""
        return np.arange(length, dtype=np.int64)

    def describe(self, length: int) -> dict:
        """The realized settings for windows of `length` tokens (results.json)."""
        return {"name": self.name, "label": self.label, "span": self.span(length)}

    def check_schemes(self, schemes: list) -> None:
        """Refuse a model none of whose layers reads position ids."""
        if not self.active or any(s.family in READS_IDS for s in schemes):
            return
        names = ", ".join(sorted({s.name for s in schemes}))
        raise ConfigError(
            f"Training-time position method {self.name!r} (setting `train_pos`) changes the position ids a "
            f"scheme reads, but this model's scheme ({names}) reads none: it sees only the order of the "
            f"tokens, which the ids never change. Use it with a scheme of family "
            f"{', '.join(sorted(READS_IDS))} (e.g. pos=rope, pos=alibi), or train_pos=none."
        )


def check_factor(name: str, factor) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1 or factor == float("inf"):
        raise ConfigError(
            f"train_pos.factor={factor!r} must be a finite number >= 1 (method {name!r}): the ids "
            f"of a window of L tokens cover factor x L positions."
        )
    return float(factor)


def build_train_positions(options: dict | None) -> TrainPositions:
    return TRAIN_POSITIONS.build(options, default="none")


def train_positions_label(options: dict | None) -> str:
    """The method's label from a run's settings; "none" when there are none
    (a run from before training-time methods existed)."""
    try:
        return build_train_positions(options).label
    except ConfigError:
        return str((options or {}).get("name", "none"))


def batch_rng(seed: int, rank: int, draw: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(rank, draw)))


def draw_batch(method: TrainPositions, seed: int, rank: int, draw: int, batch: int, length: int) -> np.ndarray:
    """The ids (batch, length) of the `draw`-th training batch on `rank`: one
    independent draw per sequence."""
    rng = batch_rng(seed, rank, draw)
    return np.stack([method.sample(rng, length) for _ in range(batch)])
