"""A device that is not there: every script that opens a model refuses
`device=cuda` on a machine without one in one paragraph (exit status 2, no
traceback) before any work, and `auto` takes the CPU. torch's own answer is
an AssertionError from inside the first `.to()`."""

import os
import subprocess
import sys

import pytest
import torch

from rope_lm.core.devices import resolve_device
from rope_lm.core.errors import ConfigError
from tests.conftest import ROOT

RUN = os.path.join(ROOT, "tests", "fixtures", "run_before_house")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@no_cuda
def test_cuda_on_a_machine_without_one_is_one_paragraph():
    with pytest.raises(ConfigError, match=r"device=cuda but this machine has no CUDA device.*device=cpu"):
        resolve_device("cuda")


def test_auto_takes_what_there_is_and_cpu_is_always_there():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"


def test_a_gpu_index_past_the_machines_is_refused_naming_the_ones_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device=cuda:3 but this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:1") == "cuda:1"


@pytest.mark.parametrize("name", ["gpu", "tpu", "cuda:x"])
def test_a_device_name_that_is_no_device_is_refused(name):
    with pytest.raises(ConfigError, match=r"device="):
        resolve_device(name)


@no_cuda
@pytest.mark.parametrize(
    "script, args",
    [
        ("generate.py", [f"ckpt={RUN}", "prompt='ab'", "max_new_tokens=2"]),
        ("retrieval.py", [f"ckpt={RUN}"]),
        ("search.py", [f"ckpt={RUN}"]),
        ("eval_extrapolation.py", [f"ckpt={RUN}"]),
    ],
)
def test_each_script_refuses_cuda_without_one_before_any_work(script, args, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", script), *args, "device=cuda", f"hydra.run.dir={out}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "no CUDA device" in text and "Traceback" not in text, text
