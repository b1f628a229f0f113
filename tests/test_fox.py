"""FoX and Cable (rope_lm/positional/fox.py, cable.py, _forget_gate.py) against
a reference written from the formula with explicit loops over queries and
keys in float64: outputs and gradients (q, k, v, the layer's input and the
gate parameters) of every path, past the training length, with windows, sink
tokens, log-n scales and learned sink logits; precision where the cumulative
gate is large; the KV cache, generation, layouts, methods and export."""

import math
import sys

from conftest import ROOT
import pytest
import torch
import torch.nn.attention.flex_attention  # noqa: F401 (its module is patched below)
import torch.nn.functional as F
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan, attend
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM, build_model, check_fit
from rope_lm.positional import Dims, PosContext, _content, _forget_gate, build_scheme
from rope_lm.scaling import build_scaling

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

L, T, B = 8, 21, 2  # trained at 8, read at 21
DIMS = Dims(d_model=16, n_head=3, head_dim=8, n_layer=2, train_len=L)
LAYER = 1
KINDS = ("fox", "cable")


def options(name, **extra):
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        return {**yaml.safe_load(f), **extra}


def scheme(name, dims=DIMS):
    torch.manual_seed(0)
    s = build_scheme(options(name), dims)
    with torch.no_grad():  # gates spread from nearly shut to nearly open, per layer
        s.gate_weight.normal_(0.0, 0.5)
        s.gate_bias.normal_(1.0, 1.5)
    return s


def ctx(n=T):
    return PosContext(seq_len=n, train_len=L, scaling=build_scaling(None))


def inputs(seed=1, n=T):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, DIMS.n_head, n, DIMS.head_dim, generator=g) for _ in range(3))
    x = torch.randn(B, n, DIMS.d_model, generator=g)
    return [t.requires_grad_() for t in (q, k, v, x)]


def loop_reference(kind, q, k, v, x, W, b, window=None, sink_tokens=0, q_scale=None, sinks=None):
    """Float64, from the formula: the gate of every token from x, and for each
    query i and each key j it may see, q_i . k_j / sqrt(D) plus the sum of the
    log-gates of tokens j+1..i; softmax (a learned sink logit in the
    denominator when given); the weighted sum of values."""
    q, k, v, x, W, b = (t.double() for t in (q, k, v, x, W, b))
    n, D = q.shape[2], q.shape[3]
    pre = torch.einsum("btc,hc->bht", x, W) + b[None, :, None]
    gate = F.logsigmoid(pre) if kind == "fox" else -F.softplus(pre)
    rows = []
    for i in range(n):
        qi = q[:, :, i] * (1.0 if q_scale is None else float(q_scale[i]))
        seen = [j for j in range(i + 1) if window is None or i - j < window or j < sink_tokens]
        logits = []
        for j in seen:
            path = sum((gate[:, :, s] for s in range(j + 1, i + 1)), torch.zeros_like(gate[:, :, 0]))
            logits.append((qi * k[:, :, j]).sum(-1) / math.sqrt(D) + path)
        logits = torch.stack(logits, -1)
        if sinks is not None:
            logits = torch.cat((logits, sinks.double()[None, :, None].expand(logits.shape[0], -1, 1)), -1)
        weights = torch.softmax(logits, -1)[..., : len(seen)]
        rows.append(torch.einsum("bhj,bhjd->bhd", weights, v[:, :, seen]))
    return torch.stack(rows, 2)


PLANS = {
    "plain": dict(),
    "window+sinks+q_scale": dict(window=5, sink_tokens=2, q_scale=torch.linspace(0.5, 1.5, T)),
    "sink_logits": dict(sinks=torch.tensor([-1.0, 0.5, 3.0])),
}


def plan_of(case):
    p = PLANS[case]
    return AttnPlan(
        window=p.get("window"),
        sink_tokens=p.get("sink_tokens", 0),
        q_scale=p.get("q_scale"),
        sink_logits=p.get("sinks"),
    )


