"""The Lightning trainer of a run: its callbacks (checkpoints, progress,
graceful stop) and settings, with Lightning's refusals turned into
configuration errors before any data or model work."""

from dataclasses import dataclass, field, fields
import datetime
import os

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.typed import signature_annotations, typed, typed_dataclass
from rope_lm.train.allocator import KeepFreedMemory
from rope_lm.train.checkpointing import AtomicCheckpointIO, FiniteWeights, GracefulStop
from rope_lm.train.distributed import StopTogether
from rope_lm.train.lit import ProgressLog, TokensPerSecond


@dataclass
class TrainerConfig:
    """trainer.*: rope-lm's own keys; every other key goes to lightning.Trainer."""

    max_steps: int = 1200
    val_every_n_steps: int = 200
    ckpt_every_n_steps: int = 200
    ckpt_every_minutes: float | None = None
    precision: str = "auto"
    deterministic: bool | str = "auto"
    compile: bool = False
    skip_nonfinite: int = 0
    sharded: bool = False  # FSDP2 per block over the devices (rope_lm/train/sharding.py; the trainer=fsdp preset)
    # Devices that share each training sequence (rope_lm/train/context_parallel.py): FSDP2 on a data x context
    # mesh; 1: none.
    context_parallel: int = 1
    # How long the processes of a torchrun / srun job wait for one another at start (train/distributed.py);
    # None: distributed.DEFAULT_RENDEZVOUS_S. A None default, so that run.yaml files written before it compare equal.
    rendezvous_timeout_s: float | None = None
    lightning: dict = field(default_factory=dict)

    def validate(self):
        for key in ("max_steps", "val_every_n_steps", "ckpt_every_n_steps"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"trainer.{key}={getattr(self, key)} must be a positive integer.")
        if isinstance(self.context_parallel, bool) or self.context_parallel < 1:
            raise ConfigError(
                f"trainer.context_parallel={self.context_parallel} must be a positive integer: the number of "
                f"devices that share each training sequence (1: none)."
            )
        if self.skip_nonfinite < 0:
            raise ConfigError(f"trainer.skip_nonfinite={self.skip_nonfinite} must be 0 or more.")
        if self.ckpt_every_minutes is not None and self.ckpt_every_minutes <= 0:
            raise ConfigError(f"trainer.ckpt_every_minutes={self.ckpt_every_minutes} must be positive (or null).")
        if self.rendezvous_timeout_s is not None and not self.rendezvous_timeout_s > 0:
            raise ConfigError(
                f"trainer.rendezvous_timeout_s={self.rendezvous_timeout_s} must be a positive number of seconds (or "
                f"null, for 600): how long the processes of a torchrun or srun job wait for one another at start."
            )
        if self.deterministic not in (True, False, "auto", "warn"):
            raise ConfigError(f"trainer.deterministic={self.deterministic!r} must be true, false, auto or warn.")


def _lightning_annotations() -> dict:
    import lightning as L

    named, _ = signature_annotations(L.Trainer.__init__, skip=1)
    return named


def trainer_config(options: dict) -> TrainerConfig:
    """trainer.* checked: rope-lm's own keys typed by TrainerConfig, every
    other key by lightning.Trainer's signature (into TrainerConfig.lightning)."""
    trainer_opts = dict(options)
    own_keys = {f.name for f in fields(TrainerConfig)} - {"lightning"}
    lightning_opts = {k: trainer_opts.pop(k) for k in list(trainer_opts) if k not in own_keys}
    lightning_ann = _lightning_annotations()
    unknown = sorted(set(lightning_opts) - set(lightning_ann))
    if unknown:
        raise ConfigError(
            f"Unknown trainer setting(s) {', '.join('trainer.' + k for k in unknown)}: `trainer.*` keys are rope-lm's "
            f"own ({', '.join(sorted(own_keys))}) or arguments of lightning.Trainer (e.g. strategy, devices, "
            f"num_nodes, accumulate_grad_batches, gradient_clip_val)."
        )
    taken = {"max_steps", "max_epochs", "callbacks", "logger", "plugins", "default_root_dir", "val_check_interval"}
    clash = sorted(set(lightning_opts) & taken)
    if clash:
        raise ConfigError(
            f"trainer.{clash[0]} is set by rope-lm itself (from trainer.max_steps, the run directory "
            f"and trainer.val_every_n_steps); remove it."
        )
    lightning = typed(lightning_opts, lightning_ann, "trainer.", "trainer")
    trainer = typed_dataclass(TrainerConfig, trainer_opts, "trainer.", "trainer")
    trainer.lightning = lightning
    return trainer


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
    graceful = GracefulStop(ckpt_dir, on_stop)
    callbacks = [
        FiniteWeights(),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best",
            monitor="val/loss",
            mode="min",
            save_top_k=1,
            enable_version_counter=False,
        ),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            save_last=True,
            save_top_k=0,
            enable_version_counter=False,
            every_n_train_steps=None if minutes else tc.ckpt_every_n_steps,
            train_time_interval=datetime.timedelta(minutes=minutes) if minutes else None,
        ),
        TokensPerSecond(every=lightning.get("log_every_n_steps") or 10),
        ProgressLog(),
        StopTogether(graceful),  # before GracefulStop: a stop any process got ends every process after one step
        graceful,
        KeepFreedMemory(),
    ]
    if logger is not None:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    kwargs = dict(
        # Training is one endless "epoch" (data.StepSampler) that max_steps ends; max_epochs=-1 lets a
        # finished run be extended (with max_epochs=1 Lightning would call the epoch done on resume).
        max_steps=tc.max_steps,
        max_epochs=-1,
        precision=precision,
        deterministic=deterministic,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        default_root_dir=out_dir,
        val_check_interval=tc.val_every_n_steps,
        check_val_every_n_epoch=None,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        plugins=[AtomicCheckpointIO()],
    )
    kwargs.update(lightning)
    if tc.context_parallel > 1:
        from rope_lm.train.context_parallel import ContextParallelStrategy

        kwargs["strategy"] = ContextParallelStrategy(tc.context_parallel)
    elif tc.sharded:
        from rope_lm.train.sharding import BlockShardedStrategy, check_sharded

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
        raise ConfigError(
            f"lightning.Trainer refused the trainer settings ({first}). Check the `trainer.*` "
            f"values against Lightning's documentation."
        ) from None
    from rope_lm.train import context_parallel
    from rope_lm.train.sharding import BlockShardedStrategy, check_world

    if isinstance(trainer.strategy, context_parallel.ContextParallelStrategy):
        context_parallel.check_world(trainer.strategy.context_parallel, trainer.num_devices, trainer.num_nodes)
    elif isinstance(trainer.strategy, BlockShardedStrategy):
        check_world(trainer.num_devices, trainer.num_nodes)
    return trainer


def wandb_run(logger):
    """The wandb run behind a Lightning logger, or None for any other logger."""
    if logger is None or logger.__class__.__name__ != "WandbLogger":
        return None
    return getattr(logger, "experiment", None)
