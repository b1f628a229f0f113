"""A run's results as data: results.json's fields (new_results, filled in by
rope_lm.eval.evaluation) and the names of the files a run folder holds them
in. The views of the data (markdown, plot, wandb) are report.py's."""

import datetime
import os
import subprocess

from rope_lm.core.files import write_json

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "ppl_vs_length.png"

# The setting that names a run's controls (rope_lm.runs.eval_run.CONTROLS): methods evaluated on the run's
# own final weights after its own, adding rows and never changing them. A run given more of them is the same
# experiment (a study continues it, evaluating only the missing controls) and the same seed replica.
CONTROLS_SETTING = "eval.controls"


def git_commit() -> str | None:
    """The library's commit, `-dirty` when tracked files changed; None outside a git checkout."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def new_results(config: dict, corpus: dict, train_len: int, scheme: str, **extra) -> dict:
    """A results.json before any length is evaluated: when and from which
    commit, the scheme, the training length, the corpus (its fingerprint keys
    a comparison), the run's settings and `extra` (e.g. status); `methods`
    (label -> its options) and `results` (one row per method and length:
    ppl, its interval, per-position loss, ...) are filled in as the
    evaluation goes (rope_lm.runs.eval_run). With controls, `controls` (name ->
    its label, options and whether it applies to this model) is added, and each
    row of a method that is not a control gets `controls`: name -> {ratio, lo,
    hi, paired, units}, its PPL over the control's at that length on the same
    windows."""
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "scheme": scheme,
        "train_len": train_len,
        "corpus": corpus,
        "config": config,
        **extra,
        "methods": {},
        "results": [],
    }


def write_results(results: dict, out_dir: str):
    """(Re)write out_dir/results.json."""
    write_json(os.path.join(out_dir, RESULTS_JSON), results)
