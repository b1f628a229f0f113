"""DAPE (pos=dape): logits S + B + f([S; B]) against the paper's formula written
out here in float64 (the biases ALiBi and KERPLE from their own papers' formulas,
FIRE from its scheme), forward and gradients, past the training length, on every
path (explicit, fast, blocked, grouped heads, KV-cached steps), with the
settings it is refused."""

import math

from conftest import ROOT
import pytest
import torch
import torch.nn.functional as F
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan, attend
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM, check_fit
from rope_lm.positional import Dims, PosContext, _content, build_scheme
from rope_lm.scaling import build_scaling
from rope_lm.train_positions import TRAIN_POSITIONS

L, T = 16, 40  # trained at 16, read at 40
DIMS = Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=L)
LAYER = 1  # not 0, so per-layer parameters are read at the right index
FIRE = {"mlp_width": 4, "init_L": 8.0}  # a narrow FIRE whose normaliser switches from L to i within 40 tokens


def conf() -> dict:
    with open(f"{ROOT}/conf/pos/dape.yaml") as f:
        return yaml.safe_load(f)


def options(bias: str, **extra) -> dict:
    return {**conf(), "bias": bias, "bias_options": FIRE if bias == "fire" else {}, **extra}


def dape(bias: str, **extra):
    torch.manual_seed(0)
    scheme = build_scheme(options(bias, **extra), DIMS)
    with torch.no_grad():  # off the initial values, so a dropped or misplaced parameter shows
        for p in scheme.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return scheme


def context(scaling=None):
    return PosContext(seq_len=T, train_len=L, scaling=build_scaling(scaling))


def reference_bias(scheme, pos) -> torch.Tensor:
    """B (H, T, T) in float64: ALiBi's -m_h (i - j), m_h = 2^(-8(h+1)/H) (H a
    power of two); KERPLE's -r1 log(1 + r2 (i - j)); FIRE's own bias()."""
    i, j = pos.double()[:, None], pos.double()[None, :]
    d = (i - j).clamp(min=0)
    H = DIMS.n_head
    if scheme.bias_name == "alibi":
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
        return -slopes[:, None, None] * d
    if scheme.bias_name == "kerple":
        r1, r2 = (r.double()[:, None, None] for r in scheme.bias_scheme.parameters_of(LAYER))
        return -r1 * torch.log(1 + r2 * d)
    return scheme.bias_scheme.bias(LAYER, pos, pos, context()).double()


