"""Every attention kernel agrees with the explicit reference, for every
registered scheme: outputs and gradients (inputs and scheme parameters),
with and without a window and a per-query scale, on integer and rescaled
(fractional) positions, in one block or many. A scheme that computes its
attention itself (owns_attention) is held the same way to its own explicit
reference, its per-token terms read off a fixed random layer input where it
reads one (reads_input), gradients to that input included."""

import os
import sys

from conftest import ROOT
import pytest
import torch
import torch.nn.attention.flex_attention  # noqa: F401 (its module is patched below)
import yaml

from rope_lm.core import flex as flex_kernel
from rope_lm.core.errors import ConfigError
from rope_lm.kernels import attention, offset_sdpa
from rope_lm.kernels.attention import AttnPlan, attend, choose_kernel, explicit_attention, flex_path
from rope_lm.positional import SCHEMES, Dims, PosContext, PositionalScheme, _content, build_scheme
from rope_lm.scaling import build_scaling

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, T = 2, 21
DIMS = Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=16)
LAYER = 1  # not 0, so per-layer parameters are read at the right index
# Small sizes make the interesting regimes appear within T tokens: T5 log
# buckets and the last bucket, DeBERTa log buckets and clipping, Shaw
# clipping, FIRE's normaliser switching from L to i. A narrow FIRE MLP keeps
# its unrolled score_mod cheap in eager flex.
OVERRIDES = {
    "t5": {"num_buckets": 8, "max_distance": 12},
    "deberta": {"position_buckets": 8, "max_relative_positions": 16},
    "shaw": {"max_relative_position": 4},
    "fire": {"mlp_width": 4, "init_L": 8.0},
    "sandwich": {"dim": 8},
}
CASES = {
    "plain": (AttnPlan(), "int"),
    "window+q_scale": (AttnPlan(window=5, q_scale=torch.linspace(0.5, 1.5, T)), "int"),
    "rescaled": (AttnPlan(window=7), "float"),
}


# Where a scheme's settings are read from: conf/pos/<name>.yaml in the first of these folders that has it.
# ROPE_LM_TESTS_CONF puts folders in front, as hydra.searchpath does for the command line: the way
# tests/test_extension_points.py runs these tests on a scheme whose config it wrote to a temporary folder.
CONF_DIRS = [*filter(None, os.environ.get("ROPE_LM_TESTS_CONF", "").split(os.pathsep)), f"{ROOT}/conf"]


def scheme_options(name: str) -> dict:
    path = next((f"{d}/pos/{name}.yaml" for d in CONF_DIRS if os.path.isfile(f"{d}/pos/{name}.yaml")), None)
    assert path, f"no conf/pos/{name}.yaml in {CONF_DIRS}"
    with open(path) as f:
        return yaml.safe_load(f)


def make_scheme(name: str, dims: Dims = DIMS) -> PositionalScheme:
    options = {**scheme_options(name), **OVERRIDES.get(name, {})}
    torch.manual_seed(0)
    scheme = build_scheme(options, dims)
    # Move learned parameters off their initial values so that a wrongly
    # indexed or dropped parameter changes the result.
    with torch.no_grad():
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return scheme


def positions(kind: str) -> torch.Tensor:
    return torch.arange(T) if kind == "int" else torch.arange(T) * 0.75 + 2.5


def ctx():
    return PosContext(seq_len=T, train_len=DIMS.train_len, scaling=build_scaling(None))


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    """torch refuses flex backward on CPU up front (_validate_device) as not
    supported for speed; its dense reference backward, which evaluates the
    joint graph of the score_mod, runs fine and is what checks that
    score_mod gradients w.r.t. scheme parameters equal bias() ones."""
    module = sys.modules["torch.nn.attention.flex_attention"]
    monkeypatch.setattr(module, "_validate_device", lambda *args: None)


def layer_input(seed=7):
    """The fixed random normed layer input a reads_input scheme derives its terms from."""
    return torch.randn(B, T, DIMS.d_model, generator=torch.Generator().manual_seed(seed))


