"""The LightningModule: loss, optimizer, schedule, logging."""

from dataclasses import asdict, dataclass
import logging
import math
import time

import lightning as L
import torch
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError, TrainingDiverged
from rope_lm.data.loaders import data_replica
from rope_lm.model.head import mean_cross_entropy
from rope_lm.model.layout import UNRESOLVED
from rope_lm.model.transformer import ModelConfig, build_model, check_fit
from rope_lm.positional import build_scheme
from rope_lm.train_positions.base import build_train_positions, draw_batch

log = logging.getLogger("rope_lm")


@dataclass
class OptimConfig:
    # The defaults of a train run: conf/config.yaml's optim block repeats them for Hydra (its overrides and
    # --help need the keys there), and tests/test_optimizer.py holds the two equal.
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # Fused AdamW kernel. null: on CUDA only, so CPU runs keep the exact numbers of the foreach
    # kernel that docs/ record (fused differs in the last bit); true: wherever the parameters
    # are (on CPU the tiny model's optimizer step drops from ~28 to ~5 ms, docs/benchmarks.md).
    fused: bool | None = None

    def validate(self):
        if self.lr <= 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(
                f"optim settings lr={self.lr}, warmup_steps={self.warmup_steps}, min_lr_ratio={self.min_lr_ratio}: "
                f"lr must be positive, warmup_steps non-negative and min_lr_ratio within [0, 1]."
            )
        # AdamW's own checks come only at its construction, after the data and the model are built.
        for key in ("beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(
                    f"optim.{key}={getattr(self, key)} must be within [0, 1): AdamW's decay rate of its "
                    f"{'gradient' if key == 'beta1' else 'squared-gradient'} average (usual: "
                    f"{'0.9' if key == 'beta1' else '0.95 to 0.999'})."
                )
        if self.eps < 0 or self.weight_decay < 0:
            raise ConfigError(
                f"optim.eps={self.eps} and optim.weight_decay={self.weight_decay} must be 0 or more "
                f"(usual: eps 1e-8, weight_decay 0.1)."
            )