def run_path(path, s, q, k, v, x, plan):
    """Through the dispatcher as the model calls it (heads matched, log-n
    applied), or flex in eager mode on the scheme's own tensors."""
    c = ctx(q.shape[2])
    terms = s.token_terms(LAYER, x, c)
    if path == "flex-eager":
        qs = q if plan.q_scale is None else q * plan.q_scale[:, None]
        return _forget_gate.flex(qs, k, v, terms[_forget_gate.TERM], plan, c, compiled=False)
    return attend(q, k, v, s, LAYER, torch.arange(q.shape[2]), plan, c, path, terms)


@pytest.fixture
def flex_backward_on_cpu(monkeypatch):
    """torch refuses flex backward on CPU up front; its dense reference runs (tests/test_attention.py)."""
    module = sys.modules["torch.nn.attention.flex_attention"]
    monkeypatch.setattr(module, "_validate_device", lambda *args: None)


@pytest.mark.parametrize("case", PLANS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_path_equals_the_loop_reference(kind, case, flex_backward_on_cpu, monkeypatch):
    s = scheme(kind)
    plan = plan_of(case)
    W, b = s.gate_weight[LAYER], s.gate_bias[LAYER]
    q, k, v, x = inputs()
    weights = torch.randn(B, DIMS.n_head, T, DIMS.head_dim, generator=torch.Generator().manual_seed(9))
    wrt = [q, k, v, x, s.gate_weight, s.gate_bias] + (
        [plan.sink_logits.requires_grad_()] if case == "sink_logits" else []
    )
    p = PLANS[case]
    ref = loop_reference(
        kind, q, k, v, x, W, b, p.get("window"), p.get("sink_tokens", 0), p.get("q_scale"), p.get("sinks")
    )
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), wrt)
    assert ref_grads[5][1 - LAYER].abs().max() == 0 and ref_grads[5][LAYER].abs().max() > 0  # per layer
    for blocked in (False, True):
        if blocked:  # blocks of 3 queries: offsets, windowed key ranges and sink keys per block
            monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * T * 3)
            assert len(_content.query_blocks(B, DIMS.n_head, 0, T)) > 5
        for path in ("explicit", "auto", "flex-eager"):
            out = run_path(path, s, q, k, v, x, plan)
            grads = torch.autograd.grad((out * weights).sum(), wrt)
            label = f"{kind}/{case}/{path}/blocked={blocked}"
            torch.testing.assert_close(out.double(), ref.detach(), atol=2e-6, rtol=1e-5, msg=lambda m: f"{label}: {m}")
            for i, (g, r) in enumerate(zip(grads, ref_grads)):
                torch.testing.assert_close(
                    g.double(), r.double(), atol=1e-5, rtol=1e-4, msg=lambda m: f"{label} grad {i}: {m}"
                )


def test_the_reference_sees_a_wrong_gate_sum():
    """The comparison above can fail: summing the gates over j..i (one token
    too many) instead of j+1..i moves the output."""
    s = scheme("fox")
    q, k, v, x = inputs()
    with torch.no_grad():
        want = run_path("explicit", s, q, k, v, x, AttnPlan())
        terms = s.token_terms(LAYER, x, ctx())[_forget_gate.TERM]
        shifted = torch.cat((terms[:, :, 1:], terms[:, :, :1]), 2)  # token j's gate read as j+1's
        wrong = _forget_gate.explicit(q, k, v, shifted, AttnPlan())
    assert (want - wrong).abs().max() > 1e-2


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("path", ["explicit", "masked", "flex-eager"])
def test_a_large_cumulative_gate_keeps_its_precision(path, blocked, monkeypatch):
    """The gates of all tokens before a pair cancel out of its logit, so a
    first token whose log-gate is -1e5 (what 64k tokens of gates near 1/2 sum
    to, where float32 steps are 0.008) changes nothing: every path gives what
    it gives with that gate at 0, to float32 precision. A float32 cumsum
    differenced as is would not."""
    q, k, v, _ = (t.detach() for t in inputs(seed=3, n=40))
    g = torch.Generator().manual_seed(4)
    log_gate = F.logsigmoid(torch.randn(B, DIMS.n_head, 40, 1, generator=g) + 1.0)
    far = log_gate.clone()
    far[:, :, 0] = -1e5
    plan, c = AttnPlan(window=30, sink_tokens=1), ctx(40)
    if blocked:  # each block's own offset
        monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * DIMS.n_head * 40 * 12)
    run = {
        "explicit": lambda lg: _forget_gate.explicit(q, k, v, lg, plan),
        "masked": lambda lg: _forget_gate.masked_sdpa(q, k, v, lg, plan),
        "flex-eager": lambda lg: _forget_gate.flex(q, k, v, lg, plan, c, compiled=False),
    }[path]
    with torch.no_grad():
        torch.testing.assert_close(run(far), run(log_gate), atol=2e-6, rtol=1e-5)
    naive = far[..., 0].cumsum(-1)  # float32
    exact = log_gate[..., 0].double().cumsum(-1)
    err = ((naive[:, :, 1:] - naive[:, :, :1]).double() - (exact[:, :, 1:] - exact[:, :, :1])).abs().max()
    assert err > 1e-3


