"""The defining properties of each positional scheme, checked against values
computed independently (by hand, or by a naive loop over the paper's formula)."""

import math
import sys

from conftest import ROOT
import pytest
import torch
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.model.transformer import build_model
from rope_lm.positional import SCHEMES, Dims, PosContext, PositionalScheme, build_scheme
from rope_lm.positional.alibi import alibi_slopes
from rope_lm.positional.deberta import log_bucket
from rope_lm.positional.rope import rotate
from rope_lm.positional.t5 import causal_bucket
from rope_lm.scaling import build_scaling

DIMS = Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=16)
SMALL = {  # sizes at which clipping / log buckets / normaliser switches happen within a few dozen tokens
    "t5": {"num_buckets": 8, "max_distance": 12},
    "deberta": {"position_buckets": 8, "max_relative_positions": 16},
    "shaw": {"max_relative_position": 4},
    "fire": {"mlp_width": 8, "init_L": 8.0},
}


def options(name, **extra):
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        return {**yaml.safe_load(f), **SMALL.get(name, {}), **extra}


def make(name, dims=DIMS, **extra) -> PositionalScheme:
    torch.manual_seed(0)
    scheme = build_scheme(options(name, **extra), dims)
    with torch.no_grad():  # off the initial values, so every parameter matters
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return scheme


def ctx(scaling=None, T=16):
    return PosContext(seq_len=T, train_len=DIMS.train_len, scaling=scaling or build_scaling(None))


def logits(scheme, q, k, pos, layer=1):
    """All pre-softmax logits a scheme produces for q, k at positions pos
    (causal part only; the rest is masked in every kernel)."""
    c = ctx(T=len(pos))
    qr, kr = scheme.rotate(q, k, pos, pos, layer, c)
    s = qr @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if scheme.has_bias:
        s = s + scheme.bias(layer, pos, pos, c)
    extra = scheme.content_scores(layer, q, k, pos, pos, c)
    if extra is not None:
        s = s + extra
    causal = torch.ones(len(pos), len(pos), dtype=torch.bool).tril()
    return s.masked_fill(~causal, 0.0)


# ---------------------------------------------------------------- all schemes


def test_every_scheme_has_a_config_that_builds():
    names = SCHEMES.names()
    assert len(names) >= 15
    for name in names:
        with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
            text = f.read()
        assert text.startswith("# ") and "20" in text.splitlines()[0], f"{name}.yaml: first line cites the paper"
        assert yaml.safe_load(text)["name"] == name
        build_scheme(yaml.safe_load(text), DIMS)


@pytest.mark.parametrize("name", SCHEMES.names())
def test_causal(name):
    """Changing token t+1 changes no logit at positions <= t (whole model),
    also past the training length."""
    model_cfg = {"n_layer": 2, "n_head": 4, "d_model": 32, "mlp_ratio": 2.0}
    torch.manual_seed(0)
    model = build_model(model_cfg, options(name), None, vocab_size=50, train_len=16).eval()
    with torch.no_grad():
        for p in model.pos_scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    idx = torch.randint(0, 50, (2, 27))
    changed = idx.clone()
    t = 19
    changed[:, t + 1] = (idx[:, t + 1] + 1) % 50
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])  # the change is visible where it may be


RELATIVE_FAMILIES = ("rotary", "bias", "relative")
# Schemes whose logits the hooks give (rotate, bias, content_scores); one that owns its attention is
# checked on its attention's output below.
RELATIVE = [
    n for n in SCHEMES.names() if SCHEMES.get(n).family in RELATIVE_FAMILIES and not SCHEMES.get(n).owns_attention
]


@pytest.mark.parametrize("name", RELATIVE)
def test_scores_depend_only_on_relative_positions(name):
    # FIRE normalises by max(L, i): relative only while every i < L.
    scheme = make(name, init_L=1000.0) if name == "fire" else make(name)
    torch.manual_seed(1)
    q, k = torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8)
    pos = torch.arange(20)
    for shift in (7, 300):
        torch.testing.assert_close(logits(scheme, q, k, pos + shift), logits(scheme, q, k, pos), atol=2e-3, rtol=1e-3)
    # Non-uniform spacing still gives the same logits for the same gaps.
    gaps = torch.tensor([0, 1, 3, 4, 8, 9, 15, 16, 17, 30])
    torch.testing.assert_close(
        logits(scheme, q[..., :10, :], k[..., :10, :], gaps + 50),
        logits(scheme, q[..., :10, :], k[..., :10, :], gaps),
        atol=2e-3,
        rtol=1e-3,
    )


