"""scripts/eval_extrapolation.py existing=continue finishes a part-way
evaluation only of the model it started with: known by its weights and step
(results.json records them, with the step a model still training was read
at), not by the path it was given. The same checkpoint by another path
continues; another model under the same path is refused, both shown; other
settings are refused with the values before and now."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, write_corpus

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def evaluate(run, out, corpus, *extra):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "eval_extrapolation.py"),
            f"ckpt={run}",
            f"data.path={corpus}",
            f"data.cache_dir={os.path.dirname(out)}/cache",
            "eval.multipliers=[1,2]",
            "eval.token_budget=128",
            "eval.batch_tokens=128",
            f"out={out}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def part_way(out):
    """The folder as a stop after the first length leaves it."""
    path = os.path.join(out, "results.json")
    with open(path) as f:
        results = json.load(f)
    results["status"], results["results"] = "evaluating", results["results"][:1]
    with open(path, "w") as f:
        json.dump(results, f)
    return results


@pytest.fixture
def stopped(tmp_path, corpus):
    out = str(tmp_path / "eval")
    rc, text = evaluate(FIXTURE, out, corpus)
    assert rc == 0, text
    return out, part_way(out)


def test_the_evaluation_records_the_model_by_weights_and_step(stopped):
    _, results = stopped
    assert set(results["config"]["model_identity"]) == {"weights", "step"}
    assert results["config"]["model_identity"]["step"] == 3


def test_the_same_checkpoint_by_another_path_finishes_it(stopped, tmp_path, corpus):
    out, _ = stopped
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURE, copy)
    rc, text = evaluate(copy / "checkpoints" / "last.ckpt", out, corpus, "existing=continue")
    assert rc == 0, text
    with open(os.path.join(out, "results.json")) as f:
        assert json.load(f)["status"] == "complete"


def test_another_model_under_the_same_path_is_refused_naming_both(stopped, tmp_path, corpus):
    out, results = stopped
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for key in saved["state_dict"]:  # every copy of one tensor (the module is registered twice)
        if key.endswith("blocks.0.attn.qkv.weight"):
            saved["state_dict"][key] = saved["state_dict"][key] + 1.0
    torch.save(saved, run / "checkpoints" / "last.ckpt")
    rc, text = evaluate(run, out, corpus, "existing=continue")
    assert rc == 2 and "another model" in text and results["config"]["model_identity"]["weights"] in text, text


def test_other_settings_are_refused_showing_both_values(stopped, corpus):
    out, _ = stopped
    rc, text = evaluate(FIXTURE, out, corpus, "existing=continue", "eval.token_budget=256")
    assert rc == 2 and "other settings" in text and "before" in text and "now" in text and "256" in text, text


def test_the_models_checksum_is_neither_a_setting_nor_a_row_name():
    """Seed replicas evaluated from their checkpoints differ in weights: still replicas, never named by a hash."""
    from rope_lm.compare.labels import differing_keys, flat_settings

    a = flat_settings({"seed": 0, "model_identity": {"weights": "aa", "step": 3}, "pos": {"name": "rope"}})
    b = flat_settings({"seed": 1, "model_identity": {"weights": "bb", "step": 3}, "pos": {"name": "rope"}})
    assert a == b and differing_keys([a, b]) == []


def test_a_diagnostic_records_the_weights_it_read_and_their_step(tmp_path):
    out = tmp_path / "passkey"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "passkey.py"),
            f"ckpt={FIXTURE}",
            "lengths=[128]",
            "depths=[0.5]",
            "samples=1",
            f"out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "passkey.json") as f:
        assert json.load(f)["model"]["step"] == 3
