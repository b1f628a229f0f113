"""Stick-breaking attention (rope_lm/positional/stick_breaking.py) against an
independent reference written from the paper's product formula with explicit
loops over queries and keys in float64: forward and gradients, both kernels,
past the training length, under a window and sink tokens, in a KV-cached
step; its numerics at extreme logits; the methods and settings it refuses."""

import math

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan, attend
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM, check_fit
from rope_lm.positional import Dims, PosContext, _content, build_scheme
from rope_lm.scaling import build_scaling

L = 8  # the training length; every test reads past it
DIMS = Dims(d_model=16, n_head=2, head_dim=4, n_layer=2, train_len=L)
SETTINGS = {
    "paper": {},
    "no-remainder": {"remainder": "none"},
    "attend-current": {"attend_current": True},
}
PLANS = {
    "plain": AttnPlan(),
    "window": AttnPlan(window=5),
    "window+sinks": AttnPlan(window=4, sink_tokens=2),
    "q_scale": AttnPlan(q_scale=torch.linspace(0.5, 2.0, 19)),
}


def scheme(**options):
    return build_scheme({"name": "stick_breaking", **options}, DIMS)


def ctx(T):
    return PosContext(seq_len=T, train_len=L, scaling=build_scaling(None))


def reference(q, k, v, plan, attend_current=False, remainder="current"):
    """The paper's formula, one (query, key) pair at a time, in float64:
    A_ij = sigmoid(z_ij) * prod over the keys k the query sees with j < k < i
    (j < k <= i with attend_current) of (1 - sigmoid(z_ik)). q holds the last
    t of T queries, as a KV-cached step hands them over."""
    B, H, t, D = q.shape
    T = k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    if plan.q_scale is not None:
        q = q * plan.q_scale[T - t :].double()[:, None]
    rows = []
    for r in range(t):
        i = T - t + r

        def sees(j):
            if j > i or (j == i and not attend_current):
                return False
            return not plan.window or i - j < plan.window or j < plan.sink_tokens

        beta = {j: torch.sigmoid((q[:, :, r] * k[:, :, j]).sum(-1) / math.sqrt(D)) for j in range(T) if sees(j)}
        out = torch.zeros(B, H, D, dtype=torch.float64)
        total = torch.zeros(B, H, dtype=torch.float64)
        for j in beta:
            weight = beta[j]
            for m in beta:
                if m > j:
                    weight = weight * (1 - beta[m])
            out = out + weight[..., None] * v[:, :, j]
            total = total + weight
        if remainder == "current":
            out = out + (1 - total)[..., None] * v[:, :, i]
        rows.append(out)
    return torch.stack(rows, dim=2)


def run(sch, q, k, v, plan, kernel):
    """The scheme's attention as the model calls it (log-n's scale put on q by the dispatcher)."""
    T = k.shape[2]
    if q.shape[2] == T:
        return attend(q, k, v, sch, 1, torch.arange(T), plan, ctx(T), kernel)
    if plan.q_scale is not None:
        q = q * plan.q_scale[T - q.shape[2] :][:, None]
    return sch.attention(1, q, k, v, {}, torch.arange(T), plan, ctx(T), kernel)


def inputs(T, t=None, dtype=torch.float64, spread=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = T if t is None else t
    q = (torch.randn(2, 2, t, 4, generator=g, dtype=dtype) * spread).requires_grad_()
    k = (torch.randn(2, 2, T, 4, generator=g, dtype=dtype) * spread).requires_grad_()
    v = torch.randn(2, 2, T, 4, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def value_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)
    return (out.detach(), *torch.autograd.grad((out * weights).sum(), (q, k, v)))


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kernel", ["explicit", "auto"])
def test_both_kernels_equal_the_loop_reference_with_gradients(kernel, setting, plan):
    """19 tokens (past L = 8), in float64 so that the reference decides to 1e-10."""
    options, p = SETTINGS[setting], PLANS[plan]
    sch = scheme(**options)
    q, k, v = inputs(19)
    got = value_and_grads(lambda q, k, v: run(sch, q, k, v, p, kernel), q, k, v)
    want = value_and_grads(lambda q, k, v: reference(q, k, v, p, **options), q, k, v)
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9, msg=lambda m: f"{kernel}/{setting}/{plan} {name}: {m}")


