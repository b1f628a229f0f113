"""Entry-point glue shared by train.py and scripts/: user errors as one
paragraph, Hydra jobs that fail without ending a sweep, and a sweep summary.

This is the one module of rope_lm that knows Hydra (tests/test_architecture.py
checks it); it reads no config file itself: each entry point names its own
conf/, and group_options/group_config ask the Hydra that the entry point set up.
"""

import atexit
import contextlib
import dataclasses
import functools
import json
import logging
import os
import secrets
import sys
import textwrap

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from rope_lm.core.errors import ConfigError, Interrupted, OutputError, RopeLMError
from rope_lm.core.files import check_room
from rope_lm.runs.run_folder import Status, check_writable

_RUN_IDS: dict[int, str] = {}


def _run_id() -> str:
    # Drawn on first use in each process, not at import: a process forked
    # from one that imported this module (a forkserver, a worker pool) gets
    # its own folder name.
    return _RUN_IDS.setdefault(os.getpid(), secrets.token_hex(3))


def register_resolvers() -> None:
    """${run_id:}: six hex digits drawn once per process, so that two runs
    started in the same second (two seeds, a script loop) get two folders;
    ${layout_tag:<layout>,<softmax>}: a layout's name and the softmax options
    beside the scheme's;
    ${train_tag:${train_pos}}: "" for plain training positions, else "-" and
    the method's label, so a run folder names how its ids were drawn;
    ${div:${data.seq_len},4}: whole-number division, so a setting that is a
    length (a layer's window) can be written relative to the training length;
    ${seed_tag:${seed},<default>}: "" at the config's default seed, else
    "_seed<N>", so a study's other seeds swept into the same folder get
    folders of their own while the folders of runs made before keep their names."""
    OmegaConf.register_new_resolver("run_id", _run_id, replace=True)
    # ${layout_tag:${oc.select:model.layout,null}}: "+<layout name>" in run folder names, "" without a layout.
    OmegaConf.register_new_resolver("layout_tag", _layout_tag, replace=True)
    OmegaConf.register_new_resolver("train_tag", _train_tag, replace=True)
    OmegaConf.register_new_resolver("div", _div, replace=True)
    OmegaConf.register_new_resolver("seed_tag", _seed_tag, replace=True)


def _seed_tag(seed, default) -> str:
    return "" if seed == default else f"_seed{seed}"


def _div(a, b) -> int:
    from rope_lm.core.errors import ConfigError

    if not (isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0 and a >= b):
        raise ConfigError(
            f"${{div:{a},{b}}} divides a length by a whole number: give two positive integers, the "
            f"first at least the second (e.g. ${{div:${{data.seq_len}},4}})."
        )
    return a // b


def _layout_tag(layout, softmax=None) -> str:
    from rope_lm.model.layout import scheme_label

    def plain(node):
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    return scheme_label({"name": ""}, {"layout": plain(layout), "softmax": plain(softmax)})


def _train_tag(options) -> str:
    from rope_lm.train_positions import train_positions_label

    options = OmegaConf.to_container(options, resolve=True) if OmegaConf.is_config(options) else options
    label = train_positions_label(options if isinstance(options, dict) else None)
    return "" if label == "none" else f"-{label}"


register_resolvers()


def script_settings(cfg, settings_class):
    """A script's composed config as its plain typed settings: the dataclass
    `settings_class` given the keys it names, resolved (a key the config
    does not hold, e.g. an optional group left out, keeps its default)."""
    options = OmegaConf.to_container(cfg, resolve=True)
    names = {f.name for f in dataclasses.fields(settings_class)}
    return settings_class(**{k: v for k, v in options.items() if k in names})


