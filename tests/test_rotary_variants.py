"""p-RoPE (pos=p_rope: RoPE with p_rope=0.75) against transformers' rope type
"proportional", and PoPE (pos=pope) against its paper's formula written out
here in float64 loops: forward and gradients, past the training length, on
every path (explicit, fast, blocked, grouped heads, a KV cache), and under the
rotary extrapolation methods."""

import math

from conftest import ROOT
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan, attend, flex_path
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.positional import Dims, PosContext, _content, build_scheme
from rope_lm.scaling import build_scaling
from rope_lm.train.lit import _decay_split

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

L = 16  # training length; the tests read 40 tokens, past it
T = 40
BASE = 10000.0


def conf(name: str) -> dict:
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        return yaml.safe_load(f)


def context(seq_len=T, train_len=L, scaling=None):
    return PosContext(seq_len=seq_len, train_len=train_len, scaling=build_scaling(scaling))


# ====================================================================== p-RoPE


def hf_config(head_dim: int, p: float, factor: float | None = None) -> LlamaConfig:
    params = {"rope_type": "proportional", "rope_theta": BASE, "partial_rotary_factor": p}
    if factor is not None:
        params["factor"] = factor
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=4 * L,
        rope_parameters=params,
    )


def p_rope(head_dim: int, **extra):
    dims = Dims(d_model=2 * head_dim, n_head=2, head_dim=head_dim, n_layer=1, train_len=L)
    return build_scheme({**conf("p_rope"), **extra}, dims)


def test_the_preset_is_rope_with_the_papers_p():
    options = conf("p_rope")
    assert options["name"] == "rope" and options["p_rope"] == 0.75 and options["rotary_fraction"] == 1.0
    scheme = p_rope(32)
    assert scheme.kept_pairs == 12  # 0.75 of 16 pairs, the lowest 4 zeroed


@pytest.mark.parametrize("head_dim,p", [(16, 0.75), (32, 0.75), (16, 0.5), (64, 0.25), (24, 0.5)])
def test_frequencies_equal_transformers_proportional(head_dim, p):
    want, hf_factor = ROPE_INIT_FUNCTIONS["proportional"](hf_config(head_dim, p), "cpu")
    got, factor = p_rope(head_dim, p_rope=p).frequencies(context())
    torch.testing.assert_close(got, want)
    assert factor == hf_factor == 1.0
    assert int((got == 0).sum()) == head_dim // 2 - int(p * head_dim // 2)


def test_transformers_factor_is_position_interpolation():
    """proportional's `factor` divides every frequency: scaling=pi on p-RoPE."""
    want, _ = ROPE_INIT_FUNCTIONS["proportional"](hf_config(32, 0.75, factor=4.0), "cpu")
    got, factor = p_rope(32).frequencies(context(4 * L, scaling={"name": "pi", "factor": 4.0}))
    torch.testing.assert_close(got, want)
    assert factor == 1.0


def test_rotated_queries_and_keys_equal_transformers_apply_rotary_pos_emb():
    """cos/sin from transformers' rotary embedding under "proportional", applied
    by Llama's and Gemma 4's apply_rotary_pos_emb (rotate_half pairing), at
    positions up to 6 x L."""
    head_dim, n = 32, 6 * L
    cfg = hf_config(head_dim, 0.75)
    pos = torch.arange(n)
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, n, 2 * head_dim), pos[None])
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, n, head_dim), torch.randn(2, 2, n, head_dim)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = p_rope(head_dim).rotate(q, k, pos, pos, 0, context(n))
    torch.testing.assert_close(got_q, want_q, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=2e-5, rtol=1e-5)
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb as gemma4_apply_rotary

    torch.testing.assert_close(got_q, gemma4_apply_rotary(q, cos, sin), atol=2e-5, rtol=1e-5)
    # The lowest quarter of the pairs (channels 12..15 with their partners 28..31) do not move.
    for ch in (slice(12, 16), slice(28, 32)):
        assert torch.equal(got_q[..., ch], q[..., ch])


