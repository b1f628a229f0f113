"""The life of a run's folder, in one place: who may work in it, what it
holds, and what a run started there does (start, resume, only evaluate, or
skip).

Train runs (train.py), study continues (`existing=continue`) and task runs
(scripts/task.py) all ask `RunFolder.claim`, so they share one rule:

* a folder is worked in by one process at a time (a lock held until the
  process ends);
* a folder that holds another run's files is never written over; its own
  checkpoint (`resume=`) is the one way back in;
* with `existing=continue` a folder is finished, not redone: skipped when
  complete or held by another process, resumed from its last checkpoint,
  or only evaluated when its training is done; a folder recording other
  settings is refused, bookkeeping aside (run_settings).

The status a folder's results record and the status a sweep's jobs.json
records are one enum, `Status`.
"""

import dataclasses
from dataclasses import dataclass
import enum
import json
import os

from rope_lm.core.errors import ConfigError, OutputError, RopeLMError, UnwritableFolder
from rope_lm.core.files import atomic_write, write_json
from rope_lm.eval.results import RESULTS_JSON
from rope_lm.runs.run_settings import settings_differences

RUN_CONFIG = "run.yaml"  # the settings a run (re)started with; `resume=` reads them
LOCK = ".run.lock"


class Status(str, enum.Enum):
    """What a results file (results.json, task_results.json) or a sweep's
    jobs.json says of a run. A str, so the JSON holds the plain word."""

    COMPLETE = "complete"
    EVALUATING = "evaluating"  # trained; some lengths or methods not evaluated yet
    INTERRUPTED = "interrupted"  # stopped by a signal; resumable from its last checkpoint
    FAILED = "failed"
    SKIPPED = "skipped"  # jobs.json: existing=continue found nothing left for this process
    NO_RESULTS = "no results"  # stopped before writing any results

    def __str__(self) -> str:  # the word, in messages and tables, on every Python version
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def read(cls, word: str | None) -> "Status":
        """The status a file records; files older than this enum wrote
        "completed" in jobs.json, and results.json without a status is
        complete. A word this version does not know (a file edited by hand,
        or from a newer version) reads as no results, never as complete."""
        if word in (None, "completed"):
            return cls.COMPLETE
        try:
            return cls(word)
        except ValueError:
            return cls.NO_RESULTS


# --- what a run started in the folder does -------------------------------------------


@dataclass(frozen=True)
class Start:
    """Train from scratch (or from `ckpt`, another run's checkpoint, into this new folder)."""

    ckpt: str | None = None


@dataclass(frozen=True)
class Resume:
    """Continue training from the folder's own checkpoint."""

    ckpt: str
    steps: int


@dataclass(frozen=True)
class EvaluateOnly:
    """The training is done; finish the evaluation from the final checkpoint."""

    ckpt: str
    steps: int


@dataclass(frozen=True)
class Skip:
    """Nothing left for this process (existing=continue)."""

    reason: str


Decision = Start | Resume | EvaluateOnly | Skip


def describe(decision: Decision) -> str:
    """The line a study prints for each of its runs."""
    if isinstance(decision, Skip):
        return f"{decision.reason}; skipped"
    if isinstance(decision, EvaluateOnly):
        return "evaluating its final checkpoint"
    if isinstance(decision, Resume):
        return f"resuming from step {decision.steps}"
    return "starting"