def test_the_last_queries_of_64k_tokens():
    """Four queries at the end of 65536 tokens whose gates sum to about
    -47000 (a KV-cached step deep into a long generation): the explicit and
    the masked paths give the float64 computation of those rows."""
    n, D = 65536, 8
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, n, D, generator=g) for _ in range(3))
    log_gate = F.logsigmoid(torch.randn(1, 1, n, 1, generator=g))
    c = log_gate[0, 0, :, 0].double().cumsum(0)
    assert c[-1] < -40000
    logits = (q[0, 0, -4:].double() @ k[0, 0].double().T) / math.sqrt(D) + c[-4:, None] - c[None, :]
    logits = logits.masked_fill(torch.arange(n)[None, :] > torch.arange(n - 4, n)[:, None], float("-inf"))
    want = torch.softmax(logits, -1) @ v[0, 0].double()
    with torch.no_grad():
        for run in (_forget_gate.explicit, _forget_gate.masked_sdpa):
            got = run(q[:, :, -4:], k, v, log_gate, AttnPlan())
            torch.testing.assert_close(got[0, 0].double(), want, atol=2e-6, rtol=1e-5)


def test_cached_steps_read_the_terms_they_kept():
    """Queries at the end of a longer sequence (a KV-cached step or chunk)
    equal those rows of the full computation, on every path."""
    s = scheme("fox")
    q, k, v, x = (t.detach() for t in inputs())
    plan = AttnPlan(window=6, sink_tokens=1)
    with torch.no_grad():
        full = run_path("explicit", s, q, k, v, x, plan)
        terms = s.token_terms(LAYER, x, ctx())
        for t in (1, 4):
            for path in ("explicit", "auto"):
                out = s.attention(LAYER, q[:, :, -t:], k, v, terms, torch.arange(T), plan, ctx(), path)
                torch.testing.assert_close(out, full[:, :, -t:], atol=2e-6, rtol=1e-5)


def test_cable_is_fox_with_the_gate_negated():
    fox, cable = scheme("fox"), scheme("cable")
    with torch.no_grad():
        cable.gate_weight.copy_(-fox.gate_weight)
        cable.gate_bias.copy_(-fox.gate_bias)
    q, k, v, x = (t.detach() for t in inputs())
    with torch.no_grad():
        a = run_path("auto", fox, q, k, v, x, AttnPlan())
        b = run_path("auto", cable, q, k, v, x, AttnPlan())
        c = run_path("auto", scheme("cable"), q, k, v, x, AttnPlan())
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert (a - c).abs().max() > 1e-2  # and not without the negation


@pytest.mark.parametrize("kind", KINDS)
def test_defaults_are_the_papers_code(kind):
    """Weights N(0, 0.02) per layer (d_model -> n_head), bias 0: every gate
    starts near 1/2 (FoX: sigmoid(0); Cable: exp(-softplus(0)) = 1/2); the
    bias stays out of weight decay, the weights do not."""
    from rope_lm.train.lit import _decay_split

    dims = Dims(d_model=256, n_head=4, head_dim=64, n_layer=3, train_len=64)
    torch.manual_seed(0)
    s = build_scheme(options(kind), dims)
    assert s.gate_weight.shape == (3, 4, 256) and s.gate_bias.shape == (3, 4)
    assert abs(s.gate_weight.std().item() - 0.02) < 1e-3 and s.gate_bias.abs().max() == 0
    gate = s.token_terms(0, torch.zeros(1, 5, 256), ctx(5))[_forget_gate.TERM].exp()
    torch.testing.assert_close(gate, torch.full((1, 4, 5, 1), 0.5))
    decay, no_decay = _decay_split(s)
    assert [p is s.gate_weight for p in decay] == [True] and [p is s.gate_bias for p in no_decay] == [True]
    # In a model, the model's init of its own layers leaves them as they are.
    m = build_model({"n_layer": 2, "n_head": 4, "d_model": 32}, options(kind, bias_init=3.0), None, 50, 16)
    assert m.pos_scheme.gate_bias.eq(3.0).all()


