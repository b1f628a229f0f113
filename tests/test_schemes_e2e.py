"""Every registered scheme, with its shipped conf/pos defaults, trains and is
evaluated past the training length by the real pipeline."""

import math

from conftest import ROOT
import pytest
import yaml

from rope_lm.positional import SCHEMES
from rope_lm.runs.pipeline import train_and_evaluate


@pytest.mark.parametrize("name", SCHEMES.names())
def test_trains_and_evaluates_past_the_training_length(name, tiny_config, tmp_path):
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        tiny_config["pos"] = yaml.safe_load(f)
    tiny_config["trainer"].update(max_steps=4, val_every_n_steps=4, ckpt_every_n_steps=4)
    results = train_and_evaluate(tiny_config, str(tmp_path / name))
    rows = results["results"]
    assert [r["length"] for r in rows] == [16, 32, 64]  # 1x, 2x, 4x the training length
    assert results["training"]["steps"] == 4
    for r in rows:
        assert math.isfinite(r["loss"]) and r["ppl"] > 1
    assert rows[0]["loss_beyond"] is None and all(math.isfinite(r["loss_beyond"]) for r in rows[1:])


LLAMA_SHAPED = {
    "mlp": "swiglu",
    "mlp_hidden": 48,
    "n_kv_head": 1,
    "head_dim": 12,
    "norm_eps": 1e-5,
    "qkv_bias": True,
    "tie_embeddings": False,
}


@pytest.mark.parametrize("name", SCHEMES.names())
def test_llama_shaped_model_trains_and_evaluates(name, tiny_config, tmp_path):
    """The same pipeline with SwiGLU, multi-query attention, an explicit
    head_dim, q/k/v biases and an untied head."""
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        tiny_config["pos"] = yaml.safe_load(f)
    tiny_config["model"].update(LLAMA_SHAPED)
    tiny_config["trainer"].update(max_steps=2, val_every_n_steps=2, ckpt_every_n_steps=2)
    rows = train_and_evaluate(tiny_config, str(tmp_path / name))["results"]
    assert [r["length"] for r in rows] == [16, 32, 64]
    assert all(math.isfinite(r["loss"]) for r in rows)