class RunFolder:
    """One run's folder. `results` names its results file, `bookkeeping` the
    settings that may differ between sittings of one experiment."""

    def __init__(
        self,
        path: str,
        results: str = RESULTS_JSON,
        bookkeeping: frozenset = frozenset(),
        checkpoints: bool = True,
        setting: str = "hydra.run.dir",
    ):
        self.path = path
        self.setting = setting  # the setting that moves the folder, for a write that fails
        self.results = results
        self.bookkeeping = bookkeeping
        self.checkpoints = checkpoints  # task runs keep no resumable checkpoint
        self._lock = None
        self.new = False  # claimed for a run that started here (its failure may be recorded here)
        self.joined = False  # another process of a multi-process run: rank 0 claimed it and writes its files

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def last_checkpoint(self) -> str:
        return self.file(os.path.join("checkpoints", "last.ckpt"))

    # --- the lock ---------------------------------------------------------------------

    def lock(self) -> bool:
        """Take the folder's lock without waiting (held until release or the
        process ends); False when another process holds it."""
        from filelock import FileLock, Timeout

        if self._lock is not None:
            return True
        os.makedirs(self.path, exist_ok=True)
        lock = FileLock(self.file(LOCK))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        self._lock = lock
        return True

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- what it holds ------------------------------------------------------------------

    def read_results(self) -> dict | None:
        """The results file, or None when there is none or it cannot be read."""
        try:
            with open(self.file(self.results)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def state(self, failure: str | None = None) -> dict:
        """{'dir', 'state': Status, 'detail'}: from the results file, with a
        sweep's record of a job that failed before writing one (`failure`)."""
        path = self.file(self.results)
        if not os.path.exists(path):
            status = Status.FAILED if failure else Status.NO_RESULTS
            return {
                "dir": self.path,
                "state": status,
                "detail": failure or f"the job stopped before writing {self.results} (killed, or crashed at start)",
            }
        try:
            with open(path) as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            return {"dir": self.path, "state": Status.NO_RESULTS, "detail": f"{self.results} is unreadable ({e})"}
        status = Status.read(results.get("status"))
        rows = results.get("results") or []
        expected = (results.get("eval") or {}).get("lengths") or []
        methods = max(1, len(results.get("methods") or {}))
        if status == Status.NO_RESULTS:
            return {
                "dir": self.path,
                "state": status,
                "detail": f"{self.results} records a status this version does not know ({results.get('status')!r})",
            }
        if status == Status.FAILED:
            return {"dir": self.path, "state": status, "detail": results.get("error") or "failed"}
        if status == Status.INTERRUPTED:
            steps = (results.get("training") or {}).get("steps")
            return {
                "dir": self.path,
                "state": status,
                "detail": f"stopped at step {steps}; resume with python train.py resume={self.path}",
            }
        if status == Status.EVALUATING or (expected and len(rows) < len(expected) * methods):
            return {
                "dir": self.path,
                "state": Status.EVALUATING,
                "detail": f"{len(rows)} of {len(expected) * methods or '?'} lengths evaluated",
            }
        return {"dir": self.path, "state": Status.COMPLETE, "detail": f"{len(rows)} lengths evaluated"}

    def recorded_settings(self) -> dict | None:
        """The settings the folder's run recorded: run.yaml, else the config
        of its results file (runs written before run.yaml existed)."""
        import yaml

        if os.path.isfile(self.file(RUN_CONFIG)):
            try:
                with open(self.file(RUN_CONFIG)) as f:
                    saved = yaml.safe_load(f) or {}
            except (OSError, yaml.YAMLError) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ConfigError(
                    f"{self.file(RUN_CONFIG)} (the settings this folder's run recorded) cannot be read "
                    f"({first}), so it is not known whether this run is the same experiment. Restore "
                    f"the file, or give this run its own folder."
                ) from None
            if not isinstance(saved, dict):
                raise ConfigError(
                    f"{self.file(RUN_CONFIG)} does not hold a run's settings (a mapping); restore the "
                    f"file, or give this run its own folder."
                )
            return saved
        results = self.read_results()
        return None if results is None else results.get("config")

    def record_settings(self, settings: dict) -> None:
        if self.joined:
            return
        import yaml

        try:
            atomic_write(self.file(RUN_CONFIG), yaml.safe_dump(settings, sort_keys=False))
        except OutputError as e:
            raise e.reworded(setting=self.setting) from None

    def taken(self) -> list[str]:
        """The files of a run that this folder holds already."""
        names = [self.results] + (["checkpoints/last.ckpt", "checkpoints/best.ckpt"] if self.checkpoints else [])
        return [n for n in names if os.path.exists(self.file(n))]

    # --- the one decision -------------------------------------------------------------------

    def claim(
        self,
        settings: dict,
        existing: str = "refuse",
        ckpt: str | None = None,
        max_steps: int | None = None,
        what: str = "training",
    ) -> Decision:
        """Lock the folder and decide what a run with these settings does in
        it. `ckpt`: a checkpoint given to resume from (inside this folder: a
        resume; elsewhere: a new run starting from it). `max_steps`: the
        training the run asks for, to tell a resume from an evaluation.
        Raises ConfigError for what must not happen (another run's files,
        another process in a folder it may not skip, other settings)."""
        cont = existing == "continue"
        if not self.lock():
            if cont:
                return Skip("another process is running it")
            raise ConfigError(
                f"Another rope-lm process is running a {what} in {self.path} right now. Give this run its own folder "
                f"(leave hydra.run.dir at its default, which is unique per run, or choose another)"
                f"{'' if ckpt else ', or set existing=continue to skip a folder another process holds (a study shared by two shells or machines)'}."
            )
        try:
            decision = self._decide(settings, cont, ckpt, max_steps, what)
        except BaseException:
            self.release()
            raise
        if isinstance(decision, Skip):
            self.release()
        return decision

    def _decide(self, settings, cont, ckpt, max_steps, what) -> Decision:
        own = ckpt is not None and os.path.abspath(ckpt).startswith(os.path.abspath(self.path) + os.sep)
        if own:  # resume=: the run's own checkpoint is the one way back into a used folder
            steps = _steps(ckpt)
            done = max_steps is not None and steps >= max_steps
            if cont and done and self.state()["state"] == Status.COMPLETE:
                return Skip("its results are complete")
            return Resume(ckpt, steps)
        if not cont:
            taken = self.taken()
            if taken == [self.results] and self.state()["state"] == Status.FAILED:
                # Only the record of a run that failed before it trained a step (a refused setting):
                # nothing to keep but that record, which this run replaces.
                os.remove(self.file(self.results))
                taken = []
            if taken:
                raise ConfigError(self._refusal(taken, what, settings))
            self.new = True
            self.record_settings(settings)
            return Start(ckpt)
        recorded = self.recorded_settings()
        if recorded is not None:
            differ = settings_differences(recorded, settings, self.bookkeeping)
            if differ:
                shown = "; ".join(f"{key}: {a!r} there, {b!r} now" for key, a, b in differ[:4])
                raise ConfigError(
                    f"existing=continue: the run folder {self.path} holds a {what} run with other settings ({shown}"
                    f"{'; ...' if len(differ) > 4 else ''}), so it is neither skipped nor continued. Run the study's "
                    f"original command to finish it, or give these settings their own folder (another hydra.sweep.dir)."
                )
        if os.path.exists(self.file(self.results)) and self.state()["state"] == Status.COMPLETE:
            return Skip("its results are complete")
        if self.checkpoints and os.path.isfile(self.last_checkpoint):
            done = _steps(self.last_checkpoint)
            if max_steps is not None and done >= max_steps:
                return EvaluateOnly(self.last_checkpoint, done)
            return Resume(self.last_checkpoint, done)
        # Stopped before its first checkpoint (or a task run, which keeps none): nothing to keep
        # but the record of how it stopped.
        if os.path.exists(self.file(self.results)):
            os.remove(self.file(self.results))
        self.new = True
        self.record_settings(settings)
        return Start(ckpt)

    def _refusal(self, taken: list[str], what: str, settings: dict) -> str:
        recorded = self.recorded_settings()
        if recorded is not None and not settings_differences(recorded, settings, self.bookkeeping):
            # The same command run again (a sweep or study rerun): this folder is this run's own.
            return (
                f"The run folder {self.path} already holds a {what} run's results from these same settings "
                f"({', '.join(taken)}), so it was not started again. To skip it when its results are complete, "
                f"or finish it from its last checkpoint, run the same command with existing=continue"
                f"{'' if not self.checkpoints else f'; to train it longer: python train.py resume={self.path} trainer.max_steps=N'}."
            )
        if self.checkpoints:
            return (
                f"The run folder {self.path} already holds another run's files ({', '.join(taken)}); this run would "
                f"overwrite them, so it was not started. To continue that run: python train.py resume={self.path} "
                f"(with trainer.max_steps=N to train longer); to finish a study's runs, run its command again "
                f"with existing=continue; for a new run, leave hydra.run.dir at its default (unique per run) or "
                f"choose an empty folder."
            )
        return (
            f"{self.path} already holds a {what} run's results ({', '.join(taken)}); this run would overwrite them, "
            f"so it was not started. Leave hydra.run.dir at its default (unique per run), or set "
            f"existing=continue to skip a run whose results are complete."
        )


def _steps(ckpt: str) -> int:
    from rope_lm.train.checkpointing import read_checkpoint

    return int(read_checkpoint(ckpt).get("global_step") or 0)


# --- evaluation folders ----------------------------------------------------------------


def refuse_taken(out_dir: str, results: str = RESULTS_JSON) -> str:
    """An out= folder for an evaluation: refused when it holds results."""
    taken = [name for name in (results, "checkpoints") if os.path.exists(os.path.join(out_dir, name))]
    if taken:
        finish = (
            ""
            if "checkpoints" in taken
            else ", or add existing=continue to finish an evaluation that stopped part-way in it"
        )
        raise ConfigError(
            f"out={out_dir} already holds results ({', '.join(taken)}); an evaluation never overwrites another "
            f"run's or evaluation's files. Leave out= unset (a new folder inside the run: <run>/eval/<methods>/) "
            f"or give a new folder{finish}."
        )
    return out_dir


def check_writable(out_dir: str, setting: str = "hydra.run.dir (or the script's out=)") -> None:
    """The folder can be made and written, checked without leaving anything
    behind: a folder that does not exist yet is not made here."""
    missing = first_missing(out_dir)
    probe = os.path.dirname(missing) if missing else os.path.abspath(out_dir)
    if not os.path.isdir(probe):
        raise UnwritableFolder(
            f"The folder {out_dir} is not writable: {probe} is a file, not a folder. Set "
            f"{setting} to a writable place{_relative(out_dir)}."
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        import errno

        reason = "read-only file system" if _read_only(probe) else os.strerror(errno.EACCES).lower()
        raise UnwritableFolder(
            f"The folder {out_dir} is not writable ({probe}: {reason}). Set {setting} to a "
            f"writable place{_relative(out_dir)}."
        )


def first_missing(path: str) -> str | None:
    """The outermost folder of path that does not exist yet: what making it
    would create first (None when path exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def _relative(path: str) -> str:
    return "" if os.path.isabs(path) else f", or run from a writable directory (it is relative to {os.getcwd()})"


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


# --- the other processes of one multi-device run ---------------------------------------------

# Lightning starts the other ranks of a multi-device run (DDP, trainer=fsdp) by running the same command
# again; they must join rank 0's run, not claim its folder (whose lock rank 0 holds) as a second run.
RANKS_ENV = "ROPE_LM_CLAIMED_RUN"


def hand_to_ranks(path: str, decision: Decision) -> None:
    """Rank 0, once it holds the folder: the processes it starts later (they
    inherit its environment) take `decision` instead of claiming the folder."""
    if isinstance(decision, (Start, Resume)):
        os.environ[RANKS_ENV] = json.dumps(
            {
                "dir": os.path.abspath(path),
                "kind": type(decision).__name__,
                "ckpt": decision.ckpt,
                "steps": getattr(decision, "steps", None),
            }
        )


def rank_zero_claim(path: str) -> Decision | None:
    """The decision of the rank 0 that started this process for the same
    folder, or None where this process is no such rank."""
    given = os.environ.get(RANKS_ENV)
    if not given or os.environ.get("LOCAL_RANK", "0") == "0":  # Lightning gives the processes it starts theirs
        return None
    claim = json.loads(given)
    if claim["dir"] != os.path.abspath(path):
        return None
    return Resume(claim["ckpt"], claim["steps"]) if claim["kind"] == "Resume" else Start(claim["ckpt"])


def as_record(decision: Decision) -> dict:
    """A decision as plain values, for the other processes of a launched job (train/distributed.py)."""
    return {"kind": type(decision).__name__, **dataclasses.asdict(decision)}


def from_record(record: dict) -> Decision:
    kinds = {kind.__name__: kind for kind in (Start, Resume, EvaluateOnly, Skip)}
    values = dict(record)
    return kinds[values.pop("kind")](**values)


def record_failure(out_dir: str, config: dict, error: Exception, folder: RunFolder | None = None) -> None:
    """results.json of a run that stopped on an error says so (status failed
    and the message), so a sweep's comparison lists it. Only in a folder this
    run started anew (`folder.new`), or one where nothing was written before
    the error (no results, no checkpoints): another run's or a resumed run's
    results are never touched."""
    path = os.path.join(out_dir, RESULTS_JSON)
    if folder is not None and not folder.new:
        return
    if folder is None and any(os.path.exists(os.path.join(out_dir, n)) for n in (RESULTS_JSON, "checkpoints")):
        return
    results = {"status": Status.FAILED, "config": config, "methods": {}, "results": []}
    if folder is not None:
        results = folder.read_results() or results
    results.update(status=Status.FAILED, error=str(error))
    try:
        write_json(path, results)
    except (OSError, RopeLMError):
        pass  # the error being reported is likely this very disk
