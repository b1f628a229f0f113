"""Training-time position methods (rope_lm/train_positions/): the ids each
method draws, checked against the documented distributions; the model reading
them; the refusals; and the id stream across a resume."""

import copy
import inspect
import json
import os

import numpy as np
import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.runs.config import resolve_run
from rope_lm.runs.pipeline import train_and_evaluate
from rope_lm.train.lit import LitLM
from rope_lm.train_positions import TRAIN_POSITIONS, build_train_positions, draw_batch
from rope_lm.train_positions.base import batch_rng
from tests.conftest import TINY_MODEL

L, FACTOR = 32, 4
ROOM = FACTOR * L - L  # L_t - L: the largest skip


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's goodness-of-fit p-value (upper tail of chi^2 with k - 1 degrees of freedom)."""
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(
        torch.special.gammaincc(
            torch.tensor((len(counts) - 1) / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def many(method, n=4000, length=L, seed=0):
    return draw_batch(method, seed, 0, 0, n, length)


def test_the_registry_lists_the_methods_each_with_a_config_of_every_knob():
    from omegaconf import OmegaConf

    from tests.conftest import ROOT

    assert TRAIN_POSITIONS.names() == ["none", "pose", "randomized"]
    for name in TRAIN_POSITIONS.names():
        cfg = OmegaConf.to_container(OmegaConf.load(os.path.join(ROOT, "conf", "train_pos", f"{name}.yaml")))
        knobs = set(inspect.signature(TRAIN_POSITIONS.get(name).__init__).parameters) - {"self", "args", "kwargs"}
        assert cfg["name"] == name and set(cfg) - {"name"} == knobs
        build_train_positions(cfg)


@pytest.mark.parametrize("chunks,skips", [(2, "paper"), (3, "paper"), (3, "uniform"), (5, "paper")])
def test_pose_ids_increase_stay_below_the_target_and_are_contiguous_within_chunks(chunks, skips):
    ids = many(build_train_positions({"name": "pose", "factor": FACTOR, "chunks": chunks, "skips": skips}), n=2000)
    assert ids.shape == (2000, L) and ids.dtype == np.int64
    assert (np.diff(ids, axis=1) >= 1).all()  # strictly increasing
    assert (ids[:, 0] == 0).all() and (ids < FACTOR * L).all()  # u_0 = 0; below L_t
    offsets = ids - np.arange(L)  # u_i on chunk i: a non-decreasing step function
    for row in offsets:
        values, starts = np.unique(row, return_index=True)
        assert len(values) <= chunks
        # Each skip value covers one contiguous run of the window (a chunk, or neighbouring chunks that drew
        # the same skip), so within it the ids are consecutive.
        assert (np.bincount(np.searchsorted(values, row)) == np.diff(np.append(starts, L))).all()
    assert (ids[:, -1] - (L - 1)).max() > ROOM * 0.9  # the skips do reach the target


def test_pose_two_chunks_skip_and_cut_are_uniform():
    """N = 2: u_1 ~ U{0..L_t - L} and the cut l_0 ~ U{1..L-1}."""
    ids = many(build_train_positions({"name": "pose", "factor": FACTOR}), n=20000)
    u1 = ids[:, -1] - (L - 1)
    assert chi_square_p(np.bincount(u1, minlength=ROOM + 1), np.full(ROOM + 1, 1 / (ROOM + 1))) > 1e-3
    jumped = u1 > 0
    cut = np.argmax(np.diff(ids[jumped], axis=1) > 1, axis=1) + 1  # the first index of chunk 1
    assert chi_square_p(np.bincount(cut, minlength=L)[1:], np.full(L - 1, 1 / (L - 1))) > 1e-3


def last_skip_pmf(skips: str) -> np.ndarray:
    """P(u_2 = k), N = 3: 'paper' u_1 ~ U{0..S}, u_2 ~ U{u_1..S}; 'uniform' the larger of two U{0..S}."""
    S = ROOM
    if skips == "paper":
        return np.array([sum(1 / (S + 1) / (S - j + 1) for j in range(k + 1)) for k in range(S + 1)])
    cdf = (np.arange(1, S + 2) / (S + 1)) ** 2
    return np.diff(np.concatenate(([0.0], cdf)))


@pytest.mark.parametrize("skips,other", [("paper", "uniform"), ("uniform", "paper")])
def test_pose_last_skip_follows_the_documented_distribution(skips, other):
    ids = many(build_train_positions({"name": "pose", "factor": FACTOR, "chunks": 3, "skips": skips}), n=20000)
    counts = np.bincount(ids[:, -1] - (L - 1), minlength=ROOM + 1)
    assert chi_square_p(counts, last_skip_pmf(skips)) > 1e-3
    assert chi_square_p(counts, last_skip_pmf(other)) < 1e-6  # the check tells the two apart


def test_randomized_ids_are_a_sorted_uniform_subset():
    ids = many(build_train_positions({"name": "randomized", "factor": FACTOR}), n=4000)
    assert (np.diff(ids, axis=1) >= 1).all()  # sorted and unique
    assert ids.min() >= 0 and ids.max() < FACTOR * L
    # Every id below L_max is included with probability L / L_max.
    counts = np.bincount(ids.ravel(), minlength=FACTOR * L)
    assert chi_square_p(counts, np.full(FACTOR * L, 1 / (FACTOR * L))) > 1e-3
    # ...and the sets differ from sequence to sequence.
    assert len({tuple(r) for r in ids[:50]}) == 50


def test_the_stream_depends_on_seed_rank_and_draw_alone():
    m = build_train_positions({"name": "pose", "factor": FACTOR})
    a = draw_batch(m, 7, 0, 3, 8, L)
    assert np.array_equal(a, draw_batch(m, 7, 0, 3, 8, L))
    for other in (draw_batch(m, 8, 0, 3, 8, L), draw_batch(m, 7, 1, 3, 8, L), draw_batch(m, 7, 0, 4, 8, L)):
        assert not np.array_equal(a, other)
    assert batch_rng(1, 0, 0).integers(1 << 30) == batch_rng(1, 0, 0).integers(1 << 30)


@pytest.mark.parametrize(
    "options,pattern",
    [
        ({"name": "pose", "factor": 0.5}, r"train_pos.factor=0.5 must be a finite number >= 1"),
        ({"name": "pose", "chunks": 1}, r"train_pos.chunks=1 must be an integer >= 2"),
        ({"name": "pose", "skips": "gaussian"}, r"train_pos.skips='gaussian' has the wrong type"),
        ({"name": "pose", "chunks": 40}, r"train_pos.chunks=40 needs windows of at least 40 tokens"),
        ({"name": "randomized", "window": 3}, r"Unknown train_pos 'randomized' setting\(s\) train_pos.window"),
        ({"name": "shuffle"}, r"Unknown training-time position method 'shuffle'"),
    ],
)
def test_bad_settings_are_refused_before_work(tiny_config, options, pattern):
    tiny_config["train_pos"] = options
    with pytest.raises(ConfigError, match=pattern):
        resolve_run(tiny_config)


@pytest.mark.parametrize(
    "pos,pattern",
    [
        ({"name": "nope"}, r"scheme \(nope\) reads none: it sees only the order"),
        (
            {"name": "learned", "max_positions": 128},
            r"train_pos=pose-x16 gives training windows of 16 tokens position "
            r"ids up to 255.*max_positions=128",
        ),
    ],
)
def test_schemes_that_cannot_read_the_ids_are_refused(tiny_config, pos, pattern):
    tiny_config["train_pos"] = {"name": "pose"}
    tiny_config["pos"] = pos
    with pytest.raises(ConfigError, match=pattern):
        resolve_run(tiny_config)


def lit(train_pos=None, pos=None, seed=0):
    torch.manual_seed(0)
    return LitLM(
        TINY_MODEL,
        pos or {"name": "rope"},
        None,
        {},
        vocab_size=64,
        train_len=16,
        max_steps=10,
        train_pos=train_pos,
        seed=seed,
    )


def batch(B=3, T=16):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (B, T), generator=g), torch.randint(0, 64, (B, T), generator=g)


@pytest.mark.parametrize(
    "pos",
    [{"name": "rope"}, {"name": "alibi"}, {"name": "t5"}, {"name": "learned"}, {"name": "shaw"}, {"name": "fire"}],
)
def test_identity_ids_give_the_plain_model_bit_for_bit(pos):
    plain, pose = lit(pos=pos), lit({"name": "pose", "factor": 2.0}, pos=pos)
    pose.load_state_dict(plain.state_dict())
    x, y = batch()
    ids = torch.arange(16).expand(3, 16)  # ids a draw could give (no skip), through the ids path
    assert torch.equal(pose.loss((x, y), ids), plain.loss((x, y)))
    assert torch.equal(plain.model(x, pos=torch.arange(16)), plain.model(x))


def test_each_sequence_is_read_at_its_own_ids():
    m = lit({"name": "pose", "factor": 8.0})
    x, y = batch()
    ids = m.draw_positions(x)
    assert not torch.equal(ids[0], ids[1])
    rows = [m.loss((x[i : i + 1], y[i : i + 1]), ids[i : i + 1]) for i in range(3)]
    assert torch.allclose(m.loss((x, y), ids), torch.stack(rows).mean())
    # The ids reach the model (a random model's loss hardly moves, its logits do).
    assert not torch.allclose(m.model(x[:1], pos=ids[0]), m.model(x[:1]), rtol=0, atol=1e-5)
    assert not torch.equal(m.loss((x, y), ids), m.loss((x, y)))
    # RoPE reads differences only: every sequence shifted by one constant trains the same loss.
    assert torch.allclose(m.loss((x, y), torch.arange(16).expand(3, 16) + 100), m.loss((x, y)), atol=1e-5)


def test_validation_reads_plain_positions():
    m = lit({"name": "randomized", "factor": 8.0})
    x, y = batch()
    assert torch.equal(m.loss((x, y)), lit().loss((x, y)))


def test_a_checkpoint_carries_the_stream():
    a = lit({"name": "randomized"}, seed=3)
    x, _ = batch()
    first = [a.draw_positions(x) for _ in range(2)]
    saved = {}
    a.on_save_checkpoint(saved)
    later = a.draw_positions(x)
    b = lit({"name": "randomized"}, seed=3)
    b.on_load_checkpoint(saved)
    assert torch.equal(b.draw_positions(x), later)
    assert not torch.equal(first[0], first[1])


def test_a_resumed_run_continues_the_same_id_stream(tiny_config, tmp_path, monkeypatch):
    drawn = {}

    def recording(self, x):
        ids = original(self, x)
        drawn.setdefault(self._run, []).append(ids.clone())
        return ids

    original = LitLM.draw_positions
    monkeypatch.setattr(LitLM, "draw_positions", recording)
    monkeypatch.setattr(LitLM, "_run", "full", raising=False)
    tiny_config["train_pos"] = {"name": "pose", "factor": 4.0}
    tiny_config["eval"]["multipliers"] = [1]
    train_and_evaluate(copy.deepcopy(tiny_config), str(tmp_path / "full"))
    monkeypatch.setattr(LitLM, "_run", "cut")
    cut = copy.deepcopy(tiny_config)
    cut["trainer"]["max_steps"] = 3
    train_and_evaluate(cut, str(tmp_path / "cut"))
    monkeypatch.setattr(LitLM, "_run", "resumed")
    tiny_config["ckpt_path"] = str(tmp_path / "cut")
    train_and_evaluate(tiny_config, str(tmp_path / "resumed"))
    assert len(drawn["full"]) == 6 and len(drawn["cut"]) == 3 and len(drawn["resumed"]) == 3
    for a, b in zip(drawn["full"], drawn["cut"] + drawn["resumed"]):
        assert torch.equal(a, b)
    assert max(int(i.max()) for i in drawn["full"]) >= 16  # past L: the ids did skip
    results = json.load(open(tmp_path / "resumed" / "results.json"))
    assert results["train_positions"] == {
        "name": "pose",
        "label": "pose-x4",
        "span": 64,
        "factor": 4.0,
        "chunks": 2,
        "skips": "paper",
    }


def test_compare_names_the_training_positions(tmp_path):
    from rope_lm.compare.ppl import compare
    from tests.test_compare import write_run

    write_run(tmp_path / "runs" / "plain", methods={"none": lambda n: 10.0, "yarn": lambda n: 9.0})
    write_run(
        tmp_path / "runs" / "pose",
        methods={"none": lambda n: 8.0},
        config={"train_pos": {"name": "pose", "factor": 16, "chunks": 2, "skips": "paper"}},
    )
    summary = compare([str(tmp_path / "runs")], str(tmp_path / "out"))
    assert {r["label"] for r in summary["rows"]} == {"rope", "rope + yarn", "rope [train: pose-x16]"}


def test_run_folders_name_the_method():
    from omegaconf import OmegaConf

    from rope_lm.cli import register_resolvers

    register_resolvers()
    for options, name in (
        ({"name": "none"}, "rope_none"),
        ({"name": "pose", "factor": 16, "chunks": 3}, "rope-pose-x16-c3_none"),
        ({"name": "randomized", "factor": 8}, "rope-randomized-x8_none"),
    ):
        cfg = OmegaConf.create({"train_pos": options, "dir": "rope${train_tag:${train_pos}}_none"})
        assert cfg.dir == name


def test_plain_positions_record_no_setting(tiny_config):
    """A run folder from before train_pos existed holds settings without it; a plain run today records none,
    so such a folder is still continued, while a PoSE run records its method."""
    tiny_config["train_pos"] = {"name": "none"}
    assert "train_pos" not in resolve_run(tiny_config).raw
    tiny_config["train_pos"] = {"name": "pose"}
    run = resolve_run(tiny_config)
    assert run.raw["train_pos"] == {"name": "pose"} and run.train_pos == {"name": "pose"}


def every_scheme():
    from rope_lm.positional import SCHEMES

    return SCHEMES.names()


@pytest.mark.parametrize("name", every_scheme())
def test_every_scheme_trains_on_drawn_ids_or_is_refused(name):
    pos = {"name": name, **({"max_positions": 256} if name == "learned" else {})}
    torch.manual_seed(0)
    probe = LitLM(TINY_MODEL, pos, None, {}, vocab_size=64, train_len=16, max_steps=10)
    if all(
        s.family not in ("absolute", "rotary", "bias", "relative")
        for s in [probe.model.pos_scheme, *(probe.model.layout_schemes or [])]
    ):
        with pytest.raises(ConfigError, match="reads none"):
            lit({"name": "pose"}, pos=pos)
        return
    m = lit({"name": "pose"}, pos=pos)
    x, y = batch()
    loss = m.loss((x, y), m.draw_positions(x))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", ["pose", "randomized"])
@pytest.mark.parametrize("factor, length", [(1.0, 64), (1.004, 64)])
def test_a_factor_that_reaches_no_position_past_the_window_is_refused(name, factor, length):
    """factor=1 (or one that rounds to L) gives plain ids: refused, as pose's chunks=1 is."""
    method = build_train_positions({"name": name, "factor": factor})
    with pytest.raises(ConfigError, match=rf"train_pos={name} with train_pos.factor={factor}.*plain positions"):
        method.check(length)
    build_train_positions({"name": name, "factor": 1.5}).check(length)  # 96 positions: served
