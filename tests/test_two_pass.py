"""The two-pass kernel (rope_lm/kernels/two_pass.py) equals the explicit path for
ReRoPE, leaky ReRoPE and Self-Extend: one attention call (outputs and
gradients) under every plan shape, the full forward, and cached decoding;
it keeps grouped heads grouped and holds no block larger than the
explicit path's."""

import pytest
import torch

from rope_lm.kernels import attention, offset_sdpa, two_pass
from rope_lm.kernels.attention import AttnPlan, attend, choose_kernel, explicit_attention
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.positional import Dims, PosContext, PositionalScheme, build_scheme
from rope_lm.scaling import build_scaling
from tests import forked

L, T = 16, 40  # trained at 16, read at 40: the far pass bites from distance w on
H, D = 4, 8
METHODS = {"rerope": {"window": 6}, "leaky_rerope": {"window": 6, "k": 3.0}, "self_extend": {"window": 6, "group": 3}}


def ctx(n=T):
    return PosContext(seq_len=n, train_len=L, scaling=build_scaling(None))


def rope(name="rope"):
    return build_scheme({"name": name}, Dims(d_model=H * D, n_head=H, head_dim=D, n_layer=2, train_len=L))


def plan_of(method, n=T, **extra):
    """The method's own plan at length n, with extra plan fields (a window, log-n)."""
    m = build_scaling({"name": method, **METHODS[method]})
    c = PosContext(seq_len=n, train_len=L, scaling=m)
    pos = torch.arange(n)
    plan = m.attention_plan(m.map_positions(pos, rope(), c), c)
    assert plan.two_pass
    for key, value in extra.items():
        setattr(plan, key, value)
    return pos, plan


@pytest.fixture
def spy(monkeypatch):
    """Counts the two-pass kernel's calls, so a test knows it ran."""
    calls = []
    real = two_pass.attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(two_pass, "attention", counted)
    return calls


@pytest.fixture(params=["default blocks", "small blocks"])
def blocks(request, monkeypatch):
    """Both one block and many: blocks that start before and after the far
    region and the window begin, and a last block shorter than the others."""
    if request.param == "small blocks":
        monkeypatch.setattr(two_pass, "FUSED_QUERIES", 7)
        monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", 2 * 4 * 7 * T)
    return request.param


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 4, 6, 11, 100])  # below, at and above w, and past the length
@pytest.mark.parametrize("grad", [False, True], ids=["fused", "written"])
def test_one_call_equals_explicit(method, kv_heads, window, grad, blocks, spy):
    torch.manual_seed(0)
    pos, plan = plan_of(method, window=window, q_scale=torch.linspace(1.0, 1.6, T))
    scheme = rope()
    q = torch.randn(2, H, T, D, requires_grad=grad)
    k, v = (torch.randn(2, kv_heads, T, D, requires_grad=grad) for _ in range(2))
    want = explicit_attention(q, k, v, scheme, 1, pos, plan, ctx())
    got = attend(q, k, v, scheme, 1, pos, plan, ctx())
    assert spy, "the two-pass kernel did not run"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if grad:
        g = torch.randn_like(want)
        for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_xpos_and_reduced_precision_equal_explicit(spy):
    torch.manual_seed(1)
    pos, plan = plan_of("leaky_rerope")
    for scheme, dtype, tol in ((rope("xpos"), torch.float32, 1e-5), (rope(), torch.bfloat16, 2e-2)):
        q = torch.randn(1, H, T, D, dtype=dtype)
        k, v = (torch.randn(1, 2, T, D, dtype=dtype) for _ in range(2))
        with torch.no_grad():
            want = explicit_attention(q, k, v, scheme, 0, pos, plan, ctx())
            got = attend(q, k, v, scheme, 0, pos, plan, ctx())
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    assert len(spy) == 2


class RotaryWithBias(PositionalScheme):
    family = "rotary"
    has_bias = True


def test_what_the_kernel_cannot_serve_stays_explicit():
    pos, plan = plan_of("rerope")
    cpu = torch.device("cpu")
    assert choose_kernel("auto", rope(), plan, cpu) == "two_pass"
    assert choose_kernel("explicit", rope(), plan, cpu) == "explicit"
    biased = RotaryWithBias(Dims(d_model=H * D, n_head=H, head_dim=D, n_layer=2, train_len=L))
    assert "bias" in two_pass.unsupported(biased, plan)
    assert choose_kernel("auto", biased, plan, cpu) == "explicit"


def test_a_plan_field_the_kernel_does_not_know_stays_explicit(monkeypatch):
    """A later plan option (sinks, temperature, ...) reaches the explicit
    path until this kernel learns it, rather than being dropped."""
    from dataclasses import dataclass, field

    @dataclass
    class Extended(AttnPlan):
        sinks: int = 0
        extra: object = field(default=None)

    pos, base = plan_of("rerope")
    fields = dict(alt_q_pos=base.alt_q_pos, alt_k_pos=base.alt_k_pos, alt_from=base.alt_from)
    assert two_pass.unsupported(rope(), Extended(**fields)) is None  # defaults only
    assert "sinks" in two_pass.unsupported(rope(), Extended(**fields, sinks=4))
    assert "extra" in two_pass.unsupported(rope(), Extended(**fields, extra=torch.ones(3)))


