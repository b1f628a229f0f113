"""Extrapolation methods: formulas at their edges, position maps against a
brute-force reference, identities that must hold exactly, refusals, and an
end-to-end evaluation of several methods on one tiny checkpoint."""

import json
import math
import os
import sys

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import explicit_attention
from rope_lm.model.transformer import build_model
from rope_lm.positional import SCHEMES, Dims, PosContext, PositionalScheme, build_scheme
from rope_lm.positional import frequencies as F
from rope_lm.positional.frequencies import default_inv_freq
from rope_lm.positional.rope import RoPE, rotate
from rope_lm.scaling import METHODS, build_scaling
from rope_lm.scaling.base import logn_scale
from rope_lm.scaling.hierarchical import hierarchical_table
from tests import forked

MODEL = {"n_layer": 2, "n_head": 2, "d_model": 32, "mlp_ratio": 2.0}
ROPE = {"name": "rope", "base": 10000.0}
L = 16


def ctx_for(method, T, train_len=L):
    return PosContext(seq_len=T, train_len=train_len, scaling=method)


def model_logits(scaling, T=48, seed=0, train_len=L, grad=False, training=False):
    torch.manual_seed(seed)
    model = build_model(MODEL, ROPE, scaling, vocab_size=64, train_len=train_len).train(training)
    with torch.no_grad():  # a trained model attends sharply; GPT-2 init is nearly uniform and hides differences
        for block in model.blocks:
            block.attn.qkv.weight.mul_(6)
    idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.set_grad_enabled(grad):
        return model(idx).detach()


class Dummy(PositionalScheme):
    """A stand-in scheme of a given family (not registered)."""

    def __init__(self, family, name, **attrs):
        super().__init__(Dims(32, 2, 16, 2, L))
        self.family, self.name = family, name
        for k, v in attrs.items():
            setattr(self, k, v)


# --- frequency formulas --------------------------------------------------------

