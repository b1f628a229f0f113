"""Kill -9 mid-training, resume with the documented command, and get the
same loss curve as an uninterrupted run; SIGTERM saves and exits cleanly."""

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import forked
from tests.conftest import ROOT, cli_overrides

STEPS = 200


def train_cmd(tiny_data_options, run_dir, **extra):
    extra = {
        "trainer.max_steps": STEPS,
        "trainer.val_every_n_steps": 50,
        "trainer.ckpt_every_n_steps": 10,
        "trainer.log_every_n_steps": 1,
        **extra,
    }
    return [sys.executable, "train.py", *cli_overrides(tiny_data_options, run_dir, **extra)]


def losses(run_dir) -> dict[int, float]:
    """train/loss by step, later (re)starts overriding earlier ones."""
    out = {}
    for path in sorted(
        glob.glob(os.path.join(run_dir, "csv", "version_*", "metrics.csv")),
        key=lambda p: int(p.split("version_")[1].split(os.sep)[0]),
    ):
        for row in csv.DictReader(open(path)):
            if row.get("train/loss"):
                out[int(row["step"])] = float(row["train/loss"])
    return out


def start_and_stop_after_checkpoint(cmd, run_dir, sig):
    proc = forked.start(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt = os.path.join(run_dir, "checkpoints", "last.ckpt")
    deadline = time.time() + 120
    while not os.path.exists(ckpt) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "training finished before it could be interrupted:\n" + proc.communicate()[0]
    proc.send_signal(sig)
    output = proc.communicate(timeout=120)[0]
    return proc.returncode, output


def test_sigkill_then_resume_matches_an_uninterrupted_run(tiny_data_options, tmp_path):
    full_dir, cut_dir = str(tmp_path / "full"), str(tmp_path / "cut")
    forked.run(train_cmd(tiny_data_options, full_dir), cwd=ROOT, check=True, capture_output=True)
    code, _ = start_and_stop_after_checkpoint(train_cmd(tiny_data_options, cut_dir), cut_dir, signal.SIGKILL)
    assert code == -signal.SIGKILL
    killed_at = max(losses(cut_dir))
    assert killed_at < STEPS - 1
    drop_row_of_last_checkpoint(cut_dir)
    # The documented resume: the run's own saved config, its directory as checkpoint.
    resume = [sys.executable, "train.py", f"resume={cut_dir}"]
    done = forked.run(resume, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert "Reusing token cache" in said and "Building token cache" not in said  # its text is not tokenized again
    full, resumed = losses(full_dir), losses(cut_dir)
    assert sorted(resumed) == sorted(full) == list(range(STEPS))
    assert [resumed[s] for s in range(STEPS)] == [full[s] for s in range(STEPS)]  # exact on CPU
    results = json.load(open(os.path.join(cut_dir, "results.json")))
    assert results["status"] == "complete" and results["training"]["steps"] == STEPS


def drop_row_of_last_checkpoint(run_dir):
    """The worst moment for a kill: Lightning has written a step's checkpoint
    but not yet that step's metrics row. Made certain here by removing the row."""
    import torch

    step = (
        torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=False)[
            "global_step"
        ]
        - 1
    )
    path = os.path.join(run_dir, "csv", "version_0", "metrics.csv")
    rows = list(csv.DictReader(open(path)))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r for r in rows if int(r["step"]) != step)
    assert step not in losses(run_dir)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_stop_signal_saves_a_checkpoint_and_partial_results(tiny_data_options, tmp_path, sig):
    run_dir = str(tmp_path / "stop")
    code, output = start_and_stop_after_checkpoint(train_cmd(tiny_data_options, run_dir), run_dir, sig)
    assert code not in (0, -sig) and "Traceback" not in output
    assert "Resume with:  python train.py resume=" in output
    results = json.load(open(os.path.join(run_dir, "results.json")))
    assert results["status"] == "interrupted" and 0 < results["training"]["steps"] < STEPS
    import torch

    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == results["training"]["steps"]
