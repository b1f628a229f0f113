"""Per-layer layouts (rope_lm/model/layout.py, model.layout): each layer its own
scheme, settings and window, checked against the model's blocks run by hand
with the schemes and plans each layer should get."""

import os
import sys

from conftest import ROOT, cli_overrides
import pytest
import torch
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.layout import layer_specs
from rope_lm.model.transformer import ModelConfig, TransformerLM, check_fit
from rope_lm.positional import SCHEMES, PosContext
from rope_lm.scaling import build_scaling
from tests import forked

L = 16


def config(layout=None, n_layer=4, **extra):
    return ModelConfig(
        vocab_size=61, train_len=L, n_layer=n_layer, n_head=4, n_kv_head=2, d_model=32, layout=layout, **extra
    )


def model(layout, pos=None, scaling=None, seed=0, **extra):
    torch.manual_seed(seed)
    m = TransformerLM(config(layout, **extra), pos or {"name": "rope"}, scaling)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def tokens(n, seed=1):
    return torch.randint(0, 61, (2, n), generator=torch.Generator().manual_seed(seed))


def by_hand(m, idx, layers):
    """The model's blocks run one by one; layers: (scheme, plan, scaling) per
    layer, an absolute scheme's embedding added at its layer's input."""
    T = idx.shape[1]
    pos = torch.arange(T)
    x = m.wte(idx)
    for block, (scheme, plan, scaling) in zip(m.blocks, layers):
        ctx = PosContext(seq_len=T, train_len=L, scaling=scaling or build_scaling(None))
        p = ctx.scaling.map_positions(pos, scheme, ctx)
        plan = plan if plan is not None else ctx.scaling.attention_plan(p, ctx)
        x = block(scheme.embed(x, p, ctx), scheme, p, plan, ctx)
    return m.lm_head(m.norm(x))


def test_no_layout_and_a_uniform_layout_are_the_model_of_before():
    plain, uniform = model(None), model({"pattern": [None]})
    assert list(plain.state_dict()) == list(uniform.state_dict())
    idx = tokens(24)
    with torch.no_grad():
        assert torch.equal(plain(idx), uniform(idx))
    assert plain.layout is None and plain.layout_schemes is None


def test_every_fourth_layer_nope():
    m = model({"pattern": ["rope", "rope", "rope", "nope"]})
    rope, nope = m._layer_schemes[0], m._layer_schemes[3]
    assert rope.name == "rope" and nope.name == "nope" and m._layer_schemes[1] is rope
    idx = tokens(24)
    with torch.no_grad():
        want = by_hand(m, idx, [(rope, AttnPlan(), None)] * 3 + [(nope, AttnPlan(), None)])
        torch.testing.assert_close(m(idx), want, atol=0, rtol=0)
        # and it is not the all-RoPE model
        assert (m(idx) - by_hand(m, idx, [(rope, AttnPlan(), None)] * 4)).abs().max() > 1e-4


def test_per_layer_base_window_and_method():
    """Gemma 3's rhythm in small: local layers (window 6, base 100, method off)
    and a global layer (base 10000) that YaRN acts on alone."""
    local = {"window": 6, "pos": {"base": 100.0}, "scaling": False}
    m = model({"pattern": [local, {"pos": {"base": 10000.0}}]}, scaling={"name": "yarn", "factor": 4.0})
    assert m.scaled_layers == [1, 3]
    assert m.describe_scaling(32)["layers"] == [1, 3]
    near, far = m._layer_schemes[0], m._layer_schemes[1]
    assert near.base == 100.0 and far.base == 10000.0
    yarn = m.scaling
    idx = tokens(32)
    with torch.no_grad():
        want = by_hand(m, idx, [(near, AttnPlan(window=6), None), (far, None, yarn)] * 2)
        torch.testing.assert_close(m(idx), want, atol=1e-6, rtol=1e-6)


