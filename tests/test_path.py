"""PaTH (rope_lm/positional/path.py): both kernels against an independent
float64 reference that multiplies the D x D Householder matrices out pair by
pair, forward and gradients (q, k, v, the layer's input x and every parameter
of the scheme), past the training length, with and without PaTH-FoX's forget
gate, under windows, sink tokens and learned sink logits; the KV cache against
a full forward; the methods it takes and refuses."""

import math

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import build_model
from rope_lm.positional import Dims, PosContext, _content, _path_kernel, build_scheme

L = 8  # the training length; every sequence below is longer
DIMS = Dims(d_model=12, n_head=2, head_dim=4, n_layer=2, train_len=L)
LAYER = 1


def scheme_f64(forget_gate: bool, seed: int = 0):
    torch.manual_seed(seed)
    s = build_scheme({"name": "path", "forget_gate": forget_gate}, DIMS).double()
    p = s.layers[LAYER]
    with torch.no_grad():
        # Spread beta over (0, 2), both sides of 1 (negative eigenvalues included), and the gates over (0, 1).
        p.beta_w.normal_(0, 1.0)
        p.beta_b.copy_(torch.tensor([0.8, -0.8]))
        if forget_gate:
            p.gate_w.normal_(0, 0.5)
            p.gate_b.copy_(torch.tensor([2.0, 0.5]))
    s.chunk = 4  # several chunks and a partial last one at these lengths
    return s


def inputs(T, t=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, DIMS.n_head, DIMS.head_dim
    x = torch.randn(B, T, DIMS.d_model, generator=g, dtype=torch.float64)
    q = torch.randn(B, H, t or T, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    return [a.requires_grad_() for a in (x, q, k, v)]


# --- the independent reference ------------------------------------------------------------


def reference_terms(p, x, forget_gate, K=3, eps=1e-6):
    """w (as [b][t][h] vectors), beta and gate ([b][t][h] scalars), token by token."""
    B, T, _ = x.shape
    H, D = DIMS.n_head, DIMS.head_dim
    raw = [[((x[b, t] @ p.w_down) @ p.w_up).reshape(H, D) for t in range(T)] for b in range(B)]
    w, beta, gate = [], [], []
    for b in range(B):
        wb, bb, gb = [], [], []
        for t in range(T):
            wt, bt, gt = [], [], []
            for h in range(H):
                m = torch.zeros(D, dtype=x.dtype)
                for i in range(K):  # tap K-1 reads token t itself, tap 0 token t-K+1
                    src = t - (K - 1) + i
                    if src >= 0:
                        m = m + p.conv[h, :, i] * raw[b][src][h]
                silu = m / (1 + torch.exp(-m))
                wt.append(silu / torch.sqrt((silu * silu).sum() + eps))
                bt.append(2 / (1 + torch.exp(-(p.beta_w[h] @ x[b, t] + p.beta_b[h]))))
                if forget_gate:
                    gt.append(-torch.log1p(torch.exp(-(p.gate_w[h] @ x[b, t] + p.gate_b[h]))))
            wb.append(wt), bb.append(bt), gb.append(gt)
        w.append(wb), beta.append(bb), gate.append(gb)
    return w, beta, gate


def reference_attention(p, x, q, k, v, forget_gate, window=None, sink_tokens=0, sink_logits=None):
    """Query i (the last t of T) on key j: q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D), the
    product built as D x D matrices, j walking down from i; plus sum_{s=j+1..i} log sigmoid(f_s)."""
    w, beta, gate = reference_terms(p, x, forget_gate)
    B, H, t, D = q.shape
    T = k.shape[2]
    eye = torch.eye(D, dtype=q.dtype)
    rows = []
    for b in range(B):
        heads = []
        for h in range(H):
            outs = []
            for r in range(t):
                i = T - t + r
                P, gsum = eye, torch.zeros((), dtype=q.dtype)  # P = H_i ... H_{j+1}
                logits = [None] * T
                for j in range(i, -1, -1):
                    visible = window is None or i - j < window or j < sink_tokens
                    if visible:
                        logits[j] = q[b, h, r] @ P @ k[b, h, j] / math.sqrt(D) + gsum
                    Hj = eye - beta[b][j][h] * torch.outer(w[b][j][h], w[b][j][h])
                    P = P @ Hj
                    if forget_gate:
                        gsum = gsum + gate[b][j][h]
                keys = [j for j in range(T) if logits[j] is not None]
                z = torch.stack([logits[j] for j in keys])
                if sink_logits is not None:
                    z = torch.cat((z, sink_logits[h : h + 1]))
                probs = torch.softmax(z, 0)[: len(keys)]
                outs.append(sum(probs[n] * v[b, h, j] for n, j in enumerate(keys)))
            heads.append(torch.stack(outs))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def run_scheme(s, x, q, k, v, kernel, plan):
    T = x.shape[1]
    ctx = PosContext(seq_len=T, train_len=L, scaling=None)
    terms = s.token_terms(LAYER, x, ctx)
    return s.attention(LAYER, q, k, v, terms, torch.arange(T), plan, ctx, kernel)


def grads(out, seed, wrt):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), wrt, allow_unused=True)


