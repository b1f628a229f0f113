"""Training-time position methods (PoSE, randomized positions), registered by
name (see docs/methods.md).

A method draws the position ids of each training sequence; evaluation always
reads plain positions 0..T-1. Every module here is imported on first use; a
method is a TrainPositions subclass decorated with
``@TRAIN_POSITIONS.register("name")`` plus a conf/train_pos/<name>.yaml. The
package imports numpy, never torch, so that compare.py can name a run's
method without loading torch.
"""

from rope_lm.train_positions.base import (
    TRAIN_POSITIONS,
    TrainPositions,
    build_train_positions,
    draw_batch,
    train_positions_label,
)

__all__ = ["TRAIN_POSITIONS", "TrainPositions", "build_train_positions", "draw_batch", "train_positions_label"]