def run(kernel, scheme, q, k, v, pos, plan, x=None):
    c = ctx()
    if scheme.owns_attention:
        # As the model calls it: its terms from the layer's input, the dispatcher (heads matched, log-n's
        # scale on the queries) and the scheme's own path, "explicit" its reference.
        terms = scheme.token_terms(LAYER, layer_input() if x is None else x, c) if scheme.reads_input else None
        return attend(q, k, v, scheme, LAYER, pos, plan, c, kernel, terms)
    if kernel == "explicit":
        return explicit_attention(q, k, v, scheme, LAYER, pos, plan, c)
    if kernel == "flex-eager":
        # attend()'s own preprocessing, then eager flex (compiling on CPU
        # costs tens of seconds per shape).
        qr, kr = scheme.rotate(q, k, pos, pos, LAYER, c)
        if plan.q_scale is not None:
            qr = qr * plan.q_scale[:, None]
        out = flex_path(qr, kr, v, scheme, LAYER, pos, plan, c, compiled=False)
        assert out is not None, f"{scheme.name} offered no score_mod"
        return out
    return attend(q, k, v, scheme, LAYER, pos, plan, c, kernel)


def outputs_and_grads(kernel, scheme, pos, plan):
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim, requires_grad=True) for _ in range(3))
    weights = torch.randn(B, DIMS.n_head, T, DIMS.head_dim)
    x = layer_input().requires_grad_() if scheme.reads_input else None
    out = run(kernel, scheme, q, k, v, pos, plan, x)
    params = [p for p in scheme.parameters() if p.requires_grad]
    inputs = [q, k, v, *([x] if x is not None else []), *params]
    if plan.sink_logits is not None and plan.sink_logits.requires_grad:
        inputs.append(plan.sink_logits)
    grads = torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
    return out.detach(), grads


def assert_same(name, got, want, tol=(2e-5, 1e-4), grad_tol=(5e-5, 1e-4)):
    """Outputs and gradients equal within (atol, rtol)."""
    (out, grads), (ref, ref_grads) = got, want
    torch.testing.assert_close(out, ref, atol=tol[0], rtol=tol[1], msg=lambda m: f"{name} output: {m}")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert (g is None) == (r is None), f"{name}: gradient {i} missing on one path"
        if g is not None:
            torch.testing.assert_close(g, r, atol=grad_tol[0], rtol=grad_tol[1], msg=lambda m: f"{name} grad {i}: {m}")


def kernels_of(name):
    """The kernels held to the explicit path: the fixed kernels, or for a
    scheme that owns its attention its fast path as "auto" and "sdpa" ask for
    it (its flex, if any, is its own module's test: flex_path never sees it)."""
    cls = SCHEMES.get(name)
    if cls.owns_attention:
        return ["auto", "sdpa"]
    return [] if cls.has_content_terms else ["sdpa", "flex"]


def fast_kernels(name):
    """The kernels compared with explicit on the sdpa test below, in one block and in many."""
    return [k for k in kernels_of(name) if k != "flex"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", SCHEMES.names())
def test_sdpa_and_blocked_paths_match_explicit(name, case, monkeypatch):
    plan, kind = CASES[case]
    scheme, pos = make_scheme(name), positions(kind)
    ref = outputs_and_grads("explicit", scheme, pos, plan)
    for kernel in fast_kernels(name):
        assert_same(f"{name}/{kernel}/{case}", outputs_and_grads(kernel, scheme, pos, plan), ref)
    # Many query blocks (bias and content terms sliced per block) against one; a scheme that owns its
    # attention blocks its queries by rope_lm.positional._content.query_blocks.
    monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 4)
    monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 4)
    assert len(offset_sdpa.query_blocks(B, DIMS.n_head, T)) > 1 and len(_content.query_blocks(B, DIMS.n_head, 0, T)) > 1
    assert_same(f"{name}/explicit-blocked/{case}", outputs_and_grads("explicit", scheme, pos, plan), ref)
    for kernel in fast_kernels(name):
        assert_same(f"{name}/{kernel}-blocked/{case}", outputs_and_grads(kernel, scheme, pos, plan), ref)


def owning_schemes() -> list[str]:
    return [n for n in SCHEMES.names() if SCHEMES.get(n).owns_attention]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", owning_schemes())