FREQUENCY_FUNCTIONS = {
    "linear": lambda d, b, L_, T: F.linear(d, b, L_, T),
    "ntk": lambda d, b, L_, T: F.ntk_aware(d, b, L_, T),
    "dynamic": lambda d, b, L_, T: F.dynamic_ntk(d, b, L_, T, 2.0),
    "ntk_by_parts": lambda d, b, L_, T: F.ntk_by_parts(d, b, L_, T),
    "yarn": lambda d, b, L_, T: F.yarn(d, b, L_, T),
    "llama3": lambda d, b, L_, T: F.llama3(d, b, L_, T),
    "longrope": lambda d, b, L_, T: F.longrope(d, b, L_, T, [1.0] * (d // 2), [3.0] * (d // 2)),
}


@pytest.mark.parametrize("name", sorted(FREQUENCY_FUNCTIONS))
def test_scale_at_most_one_is_plain_rope(name):
    for d, base, L_, T in ((8, 10000.0, 16, 16), (64, 500000.0, 4096, 1000), (32, 10.0, 64, 1)):
        inv, factor = FREQUENCY_FUNCTIONS[name](d, base, L_, T)
        assert torch.equal(inv, default_inv_freq(d, base))
        assert factor == 1.0


@pytest.mark.parametrize("name", ["pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "llama3", "longrope"])
def test_every_frequency_method_is_plain_rope_within_the_training_length(name):
    options = {"name": name, **({"long_factor": [2.0] * 8} if name == "longrope" else {})}
    method = build_scaling(options)
    for T in (1, L // 2, L):
        inv, factor = method.rope_frequencies(16, 10000.0, ctx_for(method, T))
        assert torch.equal(inv, default_inv_freq(16, 10000.0))
        assert factor == 1.0
    inv, _ = method.rope_frequencies(16, 10000.0, ctx_for(method, 4 * L))
    assert not torch.allclose(inv, default_inv_freq(16, 10000.0))


def test_pi_divides_every_frequency_by_s():
    inv, factor = F.linear(32, 10000.0, 100, 350)
    torch.testing.assert_close(inv, default_inv_freq(32, 10000.0) / 3.5)
    assert factor == 1.0


def test_ntk_keeps_the_fastest_pair_and_stretches_the_slowest_by_s():
    d, base, s = 32, 10000.0, 6.0
    inv, _ = F.ntk_aware(d, base, 100, 100 * s)
    plain = default_inv_freq(d, base)
    assert inv[0] == plain[0] == 1.0
    torch.testing.assert_close(inv[-1], plain[-1] / s, rtol=1e-6, atol=0)
    i = torch.arange(d // 2)
    torch.testing.assert_close(inv, plain * s ** (-2 * i / (d - 2)), rtol=1e-6, atol=0)
    with pytest.raises(ConfigError, match="more than 2 rotary channels"):
        F.ntk_aware(2, base, 100, 200)


def test_dynamic_ntk_follows_the_current_length():
    method = build_scaling({"name": "dynamic_ntk"})
    for T in (3 * L, 8 * L):
        inv, _ = method.rope_frequencies(16, 10000.0, ctx_for(method, T))
        torch.testing.assert_close(inv, F.ntk_aware(16, 10000.0, L, T)[0])
    # HF's slope: factor 2 at T = 3L gives s = 2 * 3 - 1 = 5.
    torch.testing.assert_close(F.dynamic_ntk(16, 10000.0, L, 3 * L, 2.0)[0], F.ntk_aware(16, 10000.0, L, 5 * L)[0])


def rotations(d, base, L_):
    """Full turns each pair makes within L tokens."""
    return L_ * default_inv_freq(d, base).double() / (2 * math.pi)


@pytest.mark.parametrize("fn", [F.yarn, F.ntk_by_parts])
def test_yarn_ramp_keeps_fast_pairs_and_interpolates_slow_ones(fn):
    d, base, L_, s = 64, 10000.0, 4096, 4.0
    inv, factor = fn(d, base, L_, L_ * s)
    plain, r = default_inv_freq(d, base), rotations(d, base, L_)
    fast, slow = r >= 32, r <= 1
    middle = ~fast & ~slow
    assert fast.sum() >= 2 and slow.sum() >= 2 and middle.sum() >= 2
    torch.testing.assert_close(inv[fast], plain[fast], rtol=1e-7, atol=0)
    torch.testing.assert_close(inv[slow], plain[slow] / s, rtol=1e-7, atol=0)
    assert torch.all(inv[middle] < plain[middle]) and torch.all(inv[middle] > plain[middle] / s)
    assert factor == (pytest.approx(0.1 * math.log(s) + 1) if fn is F.yarn else 1.0)


def test_llama3_bands():
    d, base, L_, s = 128, 500000.0, 8192, 8.0
    inv, factor = F.llama3(d, base, L_, L_ * s)
    plain = default_inv_freq(d, base).double()
    wavelen = 2 * math.pi / plain
    high, low = wavelen < L_ / 4, wavelen > L_
    middle = ~high & ~low
    assert high.sum() and low.sum() and middle.sum()
    torch.testing.assert_close(inv[high], plain[high].float(), rtol=1e-7, atol=0)
    torch.testing.assert_close(inv[low], (plain[low] / s).float(), rtol=1e-7, atol=0)
    smooth = (L_ / wavelen[middle] - 1) / 3  # 0 at wavelength L, 1 at L/4
    expected = (1 - smooth) * plain[middle] / s + smooth * plain[middle]
    torch.testing.assert_close(inv[middle], expected.float(), rtol=1e-6, atol=0)
    assert factor == 1.0


def test_longrope_factors_attention_and_file(tmp_path):
    short, long = [1.0] * 8, [1.0 + i for i in range(8)]
    path = tmp_path / "factors.json"
    path.write_text(json.dumps({"short_factor": short, "long_factor": long}))
    method = build_scaling({"name": "longrope", "factors_file": str(path)})
    plain = default_inv_freq(16, 10000.0)
    inv, factor = method.rope_frequencies(16, 10000.0, ctx_for(method, 4 * L))
    torch.testing.assert_close(inv, plain / torch.tensor(long), rtol=1e-6, atol=0)
    assert factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(L)))
    inv, factor = method.rope_frequencies(16, 10000.0, ctx_for(method, L))
    torch.testing.assert_close(inv, plain)
    assert factor == 1.0
    with pytest.raises(ConfigError, match="long_factor"):
        build_scaling({"name": "longrope"})
    with pytest.raises(ConfigError, match="one entry per rotary channel pair"):  # 8 factors, 16 pairs
        build_model(MODEL | {"d_model": 64}, ROPE, {"name": "longrope", "long_factor": long}, 64, L)


# --- two-pass position maps ------------------------------------------------------


def reference_attention(q, k, v, inv_freq, rel):
    """Causal attention whose logit (i, j) is q_i rotated by rel[i, j] against
    k_j unrotated, i.e. RoPE at relative position rel[i, j]."""
    B, H, T, D = q.shape
    scores = torch.full((B, H, T, T), float("-inf"))
    for i in range(T):
        qi = rotate(q[:, :, i : i + 1].expand(B, H, i + 1, D), rel[i, : i + 1], inv_freq, "half")
        scores[:, :, i, : i + 1] = (qi * k[:, :, : i + 1]).sum(-1) / math.sqrt(D)
    return torch.softmax(scores, -1) @ v


def relative_map(name, T, w, k=4.0, G=3):
    i = torch.arange(T, dtype=torch.float64)[:, None]
    j = torch.arange(T, dtype=torch.float64)[None, :]
    d = i - j
    far = d >= w
    if name == "rerope":
        return torch.where(far, torch.full_like(d, w), d)
    if name == "leaky_rerope":
        return torch.where(far, w + (d - w) / k, d)
    grouped = torch.div(i, G, rounding_mode="floor") - torch.div(j, G, rounding_mode="floor") + w - w // G
    return torch.where(far, grouped, d)


@pytest.mark.parametrize(
    "name,options",
    [("rerope", {"window": 5}), ("leaky_rerope", {"window": 5, "k": 4.0}), ("self_extend", {"window": 5, "group": 3})],
)
def test_two_pass_maps_match_a_brute_force_relative_position(name, options):
    T, D = 24, 16
    method = build_scaling({"name": name, **options})
    scheme = RoPE(Dims(32, 2, D, 1, L))
    ctx = ctx_for(method, T)
    pos = torch.arange(T)
    plan = method.attention_plan(pos, ctx)
    assert plan.two_pass and plan.alt_from == 5
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, D, generator=g) for _ in range(3))
    got = explicit_attention(q, k, v, scheme, 0, pos, plan, ctx)
    ref = reference_attention(q, k, v, default_inv_freq(D, 10000.0), relative_map(name, T, 5).float())
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope"])
def test_rerope_with_window_at_least_the_length_is_plain_rope(name):
    T = 40
    plain = model_logits({"name": "none"}, T)
    # window = T - 1 still takes the two-pass path for the pair (T-1, 0), at relative position w.
    for w in (T - 1, T, 4 * T):
        torch.testing.assert_close(model_logits({"name": name, "window": w}, T), plain, rtol=1e-4, atol=1e-5)


def test_self_extend_with_group_one_is_plain_rope():
    T = 40
    method = build_scaling({"name": "self_extend", "window": 4, "group": 1})
    # Grouped positions equal to the true ones: no far pass to compute (the plain kernel serves it).
    assert not method.attention_plan(torch.arange(T), ctx_for(method, T)).two_pass
    torch.testing.assert_close(
        model_logits({"name": "self_extend", "window": 4, "group": 1}, T),
        model_logits({"name": "none"}, T),
        rtol=1e-4,
        atol=1e-5,
    )


def test_self_extend_auto_group_keeps_positions_inside_training():
    method = build_scaling({"name": "self_extend"})
    scheme = RoPE(Dims(32, 2, 16, 1, L))
    for T in (L, 2 * L, 8 * L, 16 * L + 3):
        info = method.describe(scheme, ctx_for(method, T))
        assert info["max_relative_position"] <= L - 1
        assert (info["group"] == 1) == (T <= L)


# --- log-n -------------------------------------------------------------------------


def test_logn_scale_definition():
    s = logn_scale(4 * L, L)
    assert torch.all(s[:L] == 1.0)  # n = i + 1 <= L
    for i in (L, 2 * L, 4 * L - 1):
        assert s[i] == pytest.approx(math.log(i + 1) / math.log(L))
    assert torch.all(logn_scale(4 * L, L, window=L) == 1.0)  # a window caps n


def test_logn_is_identity_within_training_and_scales_beyond():
    plain = model_logits({"name": "none"}, L)
    torch.testing.assert_close(model_logits({"name": "logn"}, L), plain)
    T = 3 * L
    plain, scaled = model_logits({"name": "none"}, T), model_logits({"name": "logn"}, T)
    # Causal: outputs before position L see only unscaled queries.
    torch.testing.assert_close(scaled[:, :L], plain[:, :L])
    assert (scaled[:, L:] - plain[:, L:]).abs().amax() > 1e-3


def test_logn_composes_with_any_method_and_is_eval_only_by_default():
    method = build_scaling({"name": "ntk", "logn": True})
    assert method.label == "ntk+logn" and build_scaling({"name": "logn"}).label == "logn"
    T = 3 * L
    evaluated = model_logits({"name": "ntk", "logn": True}, T)
    assert not torch.allclose(evaluated, model_logits({"name": "ntk"}, T))
    # A model in training mode gets no log-n unless asked for; autograd recording or not changes nothing.
    torch.testing.assert_close(
        model_logits({"name": "ntk", "logn": True}, T, training=True), model_logits({"name": "ntk"}, T)
    )
    torch.testing.assert_close(
        model_logits({"name": "ntk", "logn": True, "logn_in_training": True}, T, training=True), evaluated
    )
    assert torch.equal(model_logits({"name": "ntk", "logn": True}, T, grad=True), evaluated)
    with pytest.raises(ConfigError):
        build_scaling({"name": "logn", "logn": False})


# --- window, absolute tables ---------------------------------------------------------


def test_window_at_least_the_length_is_plain_causal():
    T = 40
    plain = model_logits({"name": "none"}, T)
    for w in (T, 5 * T):
        torch.testing.assert_close(model_logits({"name": "window", "window": w}, T), plain)
    windowed = model_logits({"name": "window", "window": 8}, T)
    torch.testing.assert_close(windowed[:, :8], plain[:, :8], rtol=1e-4, atol=1e-5)
    assert (windowed[:, 8:] - plain[:, 8:]).abs().amax() > 1e-3
    method = build_scaling({"name": "window"})
    assert method.attention_plan(torch.arange(4 * L), ctx_for(method, 4 * L)).window == L


def test_hierarchical_reproduces_the_table_and_its_local_structure():
    n, alpha = 12, 0.4
    table = torch.randn(n, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    big = hierarchical_table(table, n * n, alpha)
    torch.testing.assert_close(big[:n], table)
    for block in (1, 5, n - 1):  # rows block*n + j differ from each other as the trained rows do
        rows = big[block * n : (block + 1) * n]
        torch.testing.assert_close(rows - rows[0], table - table[0])
    u = (table - alpha * table[0]) / (1 - alpha)
    torch.testing.assert_close(big[3 * n + 7], alpha * u[3] + (1 - alpha) * u[7])
    method = build_scaling({"name": "hierarchical"})
    assert method.absolute_table(table, n, ctx_for(method, n, train_len=n)) is table
    with pytest.raises(ConfigError, match="at most 144 positions"):
        method.absolute_table(table, n * n + 1, ctx_for(method, n * n + 1, train_len=n))
    # Only the trained rows (the first L of a longer table) are decomposed.
    longer = torch.cat([table, torch.randn(20, 8, dtype=torch.float64)])
    torch.testing.assert_close(
        method.absolute_table(longer, 50, ctx_for(method, 50, train_len=n)), hierarchical_table(table, 50, alpha)
    )


@pytest.mark.parametrize("name", ["hierarchical", "pi"])
def test_learned_table_extended_past_its_rows(name):
    # PI puts the last position at (T-1)/s, a fraction past row L-1; learned.py asks for
    # ceil(max)+1 rows for that, so PI gets one spare row here.
    learned = {"name": "learned", "max_positions": L if name == "hierarchical" else L + 1}
    torch.manual_seed(0)
    model = build_model(MODEL, learned, {"name": "none"}, vocab_size=64, train_len=L).eval()
    idx = torch.randint(0, 64, (1, 3 * L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(idx[:, :L])
        model.set_scaling({"name": name})
        extended = model(idx)
    assert torch.isfinite(extended).all()
    if name == "hierarchical":  # positions < L read the trained rows unchanged
        torch.testing.assert_close(extended[:, :L], plain)


def test_pi_maps_absolute_positions_and_is_frequency_only_for_rotary():
    method = build_scaling({"name": "pi"})
    pos = torch.arange(4 * L)
    mapped = method.map_positions(pos, Dummy("absolute", "sinusoidal"), ctx_for(method, 4 * L))
    torch.testing.assert_close(mapped, pos.float() / 4)
    assert method.map_positions(pos, RoPE(Dims(32, 2, 16, 1, L)), ctx_for(method, 4 * L)) is pos
    within = pos[:L]
    assert method.map_positions(within, Dummy("absolute", "learned"), ctx_for(method, L)) is within
    assert method.extends_position_table and not build_scaling({"name": "ntk"}).extends_position_table


# --- refusals --------------------------------------------------------------------------


def test_methods_that_do_not_apply_are_refused_with_the_alternatives():
    bias = Dummy("bias", "alibi")
    with pytest.raises(ConfigError) as e:
        build_scaling({"name": "yarn"}).check(bias)
    message = str(e.value)
    assert "'yarn'" in message and "'alibi'" in message and "bias" in message
    assert "logn, none, window" in message  # the methods that do apply
    with pytest.raises(ConfigError, match="learned position table"):
        build_scaling({"name": "hierarchical"}).check(Dummy("absolute", "sinusoidal"))
    build_scaling({"name": "hierarchical"}).check(Dummy("absolute", "learned", table_rows=16))
    with pytest.raises(ConfigError, match="learned position table"):  # the capability decides, not the name
        build_scaling({"name": "hierarchical"}).check(Dummy("absolute", "learned"))
    build_scaling({"name": "pi"}).check(Dummy("absolute", "sinusoidal"))
    with pytest.raises(ConfigError, match="rerope"):
        build_scaling({"name": "rerope"}).check(Dummy("absolute", "learned"))
    with pytest.raises(ConfigError, match="does not apply"):
        build_model(MODEL, ROPE, {"name": "hierarchical"}, 64, L)


def test_bad_knobs_are_refused():
    for options in (
        {"name": "yarn", "factor": 0.5},
        {"name": "pi", "factor": "big"},
        {"name": "rerope", "window": 0},
        {"name": "yarn", "beta_fast": 1, "beta_slow": 2},
        {"name": "ntk", "nope": 1},
        {"name": "llama3", "low_freq_factor": 4, "high_freq_factor": 1},
    ):
        with pytest.raises(ConfigError):
            build_scaling(options)


# Where a method's and a scheme's settings are read from: conf/<group>/<name>.yaml in the first of these folders
# that has it. ROPE_LM_TESTS_CONF puts folders in front, as hydra.searchpath does for the command line: the way
# tests/test_extension_points.py runs these tests on a method whose config it wrote to a temporary folder.
CONF_DIRS = [
    *filter(None, os.environ.get("ROPE_LM_TESTS_CONF", "").split(os.pathsep)),
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf"),
]


def config_of(group: str, name: str) -> dict:
    from omegaconf import OmegaConf

    paths = [os.path.join(d, group, f"{name}.yaml") for d in CONF_DIRS]
    path = next((p for p in paths if os.path.isfile(p)), None)
    assert path, f"no conf/{group}/{name}.yaml in {CONF_DIRS}"
    return OmegaConf.to_container(OmegaConf.load(path))


def test_every_method_has_a_config_with_every_knob():
    for name in METHODS.names():
        check_config(name)


def check_config(name: str) -> None:
    import inspect

    cfg = config_of("scaling", name)
    assert cfg["name"] == name and "logn" in cfg and "logn_in_training" in cfg
    cls = METHODS.get(name)
    knobs = {
        p
        for c in cls.__mro__
        if "__init__" in c.__dict__ and c is not object
        for p in inspect.signature(c.__init__).parameters
        if p not in ("self", "common")
    }
    assert knobs == set(cfg) - {"name"}, name


# A scheme of every family, and the settings a method's config file leaves to the user.
FAMILY_SCHEMES = {"rotary": "rope", "bias": "alibi", "absolute": "learned", "relative": "shaw", "none": "nope"}
REQUIRED = {"longrope": {"long_factor": [2.0] * 8}}  # its searched factors, one per rotary pair (head_dim 16)


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_past_the_training_length_where_it_applies(name):
    check_method_runs(name)


def check_method_runs(name: str) -> None:
    """The method with its config file's settings, on a scheme of every family:
    refused before any work where it does not apply; elsewhere an evaluation
    forward at 1 and 4 x L is finite and its description is JSON that names it."""
    options = {**config_of("scaling", name), **REQUIRED.get(name, {})}
    cls, ran = METHODS.get(name), []
    for family, scheme in FAMILY_SCHEMES.items():
        pos = config_of("pos", scheme)
        assert SCHEMES.get(scheme).family == family
        if not cls.applies(build_scheme(pos, Dims(32, 2, 16, 2, L))):
            with pytest.raises(ConfigError, match="does not apply"):
                build_model(MODEL, pos, options, vocab_size=64, train_len=L)
            continue
        model = build_model(MODEL, pos, options, vocab_size=64, train_len=L).eval()
        for T in (L, 4 * L):
            idx = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(T))
            with torch.no_grad():
                assert torch.isfinite(model(idx)).all(), (name, scheme, T)
            described = json.loads(json.dumps(model.describe_scaling(T)))
            assert described["method"] == name and described["at_length"] == T
        ran.append(family)
    assert ran, f"{name} ran on no scheme"


# --- end to end ----------------------------------------------------------------------------


def test_eval_script_runs_several_methods_on_one_checkpoint(tiny_config, tmp_path):
    from rope_lm.runs.pipeline import train_and_evaluate

    run = str(tmp_path / "run")
    tiny_config["eval"]["multipliers"] = [1]  # the run's own report is not under test here
    train_and_evaluate(tiny_config, run)
    out = str(tmp_path / "eval")
    # Few methods and lengths: the report redraws its plot after every length (~0.6 s each here).
    names = "none,pi,ntk+logn,yarn,rerope"
    script = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "eval_extrapolation.py"
    )
    done = forked.run(
        [
            sys.executable,
            script,
            f"ckpt={run}",
            f"scaling={names}",
            "scaling.rerope.window=4",
            f"out={out}",
            "device=cpu",
            "eval.multipliers=[1,4]",
            "eval.token_budget=256",
            "eval.batch_tokens=256",
            "eval.position_buckets=8",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(os.path.join(out, "results.json")))
    labels = names.split(",")
    assert list(results["methods"]) == labels
    assert {(r["method"], r["length"]) for r in results["results"]} == {(m, n) for m in labels for n in (16, 64)}
    table = open(os.path.join(out, "results.md")).read()
    assert all(f"| {m} |" in table for m in labels)
    assert os.path.exists(os.path.join(out, "ppl_vs_length.png"))
    by = {(r["method"], r["length"]): r["ppl"] for r in results["results"]}
    for m in ("pi", "yarn", "ntk+logn"):  # identical to none within the training length
        assert by[(m, 16)] == pytest.approx(by[("none", 16)], rel=1e-5)
    assert len({by[(m, 64)] for m in labels}) == len(labels)  # and all different beyond it
    info = results["methods"]
    assert info["yarn"]["scale"] == 4.0 and info["yarn"]["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert info["ntk+logn"]["logn"]["max_logit_scale"] == pytest.approx(math.log(64) / math.log(16))
    assert info["rerope"]["window"] == 4 and info["rerope"]["max_relative_position"] == 4
    assert info["pi"]["stretch_last"] == [4.0] * 4
    done = forked.run(
        [sys.executable, script, f"ckpt={run}", "scaling=none,pi", "scaling.beta_fast=8"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "none of the listed methods" in done.stderr and "Traceback" not in done.stderr


def test_a_fixed_factor_is_named_in_the_label_so_tables_keep_it_apart_from_auto():
    from rope_lm.scaling import method_label

    assert method_label({"name": "pi"}) == method_label({"name": "pi", "factor": "auto"}) == "pi"
    assert method_label({"name": "pi", "factor": 2}) == "pi-x2"
    assert method_label({"name": "yarn", "factor": 2.5, "logn": True}) == "yarn-x2.5+logn"
    assert method_label({"name": "dynamic_ntk", "factor": 2}) == "dynamic_ntk-slope2"
    assert method_label({"name": "longrope", "factor": 4, "long_factor": [1.0, 2.0]}) == "longrope-x4"