def owned_attention(scheme, q, k, v, pos, x=None, plan=None, layer=1):
    """What a scheme that computes its attention itself gives for q, k, v at
    positions pos (its explicit path), its terms read off the layer input x."""
    c = ctx(T=len(pos))
    terms = scheme.token_terms(layer, x, c) if scheme.reads_input else {}
    return scheme.attention(layer, q, k, v, terms, pos, plan or AttnPlan(), c, "explicit")


# A content scheme reads no position ids at all, so its attention is the same at any shift; schemes
# of the relative families that own their attention depend on differences of positions only.
OWNED = [
    n
    for n in SCHEMES.names()
    if SCHEMES.get(n).owns_attention and SCHEMES.get(n).family in (*RELATIVE_FAMILIES, "content")
]


@pytest.mark.parametrize("name", OWNED)
def test_owned_attention_depends_only_on_relative_positions(name):
    """The analogue of the logits' check for a scheme that owns its
    attention: its output, a window with sink tokens included, is the same
    for positions shifted by a constant."""
    scheme = make(name)
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 20, 8) for _ in range(3))
    x = torch.randn(2, 20, DIMS.d_model)
    pos = torch.arange(20)
    plan = AttnPlan(window=9, sink_tokens=2)
    with torch.no_grad():
        base = owned_attention(scheme, q, k, v, pos, x, plan)
        for shift in (7, 300):
            torch.testing.assert_close(
                owned_attention(scheme, q, k, v, pos + shift, x, plan), base, atol=2e-4, rtol=1e-3
            )
        gaps = torch.tensor([0, 1, 3, 4, 8, 9, 15, 16, 17, 30])
        sub = [t[..., :10, :] for t in (q, k, v)]
        torch.testing.assert_close(
            owned_attention(scheme, *sub, gaps + 50, x[:, :10]),
            owned_attention(scheme, *sub, gaps, x[:, :10]),
            atol=2e-4,
            rtol=1e-3,
        )


@pytest.mark.parametrize("name", [n for n in SCHEMES.names() if SCHEMES.get(n).reads_input])
def test_owned_attention_reads_the_layer_input(name):
    """Where a scheme reads the layer's input (its token_terms), the input
    matters: another input, the same q, k, v and positions, another output;
    and each token's terms are its own, (B, H, T, d), so the first tokens'
    terms do not depend on later tokens."""
    scheme = make(name)
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 20, 8) for _ in range(3))
    x, other = torch.randn(2, 20, DIMS.d_model), torch.randn(2, 20, DIMS.d_model)
    pos = torch.arange(20)
    with torch.no_grad():
        a, b = owned_attention(scheme, q, k, v, pos, x), owned_attention(scheme, q, k, v, pos, other)
        assert (a - b).abs().max() > 1e-3
        terms = scheme.token_terms(1, x, ctx(T=20))
        cut = scheme.token_terms(1, x[:, :12], ctx(T=12))
    assert terms and set(cut) == set(terms)
    for key, t in terms.items():
        assert t.dim() == 4 and t.shape[:3] == (2, 4, 20), key
        torch.testing.assert_close(cut[key], t[:, :, :12], atol=1e-6, rtol=1e-5)


def test_the_invariance_check_can_fail():
    """Absolute schemes and FIRE past L are not shift invariant, and the same
    comparison sees it."""
    x = torch.randn(1, 20, DIMS.d_model)
    pos = torch.arange(20)
    for name in ("learned", "sinusoidal", "multiplicative"):
        s = make(name)
        assert not torch.allclose(s.embed(x, pos, ctx()), s.embed(x, pos + 7, ctx()), atol=1e-3)
    fire = make("fire", init_L=4.0)
    q, k = torch.randn(1, 4, 20, 8), torch.randn(1, 4, 20, 8)
    assert not torch.allclose(logits(fire, q, k, pos + 7), logits(fire, q, k, pos), atol=1e-3)


# ---------------------------------------------------------------- rotary


