"""Plain positions: every training window reads 0..L-1 (the default)."""

from rope_lm.train_positions.base import TRAIN_POSITIONS, TrainPositions


@TRAIN_POSITIONS.register("none")
class PlainPositions(TrainPositions):
    active = False