def logged_step(trainer) -> int:
    """The step under which Lightning logs the metrics of the training step
    in progress. Lightning has no public name for it (its own
    LearningRateMonitor reads the same loop attribute); tests/test_lit_lightning.py
    fails when that attribute or its meaning changes."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warmup to 1, cosine decay to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def drop_second_copy(checkpoint: dict) -> None:
    """Checkpoints written before 2026-11-28 hold every weight twice, as `model.*` and `_forward.*` (the
    same tensors under the name the forward was registered by); the second copy goes before loading."""
    state = checkpoint.get("state_dict")
    if isinstance(state, dict):
        for key in [k for k in state if k.startswith("_forward.")]:
            del state[key]


class LitLM(L.LightningModule):
    def __init__(
        self,
        model: dict,
        pos: dict,
        scaling: dict | None,
        optim: OptimConfig | dict,
        vocab_size: int,
        train_len: int,
        max_steps: int,
        corpus: dict | None = None,
        data: dict | None = None,
        compile: bool = False,
        skip_nonfinite: int = 0,
        tuned_len: int | None = None,
        train_pos: dict | None = None,
        seed: int = 0,
        layers=UNRESOLVED,
    ):
        """`layers`: the model's layer specs as its settings were resolved
        (RunConfig.layers); left out, the model resolves them. Not a
        hyperparameter: a checkpoint holds the settings they come from."""
        super().__init__()
        # A dict: how checkpoints hold it (plain values, readable without this class), and how they give it back.
        self.optim = optim if isinstance(optim, OptimConfig) else OptimConfig(**optim)
        self.optim.validate()
        self.save_hyperparameters(ignore=["optim", "layers"])
        self.save_hyperparameters({**self.hparams, "optim": asdict(self.optim)})
        self.model = build_model(model, pos, scaling, vocab_size, train_len, tuned_len, layers)
        # Training-time position ids (rope_lm/train_positions/): the n-th training batch's ids come from
        # (seed, rank, n) alone, and checkpoints carry n, so a resumed run draws the ids it would have drawn.
        self.train_positions = build_train_positions(train_pos)
        self.train_positions.check_schemes([self.model.pos_scheme, *(self.model.layout_schemes or [])])
        self._draws = 0
        self.max_steps = max_steps
        self.skips_left = skip_nonfinite
        self.tokenizer_json: str | None = None  # carried in checkpoints so evaluation re-uses the exact tokenizer
        self._pending_row = self._restored_row = None  # (step, loss) of the latest step; see on_save_checkpoint
        self._keep_listed_decay = True  # False on resuming a run saved before `no_weight_decay` (on_load_checkpoint)
        # Not registered as a child (object.__setattr__): it is the model, or a compiled wrapper of it, whose
        # weights are registered once as `model.*`; registered, checkpoints held every weight twice.
        forward = self.model
        if compile:
            from rope_lm.train.compile import maybe_compile

            forward = maybe_compile(self.model)
        object.__setattr__(self, "_forward", forward)
        # Not registered as a child: its weights are the model's, already registered (and so checkpointed) once.
        object.__setattr__(self, "_training_loss", TrainingLoss(self.model, self.compiled_forward))

    def on_save_checkpoint(self, checkpoint):
        if self.tokenizer_json is not None:
            checkpoint["tokenizer_json"] = self.tokenizer_json
        # Lightning writes a step's checkpoint before that step's metrics reach the logger, so a kill
        # in between would lose the row for good; the checkpoint carries it (loggers.restore_row).
        if self._pending_row is not None:
            step, loss = self._pending_row
            if self._trainer is not None and self._trainer.world_size > 1:  # every rank saves: the logged mean
                loss = self._trainer.strategy.reduce(loss.clone(), reduce_op="mean")
            checkpoint["rope_lm_last_row"] = {"step": step, "metrics": {"train/loss": float(loss)}}
        checkpoint["rope_lm_train_pos_draws"] = self._draws

    def on_load_checkpoint(self, checkpoint):
        drop_second_copy(checkpoint)
        self.tokenizer_json = checkpoint.get("tokenizer_json")
        self._restored_row = checkpoint.get("rope_lm_last_row")
        self._draws = checkpoint.get("rope_lm_train_pos_draws", 0)
        # A run started before `no_weight_decay` existed (the learned position table decayed with the other
        # matrices) resumes with the optimizer groups its saved state has, not today's.
        groups = [len(g["params"]) for g in ((checkpoint.get("optimizer_states") or [{}])[0].get("param_groups") or [])]
        if groups and groups != decay_group_sizes(self.model, True) and groups == decay_group_sizes(self.model, False):
            self._keep_listed_decay = False

    def forward(self, idx):
        return self.model(idx)

    @property
    def compiled_forward(self):
        """The CompiledForward that the loss runs through with compile=True
        (its `compiled` and `reason` say whether torch.compile is in use), or
        None without compile."""
        return None if self._forward is self.model else self._forward

    def loss(self, batch, pos: torch.Tensor | None = None):
        """Mean next-token cross-entropy of a batch (x, y), through the
        compiled forward when there is one; pos (B, T): each sequence's
        position ids (None: plain positions)."""
        x, y = batch
        if pos is not None and not bool((pos == pos[:1]).all()):
            # The model reads one row of ids per call: a sequence at a time. Every row has T targets,
            # so the mean of the rows' means is the batch's mean.
            return torch.stack([self.loss((x[i : i + 1], y[i : i + 1]), pos[i : i + 1]) for i in range(len(x))]).mean()
        shards = self._sequence_shards(x.shape[1], x.device)
        if shards is not None:  # this device's T/K tokens: the mean over the group's devices is the batch's mean
            from rope_lm.train.context_parallel import split

            x, y = split(x, y, shards)
        return self._training_loss(x, y, None if pos is None else pos[0], shards)

    def _sequence_shards(self, seq_len: int, device):
        """This device's share of each sequence under context parallelism (rope_lm/train/context_parallel.py), else None."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if getattr(strategy, "context_parallel", 1) == 1:
            return None
        from rope_lm.train.context_parallel import sequence_shards

        key = (seq_len, str(device))
        if getattr(self, "_shards_key", None) != key:
            self._shards, self._shards_key = sequence_shards(self.device_mesh, seq_len, device), key
            if self.global_rank == 0:
                log.info(
                    "context parallelism: each sequence of %d tokens split over %d devices, %d tokens each "
                    "(PyTorch's head-tail shards)",
                    seq_len,
                    self._shards.size,
                    self._shards.local_len,
                )
        return self._shards

    def configure_model(self):
        """Under the sharded preset (rope_lm/train/sharding.py), each block and then
        the training loss become FSDP units; under context parallelism the same
        on the (data, context) mesh, sharded over its context dimension and
        replicated over its data one (rope_lm/train/context_parallel.py); under
        any other strategy, nothing."""
        if self.device_mesh is None or getattr(self, "_sharded", False):
            return
        from rope_lm.train.sharding import shard

        context = getattr(self.trainer.strategy, "context_parallel", 1) > 1
        mesh = self.device_mesh if context else self.device_mesh["data_parallel"]
        shard(self._training_loss, self.model.blocks, mesh, self.trainer.precision)
        self._sharded = True

    def draw_positions(self, x: torch.Tensor) -> torch.Tensor | None:
        """The next training batch's position ids (B, T), or None for plain positions."""
        if not self.train_positions.active:
            return None
        # Drawn per data-parallel replica: the devices that share a sequence (context parallelism) share its ids.
        rank = self.global_rank if self._trainer is None else data_replica(self._trainer)[0]
        ids = draw_batch(self.train_positions, self.hparams.seed, rank, self._draws, *x.shape)
        self._draws += 1
        return torch.from_numpy(ids).to(x.device)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch, self.draw_positions(batch[0]))
        # All ranks must agree, or one would skip a step the others take.
        finite = self.trainer.strategy.reduce_boolean_decision(bool(torch.isfinite(loss)), all=True)
        if not finite:
            return self._nonfinite(loss)
        # The mean over the ranks: the loss of the global batch, the curve one process would log.
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        self._pending_row = (logged_step(self.trainer), loss.detach())
        return loss

    def _nonfinite(self, loss):
        step, loss = self.global_step, loss.detach()
        if self.skips_left > 0:
            self.skips_left -= 1
            self.print(
                f"rope-lm: non-finite loss ({float(loss)}) at step {step}; skipping this batch "
                f"({self.skips_left} more skips allowed by trainer.skip_nonfinite)."
            )
            return None  # Lightning skips backward and the optimizer step
        cbs = self.trainer.checkpoint_callbacks
        saved = [cb.last_model_path for cb in cbs if cb.last_model_path] or [
            cb.best_model_path for cb in cbs if cb.best_model_path
        ]
        kept = (
            f"the last good checkpoint, {saved[0]}, is untouched"
            if saved
            else "no checkpoint had been saved yet, so there is nothing to resume"
        )
        raise TrainingDiverged(
            f"The training loss became {float(loss)} at step {step}. No update was applied with it, and {kept}. "
            f"Lower optim.lr, raise optim.warmup_steps or keep trainer.gradient_clip_val on; "
            f"trainer.skip_nonfinite=N skips up to N such batches instead of stopping."
        )

    def validation_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def on_validation_epoch_end(self):
        loss = self.trainer.callback_metrics.get("val/loss")
        if loss is not None:
            self.log("val/ppl", torch.exp(loss), sync_dist=True)

    def on_train_start(self):
        # The optimizer state restored on resume carries the learning rate of the old plan; a run
        # extended to a new trainer.max_steps continues on the schedule re-planned over the new total
        # (README). Elsewhere (a new run, a resume at the same total) this rewrites the same values.
        for config in self.trainer.lr_scheduler_configs:
            sched = config.scheduler  # LambdaLR: lr = base_lr * lambda(step), as its own step() computes it
            for group, base, factor in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
                group["lr"] = base * factor(self.global_step)
            # get_last_lr() keeps the restored value until the scheduler's next step() recomputes it from the
            # groups; nothing reads it before then (LearningRateMonitor reads the groups).
        if self._restored_row is not None and self.logger is not None:
            from rope_lm.train.loggers import restore_row

            restore_row(self.logger, self._restored_row)

    def configure_optimizers(self):
        opt, sched = build_optimizer(self.model, self.optim, self.max_steps, self._keep_listed_decay)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # Lightning refuses to clip for a fused optimizer under every mixed precision, because fp16's loss
        # scaler would unscale inside step(). bf16 has no scaler, so the gradients are the true ones and the
        # base precision plugin clips them; without this, CUDA's defaults (bf16-mixed, fused AdamW,
        # gradient_clip_val 1.0) stopped at the first step (seen on an H200, docs/benchmarks.md).
        from lightning.pytorch.plugins.precision import MixedPrecision, Precision
        from lightning.pytorch.utilities import GradClipAlgorithmType

        plugin = self.trainer.precision_plugin
        if gradient_clip_val and type(plugin) is MixedPrecision and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM)
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


