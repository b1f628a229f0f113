"""Non-finite losses, concurrent cache builds, atomic writes."""

import json
import logging
import math
import os

import pytest
import torch

from rope_lm.core.errors import TrainingDiverged
from rope_lm.core.files import atomic_write
from rope_lm.data.split import split_data  # noqa: E402
from rope_lm.data.token_cache import cache_problem, prepare
from rope_lm.runs.pipeline import train_and_evaluate
from rope_lm.train import lit as lit_module
from tests import forked


def _poison(monkeypatch, steps):
    """Make the loss NaN at the given global steps, as a diverging run would."""
    real = lit_module.LitLM.loss

    def loss(self, batch, pos=None):
        value = real(self, batch, pos)
        return value * float("nan") if self.global_step in steps else value

    monkeypatch.setattr(lit_module.LitLM, "loss", loss)


def test_nan_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tiny_config, tmp_path, monkeypatch):
    _poison(monkeypatch, {4})
    out = str(tmp_path / "run")
    tiny_config["trainer"].update(max_steps=8, ckpt_every_n_steps=3)
    with pytest.raises(TrainingDiverged, match=r"became nan at step 4.*last\.ckpt"):
        train_and_evaluate(tiny_config, out)
    saved = torch.load(os.path.join(out, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())


def test_nan_can_be_skipped_a_bounded_number_of_times(tiny_config, tmp_path, monkeypatch):
    _poison(monkeypatch, {2})
    tiny_config["trainer"].update(max_steps=6, skip_nonfinite=3)
    results = train_and_evaluate(tiny_config, str(tmp_path / "run"))
    assert results["training"]["steps"] == 6 and math.isfinite(results["results"][0]["ppl"])


def _build(options, queue):
    data, source = split_data(options)
    logging.basicConfig(level=logging.INFO)
    queue.put(prepare(data, source).dir)


def test_two_processes_building_the_same_cache_do_not_corrupt_it(tiny_data_options, tmp_path):
    options = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    ctx = forked.context()  # a fresh process each, without paying the imports again
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(options, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    dirs = {queue.get(timeout=5), queue.get(timeout=5)}
    assert len(dirs) == 1
    (directory,) = dirs
    assert cache_problem(directory) is None
    assert not [f for f in os.listdir(tmp_path / "cache") if ".tmp-" in f]  # no half-built folder left


def test_atomic_write_leaves_the_previous_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic_write(str(path), json.dumps({"v": 1}))
    umask = os.umask(0o022)
    try:
        atomic_write(str(path), json.dumps({"v": 1}))
        assert path.stat().st_mode & 0o777 == 0o644  # readable like any file the user writes, not mkstemp's 0600
    finally:
        os.umask(umask)

    def broken_fsync(fd):
        raise KeyboardInterrupt  # a kill mid-write

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(path), json.dumps({"v": 2}))
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["results.json"]


def _poison_update(monkeypatch, step):
    """Make the update of one step write NaN into a weight while its loss stays finite."""
    real = lit_module.LitLM.optimizer_step

    def optimizer_step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.global_step == step:  # Lightning counts the step only after this returns
            with torch.no_grad():
                next(self.parameters()).view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(lit_module.LitLM, "optimizer_step", optimizer_step)


def test_a_last_update_that_makes_weights_nan_is_never_complete(tiny_config, tmp_path, monkeypatch):
    """The final step's loss is finite and its update is not: no next step's loss sees it, so the
    weights are checked before the final checkpoint and the evaluation."""
    _poison_update(monkeypatch, 5)
    out = str(tmp_path / "run")
    tiny_config["trainer"].update(max_steps=6, ckpt_every_n_steps=3)
    with pytest.raises(TrainingDiverged, match=r"non-finite .* update of step 6.*last finite checkpoint, .*last\.ckpt"):
        train_and_evaluate(tiny_config, out)
    saved = torch.load(os.path.join(out, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
    results = os.path.join(out, "results.json")
    if os.path.exists(results):
        with open(results) as f:
            assert json.load(f)["status"] != "complete"