def test_owned_attention_of_the_last_queries_equals_those_rows(name, case, monkeypatch):
    """A KV-cached step hands a scheme that owns its attention the last t
    queries of len(pos) (keys, values and terms over all of them): its rows
    equal those of the full computation, on its explicit and its fast path, in
    one block and in many, log-n's scale read at the queries' own indices."""
    plan, kind = CASES[case]
    scheme, pos = make_scheme(name), positions(kind)
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim) for _ in range(3))
    with torch.no_grad():
        full = run("explicit", scheme, q, k, v, pos, plan)
        for blocked in (False, True):
            if blocked:
                monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 4)
            for t in (1, 6):
                for kernel in ("explicit", *fast_kernels(name)):
                    got = run(kernel, scheme, q[:, :, -t:], k, v, pos, plan)
                    torch.testing.assert_close(
                        got, full[:, :, -t:], atol=2e-5, rtol=1e-4, msg=lambda m: f"{name}/{kernel}/t={t}: {m}"
                    )


@pytest.mark.parametrize("name", owning_schemes())
def test_owned_attention_serves_or_refuses_learned_sink_logits(name):
    """gpt-oss's learned sink logits (model.sink_logits): a scheme that says it
    serves them joins them to its softmax's denominator on every path, their
    gradient included; one that does not refuses them in one paragraph."""
    scheme, pos = make_scheme(name), positions("int")
    plan = AttnPlan(window=9, sink_logits=torch.linspace(-1.0, 2.0, DIMS.n_head).requires_grad_())
    if not scheme.serves_sink_logits:
        with pytest.raises(ConfigError) as info:
            outputs_and_grads("explicit", scheme, pos, plan)
        assert "\n" not in str(info.value)
        return
    ref = outputs_and_grads("explicit", scheme, pos, plan)
    without = outputs_and_grads("explicit", scheme, pos, AttnPlan(window=9))
    assert (ref[0] - without[0]).abs().max() > 1e-3  # the sinks take some weight
    for kernel in fast_kernels(name):
        assert_same(f"{name}/{kernel}/sink_logits", outputs_and_grads(kernel, scheme, pos, plan), ref)


def flex_cases(name):
    # Rescaled positions only change what a bias reads; other schemes see
    # them outside attention, which the sdpa test above already covers.
    return ["plain", "window+q_scale"] + (["rescaled"] if SCHEMES.get(name).has_bias else [])


@pytest.mark.parametrize("name", [n for n in SCHEMES.names() if "flex" in kernels_of(n)])
def test_flex_matches_explicit(name, flex_backward_on_cpu):
    scheme = make_scheme(name)
    for case in flex_cases(name):
        plan, kind = CASES[case]
        pos = positions(kind)
        ref = outputs_and_grads("explicit", scheme, pos, plan)
        assert_same(f"{name}/flex/{case}", outputs_and_grads("flex-eager", scheme, pos, plan), ref)


@pytest.mark.parametrize("name", [n for n in SCHEMES.names() if SCHEMES.get(n).has_content_terms])
def test_content_schemes_always_take_the_explicit_path(name):
    scheme = make_scheme(name)
    plan, kind = CASES["window+q_scale"]
    ref = outputs_and_grads("explicit", scheme, positions(kind), plan)
    for requested in ("auto", "sdpa", "flex"):
        assert choose_kernel(requested, scheme, plan, torch.device("cuda")) == "explicit"
        assert_same(f"{name}/{requested}", outputs_and_grads(requested, scheme, positions(kind), plan), ref)


@pytest.mark.parametrize("name", owning_schemes())
def test_a_scheme_that_owns_its_attention_gets_it_whatever_the_kernel(name):
    """No fixed kernel computes such a scheme's attention: every request
    reaches the scheme (its explicit path for "explicit", its fast path for the rest)."""
    scheme, plan = make_scheme(name), CASES["window+q_scale"][0]
    for requested in ("auto", "sdpa", "flex", "explicit"):
        for device in ("cpu", "cuda"):
            assert choose_kernel(requested, scheme, plan, torch.device(device)) == "scheme"
    assert not (scheme.has_bias or scheme.has_content_terms), "its hooks for the fixed kernels would be unused"


