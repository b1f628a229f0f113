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

from rope_lm.core.errors import ConfigError
from rope_lm.scaling import method_label

log = logging.getLogger("rope_lm")
LOGGERS = ("wandb", "csv", "none")
WANDB_MODES = ("auto", "online", "offline", "disabled")


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


DEFAULT_INIT_TIMEOUT = 30  # seconds; wandb's own default (90 s, and Lightning asks twice) is a long silent wait


def check_options(options: dict):
    """The `logger` settings, checked before any work."""
    name = options.get("name", "none")
    if name not in LOGGERS:
        raise ConfigError(f"logger={name!r} is not a logger; use one of {', '.join(LOGGERS)}.")
    if name != "wandb":
        return
    if options.get("mode", "auto") not in WANDB_MODES:
        raise ConfigError(f"logger.mode={options['mode']!r} is not a wandb mode; use one of {', '.join(WANDB_MODES)}.")
    env = os.environ.get("WANDB_MODE")
    if env is not None and env not in ("online", "offline", "disabled", "dryrun", "run", "shared"):
        raise ConfigError(
            f"The environment variable WANDB_MODE={env!r} is not a wandb mode; unset it or set it to "
            f"online, offline or disabled (logger.mode={options.get('mode', 'auto')} applies when it "
            f"is unset)."
        )
    timeout = options.get("init_timeout", DEFAULT_INIT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ConfigError(
            f"logger.init_timeout={timeout!r} must be a positive number of seconds (how long wandb "
            f"may take to start a run before this run gives up on it)."
        )


def build_logger(options: dict, out_dir: str, run_name: str, config: dict | None = None, sweep_dir: str | None = None):
    """options: the `logger` config; config: the whole run config (for the
    tags); sweep_dir: the Hydra sweep directory in a multirun (else detected)."""
    check_options(options)
    name = options.get("name", "none")
    if name == "none":
        return None
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=out_dir, name="csv")  # version_N per (re)start: a resume never overwrites
    mode = wandb_mode(options.get("mode", "auto"))
    timeout = options.get("init_timeout", DEFAULT_INIT_TIMEOUT)
    make = dict(
        options=options, out_dir=out_dir, run_name=run_name, config=config, sweep_dir=sweep_dir, timeout=float(timeout)
    )
    try:
        return _started(mode=mode, **make)
    except Exception as e:  # wandb raises UsageError, CommError, or a timeout of its own: all mean "not online"
        if mode != "online":
            raise
        reason = " ".join(str(e).split()) or type(e).__name__
        if "online" in (options.get("mode"), os.environ.get("WANDB_MODE")):  # asked for, not just logged in
            asked = "logger.mode=online" if options.get("mode") == "online" else "WANDB_MODE=online"
            raise ConfigError(
                f"{asked}: wandb could not start an online run ({type(e).__name__}: {reason}; it waits at most "
                f"logger.init_timeout={timeout:g} s). Without network or a wandb login (wandb login, or "
                f"WANDB_API_KEY), run with logger.mode=offline (the run is kept under the run folder's wandb/ and "
                f"uploads later with wandb sync), or logger=csv. Nothing was trained."
            ) from None
        log.warning(
            "wandb could not start an online run (%s: %s; it waits at most logger.init_timeout=%g s); this "
            "run logs offline instead (logger.mode=offline skips the wait).",
            type(e).__name__,
            reason,
            timeout,
        )
        return _started(mode="offline", **make)


def drop_anonymous(logger) -> None:
    """Lightning passes anonymous=None to wandb.init, which wandb (>= 0.19) warns about on every run
    although it has no effect. The keyword list is Lightning's private `_wandb_init`: read only here,
    and pinned by tests/test_lit_lightning.py, which fails when Lightning renames or drops it."""
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict):
        init.pop("anonymous", None)


def _started(
    options: dict, out_dir: str, run_name: str, config: dict | None, sweep_dir: str | None, mode: str, timeout: float
):
    """A WandbLogger whose wandb run has started, so a failure to reach the
    server comes now, before training, after at most `timeout` seconds."""
    from lightning.pytorch.loggers import WandbLogger
    import wandb

    # Settings, not environment variables: wandb.login (wandb_mode) has started the wandb session,
    # and an environment variable changed after that is ignored with a warning.
    settings = {"init_timeout": timeout}
    if "WANDB_SILENT" not in os.environ:
        settings["silent"] = True
    logger = WandbLogger(
        project=options.get("project", "rope-lm"),
        entity=options.get("entity"),
        name=run_name,
        group=options.get("group") or sweep_group(out_dir, sweep_dir),
        tags=run_tags(config, options.get("tags") or []),
        save_dir=out_dir,
        mode=mode,  # passed to wandb.init directly: Lightning's offline flag sets an outdated env value
        settings=wandb.Settings(**settings),
    )
    drop_anonymous(logger)
    logger.rope_lm_mode = mode
    logger.experiment  # noqa: B018 (starts the run)
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
        log.info("wandb ran offline; upload this run with:  wandb sync %s", run_dir)