def test_a_method_acts_only_where_it_applies_and_is_refused_where_it_fits_no_layer():
    m = model({"pattern": ["rope", "alibi"]}, scaling={"name": "ntk", "factor": 2.0})
    assert m.scaled_layers == [0, 2]
    with pytest.raises(ConfigError, match="fits no layer of this layout"):
        model({"pattern": ["nope", "alibi"]}, scaling={"name": "yarn"})
    with pytest.raises(ConfigError, match="fits no layer"):
        check_fit(config({"pattern": [{"scaling": False}]}), {"name": "rope"}, {"name": "pi"}, 32)
    check_fit(config({"pattern": ["rope", "alibi"]}), {"name": "rope"}, {"name": "pi"}, 32)


@pytest.mark.parametrize("name", SCHEMES.names())
def test_every_scheme_works_in_a_layout(name):
    """Each scheme beside a sliding-window RoPE layer: equal to the blocks by
    hand, and read through the KV cache, past L."""
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        pos = yaml.safe_load(f)
    if name == "learned":
        pos["max_positions"] = 64
    m = model({"pattern": [{"pos": pos}, {"pos": {"name": "rope"}, "window": 8}]}, n_layer=2)
    scheme, rope = m._layer_schemes
    idx = tokens(40)
    with torch.no_grad():
        full = m(idx)
        torch.testing.assert_close(
            full, by_hand(m, idx, [(scheme, AttnPlan(), None), (rope, AttnPlan(window=8), None)]), atol=1e-5, rtol=1e-5
        )
        cache = KVCache(planned_len=40)
        cached = torch.cat([m(idx[:, :17], cache=cache), m(idx[:, 17:18], cache=cache), m(idx[:, 18:], cache=cache)], 1)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "pos", [{"name": "rope"}, {"name": "alibi"}, {"name": "t5", "num_buckets": 8, "max_distance": 12}]
)
def test_sliding_window_layers_equal_the_explicit_kernel(pos):
    layout = {"pattern": [{"window": 5}, {"window": 11}]}
    fast = model(layout, pos=pos)
    explicit = model(layout, pos=pos, attention="explicit")
    explicit.load_state_dict(fast.state_dict())
    idx = tokens(64)
    with torch.no_grad():
        torch.testing.assert_close(fast(idx), explicit(idx), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in SCHEMES.names() if SCHEMES.get(n).owns_attention])
def test_sliding_window_layers_of_a_scheme_that_owns_its_attention_equal_its_explicit_path(name):
    """model.attention=explicit reaches such a scheme as its explicit path: a
    model of its windowed layers (a window each, past L) equals the same
    model on the scheme's fast path."""
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        pos = yaml.safe_load(f)
    layout = {"pattern": [{"window": 5}, {"window": 11}]}
    fast = model(layout, pos=pos)
    explicit = model(layout, pos=pos, attention="explicit")
    explicit.load_state_dict(fast.state_dict())
    idx = tokens(48)
    with torch.no_grad():
        torch.testing.assert_close(fast(idx), explicit(idx), atol=2e-5, rtol=1e-4)


def test_a_pattern_repeats_and_is_cut_where_the_layers_end():
    """Gemma 3 1B: a 6-layer rhythm over 26 layers ends on two local layers."""
    specs = layer_specs({"pattern": [{"window": 8}] * 5 + [None]}, {"name": "rope"}, 26)
    assert [i for i, s in enumerate(specs) if s.window is None] == [5, 11, 17, 23]
    assert len(specs) == 26 and specs[24].window == specs[25].window == 8


@pytest.mark.parametrize(
    "layout,message",
    [
        ({"layers": ["rope", "nope"]}, "2 entries for model.n_layer=4"),
        ({"pattern": ["rope"], "layers": ["rope"] * 4}, "sets both"),
        ({"pattern": [{"window": 0}]}, r"window=0 must be a positive number"),
        ({"pattern": [{"span": 3}]}, "unknown key"),
        ({"pattern": [{"scaling": "yes"}]}, "scaling='yes' must be true"),
        ({"pattern": [{"pos": {"name": "nosuch"}}]}, "nosuch"),
        ({"shape": 1}, "unknown key"),
    ],
)
def test_bad_layouts_are_one_paragraph(layout, message):
    with pytest.raises(ConfigError, match=message) as info:
        TransformerLM(config(layout), {"name": "rope"}, None)
    assert "\n" not in str(info.value)