def rotation_matrix(p, inv_freq, dim, pairing):
    """Block rotation R(p) acting on column vectors, built pair by pair."""
    R = torch.eye(dim, dtype=torch.float64)
    r = 2 * len(inv_freq)
    for i, f in enumerate(inv_freq.tolist()):
        a, b = (i, i + r // 2) if pairing == "half" else (2 * i, 2 * i + 1)
        c, s = math.cos(p * f), math.sin(p * f)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_is_an_exact_rotation(pairing, fraction):
    scheme = make("rope", pairing=pairing, rotary_fraction=fraction)
    inv_freq, _ = scheme.frequencies(ctx())
    torch.manual_seed(0)
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 5, 17, 100])
    out = rotate(x, pos, inv_freq, pairing)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    for t, p in enumerate(pos.tolist()):
        want = x[:, t] @ rotation_matrix(p, inv_freq, 8, pairing).T
        torch.testing.assert_close(out[:, t], want, atol=1e-6, rtol=1e-6)
    if fraction < 1:  # the channels past the rotary ones pass through
        torch.testing.assert_close(out[..., scheme.rot_dim :], x[..., scheme.rot_dim :])


def test_xpos_multiplies_each_pair_by_its_decay():
    scheme = make("xpos", scale_base=16.0)
    rope = make("rope", pairing=scheme.pairing)
    d = scheme.rot_dim
    zeta = [(2 * i / d + 0.4) / 1.4 for i in range(d // 2)]
    torch.testing.assert_close(scheme.zeta, torch.tensor(zeta))
    pos = torch.arange(40) + 3
    for i in range(d // 2):  # q and k living on channel pair i alone
        q, k = torch.zeros(1, 1, 40, 8), torch.zeros(1, 1, 40, 8)
        q[..., 2 * i : 2 * i + 2] = torch.randn(40, 2)
        k[..., 2 * i : 2 * i + 2] = torch.randn(40, 2)
        n, m = pos[:, None].float(), pos[None, :].float()
        decay = torch.tensor(zeta[i]) ** ((n - m) / 16.0)
        want = logits(rope, q, k, pos) * decay.tril()
        torch.testing.assert_close(logits(scheme, q, k, pos), want, atol=1e-5, rtol=1e-4)


def test_xpos_stays_finite_at_long_lengths_and_refuses_overflow():
    scheme = make("xpos")
    q = k = torch.randn(1, 1, 16384, 8)
    qr, kr = scheme.rotate(q, k, torch.arange(16384), torch.arange(16384), 0, ctx())
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
    scheme.validate(16384, build_scaling(None))
    with pytest.raises(ConfigError, match="scale_base"):
        scheme.validate(10 * scheme.max_length(), build_scaling(None))


# ---------------------------------------------------------------- biases


def test_alibi_slopes_are_the_published_ones():
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    # H=6: 2^k=4 gives 2^-2, 2^-4, 2^-6, 2^-8; the rest are every other slope
    # of H=8 (2^-1, 2^-3, ...), the first two of them.
    assert alibi_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    # H=12: the 8 slopes of H=8, then every other slope of H=16 (2^-0.5, 2^-1.5, ...).
    assert alibi_slopes(12) == pytest.approx([2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])
    scheme = make("alibi", dims=Dims(48, 6, 8, 1, 16))
    bias = scheme.bias(0, torch.arange(5), torch.arange(5), ctx())
    assert bias[4, 3, 0].item() == pytest.approx(-3 / 2)  # head 5: slope 1/2, distance 3
    assert bias[1, 4, 0].item() == pytest.approx(-4 / 16)


def test_t5_buckets_reproduce_the_survey_table():
    # One direction with 16 buckets (T5's 32 bidirectional ones, one side):
    # 0-7 exact, 8-11 -> 8, 12-15 -> 9, 16-22 -> 10, 23-30 -> 11.
    table = {
        **{n: n for n in range(8)},
        **{n: 8 for n in range(8, 12)},
        **{n: 9 for n in range(12, 16)},
        **{n: 10 for n in range(16, 23)},
        **{n: 11 for n in range(23, 31)},
    }
    assert {n: causal_bucket(n, 16, 128) for n in table} == table
    # Beyond the table: log(32/8)/log(16)*8 = 4 exactly -> 12; 64 -> 14; the last bucket from 128 on.
    assert [causal_bucket(n, 16, 128) for n in (31, 32, 63, 64, 127, 128, 5000)] == [11, 12, 13, 14, 15, 15, 15]
    # The causal default (32 buckets): 0-15 exact, then log-spaced up to 128.
    assert [causal_bucket(n, 32, 128) for n in (15, 16, 18, 19, 127, 128)] == [15, 16, 16, 17, 31, 31]


def test_t5_bias_reads_one_shared_table():
    scheme = make("t5", num_buckets=16, max_distance=128)
    pos = torch.arange(200)
    bias = scheme.bias(0, pos, pos, ctx())
    assert torch.equal(bias, scheme.bias(1, pos, pos, ctx()))  # shared across layers, as in T5
    for i, j in [(5, 5), (20, 9), (40, 10), (199, 0)]:
        assert torch.equal(bias[:, i, j], scheme.table[causal_bucket(i - j, 16, 128)])
    # Fractional distances use their floor.
    frac = scheme.bias(0, torch.tensor([11.9]), torch.tensor([0.0]), ctx())
    assert torch.equal(frac[:, 0, 0], scheme.table[causal_bucket(11, 16, 128)])


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_kernels(variant):
    scheme = make("kerple", variant=variant)
    pos = torch.arange(30).float()
    for layer in (0, 1):
        r1, r2 = (r.detach() for r in scheme.parameters_of(layer))
        assert (r1 > 0).all() and (r2 > 0).all() and (variant == "log" or (r2 <= 2).all())
        bias = scheme.bias(layer, pos, pos, ctx())
        for h in range(4):
            for i, j in [(0, 0), (7, 2), (29, 0)]:
                d = i - j
                a, b = float(r1[h]), float(r2[h])
                want = -a * (math.log(1 + b * d) if variant == "log" else d**b)
                assert bias[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert not torch.equal(scheme.bias(0, pos, pos, ctx()), scheme.bias(1, pos, pos, ctx()))  # per layer


def test_fire_is_its_mlp_of_the_progressively_normalised_distance():
    scheme = make("fire", init_L=8.0)
    f = scheme.layers[1]
    c, L = abs(f.c.item()), abs(f.L_multiplier.item() * 8.0)
    pos = torch.arange(30)
    bias = scheme.bias(1, pos, pos, ctx())
    for i, j in [(0, 0), (5, 1), (29, 3), (29, 29), (12, 0)]:
        x = math.log(c * (i - j) + 1) / (math.log(c * max(L, i) + 1) + 1e-6)
        hidden = torch.relu(x * f.w1 + f.b1)
        want = f.w2 @ hidden + f.b2
        torch.testing.assert_close(bias[:, i, j], want, atol=1e-5, rtol=1e-5)
    names = {n for n, _ in scheme.named_parameters()}
    assert {"layers.0.c", "layers.0.L_multiplier", "layers.1.w2"} <= names  # c and L are learned, per layer


def test_fire_inference_path_is_the_same_mlp_far_past_its_L():
    """Without gradients FIRE evaluates its MLP as the piecewise-linear
    function it is (knots where hidden units turn on): equal to the hidden-layer
    computation at float32 tolerance, for queries far past L, with a unit whose
    input weight is zero and knots on both sides of [0, 1]."""
    scheme = make("fire", mlp_width=32, init_L=64.0)
    f = scheme.layers[0]
    with torch.no_grad():
        f.w1[3] = 0.0  # a constant unit
        f.b1[5], f.w1[5] = 0.4, -2.0  # a unit that turns off at x = 0.2
    q = torch.tensor([0, 10, 63, 64, 500, 4097, 40000])
    k = torch.cat((torch.arange(0, 70), torch.tensor([499, 500, 4000, 4097, 39990, 40000])))
    reference = scheme.bias(0, q, k, ctx())  # gradients on: the hidden layer, written out
    assert reference.requires_grad
    with torch.no_grad():
        fast = scheme.bias(0, q, k, ctx())
    causal = q[:, None] >= k[None, :]
    torch.testing.assert_close(fast[:, causal], reference.detach()[:, causal], atol=1e-5, rtol=1e-5)
    c = abs(f.c.item())
    x = math.log(c * (40000 - 39990) + 1) / (math.log(c * 40000 + 1) + 1e-6)
    want = f.w2 @ torch.relu(x * f.w1 + f.b1) + f.b2
    torch.testing.assert_close(fast[:, -1, -2], want.detach(), atol=1e-5, rtol=1e-5)


def test_sandwich_is_the_sinusoid_inner_product_compressed_per_head():
    from rope_lm.positional._common import sinusoid

    scheme = make("sandwich", dim=16)
    pos = torch.arange(50)
    bias = scheme.bias(0, pos, pos, ctx())
    p = sinusoid(pos, 16).double()  # Vaswani's vectors
    inner = p @ p.T - 8
    for h in range(4):
        torch.testing.assert_close(bias[h].double().tril(), (inner / (8 * (h + 1) / 4)).tril(), atol=1e-4, rtol=1e-4)
    assert torch.allclose(bias.diagonal(dim1=1, dim2=2), torch.zeros(4, 50), atol=1e-5)
    assert (bias <= 1e-5).all()


# ---------------------------------------------------------------- content terms


def test_shaw_matches_the_paper_formula():
    scheme = make("shaw")  # k = 4
    torch.manual_seed(3)
    q, k = torch.randn(2, 4, 10, 8), torch.randn(2, 4, 10, 8)
    probs = torch.softmax(torch.randn(2, 4, 10, 10), -1).tril()
    pos = torch.arange(10)
    extra = scheme.content_scores(1, q, k, pos, pos, ctx())
    value = scheme.value_term(1, probs, pos, pos, ctx())
    aK, aV = scheme.rel_key[1], scheme.rel_value[1]
    for i in range(10):
        want_v = sum(probs[:, :, i, j, None] * aV[min(i - j, 4)] for j in range(i + 1))
        torch.testing.assert_close(value[:, :, i], want_v, atol=1e-5, rtol=1e-5)
        for j in range(i + 1):
            want = (q[:, :, i] * aK[min(i - j, 4)]).sum(-1) / math.sqrt(8)
            torch.testing.assert_close(extra[:, :, i, j], want, atol=1e-5, rtol=1e-5)


def test_transformer_xl_matches_the_paper_formula():
    from rope_lm.positional._common import sinusoid

    scheme = make("transformer_xl")
    torch.manual_seed(4)
    q, k = torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    pos = torch.arange(9) + 4
    extra = scheme.content_scores(1, q, k, pos, pos, ctx())
    W = scheme.w_r[1]
    for i in range(9):
        for j in range(i + 1):
            R = sinusoid(torch.tensor([float(i - j)]), 32, layout="halves")[0]
            r = (R @ W).view(4, 8)  # W_{k,R} R_{i-j}, per head
            want = ((scheme.u * k[:, :, j]).sum(-1) + ((q[:, :, i] + scheme.v) * r).sum(-1)) / math.sqrt(8)
            torch.testing.assert_close(extra[:, :, i, j], want, atol=1e-5, rtol=1e-5)


def test_deberta_log_buckets():
    d = torch.arange(0, 40).float()
    got = log_bucket(d, 8, 16).tolist()
    # mid = 4: exact up to 4; then ceil(log(d/4) / log(15/4) * 3) + 4.
    assert got[:5] == [0, 1, 2, 3, 4]
    assert [got[n] for n in (5, 8, 15, 16, 39)] == [5, 6, 7, 8, 10]
    big = log_bucket(torch.tensor([127.0, 128.0, 129.0, 511.0]), 256, 512).tolist()
    assert big == [127, 128, 129, 255]


def test_deberta_matches_the_paper_formula():
    scheme = make("deberta")  # k = 8 buckets, max 16
    torch.manual_seed(5)
    T = 24
    q, k = torch.randn(2, 4, T, 8), torch.randn(2, 4, T, 8)
    pos = torch.arange(T)
    c = ctx(T=T)
    extra = scheme.content_scores(1, q, k, pos, pos, c)
    qr, kr = scheme.rotate(q, k, pos, pos, 1, c)
    content = qr @ kr.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(content, q @ k.transpose(-1, -2) / math.sqrt(3 * 8))  # q.k / sqrt(3d)
    P = scheme.rel_embeddings
    Kr = (P @ scheme.w_kr[1]).view(16, 4, 8)
    Qr = (P @ scheme.w_qr[1]).view(16, 4, 8)

    def delta(a, b):
        return min(max(int(log_bucket(torch.tensor([float(abs(a - b))]), 8, 16)) * (1 if a >= b else -1) + 8, 0), 15)

    for i in range(T):
        for j in range(i + 1):
            c2p = (q[:, :, i] * Kr[delta(i, j)]).sum(-1)
            p2c = (k[:, :, j] * Qr[delta(j, i)]).sum(-1)
            torch.testing.assert_close(extra[:, :, i, j], (c2p + p2c) / math.sqrt(3 * 8), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- absolute


def test_sinusoidal_and_multiplicative_embeddings():
    x = torch.randn(1, 3, 32)
    pos = torch.tensor([0.0, 1.0, 6.5])
    pe = torch.zeros(3, 32)
    for t, p in enumerate(pos.tolist()):
        for i in range(16):
            pe[t, 2 * i] = math.sin(p / 10000 ** (2 * i / 32))
            pe[t, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / 32))
    torch.testing.assert_close(make("sinusoidal").embed(x, pos, ctx()), x * math.sqrt(32) + pe, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(make("multiplicative").embed(x, pos, ctx()), x * (1 + 0.5 * pe), atol=1e-5, rtol=1e-5)
    literal = make("multiplicative", offset=0.0, amplitude=1.0)
    torch.testing.assert_close(literal.embed(x, pos, ctx()), x * pe, atol=1e-5, rtol=1e-5)


class TableScaling:
    """Stands in for an extrapolation method that extends the table."""

    name = "fake-extend"
    extends_position_table = True

    def __init__(self):
        self.asked = []

    def absolute_table(self, table, needed, ctx):
        self.asked.append(needed)
        return torch.cat([table, table.flip(0)])[: max(needed, len(table))]


def test_learned_table_refuses_positions_past_its_end():
    scheme = make("learned", max_positions=32)
    none = build_scaling(None)
    scheme.validate(32, none)
    with pytest.raises(ConfigError, match="max_positions=32") as err:
        scheme.validate(33, none)
    assert "extrapolation method" in str(err.value) and "eval.multipliers" in str(err.value)
    x = torch.zeros(1, 40, 32)
    with pytest.raises(ConfigError):
        scheme.embed(x, torch.arange(40), ctx(none))
    # A method that extends the table is let through and asked for the rows.
    extend = TableScaling()
    scheme.validate(64, extend)
    out = scheme.embed(x, torch.arange(40), ctx(extend))
    assert extend.asked == [40]
    torch.testing.assert_close(out[0, 35], scheme.weight[32 - 4])  # row 35 of [table, flipped table]


def test_learned_interpolates_fractional_positions():
    scheme = make("learned", max_positions=32)
    x = torch.zeros(1, 2, 32)
    out = scheme.embed(x, torch.tensor([2.5, 31.0]), ctx())
    torch.testing.assert_close(out[0, 0], (scheme.weight[2] + scheme.weight[3]) / 2)
    torch.testing.assert_close(out[0, 1], scheme.weight[31])


def test_learned_refuses_evaluation_past_its_table_before_any_work(tiny_config):
    from rope_lm.runs.config import resolve_run

    cfg = tiny_config
    cfg["pos"] = options("learned")  # 2048 rows: the default run's 16 x 128 fits, 32 x 128 does not
    cfg["eval"]["multipliers"] = [1, 2, 4, 8, 16, 32]
    cfg["data"]["seq_len"] = 128
    with pytest.raises(ConfigError, match="2048 rows, but 4096 positions") as err:
        resolve_run(cfg)
    assert "pos.max_positions" in str(err.value)


# ---------------------------------------------------------------- registry


def test_a_dropped_in_module_is_discovered(tmp_path, monkeypatch):
    """A new file in the package is all a new scheme takes: the registry
    finds it by scanning the package path."""
    import rope_lm.positional as package

    (tmp_path / "dropped_in.py").write_text(
        "from rope_lm.positional import SCHEMES\n"
        "from rope_lm.positional.base import PositionalScheme\n\n"
        "@SCHEMES.register('dropped_in')\n"
        "class DroppedIn(PositionalScheme):\n"
        "    family = 'none'\n"
    )
    before = set(SCHEMES.names())
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(SCHEMES, "_loaded", False)
    monkeypatch.setattr(SCHEMES, "_entries", dict(SCHEMES._entries))
    try:
        assert set(SCHEMES.names()) == before | {"dropped_in"}
        model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "dropped_in"}, None, 20, 8)
        assert model(torch.randint(0, 20, (1, 8))).shape == (1, 8, 20)
    finally:
        sys.modules.pop("rope_lm.positional.dropped_in", None)


def test_learned_under_position_interpolation_needs_only_its_rows():
    # PI maps 64 positions onto [0, 15.75] for a 16-row table trained at 16.
    scheme = make("learned", max_positions=16)
    out = scheme.embed(torch.zeros(1, 3, 32), torch.tensor([0.0, 14.5, 15.75]), ctx())
    torch.testing.assert_close(out[0, 1], (scheme.weight[14] + scheme.weight[15]) / 2)
    torch.testing.assert_close(out[0, 2], scheme.weight[15])  # past the last row: the last row
