"""Nothing lost: atomic checkpoints, a checkpoint on SIGTERM / Ctrl-C, and a
refusal to resume a checkpoint into a different model."""

import logging
import os
import signal

import lightning as L
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
import torch

from rope_lm.core.errors import ConfigError, TrainingDiverged
from rope_lm.core.files import replaced_atomically
from rope_lm.model.layout import UNRESOLVED
from rope_lm.model.recompute import SETTING

log = logging.getLogger("rope_lm")

# Settings that must match for a checkpoint's weights to mean the same thing.
MODEL_IDENTITY = ("model", "pos", "vocab_size", "train_len")


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file in the same folder, then rename: a kill
    mid-write leaves the previous checkpoint, never a truncated one."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        # torch reports a full disk as RuntimeError("[enforce fail ..."), not OSError.
        with replaced_atomically(str(path), errors=(OSError, RuntimeError)) as tmp:
            torch.save(checkpoint, tmp)


class FiniteWeights(L.Callback):
    """The weights a checkpoint or the final evaluation would read are checked first. The loss
    check (lit.LitLM.training_step) comes before a step's update, so an update that makes a
    weight non-finite is seen only by the next step's loss, and the last step has no next
    step: without this check its checkpoint and results would hold NaN weights as complete.
    A failed check stops the run before the file is written, so the checkpoint on disk is the
    last finite one."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self.check(trainer, pl_module, "before its checkpoint was written")

    def on_train_end(self, trainer, pl_module):
        self.check(trainer, pl_module, "at the end of training, before the evaluation")

    @staticmethod
    def check(trainer, pl_module, when: str) -> None:
        local = all(bool(torch.isfinite(getattr(p, "_local_tensor", p)).all()) for p in pl_module.parameters())
        if trainer.strategy.reduce_boolean_decision(local, all=True):
            return
        # last.ckpt first: it is what `resume=` reads.
        paths = [cb.last_model_path for cb in trainer.checkpoint_callbacks]
        paths += [cb.best_model_path for cb in trainer.checkpoint_callbacks]
        on_disk = [p for p in paths if p and os.path.exists(p)]
        kept = (
            f"the last finite checkpoint, {on_disk[0]}, is untouched (resume from it with a lower optim.lr)"
            if on_disk
            else "no checkpoint had been written yet, so there is nothing to resume"
        )
        raise TrainingDiverged(
            f"The weights became non-finite (NaN or infinite) in the update of step {trainer.global_step} (counting from 1), "
            f"found {when}; its loss was finite, so the loss check could not see it. Nothing of that step "
            f"was saved, and {kept}. Lower optim.lr, raise optim.warmup_steps or keep "
            f"trainer.gradient_clip_val on."
        )


class GracefulStop(L.Callback):
    """SIGTERM (Lightning's handler) or a first Ctrl-C: finish the current step,
    save checkpoints/last.ckpt, call ``on_stop(trainer)`` to write partial
    results, and exit. A second Ctrl-C interrupts at once."""

    def __init__(self, ckpt_dir: str, on_stop=None):
        self.ckpt_dir = ckpt_dir
        self.on_stop = on_stop
        self.requested = False
        self._previous = None

    def on_fit_start(self, trainer, pl_module):
        def handler(signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
            log.warning("Ctrl-C: stopping after this step and saving a checkpoint (press again to abort at once).")

        try:
            self._previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self._previous = None

    def on_fit_end(self, trainer, pl_module):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.requested:
            raise SIGTERMException(130)

    def on_exception(self, trainer, pl_module, exception):
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        path = os.path.join(self.ckpt_dir, "last.ckpt")
        trainer.save_checkpoint(path)
        if self.on_stop is not None and trainer.is_global_zero:
            self.on_stop(trainer)
        log.warning(
            "Stopped at step %d; checkpoint saved to %s. Resume with:  python train.py resume=%s",
            trainer.global_step,
            path,
            os.path.dirname(self.ckpt_dir),
        )


def resolve_checkpoint(path: str | None, setting: str = "ckpt") -> str:
    """A .ckpt file, or a run directory (its checkpoints/last.ckpt)."""
    if not path:
        raise ConfigError(f"{setting}= is required: a .ckpt file or a run directory with checkpoints/last.ckpt.")
    candidate = os.path.join(path, "checkpoints", "last.ckpt") if os.path.isdir(path) else path
    if not os.path.isfile(candidate):
        raise ConfigError(
            f"{setting}={path!r} is not a checkpoint file or a run directory with checkpoints/last.ckpt "
            f"(resolved from {os.getcwd()})."
        )
    return candidate


def read_checkpoint(path: str) -> dict:
    """The checkpoint dict of a rope-lm .ckpt file, or a ConfigError that says
    why it is not one (empty, unreadable, another kind of file) and names an
    intact checkpoint beside it, if there is one."""
    try:
        return _read_checkpoint(path)
    except ConfigError as e:
        intact = _intact_siblings(path)
        if not intact:
            raise
        shown = "; ".join(f"{p} (step {step})" for p, step in intact)
        raise ConfigError(
            f"{e} The folder also holds an intact checkpoint: {shown}. To resume from it: python "
            f"train.py resume=<run> ckpt_path={intact[0][0]}; or give it as ckpt= to evaluate it."
        ) from None


def _intact_siblings(path: str) -> list[tuple[str, int]]:
    """Other readable rope-lm checkpoints in the folder of a damaged one, newest step first."""
    folder = os.path.dirname(os.path.abspath(path))
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        other = os.path.join(folder, name)
        if name.endswith(".ckpt") and os.path.abspath(other) != os.path.abspath(path):
            try:
                found.append((other, int(_read_checkpoint(other).get("global_step") or 0)))
            except ConfigError:
                continue
    return sorted(found, key=lambda f: -f[1])


def _read_checkpoint(path: str) -> dict:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ConfigError(f"The checkpoint {path} cannot be read ({e.strerror}).") from None
    if size == 0:
        raise ConfigError(
            f"The checkpoint {path} is empty (0 bytes): it is not a checkpoint (a write that never "
            f"finished, or a placeholder). Give a checkpoint that train.py wrote, e.g. "
            f"<run>/checkpoints/last.ckpt."
        )
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except OSError as e:
        raise ConfigError(f"The checkpoint {path} cannot be read ({e.strerror}).") from None
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(
            f"{path} is not a checkpoint ({size} bytes that torch.load cannot read: {type(e).__name__}"
            f"{': ' + first if first else ''}). Give a checkpoint that train.py wrote, e.g. "
            f"<run>/checkpoints/last.ckpt."
        ) from None
    if not isinstance(saved, dict) or "state_dict" not in saved or "hyper_parameters" not in saved:
        raise ConfigError(
            f"{path} is a torch file but not a rope-lm checkpoint (it has no state_dict and "
            f"hyper_parameters). Give a checkpoint that train.py wrote."
        )
    return saved


def load_checkpoint(path: str, device: str = "cpu", setting: str = "ckpt", layers=UNRESOLVED):
    """(LitLM in eval mode, checkpoint file) from a .ckpt file or a run directory;
    `layers`: its model's layer specs where the caller has them resolved."""
    from rope_lm.train.lit import LitLM, drop_second_copy

    ckpt = resolve_checkpoint(path, setting)
    saved = read_checkpoint(ckpt)
    try:
        lit = LitLM(**saved["hyper_parameters"], layers=layers)
        drop_second_copy(saved)
        lit.load_state_dict(saved["state_dict"])
        lit.trained_step = saved.get("global_step")  # what results read from it record (Trained.step)
    except (TypeError, KeyError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(
            f"{ckpt} does not hold a model this version of rope-lm can build ({type(e).__name__}: {first})."
        ) from None
    lit.on_load_checkpoint(saved)
    lit.to(device).eval()
    return lit, ckpt


def check_resumable(ckpt_path: str, hparams: dict, saved_hparams: dict | None = None):
    """Refuse, before any work, to resume a checkpoint whose model differs
    (saved_hparams: the checkpoint's, when the caller has read them already)."""
    old = saved_hparams if saved_hparams is not None else read_checkpoint(ckpt_path).get("hyper_parameters") or {}

    def identity(hp, key):  # recomputing activations (or not) changes no weight
        value = hp.get(key)
        return {k: v for k, v in value.items() if k != SETTING} if key == "model" and isinstance(value, dict) else value

    diffs = [
        f"{k}: checkpoint {old.get(k)!r} vs now {hparams.get(k)!r}"
        for k in MODEL_IDENTITY
        if identity(old, k) != identity(hparams, k)
    ]
    if diffs:
        raise ConfigError(
            f"Cannot resume {ckpt_path}: it was trained with a different model ({'; '.join(diffs)}). "
            f"Resume with the run's own settings (`python train.py resume=<run dir>`), or start a new run with "
            f"init_from= to fine-tune its weights."
        )