@pytest.mark.parametrize("kernel", ["explicit", "auto"])
def test_a_cached_step_and_many_query_blocks_equal_the_reference(kernel, monkeypatch):
    """The last 7 of 23 queries (a KV-cached chunk), in blocks of two queries."""
    monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", 2 * 2 * 23 * 6 * 2)
    assert len(_content.query_blocks(2, 2, 16, 23, per_pair=6)) > 2
    plan = AttnPlan(window=6, sink_tokens=1)
    sch = scheme()
    q, k, v = inputs(23, t=7)
    got = value_and_grads(lambda q, k, v: run(sch, q, k, v, plan, kernel), q, k, v)
    want = value_and_grads(lambda q, k, v: reference(q, k, v, plan), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_float32_fast_path_equals_explicit_path():
    sch = scheme()
    q, k, v = inputs(40, dtype=torch.float32, seed=3)
    plan = AttnPlan(window=12, sink_tokens=3)
    fast = value_and_grads(lambda q, k, v: run(sch, q, k, v, plan, "auto"), q, k, v)
    ref = value_and_grads(lambda q, k, v: run(sch, q, k, v, plan, "explicit"), q, k, v)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_the_nearest_key_breaks_first():
    """Equal logits z = 1.4 everywhere: the key d tokens back gets
    beta (1 - beta)^(d - 1), the nearest the most, and the rest of the stick
    goes to the query's own value."""
    T = 6
    q = torch.zeros(1, 1, T, T, dtype=torch.float64)
    k = torch.zeros(1, 1, T, T, dtype=torch.float64)
    q[..., 0], k[..., 0] = 1.0, 1.4 * math.sqrt(T)
    v = torch.eye(T, dtype=torch.float64)[None, None]  # value j is e_j: the output row is the weights
    beta = torch.sigmoid(torch.tensor(1.4, dtype=torch.float64))
    for kernel in ("explicit", "auto"):
        out = scheme().attention(0, q, k, v, {}, torch.arange(T), AttnPlan(), ctx(T), kernel)[0, 0]
        last = out[T - 1]
        torch.testing.assert_close(last[: T - 1], torch.stack([beta * (1 - beta) ** (T - 2 - j) for j in range(T - 1)]))
        torch.testing.assert_close(last[T - 1], (1 - beta) ** (T - 1))
        assert (last[1 : T - 1] > last[: T - 2]).all()  # more weight the nearer the key
        torch.testing.assert_close(out[0], v[0, 0, 0])  # the first token sees no key: all of it is its own


def test_a_window_drops_far_keys_without_breaking_the_stick_for_near_ones():
    """Under a window of w, a query's output equals the unwindowed attention
    over only its w nearest tokens; with sink tokens, over the sinks followed
    by those tokens (the sinks are the farthest keys it sees)."""
    torch.manual_seed(0)
    T, w, sinks = 15, 4, 2
    q, k, v = (torch.randn(1, 2, T, 4, dtype=torch.float64) * 2 for _ in range(3))
    sch = scheme()
    for kernel in ("explicit", "auto"):
        windowed = run(sch, q, k, v, AttnPlan(window=w), kernel)
        sunk = run(sch, q, k, v, AttnPlan(window=w, sink_tokens=sinks), kernel)
        for i in range(sinks + w, T):
            near = list(range(i - w + 1, i + 1))
            for keys, got in ((near, windowed), (list(range(sinks)) + near, sunk)):
                cut = run(sch, q[:, :, keys], k[:, :, keys], v[:, :, keys], AttnPlan(), kernel)[:, :, -1]
                torch.testing.assert_close(got[:, :, i], cut, atol=1e-12, rtol=0)


def test_extreme_logits_stay_finite_in_float32():
    """Logits of +-3e3 (keys, queries, values scaled up) at 3,000 tokens:
    float32 outputs and gradients finite and equal to a float64 run."""
    g = torch.Generator().manual_seed(5)
    T = 3000
    q = torch.randn(1, 1, T, 4, generator=g) * 40
    k = torch.randn(1, 1, T, 4, generator=g) * 40
    v = torch.randn(1, 1, T, 4, generator=g)
    sch = scheme()
    results = {}
    for dtype in (torch.float32, torch.float64):
        a, b, c = (x.to(dtype).requires_grad_() for x in (q, k, v))
        results[dtype] = value_and_grads(lambda q, k, v: run(sch, q, k, v, AttnPlan(), "auto"), a, b, c)
    z = (q[0, 0] @ k[0, 0].T).abs().max() / 2
    assert z > 2000, "the test must reach extreme logits"
    for got, want in zip(results[torch.float32], results[torch.float64]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, atol=2e-4 * want.abs().max().item(), rtol=0)
    with torch.no_grad():  # the explicit reference too
        assert torch.isfinite(run(sch, q, k, v, AttnPlan(), "explicit")).all()


def test_near_keys_keep_float32_precision_at_long_lengths():
    """At 4,000 tokens of ordinary logits the float32 output matches float64
    to 1e-5: the sums of log(1 - beta) are taken from the nearest key outward."""
    g = torch.Generator().manual_seed(6)
    T = 4000
    q, k, v = (torch.randn(1, 1, T, 8, generator=g) for _ in range(3))
    with torch.no_grad():
        out = run(scheme(), q, k, v, AttnPlan(), "auto")
        want = run(scheme(), q.double(), k.double(), v.double(), AttnPlan(), "auto")
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)


