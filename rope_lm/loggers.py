"""Lightning loggers from the `logger` config: wandb (default), csv or none.

On wandb, the runs of one study share a group and carry tags for the scheme,
the extrapolation method and the training length, so a dashboard can filter
and compare them: the group is `logger.group` (experiment presets set it to
the study's name), else, in a Hydra multirun, the sweep directory.
"""

import csv
import glob
import logging
import os

from rope_lm.errors import ConfigError
from rope_lm.scaling import method_label

log = logging.getLogger("rope_lm")
LOGGERS = ("wandb", "csv", "none")


def wandb_mode(requested: str) -> str:
    """'online' when the user is logged in to wandb, else 'offline': never a prompt."""
    if os.environ.get("WANDB_MODE") in ("offline", "online", "disabled"):
        return os.environ["WANDB_MODE"]
    if requested != "auto":
        return requested
    import wandb

    return "online" if wandb.login(prompt=False, verify=False) else "offline"


def run_tags(config: dict | None, extra=()) -> list[str]:
    """scheme:<pos.name>, method:<scaling label>, train_len:<data.seq_len>,
    data:<data.name> (and finetune for init_from runs), then `logger.tags`."""
    tags = []
    if config:
        pos, data = config.get("pos") or {}, config.get("data") or {}
        if pos.get("name"):
            tags.append(f"scheme:{pos['name']}")
        tags.append(f"method:{method_label(config.get('scaling'))}")
        if data.get("seq_len"):
            tags.append(f"train_len:{data['seq_len']}")
        if data.get("name"):
            tags.append(f"data:{data['name']}")
        if config.get("init_from"):
            tags.append("finetune")
    # wandb refuses tags longer than 64 characters
    return list(dict.fromkeys(str(t)[:64] for t in [*tags, *extra]))


def sweep_group(out_dir: str, sweep_dir: str | None = None) -> str | None:
    """The wandb group of a multirun job without logger.group: its sweep
    directory, relative to the working directory and without the leading
    `multirun/`. Without sweep_dir, a parent holding Hydra's multirun.yaml
    (written at the start of every sweep) marks a sweep job."""
    if sweep_dir is None:
        parent = os.path.dirname(os.path.abspath(out_dir))
        if not os.path.exists(os.path.join(parent, "multirun.yaml")):
            return None
        sweep_dir = parent
    rel = os.path.relpath(os.path.abspath(sweep_dir))
    if rel.startswith(".."):
        rel = os.path.basename(os.path.normpath(sweep_dir))
    parts = rel.split(os.sep)
    if len(parts) > 1 and parts[0] == "multirun":
        parts = parts[1:]
    return "/".join(parts)


def build_logger(options: dict, out_dir: str, run_name: str, config: dict | None = None, sweep_dir: str | None = None):
    """options: the `logger` config; config: the whole run config (for the
    tags); sweep_dir: the Hydra sweep directory in a multirun (else detected)."""
    name = options.get("name", "none")
    if name not in LOGGERS:
        raise ConfigError(f"logger={name!r} is not a logger; use one of {', '.join(LOGGERS)}.")
    if name == "none":
        return None
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=out_dir, name="csv")  # version_N per (re)start: a resume never overwrites
    from lightning.pytorch.loggers import WandbLogger

    mode = wandb_mode(options.get("mode", "auto"))
    os.environ.setdefault("WANDB_SILENT", "true")
    logger = WandbLogger(
        project=options.get("project", "rope-lm"), entity=options.get("entity"), name=run_name,
        group=options.get("group") or sweep_group(out_dir, sweep_dir),
        tags=run_tags(config, options.get("tags") or []), save_dir=out_dir,
        mode=mode,  # passed to wandb.init directly: Lightning's offline flag sets an outdated env value
    )
    logger.rope_lm_mode = mode
    return logger


def restore_row(logger, row: dict):
    """Log a resumed checkpoint's last row ({"step", "metrics"}) if no earlier
    CSV version holds it (a kill landed between the checkpoint and the row).
    Other loggers keep their own record of what reached them."""
    if logger.__class__.__name__ != "CSVLogger":
        return
    current = os.path.abspath(logger.log_dir)
    for path in glob.glob(os.path.join(logger.root_dir, "version_*", "metrics.csv")):
        if os.path.abspath(os.path.dirname(path)) == current:
            continue
        with open(path, newline="") as f:
            for line in csv.DictReader(f):
                if line.get("step") == str(row["step"]) and all(line.get(k) for k in row["metrics"]):
                    return
    logger.log_metrics(row["metrics"], step=row["step"])


def finish(logger):
    if logger is None or logger.__class__.__name__ != "WandbLogger":
        return
    import wandb

    run = logger.experiment
    run_dir = os.path.dirname(run.dir) if getattr(run, "dir", None) else None
    wandb.finish()
    if getattr(logger, "rope_lm_mode", "") == "offline" and run_dir:
        log.info("wandb ran offline (not logged in); upload this run with:  wandb sync %s", run_dir)
