"""CoPE (rope_lm/positional/cope.py) against an independent reference written
as the paper's sums, loop by loop in float64: g_ik = sigmoid(q_i.k_k/sqrt(D)),
p_ij = sum_{k=j..i} g_ik over the keys query i sees, clamped at npos_max - 1,
e[p] interpolated between floor and ceil rows, softmax of q_i.k_j/sqrt(D) +
q_i.e[p_ij]. Both kernels (explicit, fast) agree with it, outputs and
gradients of q, k, v, the table and learned sink logits, past L and with
counts past the table; the fast path never holds a (B, H, queries, keys, D)
tensor; a KV cache (prefill, steps, a second chunk) equals a full forward."""

import math

from conftest import ROOT
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan, scheme_attention
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.positional import Dims, PosContext, _content
from rope_lm.positional.cope import CoPE
from rope_lm.scaling import build_scaling

L = 8
DIMS = Dims(d_model=12, n_head=2, head_dim=6, n_layer=2, train_len=L)
LAYER = 1


def reference(q, k, v, table, npos, plan=AttnPlan(), scale_positions=False):
    """Attention of the last t = q.shape[2] of T = k.shape[2] queries, one
    (batch, head, query, key) at a time. Also returns the largest count
    before clamping, so a case can show that it reached past the table."""
    B, H, t, D = q.shape
    T = k.shape[2]
    pos_factor = 1 / math.sqrt(D) if scale_positions else 1.0
    rows, largest = [], 0.0
    for b in range(B):
        for h in range(H):
            for r in range(t):
                i = T - t + r
                qi = q[b, h, r]

                def sees(j, i=i):
                    near = plan.window is None or i - j < plan.window
                    return j <= i and (near or j < plan.sink_tokens)

                visible = [j for j in range(T) if sees(j)]
                gate = {kk: torch.sigmoid(qi @ k[b, h, kk] / math.sqrt(D)) for kk in visible}
                logits = []
                for j in visible:
                    count = sum(gate[kk] for kk in range(j, i + 1) if kk in gate)
                    largest = max(largest, float(count.detach()))
                    p = torch.clamp(count, max=npos - 1)
                    lo, hi = math.floor(float(p.detach())), math.ceil(float(p.detach()))
                    w = p - lo
                    e = (1 - w) * table[lo] + w * table[hi]
                    logits.append(qi @ k[b, h, j] / math.sqrt(D) + (qi @ e) * pos_factor)
                logits = torch.stack(logits)
                if plan.sink_logits is not None:
                    logits = torch.cat((logits, plan.sink_logits[h : h + 1]))
                a = torch.softmax(logits, 0)[: len(visible)]
                rows.append(sum(a[n] * v[b, h, j] for n, j in enumerate(visible)))
    return torch.stack(rows).reshape(B, H, t, D), largest


def scheme(npos_max=None, scale_positions=False, seed=0):
    torch.manual_seed(seed)
    s = CoPE(DIMS, npos_max=npos_max, scale_positions=scale_positions).double()
    with torch.no_grad():
        s.table.normal_(0, 0.5)  # off its zeros, so a misread row changes the result
    return s


def inputs(T, t=None, seed=1, counting=False):
    """q (B, H, t, D) and k, v (B, H, T, D) in float64. counting: keys share
    a direction the queries point along, so gates sit near 1 and counts grow
    with the distance (past the table, at T > L)."""
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, DIMS.n_head, DIMS.head_dim
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    if counting:
        u = torch.zeros(D, dtype=torch.float64)
        u[0] = 3.0
        q, k = q * 0.3 + u, k * 0.3 + u
    t = T if t is None else t
    return [x.clone().requires_grad_() for x in (q[:, :, T - t :], k, v)]


def ctx(T):
    return PosContext(seq_len=T, train_len=L, scaling=build_scaling(None))


def grads_of(out, tensors, seed=2):
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * weights).sum(), tensors)


CASES = {
    # name: (T, queries, npos_max, plan, scale_positions, counting)
    "past L, counts past L + 1 rows": (14, None, None, AttnPlan(), False, True),
    "a short table": (11, None, 3, AttnPlan(), False, False),
    "RAM's scaled position term": (10, None, None, AttnPlan(), True, False),
    "window with sinks": (13, None, 4, AttnPlan(window=4, sink_tokens=2), False, True),
    "window without sinks": (12, None, None, AttnPlan(window=3), False, False),
    "learned sink logits": (
        9,
        None,
        None,
        AttnPlan(sink_logits=torch.tensor([0.5, -1.0], dtype=torch.float64)),
        False,
        False,
    ),
    "the last queries (a cached step)": (13, 4, 5, AttnPlan(window=6, sink_tokens=1), False, True),
}


@pytest.mark.parametrize("kernel", ["explicit", "auto"])
@pytest.mark.parametrize("case", CASES)
def test_both_kernels_equal_the_reference_loops(case, kernel, monkeypatch):
    T, t, npos, plan, scaled, counting = CASES[case]
    if plan.window:  # blocks of 3 queries (per_pair = D = 6 floats on both paths): each block's window moves on
        monkeypatch.setattr(_content, "MAX_SCORE_ELEMENTS", 2 * DIMS.n_head * T * 6 * 3)
    s = scheme(npos, scaled)
    q, k, v = inputs(T, t, counting=counting)
    extra = [plan.sink_logits.clone().requires_grad_()] if plan.sink_logits is not None else []
    if extra:
        plan = AttnPlan(sink_logits=extra[0])
    want, largest = reference(q, k, v, s.table[LAYER], s.npos_max, plan, scaled)
    got = s.attention(LAYER, q, k, v, {}, torch.arange(T), plan, ctx(T), kernel)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)
    tensors = [q, k, v, s.table, *extra]
    for name, g, r in zip(["q", "k", "v", "table", "sinks"], grads_of(got, tensors), grads_of(want, tensors)):
        torch.testing.assert_close(g, r, atol=1e-9, rtol=1e-8, msg=lambda m: f"{case} {kernel} grad {name}: {m}")
    if counting:
        assert largest > s.npos_max - 1, "the case meant to clamp counts never reached past the table"
    if case == "a short table":
        assert largest > s.npos_max  # and with a table of 3 rows the counts clamp too


