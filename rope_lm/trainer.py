"""The Lightning trainer of a run: its callbacks (checkpoints, progress,
graceful stop) and settings, with Lightning's refusals turned into
configuration errors before any data or model work."""

import datetime
import os

import torch

from rope_lm.allocator import KeepFreedMemory
from rope_lm.checkpointing import AtomicCheckpointIO, GracefulStop
from rope_lm.config import TrainerConfig
from rope_lm.errors import ConfigError
from rope_lm.lit import ProgressLog, TokensPerSecond


def trainer_kwargs(tc: TrainerConfig, out_dir: str, logger, on_stop=None) -> dict:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    lightning = dict(tc.lightning)
    cuda = torch.cuda.is_available() and lightning.get("accelerator", "auto") in ("auto", "gpu", "cuda")
    precision = tc.precision
    if precision == "auto":
        precision = "bf16-mixed" if cuda and torch.cuda.is_bf16_supported() else "32-true"
    deterministic = (not cuda) if tc.deterministic == "auto" else tc.deterministic
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    minutes = tc.ckpt_every_minutes
    callbacks = [
        ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                        enable_version_counter=False),
        ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, enable_version_counter=False,
                        every_n_train_steps=None if minutes else tc.ckpt_every_n_steps,
                        train_time_interval=datetime.timedelta(minutes=minutes) if minutes else None),
        TokensPerSecond(every=lightning.get("log_every_n_steps") or 10),
        ProgressLog(),
        GracefulStop(ckpt_dir, on_stop),
        KeepFreedMemory(),
    ]
    if logger is not None:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    kwargs = dict(
        # Training is one endless "epoch" (data.StepSampler) that max_steps ends; max_epochs=-1 lets a
        # finished run be extended (with max_epochs=1 Lightning would call the epoch done on resume).
        max_steps=tc.max_steps, max_epochs=-1, precision=precision, deterministic=deterministic,
        logger=logger if logger is not None else False, callbacks=callbacks, default_root_dir=out_dir,
        val_check_interval=tc.val_every_n_steps, check_val_every_n_epoch=None, use_distributed_sampler=False,
        num_sanity_val_steps=0, plugins=[AtomicCheckpointIO()],
    )
    kwargs.update(lightning)
    if tc.sharded:
        from rope_lm.sharding import BlockShardedStrategy, check_sharded

        check_sharded(lightning)
        kwargs["strategy"] = BlockShardedStrategy()
    return kwargs


def build_trainer(kwargs: dict):
    """lightning.Trainer, with a value Lightning refuses (trainer.devices=3 on
    a 2-core CPU, an unknown strategy) reported as a configuration error
    before any data or model work."""
    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        trainer = L.Trainer(**kwargs)
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"lightning.Trainer refused the trainer settings ({first}). Check the `trainer.*` "
                          f"values against Lightning's documentation.") from None
    from rope_lm.sharding import BlockShardedStrategy, check_world

    if isinstance(trainer.strategy, BlockShardedStrategy):
        check_world(trainer.num_devices, trainer.num_nodes)
    return trainer


def wandb_run(logger):
    """The wandb run behind a Lightning logger, or None for any other logger."""
    if logger is None or logger.__class__.__name__ != "WandbLogger":
        return None
    return getattr(logger, "experiment", None)