def test_kept_pairs_round_where_the_paper_and_transformers_floor():
    """rope-lm keeps round(p * pairs) pairs, the paper's code and transformers
    int(p * head_dim // 2): they differ where p * pairs is not a whole number
    (0.35 of 10 pairs: 4 against 3). p = kept / pairs gives the same model in
    both, which is what an import or export writes."""
    hf, _ = ROPE_INIT_FUNCTIONS["proportional"](hf_config(20, 0.35), "cpu")
    ours, _ = p_rope(20, p_rope=0.35).frequencies(context())
    assert int((hf > 0).sum()) == 3 and int((ours > 0).sum()) == 4
    same, _ = p_rope(20, p_rope=3 / 10).frequencies(context())
    torch.testing.assert_close(same, hf)


def rope_reference(q, k, v, kept: int, base: float):
    """Causal attention with p-RoPE written out in float64: every vector's
    channel pair (c, c + D/2) turned by position x base^(-2c/D) when c < kept,
    left alone otherwise; then softmax(q.k / sqrt(D)) v, one query at a time."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, n, D = q.shape
    half = D // 2

    def turned(x):
        first, second = list(x[..., :half].unbind(-1)), list(x[..., half:].unbind(-1))
        for c in range(kept):
            a = torch.arange(n, dtype=torch.float64) * base ** (-2 * c / D)  # the angle at each position
            x1, x2 = first[c], second[c]
            first[c], second[c] = x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()
        return torch.stack(first + second, dim=-1)

    qr, kr = turned(q), turned(k)
    rows = []
    for i in range(n):
        logits = (qr[:, :, i : i + 1] * kr[:, :, : i + 1]).sum(-1) / math.sqrt(D)
        rows.append((torch.softmax(logits, -1)[..., None] * v[:, :, : i + 1]).sum(2))
    return torch.stack(rows, dim=2)


def test_p_rope_attention_equals_the_reference_on_every_kernel():
    head_dim = 16
    scheme = p_rope(head_dim)
    assert scheme.kept_pairs == 6
    pos, c = torch.arange(T), context()
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, T, head_dim, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weights = torch.randn(1, 2, T, head_dim, dtype=torch.float64)
    want = rope_reference(q, k, v, scheme.kept_pairs, BASE)
    want_grads = torch.autograd.grad((want * weights).sum(), [q, k, v])
    for kernel in ("explicit", "sdpa"):
        got = attend(q, k, v, scheme, 0, pos, AttnPlan(), c, kernel)
        grads = torch.autograd.grad((got * weights).sum(), [q, k, v])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{kernel}: {m}")
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"{kernel} grad: {m}")
    with torch.no_grad():
        qr, kr = scheme.rotate(q.detach(), k.detach(), pos, pos, 0, c)
        flex = flex_path(qr, kr, v.detach(), scheme, 0, pos, AttnPlan(), c, compiled=False)
    torch.testing.assert_close(flex, want.detach(), atol=1e-5, rtol=1e-5)


def tiny_model(pos: dict, scaling: dict | None = None, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=61, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32)
    model = TransformerLM(cfg, pos, scaling)
    with torch.no_grad():  # off the initial values (PoPE's phases start at zero)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


SCALING = {
    "none": None,
    "yarn": {"name": "yarn", "factor": "auto", "logn": True},
    "rerope": {"name": "rerope", "window": 6},
    "dca": {"name": "dca"},
}


@pytest.mark.parametrize("name", ["p_rope", "pope"])
@pytest.mark.parametrize("method", SCALING)
def test_kv_cache_equals_a_full_forward(name, method):
    model = tiny_model(conf(name), SCALING[method])
    idx = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(planned_len=T)
        pieces = [model(idx[:, a:b], cache=cache) for a, b in ((0, 13), (13, 14), (14, 15), (15, T))]
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=2e-5, rtol=1e-4)


# ====================================================================== PoPE

DIMS = Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=L)
LAYER = 1


def pope(**extra):
    torch.manual_seed(0)
    scheme = build_scheme({**conf("pope"), **extra}, DIMS)
    if scheme.phase_bias is not None:
        with torch.no_grad():  # phases across the clamp's whole range and past both of its ends
            scheme.phase_bias.uniform_(-2 * math.pi - 1.0, 1.0)
    return scheme


def pope_reference(
    q, k, v, delta, q_pos, k_pos, *, inv_freq=None, factor=1.0, gain=None, window=None, sink=None, alt=None
):
    """PoPE's attention from the paper's formula in float64, one query and one
    channel at a time: logit(i, j) = sum_c softplus(q_ic) softplus(k_jc)
    cos((p_j - p_i) theta_c + delta_hc) / sqrt(D), theta_c = base^(-c/D)
    (or the given frequencies), times factor^2 and the query's log-n gain;
    causal (and windowed) softmax, optional sink logits in the denominator.
    alt = (q_alt, k_alt, alt_from[, alt_below]): pairs at index distance >=
    alt_from take the phases of those positions (ReRoPE / Self-Extend), and
    with alt_below only keys j < alt_below[i] (Dual Chunk Attention)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, t, D = q.shape
    n = k.shape[2]
    theta = [BASE ** (-c / D) for c in range(D)] if inv_freq is None else [float(x) for x in inv_freq]
    delta = delta.double().clamp(-2 * math.pi, 0.0)
    mq, mk = F.softplus(q), F.softplus(k)
    q_pos, k_pos = q_pos.double(), k_pos.double()
    rows = []
    for r in range(t):
        i = n - t + r
        keys = torch.arange(i + 1)
        if window is not None:
            keys = keys[i - keys < window]
        gap = k_pos[keys] - q_pos[r]
        if alt is not None:
            q_alt, k_alt, alt_from, *below = alt
            far = i - keys >= alt_from
            if below:
                far = far & (keys < int(below[0][i]))
            gap = torch.where(far, k_alt.double()[keys] - float(q_alt[i]), gap)
        logits = torch.zeros(B, H, len(keys), dtype=torch.float64)
        for c in range(D):
            phase = gap[None, :] * theta[c] + delta[:, c, None]  # (H, keys)
            logits = logits + mq[:, :, r, c, None] * mk[:, :, keys, c] * torch.cos(phase)
        logits = logits * factor**2 / math.sqrt(D)
        if gain is not None:
            logits = logits * float(gain[i])
        if sink is not None:
            logits = torch.cat((logits, sink.double()[None, :, None].expand(B, H, 1)), -1)
        probs = torch.softmax(logits, -1)[..., : len(keys)]
        rows.append((probs[..., None] * v[:, :, keys]).sum(2))
    return torch.stack(rows, dim=2)


