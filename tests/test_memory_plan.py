"""The memory plan (rope_lm/train/memory_plan.py, scripts/plan_memory.py): its
total within 25% of the peak measured on this CPU for the same training step
(tiny and small, with and without activation checkpointing; the full sweep
to 8k is benchmarks/activation_memory.py), the longest length that fits
checked by tracing either side of it, sharding applied, and its refusals."""

import os
import sys

from conftest import ROOT
import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.train.memory_plan import GiB, Setup, longest_fit, per_device, setup_of, trace_step

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from activation_memory import _in_fresh_process, model_shape, planned  # noqa: E402

from tests import forked

VOCAB = 4096


@pytest.mark.parametrize(
    "model,seq_len,checkpointing",
    [
        ("tiny", 1024, False),
        ("tiny", 1024, True),
        ("small", 1024, True),
    ],
)
def test_plan_is_within_a_quarter_of_the_measured_peak(model, seq_len, checkpointing):
    spec = {
        "model": model_shape(model),
        "pos": {"name": "rope"},
        "vocab_size": VOCAB,
        "seq_len": seq_len,
        "batch_size": 1,
        "checkpointing": checkpointing,
        "device": "cpu",
        "threads": 1,
    }
    measured = _in_fresh_process(spec)["peak"]
    plan = planned(spec)
    assert 0.75 <= plan / measured <= 1.25, (plan / 2**20, measured / 2**20)


TINY = {"n_layer": 4, "n_head": 6, "d_model": 192}


def test_checkpointing_keeps_less_and_sharding_divides_the_weights():
    off = trace_step(TINY, {"name": "rope"}, None, VOCAB, 512, 1, False)
    on = trace_step(TINY, {"name": "rope"}, None, VOCAB, 512, 1, True)
    assert on.activations < off.activations / 2 and on.peak < off.peak
    one = per_device(off, Setup())
    ddp = per_device(off, Setup(devices=4, strategy="ddp"))
    fsdp = per_device(off, Setup(devices=4, strategy="fsdp"))
    assert ddp["total"] == one["total"] + off.grads  # DDP's buckets: a second copy of the gradients
    assert fsdp["optimizer state"] == off.optimizer // 4
    assert fsdp["parameters"] == off.params // 4 + off.root_params + 2 * off.block_params
    assert fsdp["total"] < one["total"] and fsdp["activations"] == one["activations"]


def test_the_longest_length_fits_and_64_tokens_more_do_not():
    budget = 0.1 * GiB
    setup = Setup()
    total = per_device(trace_step(TINY, {"name": "rope"}, None, VOCAB, 256, 1, False), setup)["total"]
    n = longest_fit(TINY, {"name": "rope"}, None, VOCAB, 1, setup, None, False, budget, 256, total)
    fits = per_device(trace_step(TINY, {"name": "rope"}, None, VOCAB, n, 1, False), setup)["total"]
    over = per_device(trace_step(TINY, {"name": "rope"}, None, VOCAB, n + 64, 1, False), setup)["total"]
    assert fits <= budget < over, (n, fits, over)


def test_the_script_takes_train_overrides(tmp_path):
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "plan_memory.py"),
            "model=tiny",
            "data.seq_len=256",
            "data.batch_size=2",
            "trainer=fsdp",
            "trainer.devices=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for row in (
        "parameters",
        "gradients",
        "optimizer state",
        "activations",
        "attention workspace",
        "loss / logits",
        "total",
        "2 device(s), fsdp",
    ):
        assert row in done.stdout, row
    assert not os.listdir(tmp_path)  # writes nothing
    bad = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "plan_memory.py"), "device_gb=-1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert bad.returncode == 2 and "device_gb=-1 must be a positive number" in bad.stderr


def test_a_strategy_it_does_not_know_is_named(tiny_config):
    from rope_lm.runs.config import resolve_run

    tiny_config["trainer"].update(strategy="deepspeed", devices=2)
    with pytest.raises(ConfigError, match="trainer.strategy='deepspeed' is not one the memory plan knows"):
        setup_of(resolve_run(tiny_config).trainer)