def test_self_extend_where_its_group_is_one_is_plain_attention():
    m = build_scaling({"name": "self_extend", "window": 6})  # group auto: 1 while every position stays below L
    for n in (L, 12):
        c = PosContext(seq_len=n, train_len=L, scaling=m)
        plan = m.attention_plan(torch.arange(n), c)
        assert not plan.two_pass and choose_kernel("auto", rope(), plan, torch.device("cpu")) == "sdpa"
    c = PosContext(seq_len=T, train_len=L, scaling=m)
    assert m.attention_plan(torch.arange(T), c).two_pass  # past L the group grows and the far pass bites


def model(method, kv_heads, attention_kernel="auto", logn=False, layout=None):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=61,
        train_len=L,
        n_layer=2,
        n_head=H,
        n_kv_head=kv_heads,
        d_model=H * D,
        attention=attention_kernel,
        layout=layout,
    )
    m = TransformerLM(cfg, {"name": "rope"}, {"name": method, **METHODS[method], "logn": logn})
    with torch.no_grad():  # a sharper model than GPT-2's init, so a wrong logit shows
        for block in m.blocks:
            block.attn.qkv.weight.mul_(6)
    return m.eval()


def tokens(n=T):
    return torch.randint(0, 61, (2, n), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("logn", [False, True])
@pytest.mark.parametrize("layout", [None, {"pattern": [{"window": 9}, {}]}], ids=["global", "sliding 9 / global"])
def test_full_forward_and_cached_decoding_equal_the_explicit_path(method, kv_heads, logn, layout, spy):
    idx = tokens()
    with torch.no_grad():
        want = model(method, kv_heads, "explicit", logn, layout)(idx)
        fast = model(method, kv_heads, "auto", logn, layout)
        got = fast(idx)
        assert spy, "the two-pass kernel did not run"
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        spy.clear()
        cache = KVCache(planned_len=T)
        pieces, start, out = (17, 1, 1, 1, 20), 0, []
        for n in pieces:  # a prefill, single-token steps, a second chunk
            out.append(fast(idx[:, start : start + n], cache=cache))
            start += n
        assert len(spy) == len(pieces) * 2  # every call, both layers
        torch.testing.assert_close(torch.cat(out, 1), want, atol=1e-5, rtol=1e-5)


def test_grouped_heads_are_never_repeated(monkeypatch):
    """The kernel is handed the key/value heads as the model made them."""
    seen = []
    real = two_pass.attention

    def record(qr, kr, q2, k2, v, *rest):
        seen.append((qr.shape[1], kr.shape[1], k2.shape[1], v.shape[1]))
        return real(qr, kr, q2, k2, v, *rest)

    monkeypatch.setattr(two_pass, "attention", record)
    monkeypatch.setattr(attention, "match_heads", lambda *a: pytest.fail("grouped heads repeated"))
    with torch.no_grad():
        m = model("self_extend", kv_heads=1)
        m(tokens())
        cache = KVCache(planned_len=T)
        m(tokens()[:, :30], cache=cache)
        m(tokens()[:, 30:31], cache=cache)
    assert seen and set(seen) == {(H, 1, 1, 1)}


@pytest.mark.parametrize("grad", [False, True], ids=["fused", "written"])
def test_no_block_larger_than_the_explicit_paths(grad, monkeypatch):
    """Peak memory, counted: the explicit path holds a block of scores
    (B x H x rows x keys, several copies); the two-pass kernel holds at
    most three masks and, written out, one part's scores. At 300 tokens
    under a small score budget both work in many blocks."""
    n = 300
    monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", 1 << 15)
    explicit_largest, ours_largest = [0], [0]
    block_probs = attention._block_probs

    def counted_probs(*args, **kwargs):
        p = block_probs(*args, **kwargs)
        explicit_largest[0] = max(explicit_largest[0], p.numel())
        return p

    real_written, real_fused, real_get = two_pass._written_part, two_pass._fused_part, two_pass._Masks.get
    held = []

    def get(self, key, build):
        out = real_get(self, key, build)
        held[:] = list(self.held.values())
        return out

    def counted(real):
        def part(q, k, v, mask):
            scores = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] if real is real_written else 0
            ours_largest[0] = max(ours_largest[0], scores + sum(m.numel() for m in held))
            return real(q, k, v, mask)

        return part

    monkeypatch.setattr(attention, "_block_probs", counted_probs)
    monkeypatch.setattr(two_pass, "_written_part", counted(real_written))
    monkeypatch.setattr(two_pass, "_fused_part", counted(real_fused))
    monkeypatch.setattr(two_pass._Masks, "get", get)
    pos, plan = plan_of("self_extend", n)
    q = torch.randn(1, H, n, D, requires_grad=grad)
    k, v = (torch.randn(1, 2, n, D) for _ in range(2))
    want = explicit_attention(q, k, v, rope(), 0, pos, plan, ctx(n))
    got = attend(q, k, v, rope(), 0, pos, plan, ctx(n))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert explicit_largest[0] and ours_largest[0]
    assert ours_largest[0] <= explicit_largest[0]


def test_the_benchmark_runs_at_a_tiny_size(tmp_path):
    """benchmarks/two_pass.py end to end; smoke only, no timing asserted
    (the machine is shared), but its comparison with explicit is read."""
    import os
    import sys

    from conftest import ROOT

    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "two_pass.py"),
            "models=[tiny]",
            "lengths=[48]",
            "train_len=16",
            "threads=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    assert [r[2].strip() for r in rows] == ["rerope", "leaky_rerope", "self_extend"]
    for r in rows:
        assert float(r[5].strip().rstrip("x")) > 0 and float(r[-1]) < 1e-4, r
    assert os.listdir(tmp_path) == []  # writes nothing