class TrainingLoss(torch.nn.Module):
    """The training loss as a module of its own, so that a sharded run's root
    FSDP unit is entered before the loss reads the output head's weight
    (rope_lm/train/sharding.py)."""

    def __init__(self, model, compiled=None):
        super().__init__()
        self.model = model
        object.__setattr__(self, "compiled", compiled)  # shares the model's modules: not registered twice

    def forward(self, x, y, pos=None, shards=None):
        if self.compiled is None:
            # Chunked past CHUNK_TOKENS; the plain computation up to it.
            return mean_cross_entropy(self.model.hidden(x, pos, shards=shards), self.model.lm_head.weight, y)
        logits = self.compiled(x, pos)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def check_train_positions(cfg: ModelConfig, pos: dict, options: dict | None, length: int, layers) -> None:
    """Refuse, before any work, a training-time position method that windows
    of `length` tokens cannot train with: a model whose schemes read no ids,
    or ids past what a scheme serves without an extrapolation method (a
    learned table's rows). `layers`: the model's resolved layer specs
    (ModelConfig.resolve)."""
    method = build_train_positions(options)
    if not method.active:
        return
    method.check(length)
    method.check_schemes(
        [build_scheme(s.pos, cfg.dims()) for s in layers] if layers else [build_scheme(pos, cfg.dims())]
    )
    span = method.span(length)
    try:
        check_fit(cfg, pos, None, span, layers)
    except ConfigError as e:
        raise ConfigError(
            f"train_pos={method.label} gives training windows of {length} tokens position ids up to "
            f"{span - 1}, which the scheme must read as they are: {e}"
        ) from None