PLANS = {
    "causal": dict(),
    "window": dict(window=5),
    "window+sinks+sink_logits": dict(window=5, sink_tokens=2, sink_logits=True),
}


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
@pytest.mark.parametrize("plan_name", list(PLANS))
def test_both_kernels_equal_the_householder_product_reference(forget_gate, plan_name):
    spec = dict(PLANS[plan_name])
    s = scheme_f64(forget_gate)
    p = s.layers[LAYER]
    x, q, k, v = inputs(T=2 * L + 3)
    sinks = None
    if spec.pop("sink_logits", False):
        sinks = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    plan = AttnPlan(window=spec.get("window"), sink_tokens=spec.get("sink_tokens", 0), sink_logits=sinks)
    wrt = [x, q, k, v, *p.parameters()] + ([sinks] if sinks is not None else [])

    ref = reference_attention(p, x, q, k, v, forget_gate, spec.get("window"), spec.get("sink_tokens", 0), sinks)
    ref_grads = grads(ref, 7, wrt)
    for kernel in ("explicit", "auto"):
        out = run_scheme(s, x, q, k, v, kernel, plan)
        torch.testing.assert_close(out, ref, atol=1e-11, rtol=1e-9, msg=f"{kernel} forward")
        for name, got, want in zip(
            ["x", "q", "k", "v", *dict(p.named_parameters()), "sinks"], grads(out, 7, wrt), ref_grads
        ):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8, msg=f"{kernel}: gradient of {name}")


def test_the_last_queries_alone_and_small_blocks_give_the_same_rows(monkeypatch):
    """Queries at the end of a longer sequence (a KV-cached step) and query blocks
    far smaller than the sequence (a long evaluation) change nothing."""
    s = scheme_f64(True)
    p = s.layers[LAYER]
    T, t = 2 * L + 5, 6
    x, q, k, v = inputs(T, t=t, seed=3)
    ref = reference_attention(p, x, q, k, v, True, window=7, sink_tokens=1)
    plan = AttnPlan(window=7, sink_tokens=1)
    B, H = q.shape[:2]
    for kernel in ("explicit", "auto"):
        torch.testing.assert_close(run_scheme(s, x, q, k, v, kernel, plan), ref, atol=1e-11, rtol=1e-9)
    # Blocks of 3 query rows (explicit) and of one chunk (chunked) over all T keys.
    monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", B * H * T * 3)
    monkeypatch.setattr(_path_kernel, "MAX_SCORE_ELEMENTS", 2 * B * H * s.chunk * T)
    assert len(_content.query_blocks(B, H, T - t, T)) == 2
    for kernel in ("explicit", "auto"):
        torch.testing.assert_close(run_scheme(s, x, q, k, v, kernel, plan), ref, atol=1e-11, rtol=1e-9)
    x2, q2, k2, v2 = inputs(T, seed=4)
    ref2 = reference_attention(p, x2, q2, k2, v2, True)
    for kernel in ("explicit", "auto"):
        torch.testing.assert_close(run_scheme(s, x2, q2, k2, v2, kernel, AttnPlan()), ref2, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
def test_kernels_agree_in_float32_over_several_default_chunks(forget_gate):
    """At the default chunk of 64 over 200 tokens (four chunks, the last partial):
    outputs and gradients of the chunked path equal the explicit one's."""
    torch.manual_seed(0)
    dims = Dims(d_model=32, n_head=2, head_dim=16, n_layer=1, train_len=64)
    s = build_scheme({"name": "path", "forget_gate": forget_gate}, dims)
    with torch.no_grad():
        s.layers[0].beta_w.normal_(0, 0.5)
    T = 200
    x = torch.randn(1, T, 32, requires_grad=True)
    q, k, v = (torch.randn(1, 2, T, 16, requires_grad=True) for _ in range(3))
    ctx = PosContext(seq_len=T, train_len=64, scaling=None)
    wrt = [x, q, k, v, *s.parameters()]
    results = []
    for kernel in ("explicit", "auto"):
        out = s.attention(0, q, k, v, s.token_terms(0, x, ctx), torch.arange(T), AttnPlan(), ctx, kernel)
        results.append((out, grads(out, 3, wrt)))
    (e, ge), (c, gc) = results
    torch.testing.assert_close(c, e, atol=2e-5, rtol=1e-4)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_no_reflection_is_plain_causal_attention_and_the_order_of_the_product_matters():
    """beta = 0 everywhere leaves softmax(q k^T / sqrt(D)) v; a product in the other order
    (H_{j+1} ... H_i applied to the key) gives other logits, so the reference would see it."""
    s = scheme_f64(False)
    p = s.layers[LAYER]
    x, q, k, v = inputs(T=L + 4)
    with torch.no_grad():
        p.beta_w.zero_()
        p.beta_b.fill_(-60.0)  # beta = 2 sigmoid(-60) ~ 2e-26
    out = run_scheme(s, x, q, k, v, "auto", AttnPlan())
    mask = torch.ones(L + 4, L + 4, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / 2).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-12, rtol=1e-10)

    w, beta, _ = reference_terms(scheme_f64(False).layers[LAYER], x, False)
    eye = torch.eye(4, dtype=torch.float64)
    Hs = [eye - beta[0][s_][0] * torch.outer(w[0][s_][0], w[0][s_][0]) for s_ in range(3)]
    paper = q[0, 0, 2] @ (Hs[2] @ Hs[1]) @ k[0, 0, 0]  # q_2^T H_2 H_1 k_0
    reversed_ = q[0, 0, 2] @ (Hs[1] @ Hs[2]) @ k[0, 0, 0]
    assert abs(float((paper - reversed_).detach())) > 1e-6