def test_every_bias_scheme_offers_a_score_mod():
    for name in SCHEMES.names():
        if SCHEMES.get(name).has_bias:
            assert attention.flex_supported(make_scheme(name)), name


class BiasWithoutScoreMod(PositionalScheme):
    has_bias = True

    def bias(self, layer, q_pos, k_pos, ctx):
        return torch.zeros(self.dims.n_head, len(q_pos), len(k_pos))


def test_kernel_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    alibi, nope, plain = make_scheme("alibi"), make_scheme("nope"), AttnPlan()
    window, two_pass = AttnPlan(window=4), AttnPlan(alt_q_pos=torch.arange(3), alt_k_pos=torch.arange(3), alt_from=2)
    assert choose_kernel("auto", nope, plain, cuda) == "sdpa"
    assert choose_kernel("auto", alibi, plain, cuda) == "flex"
    assert choose_kernel("auto", nope, window, cuda) == "flex"
    # CPU default: the blocked SDPA mask (compiled flex costs a compile per length there).
    assert choose_kernel("auto", alibi, plain, cpu) == "sdpa"
    assert choose_kernel("flex", alibi, plain, cpu, needs_grad=False) == "flex"
    assert choose_kernel("flex", alibi, plain, cpu, needs_grad=True) == "sdpa"  # torch: no flex backward on CPU
    fire = make_scheme("fire")  # inductor cannot compile its score_mod's backward: trains through SDPA
    assert choose_kernel("auto", fire, plain, cuda, needs_grad=True) == "sdpa"
    assert choose_kernel("auto", fire, plain, cuda, needs_grad=False) == "flex"
    assert choose_kernel("auto", alibi, plain, cuda, needs_grad=True) == "flex"
    assert choose_kernel("explicit", alibi, plain, cuda) == "explicit"
    assert choose_kernel("auto", alibi, two_pass, cuda) == "explicit"
    no_mod = BiasWithoutScoreMod(DIMS)
    assert choose_kernel("auto", no_mod, plain, cuda) == "sdpa"
    assert choose_kernel("flex", no_mod, plain, cuda) == "sdpa"


def test_attend_uses_flex_when_asked_and_falls_back_when_it_cannot(monkeypatch):
    calls = []

    def eager_flex(*args, **kwargs):
        calls.append(1)
        return flex_path(*args, **kwargs, compiled=False)

    monkeypatch.setattr(attention, "flex_path", eager_flex)
    scheme, pos, plan = make_scheme("alibi"), positions("int"), AttnPlan()
    with torch.no_grad():
        q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim) for _ in range(3))
        want = explicit_attention(q, k, v, scheme, LAYER, pos, plan, ctx())
        got = attend(q, k, v, scheme, LAYER, pos, plan, ctx(), "flex")
    assert calls and torch.allclose(got, want, atol=2e-5)
    calls.clear()
    q.requires_grad_(True)
    got = attend(q, k, v, scheme, LAYER, pos, plan, ctx(), "flex")  # training on CPU: sdpa
    assert not calls and torch.allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_two_pass_plan_on_the_explicit_path(name):
    """ReRoPE-style plan: pairs at distance >= alt_from use the second rotation."""
    scheme, pos, c = make_scheme(name), positions("int"), ctx()
    alt_q, alt_k = torch.full((T,), 5), torch.zeros(T, dtype=torch.long)
    plan = AttnPlan(alt_q_pos=alt_q, alt_k_pos=alt_k, alt_from=5, q_scale=torch.linspace(1.0, 2.0, T))
    torch.manual_seed(2)
    q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim) for _ in range(3))
    got = explicit_attention(q, k, v, scheme, LAYER, pos, plan, c)
    qs = plan.q_scale[:, None]
    q1, k1 = scheme.rotate(q, k, pos, pos, LAYER, c)
    q2, k2 = scheme.rotate(q, k, alt_q, alt_k, LAYER, c)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    near = (q1 * qs) @ k1.transpose(-1, -2)
    far = (q2 * qs) @ k2.transpose(-1, -2)
    scores = torch.where(i - j >= 5, far, near) / DIMS.head_dim**0.5
    want = torch.softmax(scores.masked_fill(j > i, float("-inf")), -1) @ v
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert choose_kernel("sdpa", scheme, plan, torch.device("cpu")) == "two_pass"
    assert choose_kernel("explicit", scheme, plan, torch.device("cpu")) == "explicit"