def test_learned_sink_logits_and_bad_settings_are_refused():
    plan = AttnPlan(sink_logits=torch.zeros(2))
    q, k, v = inputs(5)
    for kernel in ("explicit", "auto"):
        with pytest.raises(ConfigError, match="stick_breaking.*without a softmax denominator.*model.sink_logits"):
            run(scheme(), q, k, v, plan, kernel)
    # a run's settings meet it before any weights are built
    with pytest.raises(ConfigError, match="stick_breaking.*without a softmax denominator.*model.sink_logits"):
        check_fit(config(softmax={"sink_logits": True}), POS, None, 4 * L)
    check_fit(config(), POS, None, 4 * L)
    with pytest.raises(ConfigError, match=r"pos.remainder='value'.*'current'.*'none'"):
        scheme(remainder="value")
    with pytest.raises(ConfigError, match="pos.attend_current='yes' must be true or false"):
        scheme(attend_current="yes")


def config(**extra):
    return ModelConfig(**{**dict(vocab_size=37, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32), **extra})


POS = {"name": "stick_breaking"}


def test_rotary_methods_are_refused_by_family_and_logn_and_window_serve():
    for method in ("yarn", "ntk", "pi", "rerope", "self_extend"):
        with pytest.raises(
            ConfigError, match=rf"{method!r}.*does not apply to.*'stick_breaking'.*family is 'content'"
        ) as e:
            check_fit(config(), POS, {"name": method}, 4 * L)
        assert "\n" not in str(e.value)
    torch.manual_seed(0)
    model = TransformerLM(config(), POS).eval()
    idx = torch.randint(0, 37, (2, 4 * L))
    streaming = {"name": "window", "window": 5, "sinks": 2}
    logits = {}
    for label, method in {
        "logn": {"name": "logn"},
        "window": {"name": "window", "window": 5},
        "window+logn": {"name": "window", "window": 5, "logn": True},
        "streaming_llm-text": {**streaming, "sink_positions": "text"},
    }.items():
        check_fit(config(), POS, method, 4 * L)
        model.set_scaling(method)
        with torch.no_grad():
            logits[label] = model(idx)
        assert torch.isfinite(logits[label]).all()
    # the scheme reads no positions, so sinks re-read at positions before the window cannot be served: refused
    with pytest.raises(ConfigError, match="sink_positions=text"):
        check_fit(config(), POS, streaming, 4 * L)
    assert (logits["window"] - logits["logn"]).abs().max() > 1e-3


@pytest.mark.parametrize("method", [None, {"name": "window", "window": 6}])
def test_kv_cache_prefill_steps_and_a_second_chunk_equal_one_forward(method):
    torch.manual_seed(0)
    model = TransformerLM(config(), POS, method).eval()
    idx = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(planned_len=30)
        pieces, start = [], 0
        for n in (9, 1, 1, 1, 18):  # prefill, three steps, a second chunk
            pieces.append(model(idx[:, start : start + n], cache=cache))
            start += n
    assert set(cache.layer(0).buffers) == {"keys", "values"}
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=1e-4)


def test_the_model_trains_through_it():
    """Gradients reach the query and key projections (the break points) and a few steps lower the loss."""
    torch.manual_seed(0)
    model = TransformerLM(config(n_kv_head=4), POS).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 37, (4, 17), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).reshape(-1, 37), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        qk = model.blocks[0].attn.qkv.weight.grad[: 2 * 32]
        assert torch.isfinite(qk).all() and qk.abs().max() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