def _decay_split(model: torch.nn.Module, honour_listed: bool = True):
    """(parameters with weight decay, parameters without): matrices decay,
    except those a module lists in `no_weight_decay` (when honoured)."""
    kept = (
        {id(getattr(m, name)) for m in model.modules() for name in getattr(m, "no_weight_decay", ())}
        if honour_listed
        else set()
    )
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2 and id(p) not in kept]
    no_decay = [p for p in model.parameters() if p.requires_grad and (p.dim() < 2 or id(p) in kept)]
    return decay, no_decay


def decay_group_sizes(model: torch.nn.Module, honour_listed: bool = True) -> list[int]:
    return [len(g) for g in _decay_split(model, honour_listed)]


def build_optimizer(model: torch.nn.Module, o: OptimConfig, max_steps: int, honour_listed: bool = True):
    """(AdamW, per-step LR scheduler) as LitLM trains with: weight decay on
    matrices only (not on those a module lists in `no_weight_decay`), warmup
    then cosine decay over max_steps; fused on CUDA (or as optim.fused says).
    Public so that a loop outside Lightning (benchmarks/) steps the same
    optimizer."""
    # A module names the parameters that must keep their initial values where training never
    # reaches them (the learned position table's rows past L): weight decay would shrink them.
    decay, no_decay = _decay_split(model, honour_listed)
    fused = o.fused if o.fused is not None else bool(decay) and all(p.is_cuda for p in decay)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        **({"fused": True} if fused else {}),
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: warmup_cosine(step, o.warmup_steps, max_steps, o.min_lr_ratio)
    )
    return opt, sched


class TokensPerSecond(L.Callback):
    """Logs training throughput (tokens/s over the last logging interval)."""

    def __init__(self, every: int = 10):
        self.every = every
        self._t = None
        self._tokens = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._t is None:
            self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tokens += batch[0].numel() * data_replica(trainer)[1]
        if (batch_idx + 1) % self.every == 0:
            now = time.perf_counter()
            pl_module.log("train/tokens_per_s", self._tokens / max(1e-9, now - self._t), prog_bar=True)
            self._t, self._tokens = now, 0


class ProgressLog(L.Callback):
    """A line in the run's log at every validation (step of max_steps, losses,
    throughput, time left), so that a run in the background, whose progress
    bar goes nowhere, says where it is in train.log."""

    def __init__(self):
        self._start = None  # (time, step) when this process began training

    def on_train_start(self, trainer, pl_module):
        self._start = (time.perf_counter(), trainer.global_step)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero or self._start is None:
            return
        m = trainer.callback_metrics
        step, total = trainer.global_step, trainer.max_steps
        t0, step0 = self._start
        rate = (step - step0) / max(1e-9, time.perf_counter() - t0)
        left = f", about {_duration((total - step) / rate)} left" if rate > 0 and total > step else ""
        parts = [f"{k} {float(m[k]):.4f}" for k in ("train/loss", "val/loss") if k in m]
        if "train/tokens_per_s" in m:
            parts.append(f"{float(m['train/tokens_per_s']):,.0f} tokens/s")
        log.info("step %d/%d: %s%s", step, total, ", ".join(parts), left)


def _duration(seconds: float) -> str:
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{max(1, minutes)} min"