def test_presets_build_and_a_layout_run_trains_and_evaluates(tiny_data_options, tmp_path):
    for name in ("nope_every_4", "local_global"):
        with open(f"{ROOT}/conf/layout/{name}.yaml") as f:
            TransformerLM(config(yaml.safe_load(f)), {"name": "rope"}, None)
    with open(f"{ROOT}/conf/layout/gemma3.yaml") as f:
        TransformerLM(config(yaml.safe_load(f), n_layer=6), {"name": "rope"}, {"name": "yarn"})
    run = tmp_path / "run"
    args = [
        a.replace("model.n_layer=2", "model.n_layer=4")
        for a in cli_overrides(tiny_data_options, run, **{"trainer.max_steps": 6})
    ]
    done = forked.run(
        [sys.executable, "train.py", "+layout=nope_every_4", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(run / "results.json") as f:
        results = __import__("json").load(f)
    assert results["config"]["model"]["layout"]["name"] == "nope_every_4"
    assert results["scheme"] == "rope+nope_every_4"  # compare.py's row name


def test_the_layouts_preset_sets_windows_relative_to_the_training_length():
    """local_global's windows are L, local_global_short's L/4, resolved from data.seq_len where the
    config is composed (so the study run at another L keeps its proportions)."""
    from rope_lm.cli import register_resolvers
    from tests.test_compare import compose

    register_resolvers()
    _, sweep = compose(["+experiment=layouts"])
    arms = sweep["experiment/layout_arm@_global_"].split(",")
    assert {"local_global", "local_global_short"} <= set(arms)
    for L in (64, 256):
        windows = {
            arm: [
                e.get("window")
                for e in compose(["+experiment=layouts", f"experiment/layout_arm@_global_={arm}", f"data.seq_len={L}"])[
                    0
                ]["model"]["layout"]["pattern"]
            ]
            for arm in ("local_global", "local_global_short")
        }
        assert windows == {"local_global": [L, L, L, None], "local_global_short": [L // 4] * 3 + [None]}


def test_div_refuses_what_is_not_a_length_divided_by_a_whole_number():
    from rope_lm.cli import _div
    from rope_lm.core.errors import ConfigError

    assert _div(64, 4) == 16
    for a, b in ((64, 0), (3, 4), (64.0, 4), ("64", 4)):
        with pytest.raises(ConfigError, match="divides a length"):
            _div(a, b)


def test_a_trained_layout_model_is_named_as_its_run_names_it():
    """Diagnostics (retrieval.json, passkey.json, ...) name a checkpoint's scheme as its results.json
    does, so a comparison's rows match the run's: rope+nope_every_4, not rope."""
    from types import SimpleNamespace

    from rope_lm.runs.trained import Trained

    layout = {"name": "nope_every_4", "pattern": [None, None, None, {"pos": {"name": "nope"}}]}
    for model, name in (
        ({"layout": layout}, "rope+nope_every_4"),
        ({"softmax": {"ssmax": {"init": "auto"}}}, "rope+ssmax"),
        ({}, "rope"),
        (None, "rope"),
    ):
        lit = SimpleNamespace(hparams={"pos": {"name": "rope", "base": 10000.0}, "model": model})
        assert Trained(lit, "run", "/x/last.ckpt").scheme == name


def test_a_run_trained_on_other_position_ids_is_named_as_compare_names_it():
    from types import SimpleNamespace

    from rope_lm.compare.retrieval_compare import retrieval_labels
    from rope_lm.runs.trained import Trained

    lit = SimpleNamespace(hparams={"pos": {"name": "rope"}, "model": {}, "train_pos": {"name": "pose", "factor": 16}})
    pose = Trained(lit, "run", "/x/last.ckpt").train_positions
    assert pose == "pose-x16"
    runs = [
        {"scheme": "rope", "method": "pi-x32", "train_pos": pose, "run_dir": "a"},
        {"scheme": "rope", "method": "none", "run_dir": "b"},
    ]  # a retrieval.json from before train_pos was recorded
    assert retrieval_labels(runs) == {"a": "rope [train: pose-x16] + pi-x32", "b": "rope"}