def pope_inputs(seed=1, kv_heads=4, dtype=torch.float32):
    torch.manual_seed(seed)
    q = torch.randn(2, 4, T, 8, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, T, 8, dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v


def run_pope(scheme, q, k, v, pos, plan, kernel, ctx=None):
    return attend(q, k, v, scheme, LAYER, pos, plan, ctx or context(), kernel)


def check_against_reference(scheme, plan, pos, *, kv_heads=4, ctx=None, **reference):
    """Every PoPE path against the reference: outputs and the gradients of
    q, k, v and the phase bias, in one block of queries and in many."""
    q, k, v = pope_inputs(kv_heads=kv_heads)
    weights = torch.randn(2, 4, T, 8)
    group = 4 // kv_heads
    kf, vf = (x.repeat_interleave(group, dim=1) for x in (k, v))
    want = pope_reference(q, kf, vf, scheme.phase_bias[LAYER], pos, pos, **reference)
    params = [q, k, v, scheme.phase_bias]
    want_grads = torch.autograd.grad((want * weights.double()).sum(), params)
    for blocked in (False, True):
        limit = 2 * 4 * T * 8 * 3 if blocked else _content.MAX_SCORE_ELEMENTS
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_content, "MAX_SCORE_ELEMENTS", limit)
            if blocked:
                assert len(_content.query_blocks(2, 4, 0, T, per_pair=16)) > 1
            for kernel in ("explicit", "auto"):
                got = run_pope(scheme, q, k, v, pos, plan, kernel, ctx)
                grads = torch.autograd.grad((got * weights).sum(), params)
                where = f"{kernel}, blocked={blocked}"
                torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4, msg=lambda m: f"{where}: {m}")
                for g, w in zip(grads, want_grads):
                    torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-4, msg=lambda m: f"{where} grad: {m}")


