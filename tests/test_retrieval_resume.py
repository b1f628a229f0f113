"""A resumed retrieval battery (scripts/retrieval.py existing=continue) proves
it continues the same thing, and a stopped one says what it kept: the model
is named by its weights, not its path; a cells file cut by a kill is repaired
with a warning; a rerun into a battery's folder is told about existing=continue;
SIGTERM reports the cells kept and the command that finishes them."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")
SMALL = ["tasks=[passkey]", "lengths=[128,160]", "samples=2", "depths=[0.0,1.0]", "haystack=filler", "bootstrap=0"]


def battery(*args, cwd=None, small=True):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "retrieval.py"), *(SMALL if small else []), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout + proc.stderr


def cells(out):
    with open(os.path.join(out, "cells.jsonl")) as f:
        return [json.loads(line) for line in f.read().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished battery (4 cells) on the fixture checkpoint."""
    out = str(tmp_path_factory.mktemp("battery") / "out")
    rc, text = battery(f"ckpt={FIXTURE}", f"out={out}")
    assert rc == 0, text
    return out


def test_the_model_is_recorded_by_its_weights_and_step(finished):
    head = cells(finished)[0]["settings"]
    assert set(head["model"]) == {"weights", "step"} and head["model"]["step"] == 3
    with open(os.path.join(finished, "retrieval.json")) as f:
        assert json.load(f)["model"] == head["model"]


def test_a_rerun_into_a_batterys_folder_is_told_about_existing_continue(finished):
    rc, text = battery(f"ckpt={FIXTURE}", f"out={finished}")
    assert rc == 2 and "existing=continue" in text and "Traceback" not in text, text


def test_the_same_checkpoint_by_another_path_continues(finished, tmp_path):
    copy = tmp_path / "copied_run"
    shutil.copytree(FIXTURE, copy)
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    rc, text = battery(f"ckpt={copy}/checkpoints/last.ckpt", f"out={out}", "existing=continue")
    assert rc == 0, text
    assert "4 cell(s) scored before" in text


def test_another_model_under_the_same_path_is_refused_naming_both(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for key in saved["state_dict"]:  # other weights, same path and step (every copy of the tensor: the
        if key.endswith("blocks.0.attn.qkv.weight"):  # module is registered as `model` and `_forward`)
            saved["state_dict"][key] = saved["state_dict"][key] + 1.0
    torch.save(saved, run / "checkpoints" / "last.ckpt")
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    head = cells(out)[0]["settings"]["model"]
    rc, text = battery(f"ckpt={run}", f"out={out}", "existing=continue")
    flat = " ".join(text.split())
    assert rc == 2 and "another model" in flat and head["weights"] in flat, text
    assert "Traceback" not in text


def test_a_cells_file_cut_by_a_kill_is_repaired_with_a_warning(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    path = out / "cells.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # the last cell cut mid-write
    rc, text = battery(f"ckpt={FIXTURE}", f"out={out}", "existing=continue")
    assert rc == 0, text
    assert "cells.jsonl: its last line was cut" in text
    assert len(cells(out)) == len(lines)  # every line whole again: the cut cell was scored anew


def test_sigterm_says_what_was_kept_and_how_to_finish(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "retrieval.py"),
            f"ckpt={FIXTURE}",
            f"out={out}",
            "tasks=[passkey]",
            "lengths=[128,160,192,224,256,288,320,352]",
            "depths=[0.0,0.25,0.5,0.75,1.0]",
            "samples=40",
            "haystack=filler",
            "bootstrap=0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "cells.jsonl").exists():
        time.sleep(0.2)
    assert (out / "cells.jsonl").exists(), "no cell was scored in time"
    proc.send_signal(signal.SIGTERM)
    text = proc.communicate(timeout=120)[0]
    flat = " ".join(text.split())
    assert proc.returncode == 143, text
    kept = len(cells(out)) - 1
    assert kept < 40 and f"{kept} of 40 cells of the battery are kept" in flat, text
    assert "existing=continue" in flat and f"out={out}" in flat
    finish = shlex.split(flat.split("Finish it with: ")[1])
    assert finish[:2] == ["python", "scripts/retrieval.py"]
    rc, text = battery(*finish[2:], "bootstrap=0", cwd=ROOT, small=False)
    assert rc == 0, text
    assert len(cells(out)) - 1 == 40
