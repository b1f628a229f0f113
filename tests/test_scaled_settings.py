"""Settings that are lengths follow the training length: T5's buckets and
FIRE's threshold default to the paper's ratio to L, a number given (as a
checkpoint holds) is kept; the learned table's rows past L keep their initial
values through training (no weight decay on it)."""

import os

from hydra import compose, initialize_config_dir
import pytest
import torch

from rope_lm.model.transformer import build_model
from rope_lm.positional import build_scheme
from rope_lm.positional.base import Dims
from rope_lm.train.lit import OptimConfig, build_optimizer
from tests.conftest import ROOT


def composed_model(pos: str, seq_len: int, *extra):
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"pos={pos}", f"data.seq_len={seq_len}", *extra], return_hydra_config=False)
    # As train.py builds it: the training length is data.seq_len.
    return build_model(dict(cfg.model), dict(cfg.pos), dict(cfg.scaling), vocab_size=32, train_len=cfg.data.seq_len)


@pytest.mark.parametrize("seq_len, buckets, max_distance", [(64, 4, 16), (512, 32, 128)])
def test_t5_buckets_scale_with_the_training_length(seq_len, buckets, max_distance):
    t5 = composed_model("t5", seq_len).pos_scheme
    assert (t5.num_buckets, t5.max_distance) == (buckets, max_distance)  # T5's 32 and 128 at 512
    assert t5.table.shape[0] == buckets


@pytest.mark.parametrize("seq_len", [64, 512])
def test_fire_threshold_is_the_training_length(seq_len):
    fire = composed_model("fire", seq_len).pos_scheme
    assert all(float(layer.init_L) == seq_len for layer in fire.layers)


def test_given_numbers_are_kept_as_checkpoints_hold_them():
    dims = Dims(d_model=16, n_head=2, head_dim=8, n_layer=1, train_len=64)
    t5 = build_scheme({"name": "t5", "num_buckets": 32, "max_distance": 128}, dims)
    assert (t5.num_buckets, t5.max_distance) == (32, 128)
    fire = build_scheme({"name": "fire", "init_L": 512.0}, dims)
    assert float(fire.layers[0].init_L) == 512.0


def test_short_lengths_still_give_valid_buckets():
    t5 = build_scheme({"name": "t5"}, Dims(d_model=16, n_head=2, head_dim=8, n_layer=1, train_len=20))
    assert t5.num_buckets >= 2 and t5.max_distance > t5.num_buckets // 2


def test_learned_rows_past_the_training_length_keep_their_initial_values():
    torch.manual_seed(0)
    L = 8
    model = build_model(
        {"n_layer": 1, "n_head": 2, "d_model": 16},
        {"name": "learned", "max_positions": 32},
        {"name": "none"},
        vocab_size=16,
        train_len=L,
    )
    table = model.pos_scheme.weight
    before = table.detach().clone()
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=0, weight_decay=0.5), max_steps=10)
    for _ in range(5):
        x = torch.randint(0, 16, (4, L))
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(table[:L], before[:L])  # trained rows moved
    assert torch.equal(table[L:], before[L:])  # rows never reached: untouched, not decayed
    decayed = [g for g in opt.param_groups if g["weight_decay"] > 0]
    assert all(table is not p for g in decayed for p in g["params"])
    assert any(p is model.wte.weight for g in decayed for p in g["params"])  # the rest of the model as before