# --- the model: KV cache, training, methods ---------------------------------------------------

MODEL = dict(n_layer=2, n_head=2, d_model=32, dropout=0.0)


@pytest.mark.parametrize("forget_gate", [False, True], ids=["path", "path-fox"])
@pytest.mark.parametrize("planned", [False, True], ids=["growing", "planned"])
def test_prefill_steps_and_a_second_chunk_equal_the_full_forward(forget_gate, planned):
    torch.manual_seed(0)
    model = build_model(MODEL, {"name": "path", "forget_gate": forget_gate}, None, vocab_size=50, train_len=16).eval()
    model.pos_scheme.chunk = 8  # the cache's pieces start and end inside chunks
    T = 61
    idx = torch.randint(0, 50, (2, T))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(planned_len=T if planned else None)
        pieces = [model(idx[:, :13], cache=cache)]
        for i in range(13, 18):
            pieces.append(model(idx[:, i : i + 1], cache=cache))
        pieces.append(model(idx[:, 18:], cache=cache))
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=1e-4)


def test_the_model_trains_through_the_chunked_path_and_the_gate_learns():
    torch.manual_seed(0)
    model = build_model(MODEL, {"name": "path", "forget_gate": True}, None, vocab_size=50, train_len=16)
    model.pos_scheme.chunk = 8
    idx = torch.randint(0, 50, (4, 17))
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), idx[:, 1:].reshape(-1))
    loss.backward()
    for name, param in model.pos_scheme.named_parameters():
        assert param.grad is not None and bool(param.grad.abs().sum() > 0), name


def test_bad_settings_are_one_paragraph_errors():
    for options, match in (
        ({"forget_gate": "yes"}, "pos.forget_gate"),
        ({"rank": 0}, "pos.rank"),
        ({"conv_size": True}, "pos.conv_size"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_scheme({"name": "path", **options}, DIMS)


@pytest.mark.parametrize("method", ["ntk", "yarn", "rerope", "self_extend", "pi"])
def test_rotary_and_position_map_methods_are_refused_by_family(method):
    with pytest.raises(ConfigError, match="does not apply.*'content'"):
        build_model(MODEL, {"name": "path"}, {"name": method}, vocab_size=50, train_len=L)


def test_streaming_llm_at_cache_positions_is_refused_and_at_text_positions_runs():
    model = build_model(MODEL, {"name": "path"}, {"name": "window", "sinks": 2}, vocab_size=50, train_len=L)
    with pytest.raises(ConfigError, match="sink_positions=text"):
        model.validate_length(4 * L)
    with pytest.raises(ConfigError, match="two-pass"):
        model.eval()(torch.randint(0, 50, (1, 4 * L)))


@pytest.mark.parametrize(
    "scaling",
    [
        {"name": "logn"},
        {"name": "window"},
        {"name": "window", "sinks": 2, "sink_positions": "text", "logn": True},
    ],
    ids=["logn", "window", "window-sinks-text+logn"],
)
def test_logn_and_window_methods_run_past_the_training_length(scaling):
    torch.manual_seed(0)
    model = build_model(MODEL, {"name": "path", "forget_gate": True}, scaling, vocab_size=50, train_len=L).eval()
    model.validate_length(4 * L)
    idx = torch.randint(0, 50, (1, 4 * L))
    plain = build_model(MODEL, {"name": "path", "forget_gate": True}, None, vocab_size=50, train_len=L).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        out, base = model(idx), plain(idx)
    assert torch.isfinite(out).all()
    # Within L nothing changes (log-n is 1 there, the window covers every key); past L the method acts.
    torch.testing.assert_close(out[:, :L], base[:, :L], atol=1e-5, rtol=1e-5)
    assert (out[:, L:] - base[:, L:]).abs().max() > 1e-4
