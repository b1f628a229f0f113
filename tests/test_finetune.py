"""Fine-tuning from a checkpoint at a longer length (`init_from`)."""

import copy
import os

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.runs.finetune import load_init_from
from rope_lm.runs.pipeline import train_and_evaluate


def test_finetune_continues_from_the_checkpoint_at_a_longer_length(tiny_config, tmp_path):
    base_dir = str(tmp_path / "base")
    base_cfg = copy.deepcopy(tiny_config)
    base_cfg["eval"]["multipliers"] = [1]
    train_and_evaluate(base_cfg, base_dir)
    base = torch.load(os.path.join(base_dir, "checkpoints", "last.ckpt"), weights_only=False)

    cfg = copy.deepcopy(tiny_config)
    cfg["init_from"] = base_dir
    cfg["data"]["seq_len"] = 32
    cfg["scaling"] = {"name": "pi", "factor": "auto"}
    cfg["trainer"].update(max_steps=3, val_every_n_steps=3, ckpt_every_n_steps=3)
    cfg["eval"]["multipliers"] = [1, 2]
    # A vanishing learning rate: the weights after fine-tuning are the loaded ones.
    cfg["optim"]["lr"] = 1e-12
    out = str(tmp_path / "finetune")
    results = train_and_evaluate(cfg, out)

    tuned = torch.load(os.path.join(out, "checkpoints", "last.ckpt"), weights_only=False)
    hp = tuned["hyper_parameters"]
    assert hp["train_len"] == 16 and hp["data"]["seq_len"] == 32  # L stays the original: s = L'/L
    assert tuned["global_step"] == 3
    for key, value in base["state_dict"].items():
        torch.testing.assert_close(tuned["state_dict"][key], value, rtol=0, atol=1e-6)
    assert [r["length"] for r in results["results"]] == [32, 64]
    assert results["methods"]["pi"]["scale"] == 64 / 16
    assert hp["tuned_len"] == 32


def test_a_finetuned_model_keeps_its_scale_on_shorter_sequences(tiny_config, tmp_path):
    from rope_lm.positional.frequencies import default_inv_freq
    from rope_lm.train.lit import LitLM

    base_dir = str(tmp_path / "base")
    base_cfg = copy.deepcopy(tiny_config)
    base_cfg["eval"]["multipliers"] = [1]
    base_cfg["trainer"].update(max_steps=2, val_every_n_steps=2, ckpt_every_n_steps=2)
    train_and_evaluate(base_cfg, base_dir)
    cfg = copy.deepcopy(tiny_config)
    cfg.update(init_from=base_dir, scaling={"name": "pi", "factor": "auto"})
    cfg["data"]["seq_len"] = 64  # s = 64 / 16 = 4 while fine-tuning
    cfg["trainer"].update(max_steps=2, val_every_n_steps=2, ckpt_every_n_steps=2)
    cfg["eval"]["lengths"] = [16, 64, 128]
    out = str(tmp_path / "finetune")
    results = train_and_evaluate(cfg, out)
    model = LitLM.load_from_checkpoint(os.path.join(out, "checkpoints", "last.ckpt"), map_location="cpu").model
    scheme = model.pos_scheme
    plain = default_inv_freq(scheme.rot_dim, scheme.base).double()
    for T, s in ((16, 4.0), (64, 4.0), (128, 8.0)):  # the fine-tuned s at and below L' = 64, T / L past it
        ctx = model.context(T)
        assert model.scaling.scale(ctx) == s
        torch.testing.assert_close(
            model.scaling.rope_frequencies(scheme.rot_dim, scheme.base, ctx)[0].double(), plain / s, rtol=1e-6, atol=0
        )
    assert [results["methods"]["pi"]["scale"], [r["length"] for r in results["results"]]] == [8.0, [16, 64, 128]]


def test_init_from_refuses_a_different_model_before_any_work(tiny_config, tmp_path):
    from rope_lm.runs.config import resolve_run

    ckpt = tmp_path / "fake.ckpt"
    hp = {
        "model": dict(tiny_config["model"]),
        "pos": dict(tiny_config["pos"], base=500000.0),
        "train_len": 16,
        "vocab_size": 320,
    }
    torch.save({"hyper_parameters": hp, "state_dict": {}}, ckpt)
    cfg = copy.deepcopy(tiny_config)
    cfg["init_from"] = str(ckpt)
    with pytest.raises(ConfigError, match=r"pos\.base: checkpoint 500000\.0, this run 10000\.0"):
        load_init_from(resolve_run(cfg), str(tmp_path / "out"))
    hp["pos"]["base"] = 10000.0
    hp["model"]["d_model"] = 64
    torch.save({"hyper_parameters": hp, "state_dict": {}}, ckpt)
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        train_and_evaluate(cfg, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "checkpoints")
    cfg["init_from"] = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="init_from='.*missing' is not a checkpoint"):
        load_init_from(resolve_run(cfg), str(tmp_path / "out"))
