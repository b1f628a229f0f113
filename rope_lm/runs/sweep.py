"""The state of every job under a sweep or run folder, for compare.py: which
runs are complete, and which failed, were interrupted, are half-evaluated or
stopped before writing any results (so none is silently left out)."""

import json
import os

from rope_lm.eval.results import RESULTS_JSON
from rope_lm.runs.run_folder import RunFolder, Status

SKIP_DIRS = {"checkpoints", "wandb", "csv", "compare", "eval", "diagnostics", ".hydra", "__pycache__"}


def job_dirs(root: str) -> list[str]:
    """Folders under root that a train.py job made: they hold .hydra/ (Hydra
    writes it before the job starts) or a results.json."""
    found = []
    for here, dirs, files in os.walk(root):
        if ".hydra" in dirs or RESULTS_JSON in files:
            found.append(os.path.abspath(here))
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
    return found


def _failures(root: str) -> dict:
    """output dir -> error, from the jobs.json a sweep writes (rope_lm.cli.SweepSummary)."""
    path = os.path.join(root, "jobs.json")
    try:
        with open(path) as f:
            jobs = json.load(f)
    except (OSError, ValueError):
        return {}
    return {
        os.path.abspath(j["output_dir"]): j.get("error") for j in jobs if Status.read(j.get("status")) == Status.FAILED
    }


def job_state(run_dir: str, failures: dict | None = None) -> dict:
    """{'dir', 'state': Status, 'detail'} of one train.py job's folder."""
    return RunFolder(run_dir).state((failures or {}).get(os.path.abspath(run_dir)))


def sweep_jobs(paths: list[str]) -> list[dict]:
    """The state of every job folder under the given directories."""
    out = []
    for p in paths:
        if not os.path.isdir(p):
            continue
        failures = _failures(p)
        out += [job_state(d, failures) for d in job_dirs(p)]
    return out