def test_a_failed_flex_compile_falls_back_to_sdpa(monkeypatch):
    def no_compiler(compiled):
        if compiled:
            raise RuntimeError("no C++ compiler")
        from torch.nn.attention.flex_attention import flex_attention

        return lambda *a, **kw: flex_attention(*a, **kw)

    monkeypatch.setattr(flex_kernel, "flex_fn", no_compiler)
    scheme, pos, plan = make_scheme("t5"), positions("int"), AttnPlan(window=6)
    with torch.no_grad():
        q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim) for _ in range(3))
        want = explicit_attention(q, k, v, scheme, LAYER, pos, plan, ctx())
        got = attend(q, k, v, scheme, LAYER, pos, plan, ctx(), "flex")
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        assert choose_kernel("flex", scheme, plan, torch.device("cpu")) == "sdpa"  # remembered for this scheme
        assert choose_kernel("flex", make_scheme("alibi"), plan, torch.device("cpu")) == "flex"  # not for others
        assert choose_kernel("flex", make_scheme("t5"), plan, torch.device("cpu")) == "flex"  # nor another t5 model


def _distance_tables(c):
    return [v for key, v in c.memo.items() if key[0] == "distance_bias" and v is not None]


def offers_distance_row(scheme) -> bool:
    """Whether the scheme (a class or an instance) implements the one-row shortcut at all (overrides
    PositionalScheme.distance_bias; every PairwiseBias does)."""
    cls = scheme if isinstance(scheme, type) else type(scheme)
    return cls.distance_bias is not PositionalScheme.distance_bias


def is_function_of_distance(bias: torch.Tensor) -> bool:
    """Whether an (H, T, T) bias is, on and below the diagonal, a function of i - j alone."""
    diagonals = (bias.diagonal(-d, -2, -1) for d in range(bias.shape[-1]))
    return all(torch.allclose(g, g[:, :1].expand_as(g), atol=1e-6, rtol=1e-6) for g in diagonals)


def bias_schemes() -> list[str]:
    return [n for n in SCHEMES.names() if SCHEMES.get(n).has_bias]


# What decides the path is the scheme (its distance_bias at these positions), not a list here:
# T5 floors distances, so rescaled (fractional) positions keep it on the per-block path; FIRE
# offers the row only while every query is within its L (a long L below).
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", bias_schemes())
def test_distance_bias_path_matches_explicit(name, case, monkeypatch):
    """Inference on sdpa reads every block's bias out of one padded row per
    head (rope_lm/kernels/distance_bias.py), with reversed keys; several query
    blocks, a window and a per-query scale included. The kernel takes that
    path exactly where the scheme offers the row; a row offered is the bias
    along the distances; and a scheme with the shortcut offers it wherever, at
    integer positions, its bias is a function of the distance alone."""
    monkeypatch.setattr(attention.distance_bias, "QUERY_BLOCK", 4)
    monkeypatch.setitem(OVERRIDES, "fire", {"mlp_width": 4, "init_L": 64.0})
    plan, kind = CASES[case]
    scheme, pos = make_scheme(name), positions(kind)
    torch.manual_seed(3)
    q, k, v = (torch.randn(B, DIMS.n_head, T, DIMS.head_dim) for _ in range(3))
    with torch.no_grad():
        want = explicit_attention(q, k, v, scheme, LAYER, pos, plan, ctx())
        c = ctx()
        got = attend(q, k, v, scheme, LAYER, pos, plan, c, "sdpa")
        row = scheme.distance_bias(LAYER, pos, ctx())
        full = scheme.bias(LAYER, pos, pos, ctx())
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert bool(_distance_tables(c)) == (row is not None), name
    if row is not None:
        i, j = torch.tril_indices(T, T)
        torch.testing.assert_close(row[:, i - j], full[:, i, j], atol=1e-5, rtol=1e-5)
    if kind == "int" and offers_distance_row(scheme) and is_function_of_distance(full):
        assert row is not None, f"{name} has the one-row shortcut but does not offer it at {case}"


