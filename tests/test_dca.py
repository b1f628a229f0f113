"""Dual Chunk Attention (`scaling=dca`, rope_lm/scaling/dca.py) against a
reference written from the paper's position maps (An et al. 2024, §3.1, with
the indices of its code and Qwen2.5-1M's): for every pair (i, j), j <= i,
explicit loops build the query's and the key's position,

    key          P_k[j] = j mod c                      (c = chunk_size - local_size)
    intra        P_q = i mod c                         (j in i's chunk)
    successive   P_q = min(i mod c + c, chunk_size)    (j in the chunk before)
    inter        P_q = chunk_size                      (any earlier chunk)

and the logit of q rotated at P_q against k rotated at P_k, in float64; the
softmax over the allowed keys then weights the values. rope-lm's explicit
kernel, its two-pass kernel (fused and, with gradients, written out), a KV
cache's prefill and steps and a whole model's forward must give the same
outputs."""

import math

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import attend
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import build_model
from rope_lm.positional import Dims, PosContext, build_scheme
from rope_lm.scaling import build_scaling

L, T, D = 16, 40, 8  # trained at 16: auto chunk_size 12, local_size 1, chunks of 11; 40 tokens span 4 chunks


def reference(q, k, v, chunk_size, local_size, base=10000.0, window=None, q_scale=None):
    """DCA's attention by the paper's maps, pair by pair, float64."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, n, d = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    c = chunk_size - local_size
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)

    def rot(x, p):
        a = p * inv
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()), -1)

    logits = torch.full((B, H, n, n), float("-inf"), dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1):
            if window and i - j >= window:
                continue
            if i // c == j // c:
                pq = i % c
            elif i // c == j // c + 1:
                pq = min(i % c + c, chunk_size)
            else:
                pq = chunk_size
            pk = j % c
            qi = q[:, :, i] * (1.0 if q_scale is None else float(q_scale[i]))
            logits[:, :, i, j] = (rot(qi, pq) * rot(k[:, :, j], pk)).sum(-1) / math.sqrt(d)
    return torch.softmax(logits, -1) @ v


def inputs(seed=0, n=T, heads=4, kv_heads=2, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, n, D, generator=g) * 2 for h in (heads, kv_heads, kv_heads))
    return [x.requires_grad_(grad) for x in (q, k, v)]


def ours(q, k, v, options, kernel, window=None, n=T):
    method = build_scaling({"name": "dca", **options})
    scheme = build_scheme({"name": "rope"}, Dims(32, q.shape[1], D, 1, L))
    ctx = PosContext(seq_len=n, train_len=L, scaling=method)
    pos = torch.arange(n)
    plan = method.attention_plan(pos, ctx)
    if window:
        plan.window = window
    return attend(q, k, v, scheme, 0, pos, plan, ctx, kernel), plan


SIZES = [{}, {"chunk_size": 10, "local_size": 3}, {"chunk_size": 16, "local_size": 7}]


@pytest.mark.parametrize("options", SIZES, ids=["auto", "10-3", "16-7"])
@pytest.mark.parametrize("kernel", ["explicit", "auto"])
@pytest.mark.parametrize("window", [None, 7, 15])
def test_attention_equals_the_papers_position_maps(options, kernel, window):
    q, k, v = inputs()
    S, w = build_scaling({"name": "dca", **options}).sizes(L)
    got, plan = ours(q, k, v, options, kernel, window)
    assert plan.two_pass
    torch.testing.assert_close(got.double(), reference(q, k, v, S, w, window=window), atol=2e-5, rtol=1e-5)


def test_log_n_multiplies_both_passes():
    q, k, v = inputs(seed=3)
    method = build_scaling({"name": "dca", "logn": True})
    ctx = PosContext(seq_len=T, train_len=L, scaling=method)
    plan = method.attention_plan(torch.arange(T), ctx)
    assert plan.q_scale is not None and plan.q_scale[-1] > 1
    got, _ = ours(q, k, v, {"logn": True}, "auto")
    torch.testing.assert_close(got.double(), reference(q, k, v, 12, 1, q_scale=plan.q_scale), atol=2e-5, rtol=1e-5)


def test_written_path_with_gradients_equals_the_fused_one():
    q, k, v = inputs(seed=5, grad=True)
    written, _ = ours(q, k, v, {"chunk_size": 10, "local_size": 3}, "auto")
    written.square().sum().backward()
    with torch.no_grad():
        fused, _ = ours(q, k, v, {"chunk_size": 10, "local_size": 3}, "auto")
    torch.testing.assert_close(written, fused, atol=2e-5, rtol=1e-5)
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v))
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    explicit, _ = ours(q, k, v, {"chunk_size": 10, "local_size": 3}, "explicit")
    explicit.square().sum().backward()
    for a, x in zip(grads, (q, k, v)):  # float32 sums in another order; gradients reach O(10) here
        torch.testing.assert_close(a, x.grad, atol=1e-5 * x.grad.abs().max().item(), rtol=1e-4)


def test_within_one_chunk_it_is_plain_attention_and_no_position_passes_chunk_size():
    q, k, v = inputs(seed=1, n=11)
    got, plan = ours(q, k, v, {}, "auto", n=11)  # chunks of 11: one chunk
    assert not plan.two_pass
    method, none = build_scaling({"name": "dca"}), build_scaling({"name": "none"})
    scheme = build_scheme({"name": "rope"}, Dims(32, 4, D, 1, L))
    ctx = PosContext(seq_len=11, train_len=L, scaling=none)
    torch.testing.assert_close(got, attend(q, k, v, scheme, 0, torch.arange(11), plan, ctx, "explicit"))
    described = method.describe(None, PosContext(seq_len=4 * L, train_len=L, scaling=method))
    assert (described["chunk_size"], described["local_size"], described["chunk"]) == (12, 1, 11)
    assert described["max_relative_position"] == 12 < L


def model(method, seed=0, **extra):
    torch.manual_seed(seed)
    m = build_model(
        {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32, **extra}, {"name": "rope"}, method, 61, L
    )
    with torch.no_grad():
        for block in m.blocks:
            block.attn.qkv.weight.mul_(6)  # sharp attention, so the positions show
    return m.eval()


def test_a_model_reads_dca_differently_from_plain_rope_past_one_chunk_and_alike_within():
    idx = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(2))
    dca, plain = model({"name": "dca"}), model({"name": "none"})
    with torch.no_grad():
        a, b = dca(idx), plain(idx)
    torch.testing.assert_close(a[:, :11], b[:, :11], atol=1e-5, rtol=1e-5)  # the first chunk: nothing moves
    assert (a[:, 11:] - b[:, 11:]).abs().max() > 1e-2


@pytest.mark.parametrize("planned", [True, False])
def test_kv_cache_prefill_and_steps_equal_one_forward(planned):
    """Planned, as tests/test_kv_cache.py checks for every method; unplanned,
    the far pass starts when the tokens outgrow a chunk (raw keys kept)."""
    m = model({"name": "dca", "chunk_size": 10, "local_size": 3})
    idx = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(4))
    cache = KVCache(planned_len=T if planned else None)
    with torch.no_grad():
        full = m(idx)
        out = [m(idx[:, :5], cache=cache)] + [m(idx[:, n : n + 1], cache=cache) for n in range(5, 30)]
        out.append(m(idx[:, 30:], cache=cache))
    torch.testing.assert_close(torch.cat(out, 1), full, atol=2e-5, rtol=1e-4)
    assert ("raw_keys" in cache.layer(0).buffers) == (not planned)


# --- refusals ---------------------------------------------------------------------


def test_schemes_that_are_not_rotary_are_refused_by_family():
    for name in ("alibi", "learned", "nope"):
        with pytest.raises(ConfigError, match=r"'dca'.*does not apply.*rotary"):
            build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": name}, {"name": "dca"}, 61, L)
    # A rotary scheme that computes its own attention takes DCA only where it serves the per-query boundary:
    # PoPE does (tests/test_rotary_variants.py), a stand-in that does not is refused.
    scheme = build_scheme({"name": "pope"}, Dims(16, 2, 8, 1, L))
    build_scaling({"name": "dca"}).check(scheme)
    scheme.serves_chunked_passes = False
    with pytest.raises(ConfigError, match="computes its own attention"):
        build_scaling({"name": "dca"}).check(scheme)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"chunk_size": 8, "local_size": 4}, r"chunk_size > 2 x local_size"),
        ({"chunk_size": 0}, r"scaling.chunk_size=0 must be a positive integer"),
        ({"local_size": "big"}, r"scaling.local_size='big'"),
    ],
)
def test_bad_sizes_are_one_paragraph(options, match):
    with pytest.raises(ConfigError, match=match):
        build_scaling({"name": "dca", **options})


def test_a_chunk_past_the_training_length_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"chunk_size=20.*past the 16 positions"):
        model({"name": "dca", "chunk_size": 20, "local_size": 2}).validate_length(4 * L)
    with pytest.raises(ConfigError, match=r"chunk_size=12 with scaling.local_size=6"):  # chunk_size auto: 3L/4
        model({"name": "dca", "local_size": 6}).validate_length(4 * L)