def test_pope_equals_its_formula_past_the_training_length():
    check_against_reference(pope(), AttnPlan(), torch.arange(T))


def test_pope_with_rescaled_positions_window_log_n_and_sink_logits():
    pos = torch.arange(T) * 0.75 + 2.5
    gain, sink = torch.linspace(0.5, 1.5, T), torch.randn(4)
    plan = AttnPlan(window=7, q_scale=gain, sink_logits=sink)
    check_against_reference(pope(), plan, pos, gain=gain, window=7, sink=sink)


def test_pope_with_grouped_key_value_heads():
    check_against_reference(pope(), AttnPlan(window=9), torch.arange(T), kv_heads=2, window=9)


def test_pope_two_pass_plan_takes_the_second_phases_far_away():
    q_alt, k_alt = torch.full((T,), 5), torch.zeros(T, dtype=torch.long)
    plan = AttnPlan(alt_q_pos=q_alt, alt_k_pos=k_alt, alt_from=5)
    check_against_reference(pope(), plan, torch.arange(T), alt=(q_alt, k_alt, 5))


def test_pope_under_dual_chunk_attention_takes_the_chunk_maps():
    """DCA's plan bounds the second pass per query (alt_below: its chunk's start, or the one before); PoPE
    applies it on both paths. tests/test_dca.py holds that plan equal to the paper's position maps."""
    dca = build_scaling({"name": "dca"})
    dca.check(pope())
    plan = dca.plan(torch.arange(T), context())
    assert plan.alt_below is not None and (plan.alt_below < torch.arange(T) - plan.alt_from + 1).any()
    alt = (plan.alt_q_pos, plan.alt_k_pos, plan.alt_from, plan.alt_below)
    check_against_reference(pope(), plan, torch.arange(T), alt=alt)
    # Without the boundary (distance alone) the far pass would reach into the query's own chunk.
    loose = (plan.alt_q_pos, plan.alt_k_pos, plan.alt_from)
    q, k, v = pope_inputs()
    scheme = pope()
    with torch.no_grad():
        got = run_pope(scheme, q, k, v, torch.arange(T), plan, "auto").double()
        bounded = pope_reference(q, k, v, scheme.phase_bias[LAYER], torch.arange(T), torch.arange(T), alt=alt)
        unbounded = pope_reference(q, k, v, scheme.phase_bias[LAYER], torch.arange(T), torch.arange(T), alt=loose)
    torch.testing.assert_close(got, bounded, atol=2e-5, rtol=1e-4)
    assert (got - unbounded).abs().max() > 1e-3


def test_pope_without_phase_bias():
    scheme = pope(phase_bias=False)
    assert scheme.phase_bias is None and not list(scheme.parameters())
    q, k, v = pope_inputs()
    want = pope_reference(q, k, v, torch.zeros(4, 8), torch.arange(T), torch.arange(T))
    for kernel in ("explicit", "auto"):
        got = run_pope(scheme, q, k, v, torch.arange(T), AttnPlan(), kernel)
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