def log_to_stderr(level: int = logging.INFO) -> None:
    """rope-lm's log lines as every entry point writes them: `[rope_lm] ...`
    on standard error, standard output being the results'. A @hydra.main app
    finds the root logger already given Hydra's handler (its format, on
    standard output), so logging.basicConfig would change nothing there:
    the rope_lm logger gets its own handler and stops at it."""
    logger = logging.getLogger("rope_lm")
    if not any(getattr(h, "rope_lm_stderr", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        handler.rope_lm_stderr = True
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def paragraph(e: RopeLMError) -> str:
    kind = "configuration error" if isinstance(e, ConfigError) else "run stopped"
    # Paths and overrides stay whole (break_on_hyphens would split "pytest-of-root"), so a
    # command quoted in the message can be pasted back.
    return textwrap.fill(f"rope-lm: {kind}: {e}", width=100, break_on_hyphens=False, break_long_words=False)


def exit_status(e: RopeLMError) -> int:
    return getattr(e, "exit_status", 2 if isinstance(e, ConfigError) else 1)


@contextlib.contextmanager
def user_errors():
    """Turn a user-facing error into a one-paragraph message: exit status 2
    for a configuration error, 1 for a run that failed (e.g. diverged)."""
    try:
        yield
    except RopeLMError as e:
        print("\n" + paragraph(e), file=sys.stderr)
        sys.exit(exit_status(e))


class JobFailed(CompactHydraException):
    """A sweep job stopped by a user error. Hydra records it as a failed job
    and runs the others (a SystemExit would end the whole sweep); at the end
    it prints this message alone, without a traceback."""


def _multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def hydra_task(fn):
    """Wrap a Hydra task function: a RopeLMError becomes one paragraph (exit
    status 2 or 1) in a single run, and a failed job in a multirun."""

    @functools.wraps(fn)
    def task(cfg):
        try:
            return fn(cfg)
        except Interrupted as e:  # a stop during an evaluation: what was kept, then the sweep ends as on SIGTERM
            print("\n" + paragraph(e), file=sys.stderr)
            _note_interrupted()
            raise SystemExit(exit_status(e)) from None
        except RopeLMError as e:
            if _multirun():
                raise JobFailed(paragraph(e)) from None
            print("\n" + paragraph(e), file=sys.stderr)
            sys.exit(exit_status(e))
        except (SystemExit, KeyboardInterrupt):
            _note_interrupted()
            raise

    return task


def _note_interrupted() -> None:
    # SIGTERM or Ctrl-C ends the whole sweep; Hydra never reports this job's end, so the
    # sweep summary learns of it here.
    if _multirun():
        from hydra.core.hydra_config import HydraConfig

        INTERRUPTED.append((HydraConfig.get().job.num, HydraConfig.get().runtime.output_dir))


INTERRUPTED: list = []  # (job number, output folder) of a sweep job stopped by a signal


def _check_folder(path: str, setting: str, saves_config: str | None = None) -> None:
    try:
        check_writable(path, setting)
        if saves_config:  # Hydra writes the job's settings there first: a full disk would be its traceback
            check_room(path, setting)
    except RopeLMError as e:
        print("\n" + paragraph(e), file=sys.stderr)
        sys.exit(exit_status(e))


def _check_cache_folder(config) -> None:
    """data.cache_dir too, where the app has one and it is still to be made: a refusal there after Hydra
    made the run folder would leave a half-made run behind. A read-only cache folder that exists is
    left to the cache (a complete cache there is read, not written)."""
    try:
        cache_dir = OmegaConf.select(config, "data.cache_dir")
    except Exception:  # an interpolation this app cannot resolve yet: the run's own checks report it
        return
    if cache_dir and not os.path.exists(cache_dir):  # an existing one may hold a complete cache to read
        _check_folder(cache_dir, "data.cache_dir")


class SweepSummary(Callback):
    """Records every job of a multirun in <sweep dir>/jobs.json as it ends
    (status, overrides, output folder, error) and prints which jobs failed and
    why when the sweep is over, also when Hydra ends it on the first failure."""

    def __init__(self):
        self.jobs: list[dict] = []
        self.path: str | None = None
        self.skipped = 0
        self.printed = False
        self.unwritten: str | None = None  # why jobs.json could not be written, if it could not

    def on_run_start(self, config, **kwargs):
        # Hydra makes the run folder before the job starts: a read-only place is reported here, in
        # one paragraph, instead of as Hydra's traceback.
        _check_folder(config.hydra.run.dir, "hydra.run.dir", OmegaConf.select(config, "hydra.output_subdir"))
        _check_cache_folder(config)

    def on_multirun_start(self, config, **kwargs):
        _check_folder(config.hydra.sweep.dir, "hydra.sweep.dir", OmegaConf.select(config, "hydra.output_subdir"))
        _check_cache_folder(config)
        self.path = os.path.join(config.hydra.sweep.dir, "jobs.json")
        # Hydra re-raises the first failure after the last job, which skips
        # on_multirun_end; exit handlers still run.
        atexit.register(self.print_summary)

    def on_job_end(self, config, job_return, **kwargs):
        from hydra.core.utils import JobStatus

        if self.path is None:  # a single run: Hydra calls job callbacks there too
            return
        failed = job_return.status == JobStatus.FAILED
        error = job_return._return_value if failed else None
        returned = None if failed else job_return._return_value
        skipped = returned.get("skipped") if isinstance(returned, dict) else None
        self.skipped += bool(skipped)
        status = Status.FAILED if failed else Status.SKIPPED if skipped else Status.COMPLETE
        job = {
            "num": config.hydra.job.num,
            "status": status,
            "overrides": list(job_return.overrides or []),
            "output_dir": config.hydra.runtime.output_dir,
            "error": str(error) if error is not None else None,
        }
        if skipped:
            job["reason"] = skipped
        self._record(job)

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                return {j["output_dir"]: j for j in json.load(f)}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _record(self, job: dict, keep_overrides: bool = False):
        # A study is finished over several sittings, or by two processes at once, into one folder
        # (existing=continue): each write adds this one job to what the file holds now, so no process writes
        # back another's stale state; a skip (complete, or running elsewhere) never replaces a completed job.
        self.jobs.append(job)
        try:
            self._write(job, keep_overrides)
        except (OSError, OutputError) as e:
            # A full or read-only disk: Hydra would turn the callback's error into a warning of its own
            # and go on; the record stays in memory, and the summary says what the file lacks.
            self.unwritten = str(e).split(": ", 1)[-1] if isinstance(e, OutputError) else e.strerror or str(e)

    def _write(self, job: dict, keep_overrides: bool):
        from filelock import FileLock

        from rope_lm.core.files import atomic_write

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with FileLock(self.path + ".lock"):
            merged = self._read()
            before = merged.get(job["output_dir"])
            if keep_overrides and before:
                job["overrides"] = before.get("overrides", [])
            if not (job["status"] == Status.SKIPPED and before and Status.read(before["status"]) == Status.COMPLETE):
                merged[job["output_dir"]] = job
            atomic_write(
                self.path, json.dumps(sorted(merged.values(), key=lambda j: (j["num"], j["output_dir"])), indent=1)
            )

    def on_multirun_end(self, config, **kwargs):
        self.print_summary()

    def print_summary(self):
        if self.printed or not (self.jobs or INTERRUPTED):
            return
        self.printed = True
        if self.unwritten:
            print(
                f"\nrope-lm sweep: {self.path} could not be written ({self.unwritten.rstrip('.')}), so it does not list "
                f"every job below; each job's own folder holds its results. Free the space (or make the folder "
                f"writable) and run the same command again with existing=continue: finished jobs are skipped "
                f"and recorded.",
                file=sys.stderr,
            )
        if INTERRUPTED:
            num, out, ended = *INTERRUPTED[-1], len(self.jobs)
            self._record(
                {
                    "num": num,
                    "status": Status.INTERRUPTED,
                    "overrides": [],
                    "output_dir": out,
                    "error": "stopped by a signal (SIGTERM or Ctrl-C)",
                },
                keep_overrides=True,
            )
            print(
                f"\nrope-lm sweep: interrupted at job {num} ({out}) after {ended} job(s) ended; the "
                f"jobs after it did not run. Run the same command again with hydra.sweep.dir={os.path.dirname(out)} "
                f"to continue (existing=continue in the study presets; {self.path}).",
                file=sys.stderr,
            )
            return
        failed = [j for j in self.jobs if j["status"] == Status.FAILED]
        skipped = f", {self.skipped} of them skipped (existing=continue)" if self.skipped else ""
        if not failed:
            print(f"\nrope-lm sweep: all {len(self.jobs)} jobs completed{skipped} ({self.path}).", file=sys.stderr)
            return
        lines = [f"\nrope-lm sweep: {len(failed)} of {len(self.jobs)} jobs failed ({self.path}):"]
        for j in failed:
            reason = (j["error"] or "").replace("\n", " ")
            lines.append(f"  job {j['num']} [{' '.join(j['overrides'])}]: {reason}")
        print("\n".join(lines), file=sys.stderr)


def group_options(group: str) -> list[str]:
    """Names of the options of a config group (e.g. "scaling") in the config
    search path of the running Hydra app (or of hydra.initialize)."""
    from hydra.core.global_hydra import GlobalHydra

    return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def group_config(group: str, name: str) -> dict:
    """One option of a config group as a plain dict, e.g. ("scaling", "yarn"):
    what `<group>=<name>` selects for train.py. For an entry point that needs
    several options of one group at once (one table of several methods)."""
    import hydra
    from omegaconf import OmegaConf

    options = group_options(group)
    if name not in options:
        raise ConfigError(
            f"{group}={name!r} is not an option of the {group} config group; valid options are {', '.join(options)}."
        )
    cfg = hydra.compose(config_name=None, overrides=[f"+{group}={name}"])
    return OmegaConf.to_container(cfg[group], resolve=True)