@pytest.mark.parametrize("knob,value", [("init_std", -0.1), ("init_std", "big"), ("bias_init", float("nan"))])
def test_bad_knobs_are_one_paragraph(knob, value):
    with pytest.raises(ConfigError, match=rf"pos.{knob}=") as info:
        build_scheme(options("fox", **{knob: value}), DIMS)
    assert "\n" not in str(info.value)


def small_model(pos, scaling=None, **extra):
    cfg = ModelConfig(**{**dict(vocab_size=61, train_len=16, n_layer=2, n_head=4, n_kv_head=2, d_model=32), **extra})
    torch.manual_seed(0)
    m = TransformerLM(cfg, pos, scaling)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def tokens(n, batch=2, seed=1):
    return torch.randint(0, 61, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_keeps_each_tokens_log_gate_and_equals_a_full_forward(kind):
    m = small_model(options(kind))
    idx = tokens(40)
    cache = KVCache(planned_len=40)
    with torch.no_grad():
        full = m(idx)
        pieces = [m(idx[:, :13], cache=cache)]
        pieces += [m(idx[:, n : n + 1], cache=cache) for n in range(13, 18)]
        pieces.append(m(idx[:, 18:], cache=cache))
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=1e-4)
    buffers = cache.layer(1).buffers
    assert set(buffers) == {"keys", "values", f"term:{_forget_gate.TERM}"}
    gates = buffers[f"term:{_forget_gate.TERM}"]
    assert gates.shape == (2, 4, 40, 1) and gates.dtype == torch.float32  # every query head's gate
    assert buffers["keys"].shape == (2, 2, 40, 8)  # grouped key/value heads stay grouped
    with torch.no_grad():
        x = m.blocks[1].norm1(m.blocks[0](m.wte(idx), m.pos_scheme, torch.arange(40), AttnPlan(), ctx(40)))
        want = m.pos_scheme.token_terms(1, x, ctx(40))[_forget_gate.TERM]
    torch.testing.assert_close(gates, want, atol=1e-6, rtol=1e-5)


def test_generation_runs_through_the_cache():
    """Greedy decoding (rope_lm/infer/generate.py) writes what greedy argmax over full forwards writes."""
    from rope_lm.infer.generate import generate

    m = small_model(options("fox"), n_kv_head=4)
    prompt = tokens(7, batch=1)[0].tolist()
    (out,) = generate(m, [prompt], max_new_tokens=12)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            seq.append(int(m(torch.tensor([seq]))[0, -1].argmax()))
    assert out.ids == seq[7:] and out.finish == "length"


