"""Shared steps of the scripts/study_*.py drivers: train through train.py,
evaluate through scripts/eval_extrapolation.py (each a subprocess, so a study
runs exactly the commands a person would), then compare in-process."""

import datetime
import os
import shlex
import subprocess
import sys

from rope_lm.core.errors import ConfigError, RopeLMError

# The study drivers run the repository's own entry points, which sit next to scripts/.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StepFailed(RopeLMError):
    """A study step (a train.py or eval_extrapolation.py run) exited with an error."""


def check_overrides(overrides: list[str]):
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)}: the train= entries are train.py overrides, key=value "
            f"(e.g. \"train=['data=wikitext2','data.seq_len=256']\")."
        )


def study_dir(name: str, out: str | None) -> str:
    return out or os.path.join("outputs", "studies", name, datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))


def run_step(title: str, args: list[str]):
    """Run one command, streaming its output; a failure stops the study with
    the command to rerun by hand."""
    # Scripts by absolute path, run from the caller's directory: relative paths in overrides
    # (data.path=...) mean what they would on the command line.
    script = os.path.join(REPO, args[0])
    cmd = [sys.executable, script, *args[1:]]
    shown = shlex.join(["python", os.path.relpath(script), *args[1:]])
    print(f"\n=== {title}\n$ {shown}\n", flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise StepFailed(
            f"Study step '{title}' failed (exit status {rc}); its own message is above. "
            f"Fix it and rerun the step by hand: {shown}"
        )


def train(run_dir: str, experiment: str, overrides: list[str]) -> str:
    run_step(
        f"train ({experiment})",
        ["train.py", f"+experiment={experiment}", f"hydra.run.dir={os.path.abspath(run_dir)}", *overrides],
    )
    return run_dir


def token_budget(run_dir: str, default: int = 16384) -> int:
    """The training run's own evaluation budget, so zero-shot evaluations score the same tokens."""
    import json

    path = os.path.join(run_dir, "results.json") if os.path.isdir(run_dir) else None
    if path and os.path.exists(path):
        with open(path) as f:
            return int((json.load(f).get("eval") or {}).get("token_budget") or default)
    return default


def applicable(scheme, names: list[str]) -> tuple[list[str], list[str]]:
    """(names of scaling methods that apply to the scheme, notes on the others);
    method options come from the running Hydra app's scaling group."""
    from rope_lm.cli import group_config
    from rope_lm.scaling import build_scaling

    ok, skipped = [], []
    for name in names:
        options = group_config("scaling", name)  # outside the try: an unknown name is the user's error
        try:
            build_scaling(options).check(scheme)
            ok.append(name)
        except ConfigError as e:
            skipped.append(f"{name}: {str(e).split(';')[0]}")
    return ok, skipped


def evaluate(ckpt: str, methods: list[str], out: str, settings: list[str]):
    """A zero-shot evaluation step; a study run again skips it once its
    results are complete, and redoes it (deterministic) if they are not."""
    from rope_lm.eval.results import RESULTS_JSON
    from rope_lm.runs.run_folder import Status
    from rope_lm.runs.sweep import job_state

    results = os.path.join(out, RESULTS_JSON)
    if os.path.exists(results):
        import json

        with open(results) as f:
            done = [m.get("name") for m in (json.load(f).get("config") or {}).get("methods") or []]
        if sorted(done) != sorted(methods):
            raise ConfigError(
                f"{out} holds an evaluation of other methods ({', '.join(map(str, done))}, not "
                f"{', '.join(methods)}); give this study its own out= folder."
            )
        if job_state(out)["state"] == Status.COMPLETE:
            print(f"\n=== zero-shot evaluation ({', '.join(methods)}): {out} is complete; skipped", flush=True)
            return
        os.remove(results)  # a part-way evaluation of this same step: measured again from the start
    run_step(
        f"zero-shot evaluation ({', '.join(methods)})",
        [
            "scripts/eval_extrapolation.py",
            f"ckpt={os.path.abspath(ckpt)}",
            f"scaling={','.join(methods)}",
            *settings,
            f"out={os.path.abspath(out)}",
        ],
    )


def compare_and_report(paths: list[str], out: str, title: str, group: bool, wandb: bool, wandb_group: str | None):
    from rope_lm.compare.ppl import compare
    from rope_lm.compare.ppl_wandb import log_to_wandb

    summary = compare(paths, out, group=group, title=title)
    print("\n" + open(summary["files"]["markdown"]).read())
    if wandb:
        offline = log_to_wandb(summary, group=wandb_group)
        if offline:
            print(f"wandb ran offline; upload the summary run with:  wandb sync {offline}")
    return summary


def compare_command(paths: list[str], out: str, group: bool) -> str:
    """The scripts/compare.py command line that redoes a study's comparison."""
    return shlex.join(
        ["python", "scripts/compare.py", f"paths=[{','.join(paths)}]", *(["group=true"] if group else []), f"out={out}"]
    )