def test_the_distance_path_expectation_fails_a_kernel_that_ignores_the_row(monkeypatch):
    """The check above is not vacuous: with the kernel never reading the row,
    a scheme that offers one (ALiBi) fails it."""
    monkeypatch.setattr(attention.distance_bias, "padded_table", lambda *a, **kw: None)
    with pytest.raises(AssertionError, match="alibi"):
        test_distance_bias_path_matches_explicit("alibi", "plain", monkeypatch)


@pytest.mark.parametrize("name", [n for n in bias_schemes() if offers_distance_row(SCHEMES.get(n))])
def test_distance_bias_path_at_long_positions(name):
    """Thousands of positions: ALiBi's penalties reach hundreds of nats and
    T5 / Kerple / Sandwich / FIRE read far into their tables; the one-row
    view must still give the explicit result at float32 tolerance, and the
    row must stay linear in the length (no T x T tensor)."""
    n, long_dims = 3000, Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=512)
    options = {**scheme_options(name), **{"fire": {"mlp_width": 8, "init_L": 4096.0}}.get(name, {})}
    torch.manual_seed(0)
    scheme = build_scheme(options, long_dims)
    pos = torch.arange(n)
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 4, n, 8) * 2 for _ in range(3))
    plans = [AttnPlan(), AttnPlan(window=700, q_scale=torch.linspace(1.0, 1.4, n))]
    for plan in plans:
        c = PosContext(seq_len=n, train_len=512, scaling=build_scaling(None))
        with torch.no_grad():
            want = explicit_attention(q, k, v, scheme, LAYER, pos, plan, c)
            c = PosContext(seq_len=n, train_len=512, scaling=build_scaling(None))
            got = attend(q, k, v, scheme, LAYER, pos, plan, c, "sdpa")
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        (table,) = _distance_tables(c)
        assert table.shape == (4, 2 * n - 1)


@pytest.mark.parametrize("window", [None, 300])
def test_fire_past_its_L_writes_bias_and_mask_in_one_pass(window, monkeypatch):
    """FIRE past its L on the CPU fills SDPA's mask with bias and causal mask
    in one loop (rope_lm/positional/_fire_kernel.py). Its mask must be, to
    the last bit, the torch path's bias (Fire._piecewise) with -inf outside
    the allowed keys, and attention through it must equal the explicit
    path: several query blocks, positions not starting at 0, two sequences,
    a window, knots on both sides of [0, 1] and a unit with zero input."""
    from rope_lm.positional import _fire_kernel

    if not _fire_kernel.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", 4 * 1000 * 40)
    monkeypatch.setattr(attention, "MASKED_BIAS_MIN_QUERIES", 40)  # blocks of 40 queries
    n, dims = 1000, Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=64)
    torch.manual_seed(0)
    scheme = build_scheme({"name": "fire", "mlp_width": 16, "init_L": 64.0}, dims)
    f = scheme.layers[LAYER]
    with torch.no_grad():
        f.w1[3] = 0.0
        f.b1[5], f.w1[5] = 0.4, -2.0  # a unit that turns off at x = 0.2
        f.b1[6], f.w1[6] = -1.5, 1.0  # one that turns on past x = 1.5
    pos = torch.arange(n) + 37
    plan = AttnPlan(window=window)
    c = PosContext(seq_len=n, train_len=64, scaling=build_scaling(None))
    with torch.no_grad():
        mask = scheme.masked_bias(LAYER, pos, 120, 160, window, c).clone()
        want = scheme.bias(LAYER, pos[120:160], pos[:160], c)  # the torch path
        allowed = offset_sdpa.allowed_block(120, 160, 160, plan, pos.device)
        assert torch.equal(mask[:, allowed], want[:, allowed])
        assert bool(torch.isneginf(mask[:, ~allowed]).all())

        torch.manual_seed(5)
        q, k, v = (torch.randn(2, 4, n, 8) * 2 for _ in range(3))
        ref = explicit_attention(
            q, k, v, scheme, LAYER, pos, plan, PosContext(seq_len=n, train_len=64, scaling=build_scaling(None))
        )
        c = PosContext(seq_len=n, train_len=64, scaling=build_scaling(None))
        got = attend(q, k, v, scheme, LAYER, pos, plan, c, "sdpa")
        assert "fire_mask_buffer" in c.memo  # the one-pass mask served the blocks
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)

        # Without numba: the torch path, the same mask values (asserted above to the bit) in other query
        # blocks, so only the summation order differs (1.2e-6 measured on an Intel Xeon).
        monkeypatch.setattr(_fire_kernel, "available", lambda: False)
        c = PosContext(seq_len=n, train_len=64, scaling=build_scaling(None))
        torch.testing.assert_close(attend(q, k, v, scheme, LAYER, pos, plan, c, "sdpa"), got, atol=1e-5, rtol=1e-5)
        assert "fire_mask_buffer" not in c.memo


