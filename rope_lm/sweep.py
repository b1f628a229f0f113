"""The state of every job under a sweep or run folder, for compare.py: which
runs are complete, and which failed, were interrupted, are half-evaluated or
stopped before writing any results (so none is silently left out)."""

import json
import os

from rope_lm.report import RESULTS_JSON

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
    return {os.path.abspath(j["output_dir"]): j.get("error") for j in jobs if j.get("status") == "failed"}


def job_state(run_dir: str, failures: dict | None = None) -> dict:
    """{'dir', 'state', 'detail'}: state is complete, failed, interrupted,
    evaluating (some lengths missing) or no results."""
    path = os.path.join(run_dir, RESULTS_JSON)
    failures = failures or {}
    if not os.path.exists(path):
        error = failures.get(os.path.abspath(run_dir))
        return {"dir": run_dir, "state": "failed" if error else "no results",
                "detail": error or "the job stopped before writing results.json (killed, or crashed at start)"}
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        return {"dir": run_dir, "state": "no results", "detail": f"results.json is unreadable ({e})"}
    status = results.get("status", "complete")
    rows = results.get("results") or []
    expected = (results.get("eval") or {}).get("lengths") or []
    methods = max(1, len(results.get("methods") or {}))
    if status == "failed":
        return {"dir": run_dir, "state": "failed", "detail": results.get("error") or "failed"}
    if status == "interrupted":
        steps = (results.get("training") or {}).get("steps")
        return {"dir": run_dir, "state": "interrupted", "detail": f"stopped at step {steps}; resume with "
                f"python train.py resume={run_dir}"}
    if status == "evaluating" or (expected and len(rows) < len(expected) * methods):
        return {"dir": run_dir, "state": "evaluating",
                "detail": f"{len(rows)} of {len(expected) * methods or '?'} lengths evaluated"}
    return {"dir": run_dir, "state": "complete", "detail": f"{len(rows)} lengths evaluated"}


def sweep_jobs(paths: list[str]) -> list[dict]:
    """The state of every job folder under the given directories."""
    out = []
    for p in paths:
        if not os.path.isdir(p):
            continue
        failures = _failures(p)
        out += [job_state(d, failures) for d in job_dirs(p)]
    return out