def test_fox_layers_beside_rope_layers():
    """model.layout: FoX on layers 0 and 2, RoPE on 1 and 3. Each layer reads
    its own scheme (a FoX layer its own slice of the gates, a RoPE layer none),
    cached decoding equals the full forward, and training moves only the
    gates of the layers that use them."""
    m = small_model({"name": "rope"}, n_layer=4, layout={"pattern": [{"pos": options("fox")}, None]})
    fox, rope = m._layer_schemes[0], m._layer_schemes[1]
    assert [s.name for s in m._layer_schemes] == ["fox", "rope", "fox", "rope"] and m._layer_schemes[2] is fox
    idx = tokens(30)
    with torch.no_grad():
        full = m(idx)
        x = m.wte(idx)
        pos = torch.arange(30)
        for block, s in zip(m.blocks, m._layer_schemes):
            x = block(x, s, pos, AttnPlan(), ctx(30))
        torch.testing.assert_close(full, m.lm_head(m.norm(x)), atol=1e-6, rtol=1e-6)
        cache = KVCache(planned_len=30)
        cached = torch.cat([m(idx[:, :11], cache=cache), m(idx[:, 11:12], cache=cache), m(idx[:, 12:], cache=cache)], 1)
        torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)
        # not the all-RoPE model
        x = m.wte(idx)
        for block in m.blocks:
            x = block(x, rope, pos, AttnPlan(), ctx(30))
        assert (m.lm_head(m.norm(x)) - full).abs().max() > 1e-3
    m.train()
    F.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    used = fox.gate_weight.grad.flatten(1).abs().amax(1)
    assert used[0] > 0 and used[2] > 0 and used[1] == 0 and used[3] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_methods_by_family(kind):
    """RoPE's methods are refused by family in one paragraph; the methods that
    act on every family (window, StreamingLLM, log-n) run past L."""
    cfg = ModelConfig(vocab_size=61, train_len=16, n_layer=2, n_head=4, d_model=32)
    for method in ("pi", "yarn", "ntk", "self_extend"):
        with pytest.raises(ConfigError) as info:
            check_fit(cfg, options(kind), {"name": method}, 64)
        text = str(info.value)
        assert "\n" not in text and "family is 'content'" in text and f"{kind!r}" in text, text
    outputs = {}
    for method in ("window", "streaming_llm", "logn", "none"):
        with open(f"{ROOT}/conf/scaling/{method}.yaml") as f:
            scaling = {**yaml.safe_load(f), **({"window": 8} if method in ("window", "streaming_llm") else {})}
        if scaling.get("sinks"):
            # Re-reading the sinks at positions before the window takes a rotation; they stay in the text.
            with pytest.raises(ConfigError, match="sink_positions=text"):
                check_fit(cfg, options(kind), {**scaling, "sink_positions": "cache"}, 64)
            scaling["sink_positions"] = "text"
        check_fit(cfg, options(kind), scaling, 64)
        m = small_model(options(kind), scaling)
        with torch.no_grad():
            outputs[method] = m(tokens(64))
        assert torch.isfinite(outputs[method]).all(), method
    for a, b in (("window", "streaming_llm"), ("window", "none"), ("logn", "none")):  # each acts
        assert (outputs[a] - outputs[b]).abs().max() > 1e-4, (a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_export_to_transformers_refuses_in_one_paragraph(kind, tmp_path):
    from rope_lm.hf.export import export_hf

    m = small_model(options(kind), n_kv_head=4)
    with pytest.raises(ConfigError) as info:
        export_hf(m, None, str(tmp_path / "out"))
    assert "\n" not in str(info.value) and kind in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled flex with gradients is the CUDA path")
@pytest.mark.parametrize("case", PLANS)
def test_compiled_flex_trains_on_cuda(case):
    """Compiled flex, gradients into the gates included, equals the explicit
    path on a GPU: what ForgettingTransformer.flex_trains waits on."""
    dims = Dims(d_model=64, n_head=4, head_dim=16, n_layer=2, train_len=16)
    s = scheme("fox", dims).cuda()
    n = 300
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 16, device="cuda", generator=g).requires_grad_() for _ in range(3))
    x = torch.randn(2, n, 64, device="cuda", generator=g).requires_grad_()
    plan = {
        "plain": AttnPlan(),
        "window+sinks+q_scale": AttnPlan(window=150, sink_tokens=4),  # log-n's scale is put on q before flex
        "sink_logits": AttnPlan(sink_logits=torch.linspace(-1.0, 3.0, 4, device="cuda")),
    }[case]
    c = ctx(n)
    results = []
    for path in ("explicit", "flex"):
        lg = s.token_terms(LAYER, x, c)[_forget_gate.TERM]
        if path == "flex":
            out = _forget_gate.flex(q, k, v, lg, plan, c, compiled=True)
        else:
            out = _forget_gate.explicit(q, k, v, lg, plan)
        grads = torch.autograd.grad(out.square().sum(), [q, k, v, x, s.gate_weight, s.gate_bias])
        results.append((out.detach(), grads))
    (got, got_grads), (want, want_grads) = results[1], results[0]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=5e-4, rtol=2e-3)