def test_pope_steps_of_a_kv_cache_are_rows_of_the_full_attention():
    """Queries that are the last t of T tokens (a cached step) get the full
    forward's rows, on both paths, with and without a window."""
    scheme, pos = pope(), torch.arange(T)
    q, k, v = pope_inputs()
    with torch.no_grad():
        for plan in (AttnPlan(), AttnPlan(window=6)):
            full = run_pope(scheme, q, k, v, pos, plan, "explicit")
            for t in (1, 7):
                for kernel in ("explicit", "auto"):
                    got = scheme.attention(LAYER, q[:, :, T - t :], k, v, {}, pos, plan, context(), kernel)
                    torch.testing.assert_close(got, full[:, :, T - t :], atol=2e-5, rtol=1e-4)


def test_pope_depends_on_relative_positions_only():
    scheme = pope()
    q, k, v = pope_inputs()
    with torch.no_grad():
        for kernel in ("explicit", "auto"):
            a = run_pope(scheme, q, k, v, torch.arange(T), AttnPlan(), kernel)
            b = run_pope(scheme, q, k, v, torch.arange(T) + 1000, AttnPlan(), kernel)
            torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-3)


def test_pope_frequencies_are_one_per_channel_and_methods_move_them():
    """theta_c = base^(-c/D), c = 0..D-1, offered as RotarySpec(2D, base):
    PI divides each by s, and YaRN keeps the fast ones, divides the slow ones
    by s and scales the logits by (0.1 ln s + 1)^2."""
    dims = Dims(d_model=256, n_head=4, head_dim=64, n_layer=1, train_len=4096)
    scheme = build_scheme(conf("pope"), dims)
    assert scheme.rotary.rot_dim == 128 and scheme.rotary.base == BASE
    plain = torch.tensor([BASE ** (-c / 64) for c in range(64)])
    got, factor = scheme.frequencies(context(4096, 4096))
    torch.testing.assert_close(got, plain)
    assert factor == 1.0
    got, _ = scheme.frequencies(context(4 * 4096, 4096, {"name": "pi", "factor": 4.0}))
    torch.testing.assert_close(got, plain / 4)
    got, factor = scheme.frequencies(context(4 * 4096, 4096, {"name": "yarn", "factor": 4.0}))
    wavelength = 2 * math.pi / plain
    fast, slow = wavelength < 4096 / 32 / 1.5, wavelength > 4096 * 1.5  # margins for the ramp's rounding
    assert fast.sum() >= 15 and slow.sum() >= 15
    torch.testing.assert_close(got[fast], plain[fast])
    torch.testing.assert_close(got[slow], plain[slow] / 4)
    assert factor == pytest.approx(0.1 * math.log(4) + 1)
    lam = [1.0 + i / 16 for i in range(64)]  # LongRoPE: one factor per frequency
    longrope = {"name": "longrope", "factor": 4.0, "long_factor": lam, "short_factor": [1.0] * 64}
    got, _ = scheme.frequencies(context(4 * 4096, 4096, longrope))
    torch.testing.assert_close(got, plain / torch.tensor(lam))


def test_pope_under_yarn_equals_the_formula_with_its_frequencies_and_factor():
    ctx = context(T, L, {"name": "yarn", "factor": 4.0})
    scheme = pope()
    inv_freq, factor = scheme.frequencies(ctx)
    assert factor > 1 and not torch.allclose(inv_freq, torch.tensor([BASE ** (-c / 8) for c in range(8)]))
    check_against_reference(scheme, AttnPlan(), torch.arange(T), ctx=ctx, inv_freq=inv_freq, factor=factor)


def test_pope_phase_bias_is_not_decayed():
    model = tiny_model(conf("pope"))
    decay, no_decay = _decay_split(model)
    bias = model.pos_scheme.phase_bias
    assert bias.shape == (2, 4, 8)
    assert any(p is bias for p in no_decay) and not any(p is bias for p in decay)


@pytest.mark.parametrize("options", [{"base": 1.0}, {"base": float("inf")}, {"phase_bias": "yes"}])
def test_pope_bad_settings_are_one_paragraph(options):
    with pytest.raises(ConfigError, match=f"pos.{next(iter(options))}"):
        build_scheme({**conf("pope"), **options}, DIMS)