def test_the_reference_sees_a_wrong_count():
    """A kernel that counted from j + 1 (or forgot the clamp) would fail the
    comparison above: the reference tells them apart on the same inputs."""
    s = scheme(4)
    q, k, v = inputs(10, counting=True)
    want, _ = reference(q, k, v, s.table[LAYER], 4)
    shifted_table = torch.cat((s.table[LAYER][1:], s.table[LAYER][-1:]))  # e[p + 1]: a count one too many
    wrong, _ = reference(q, k, v, shifted_table, 4)
    longer = torch.cat((s.table[LAYER], torch.randn(20, DIMS.head_dim, dtype=torch.float64)))
    unclamped, _ = reference(q, k, v, longer, 24)
    assert not torch.allclose(want, wrong, atol=1e-6) and not torch.allclose(want, unclamped.detach(), atol=1e-6)


def test_a_zero_table_is_plain_causal_attention():
    """Zero position vectors (CoPE's initial table) leave softmax attention as it was."""
    s = CoPE(DIMS).double()
    q, k, v = inputs(12)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for kernel in ("explicit", "auto"):
        got = s.attention(0, q, k, v, {}, torch.arange(12), AttnPlan(), ctx(12), kernel)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_grouped_heads_and_log_n_scale_through_the_dispatcher():
    """scheme_attention repeats key/value heads and scales the queries first;
    the result is the reference on those repeated heads and scaled queries."""
    s = scheme()
    q, k, v = (x.detach() for x in inputs(10))
    scale = torch.linspace(0.7, 1.4, 10, dtype=torch.float64)
    plan = AttnPlan(q_scale=scale)
    got = scheme_attention(q, k[:, :1], v[:, :1], s, LAYER, torch.arange(10), plan, ctx(10))
    want, _ = reference(q * scale[:, None], k[:, :1].expand_as(k), v[:, :1].expand_as(v), s.table[LAYER], s.npos_max)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9)


class LargestTensor(TorchDispatchMode):
    """Every tensor an operation returns, by its number of elements and dimensions."""

    def __init__(self):
        super().__init__()
        self.numel, self.ndim = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.numel, self.ndim = max(self.numel, x.numel()), max(self.ndim, x.dim())
        return out


def test_the_fast_path_never_holds_a_vector_per_pair():
    """Forward and backward of the fast path stay at (B, H, queries, keys) or
    (B, H, queries, npos_max) tensors; the explicit path builds the e[p_ij]
    vectors (B, H, queries, keys, D), which is how the check would see it."""
    T, D = 48, DIMS.head_dim
    s = CoPE(DIMS)
    q, k, v = (x.detach().float().requires_grad_() for x in inputs(T))
    pairs = q.shape[0] * q.shape[1] * T * max(T, s.npos_max)
    for kernel, bounded in (("auto", True), ("explicit", False)):
        with LargestTensor() as seen:
            out = s.attention(LAYER, q, k, v, {}, torch.arange(T), AttnPlan(), ctx(T), kernel)
            out.sum().backward()
        assert (seen.ndim <= 4 and seen.numel <= pairs) == bounded, (kernel, seen.ndim, seen.numel, pairs * D)


def test_npos_max_defaults_to_L_plus_one_and_refuses_bad_values():
    assert CoPE(DIMS).npos_max == L + 1 and CoPE(DIMS).table.shape == (DIMS.n_layer, L + 1, DIMS.head_dim)
    assert CoPE(DIMS, npos_max=16).table.shape[1] == 16
    for bad in (1, 0, True, 2.5, "8"):
        with pytest.raises(ConfigError, match=r"pos\.npos_max"):
            CoPE(DIMS, npos_max=bad)


def test_the_shipped_config_is_the_constructor():
    with open(f"{ROOT}/conf/pos/cope.yaml") as f:
        options = yaml.safe_load(f)
    assert options == {"name": "cope", "npos_max": None, "scale_positions": False}


def model(method=None):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=53, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
    m = TransformerLM(cfg, {"name": "cope", "npos_max": 6}, method)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        m.pos_scheme.table.normal_(0, 0.5)
    return m.eval()


@pytest.mark.parametrize(
    "method",
    [None, {"name": "window", "window": 5, "sinks": 2, "sink_positions": "text", "logn": True}],
    ids=["plain", "window+sinks+logn"],
)
def test_a_kv_cache_read_in_pieces_equals_one_full_forward(method):
    """A prefill, single-token steps and a second chunk, past L and past the
    table, give the full forward's logits."""
    m = model(method)
    T = 30
    idx = torch.randint(0, 53, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(planned_len=T)
        pieces, out, start = (9, 1, 1, 1, 1, 17), [], 0
        for n in pieces:
            out.append(m(idx[:, start : start + n], cache=cache))
            start += n
    assert cache.length == T
    torch.testing.assert_close(torch.cat(out, 1), full, atol=2e-5, rtol=1e-4)
