"""The trainer=fsdp preset (rope_lm/train/sharding.py) on two CPU processes over
gloo, run as the README's scale-up section shows it: the loss curve equals
one process's with the same global batch, and a resume from its gathered
checkpoint continues the curve as if never stopped; the after-training
evaluation and scripts/export_hf.py read the whole model. DDP with
checkpointed blocks gives the same curve too. Plus the settings the preset
refuses, before any work."""

import csv
import glob
import os
import subprocess
import sys

from conftest import ROOT
import pytest
import torch

from rope_lm.core.errors import ConfigError

STEPS = 6  # three before the stop, three after the resume
# A Llama shape (so scripts/export_hf.py can write it) with RoPE buffers, recomputing its blocks;
# a constant learning rate, so that the run extended from 3 to 6 steps on resume follows the same
# schedule as one planned for 6 from the start.
SETTINGS = [
    "model=llama_tiny",
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_kv_head=2",
    "model.d_model=32",
    "model.head_dim=8",
    "model.mlp_hidden=48",
    "model.activation_checkpointing=true",
    "optim.warmup_steps=0",
    "optim.min_lr_ratio=1.0",
    "trainer.accelerator=cpu",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=3",
    "trainer.ckpt_every_n_steps=3",
    "trainer.enable_progress_bar=false",
    "logger=csv",
    "eval.multipliers=[1,2]",
    "eval.token_budget=64",
    "eval.batch_tokens=64",
    "eval.bootstrap=0",
]


def data_overrides(options, batch_size):
    return ["data=local_files"] + [f"data.{k}={v}" for k, v in {**options, "batch_size": batch_size}.items()]


def train(args, run_dir):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "train.py"), *args, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def curve(run_dir) -> dict[int, float]:
    """step -> logged train/loss, over every sitting of the run (csv/version_N)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "csv", "version_*", "metrics.csv"))):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("train/loss"):
                    out[int(row["step"])] = float(row["train/loss"])
    return out


def assert_ends_like_one_process(run_dir, one_dir, steps=STEPS):
    """The run's final (gathered) weights equal one process's after the same steps, and the evaluation
    after training ran once (rank 0) into one complete results.json of SETTINGS' two lengths."""
    import json

    final = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    alone = torch.load(one_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert final["global_step"] == alone["global_step"] == steps
    for key, value in alone["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][key], value, atol=2e-6, rtol=1e-4, msg=key)
    with open(run_dir / "results.json") as f:
        results = json.load(f)
    assert results["status"] == "complete" and len(results["results"]) == 2


def test_two_cpu_ranks_train_resume_evaluate_and_export_like_one_process(tiny_data_options, tmp_path):
    half = tiny_data_options["batch_size"] // 2
    sharded = tmp_path / "sharded"
    # As README's scale-up section runs it: two ranks of half the batch, stopped after 3 steps.
    first = train(
        [
            *data_overrides(tiny_data_options, half),
            *SETTINGS,
            "trainer=fsdp",
            "trainer.devices=2",
            f"trainer.max_steps={STEPS // 2}",
        ],
        sharded,
    )
    # Meanwhile, the reference: one process, the whole batch, all the steps; and DDP on two ranks with
    # the same checkpointed blocks for the first sitting's steps.
    one = train(
        [*data_overrides(tiny_data_options, 2 * half), *SETTINGS, "trainer.devices=1", f"trainer.max_steps={STEPS}"],
        tmp_path / "one",
    )
    ddp = train(
        [
            *data_overrides(tiny_data_options, half),
            *SETTINGS,
            "trainer.strategy=ddp",
            "trainer.devices=2",
            f"trainer.max_steps={STEPS // 2}",
        ],
        tmp_path / "ddp",
    )
    finished(first)
    ckpt = torch.load(sharded / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == STEPS // 2
    reference = dict(ckpt["state_dict"])  # gathered: every weight whole, as one process saves it
    assert all(not hasattr(v, "placements") and v.shape == reference[k].shape for k, v in reference.items())

    finished(train([f"resume={sharded}", f"trainer.max_steps={STEPS}"], sharded))
    finished(one)
    finished(ddp)

    expected, got = curve(tmp_path / "one"), curve(sharded)
    # In order: Lightning logs the steps of a finished run extended on resume one index on (4, 5, 6).
    expected, got = [expected[s] for s in sorted(expected)], [got[s] for s in sorted(got)]
    assert len(expected) == len(got) == STEPS, (expected, got)
    assert got == pytest.approx(expected, rel=2e-5), (expected, got)
    assert len({round(v, 4) for v in got}) == STEPS  # it trained: the curve moves at every step
    under_ddp = curve(tmp_path / "ddp")
    assert [under_ddp[s] for s in sorted(under_ddp)] == pytest.approx(expected[: STEPS // 2], rel=2e-5)

    assert_ends_like_one_process(sharded, tmp_path / "one")

    from rope_lm.runs.export import export_checkpoint

    config = export_checkpoint(str(sharded), str(tmp_path / "exported"))
    assert config["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"strategy": "ddp"}, r"trainer.strategy='ddp' cannot be used with it"),
        ({"devices": 1}, r"this run has 1 device\(s\) on 1 node\(s\)"),
    ],
)
def test_settings_the_preset_cannot_serve_are_refused_before_work(tiny_config, tmp_path, settings, message):
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.trainer import build_trainer, trainer_kwargs

    tiny_config["trainer"].update(sharded=True, **settings)
    run = resolve_run(tiny_config)
    with pytest.raises(ConfigError, match=message):
        build_trainer(trainer_kwargs(run.trainer, str(tmp_path), None))