def dape_reference(q, k, v, bias, mlp, *, gain=None, window=None, sink=None):
    """Causal attention with DAPE logits, one query at a time: S = q.k / sqrt(D)
    per head, then for every key the 2H features [S; B] through
    W2 LeakyReLU(W1 x + b1) + b2, added to S + B; softmax (sink logits in the
    denominator where given), values."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, t, D = q.shape
    n = k.shape[2]
    w1, b1, w2, b2 = (x.double() for x in mlp)
    rows = []
    for r in range(t):
        i = n - t + r
        keys = torch.arange(i + 1)
        if window is not None:
            keys = keys[i - keys < window]
        query = q[:, :, r] * (1.0 if gain is None else float(gain[i]))
        scores = (query[:, :, None, :] * k[:, :, keys]).sum(-1) / math.sqrt(D)  # (B, H, keys)
        b = bias[:, i, keys].expand(B, H, len(keys))
        features = torch.cat((scores, b), dim=1)  # (B, 2H, keys)
        hidden = F.leaky_relu(torch.einsum("uc,bcj->buj", w1, features) + b1[:, None], 0.01)
        correction = torch.einsum("hu,buj->bhj", w2, hidden) + b2[:, None]
        logits = scores + b + correction
        if sink is not None:
            logits = torch.cat((logits, sink.double()[None, :, None].expand(B, H, 1)), -1)
        probs = torch.softmax(logits, -1)[..., : len(keys)]
        rows.append((probs[..., None] * v[:, :, keys]).sum(2))
    return torch.stack(rows, dim=2)


def inputs(kv_heads=4, seed=1):
    torch.manual_seed(seed)
    q = torch.randn(2, 4, T, 8, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, T, 8, requires_grad=True) for _ in range(2))
    return q, k, v


def check(scheme, plan, pos, *, kv_heads=4, **reference):
    """Both kernels, in one block of queries and in many, against the
    reference: outputs and the gradients of q, k, v and every parameter
    (f's weights and the bias scheme's own)."""
    q, k, v = inputs(kv_heads)
    weights = torch.randn(2, 4, T, 8)
    group = 4 // kv_heads
    f = scheme.mlps[LAYER]
    want = dape_reference(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), reference_bias(scheme, pos),
        (f.w1, f.b1, f.w2, f.b2), **reference,
    )  # fmt: skip
    params = [q, k, v, *[p for p in scheme.parameters() if p.requires_grad]]
    want_grads = torch.autograd.grad((want * weights.double()).sum(), params, allow_unused=True)
    for blocked in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            if blocked:
                mp.setattr(_content, "MAX_SCORE_ELEMENTS", 2 * 4 * T * 16 * 3)
                assert len(_content.query_blocks(2, 4, 0, T, per_pair=3 + 32 // 4)) > 1
            for kernel in ("explicit", "auto"):
                got = attend(q, k, v, scheme, LAYER, pos, plan, context(), kernel)
                grads = torch.autograd.grad((got * weights).sum(), params, allow_unused=True)
                where = f"{scheme.bias_name}/{kernel}/blocked={blocked}"
                torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4, msg=lambda m: f"{where}: {m}")
                for n, (g, w) in enumerate(zip(grads, want_grads)):
                    assert (g is None) == (w is None), f"{where}: gradient {n} missing on one side"
                    if g is not None:
                        torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-4, msg=lambda m: f"{where} grad {n}: {m}")


@pytest.mark.parametrize("bias", ["alibi", "kerple", "fire"])
def test_dape_equals_its_formula_past_the_training_length(bias):
    check(dape(bias), AttnPlan(), torch.arange(T))


def test_dape_with_rescaled_positions_window_log_n_and_sink_logits():
    gain, sink = torch.linspace(0.5, 1.5, T), torch.randn(4)
    plan = AttnPlan(window=7, q_scale=gain, sink_logits=sink)
    check(dape("kerple"), plan, torch.arange(T) * 0.75 + 2.5, gain=gain, window=7, sink=sink)


def test_dape_with_grouped_key_value_heads():
    check(dape("alibi"), AttnPlan(window=9), torch.arange(T), kv_heads=2, window=9)


def test_dape_steps_of_a_kv_cache_are_rows_of_the_full_attention():
    scheme, pos = dape("fire"), torch.arange(T)
    q, k, v = inputs()
    with torch.no_grad():
        for plan in (AttnPlan(), AttnPlan(window=6, sink_tokens=2)):
            full = attend(q, k, v, scheme, LAYER, pos, plan, context(), "explicit")
            for t in (1, 7):
                for kernel in ("explicit", "auto"):
                    got = scheme.attention(LAYER, q[:, :, T - t :], k, v, {}, pos, plan, context(), kernel)
                    torch.testing.assert_close(got, full[:, :, T - t :], atol=2e-5, rtol=1e-4)


def test_the_mlp_reading_unmasked_scores_leaks_nothing_from_later_keys():
    """f sees the scores of future keys (the mask comes after it, as in the
    authors' code) but only pair by pair: changing keys and values after query i
    leaves row i as it was."""
    scheme, pos = dape("kerple"), torch.arange(T)
    q, k, v = (x.detach() for x in inputs())
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 25:], v2[:, :, 25:] = torch.randn(2, 4, T - 25, 8), torch.randn(2, 4, T - 25, 8)
    for kernel in ("explicit", "auto"):
        a = attend(q, k, v, scheme, LAYER, pos, AttnPlan(), context(), kernel)
        b = attend(q, k2, v2, scheme, LAYER, pos, AttnPlan(), context(), kernel)
        assert torch.equal(a[:, :, :25], b[:, :, :25]) and not torch.allclose(a[:, :, 25:], b[:, :, 25:])


def model(pos: dict, scaling: dict | None = None) -> TransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
    return TransformerLM(cfg, pos, scaling).eval()


@pytest.mark.parametrize("bias", ["alibi", "fire"])
def test_kv_cache_equals_a_full_forward(bias):
    """The default (kerple) is in tests/test_kv_cache.py under every method."""
    m = model(options(bias), {"name": "window", "window": 9, "sinks": 2, "sink_positions": "text", "logn": True})
    idx = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(planned_len=T)
        pieces = [m(idx[:, a:b], cache=cache) for a, b in ((0, 13), (13, 14), (14, 15), (15, T))]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=1e-4)


def test_the_mlp_keeps_nn_linears_initialisation_in_a_model():
    """The model re-initialises nn.Linear with normal(0.02); f's plain
    parameters keep the authors' uniform(+-1/sqrt(fan_in)) start."""
    f = model(conf()).pos_scheme.mlps[1].requires_grad_(False)
    bound = (2 * 4) ** -0.5
    assert f.w1.shape == (32, 8) and f.w2.shape == (4, 32)
    assert float(f.w1.abs().max()) <= bound and float(f.w1.abs().max()) > 0.8 * bound
    assert float(f.w1.std()) > 3 * 0.02


def test_dape_is_a_bias_scheme_for_the_methods():
    """Rotary methods refuse it by family; training-time positions apply (its
    bias reads the ids)."""
    cfg = ModelConfig(vocab_size=61, train_len=L, n_layer=2, n_head=4, d_model=32)
    with pytest.raises(ConfigError, match="family is 'bias'"):
        check_fit(cfg, conf(), {"name": "yarn", "factor": 4.0}, 4 * L)
    check_fit(cfg, conf(), {"name": "window", "window": 8}, 4 * L)
    TRAIN_POSITIONS.build({"name": "pose", "factor": 4}).check_schemes([build_scheme(conf(), DIMS)])


def test_bias_options_reach_the_bias_scheme():
    scheme = build_scheme({**conf(), "bias_options": {"variant": "power"}}, DIMS)
    assert scheme.bias_scheme.variant == "power"
    scheme = build_scheme(options("fire", mlp_width=8), DIMS)
    assert scheme.mlps[0].w1.shape == (8, 8) and scheme.bias_scheme.layers[0].w1.shape == (4,)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"bias": "t5"}, r"pos.bias='t5'.*alibi, kerple, fire"),
        ({"mlp_width": 0}, r"pos.mlp_width=0"),
        ({"mlp_width": True}, r"pos.mlp_width=True"),
        ({"bias_options": {"slope": 1.0}}, r"pos.bias_options.slope"),
        ({"bias_options": {"variant": 3}}, r"pos.bias_options.variant=3"),
        ({"bias_options": {"variant": "cubic"}}, r"pos.bias_options.variant='cubic'"),
    ],
)
def test_bad_settings_are_one_paragraph(extra, message):
    with pytest.raises(ConfigError, match=message):
        build_scheme({**conf(), **extra}, DIMS)