def test_distance_bias_is_built_once_per_forward_and_shared_where_parameters_are():
    """One table per forward for schemes that declare it shared across layers
    (distance_bias_shared: ALiBi, T5, Sandwich), one per layer where every layer
    has its own (Kerple, FIRE)."""
    from rope_lm.model.transformer import ModelConfig, TransformerLM

    for name in [n for n in bias_schemes() if offers_distance_row(SCHEMES.get(n))]:
        per_layer = not SCHEMES.get(name).distance_bias_shared
        cfg = ModelConfig(vocab_size=50, train_len=8, n_layer=3, n_head=2, d_model=16, attention="sdpa")
        model = TransformerLM(cfg, {"name": name}).eval()
        calls = []
        original = type(model.pos_scheme).distance_bias

        def counting(self, layer, pos, ctx, original=original):
            calls.append(layer)
            return original(self, layer, pos, ctx)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(type(model.pos_scheme), "distance_bias", counting)
            with torch.no_grad():
                model(torch.randint(0, 50, (1, 20)))
        assert calls == ([0, 1, 2] if per_layer else [0]), name


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", SCHEMES.names())
def test_grouped_key_value_heads_match_repeated_heads_on_every_path(
    name, case, kv_heads, flex_backward_on_cpu, monkeypatch
):
    """k, v with fewer heads (GQA; 1 = MQA) give, on every kernel, exactly
    what full-head k, v give when each key/value head is copied to its group
    of query heads (h // group), gradients summed back over the group."""
    plan, kind = CASES[case]
    scheme, pos = make_scheme(name), positions(kind)
    group = DIMS.n_head // kv_heads
    torch.manual_seed(2)
    q = torch.randn(B, DIMS.n_head, T, DIMS.head_dim, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, T, DIMS.head_dim, requires_grad=True) for _ in range(2))
    weights = torch.randn(B, DIMS.n_head, T, DIMS.head_dim)
    k_full, v_full = (t.detach().repeat_interleave(group, dim=1).requires_grad_() for t in (k, v))
    ref = run("explicit", scheme, q, k_full, v_full, pos, plan)
    ref_grads = torch.autograd.grad((ref * weights).sum(), [q, k_full, v_full])
    ref_grads = (ref_grads[0], *(g.view(B, kv_heads, group, T, -1).sum(2) for g in ref_grads[1:]))
    kernels = ["explicit", *dict.fromkeys(["auto", *["flex-eager" if k == "flex" else k for k in kernels_of(name)]])]
    for blocked in (False, True):
        if blocked:  # many query blocks, each slicing the repeated keys
            monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 4)
            monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 4)
            kernels = [k for k in kernels if k != "flex-eager"]
        for kernel in kernels:
            out = run(kernel, scheme, q, k, v, pos, plan)
            grads = torch.autograd.grad((out * weights).sum(), [q, k, v])
            assert_same(
                f"{name}/{kernel}/{case}/kv{kv_heads}/blocked={blocked}",
                (out.detach(), grads),
                (ref.detach(), ref_grads),
            )
