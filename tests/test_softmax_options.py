"""Attention temperature and sinks (rope_lm/model/softmax_options.py, AttnPlan's
sink_tokens and sink_logits): each against attention written out by hand
here, on every kernel that serves it (explicit, SDPA's causal, windowed and
biased paths, eager flex, a KV cache's steps), gradients included."""

import json
import math
import os
import sys

from conftest import ROOT, cli_overrides
import pytest
import torch
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.kernels import offset_sdpa
from rope_lm.kernels.attention import AttnPlan, attend, flex_path
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import TransformerLM, check_fit
from rope_lm.positional import Dims, PosContext, build_scheme
from rope_lm.scaling import build_scaling, method_label
from tests import forked
from tests.test_layout import config as layout_config
from tests.test_layout import model as layout_model
from tests.test_layout import tokens

L = 16
DIMS = Dims(d_model=32, n_head=4, head_dim=8, n_layer=2, train_len=L)


def by_hand(q, k, v, allowed, sink=None, bias=None, far=None):
    """softmax(q k^T / sqrt(D) + bias) v over the allowed pairs, with a sink
    logit per head in the denominator: exp(s_ij) / (sum_j exp(s_ij) + exp(sink_h));
    far = (queries, distance): from that i - j on, the logit takes those queries."""
    B, H, T, D = q.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for b in range(B):
        for h in range(H):
            for i in range(T):
                row = lambda j: q[b, h, i] if far is None or i - j < far[1] else far[0].double()[b, h, i]
                logits = {
                    j: float(row(j) @ k[b, h, j]) / math.sqrt(D) + (0.0 if bias is None else float(bias[h, i, j]))
                    for j in range(k.shape[2])
                    if allowed[i, j]
                }
                top = max(list(logits.values()) + ([float(sink[h])] if sink is not None else []))
                weights = {j: math.exp(x - top) for j, x in logits.items()}
                denominator = sum(weights.values()) + (math.exp(float(sink[h]) - top) if sink is not None else 0.0)
                for j, w in weights.items():
                    out[b, h, i] += w / denominator * v[b, h, j]
    return out.float()


def streaming_mask(T, window, sinks):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (j <= i) & ((i - j < window) | (j < sinks))


def qkv(T, seed=0, B=2, H=4, D=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(3)]


def ctx():
    return PosContext(seq_len=40, train_len=L, scaling=build_scaling(None))


SINKS = torch.tensor([-1.0, 0.5, 2.0, 4.0])  # from barely felt to taking most of the weight


@pytest.mark.parametrize("scheme_name", ["nope", "alibi"])
@pytest.mark.parametrize("window,sink_tokens", [(None, 0), (7, 0), (7, 3)])
@pytest.mark.parametrize("kernel", ["explicit", "sdpa", "flex"])
def test_sink_logits_and_sink_tokens_equal_the_hand_computation(scheme_name, window, sink_tokens, kernel, monkeypatch):
    """Several query blocks (a block of 5 queries), so the windowed SDPA path
    drops keys before the window while keeping the sink tokens."""
    monkeypatch.setattr(offset_sdpa, "MAX_SCORE_ELEMENTS", 2 * 4 * 5 * 24)
    T = 24
    scheme = build_scheme({"name": scheme_name}, DIMS)
    q, k, v = qkv(T)
    pos = torch.arange(T)
    allowed = streaming_mask(T, window or T, sink_tokens)
    bias = scheme.bias(0, pos, pos, ctx()) if scheme.has_bias else None
    for sink in (None, SINKS):
        plan = AttnPlan(window=window, sink_tokens=sink_tokens, sink_logits=sink)
        with torch.no_grad():
            if kernel == "flex":
                got = flex_path(q, k, v, scheme, 0, pos, plan, ctx(), compiled=False)
            else:
                got = attend(q, k, v, scheme, 0, pos, plan, ctx(), kernel)
        torch.testing.assert_close(got, by_hand(q, k, v, allowed, sink, bias), atol=1e-5, rtol=1e-4)


def test_the_sink_takes_weight_from_every_key():
    """A sink far above every logit leaves almost nothing; far below, plain attention."""
    q, k, v = qkv(12)
    scheme = build_scheme({"name": "nope"}, DIMS)
    pos = torch.arange(12)
    with torch.no_grad():
        plain = attend(q, k, v, scheme, 0, pos, AttnPlan(), ctx(), "sdpa")
        low = attend(q, k, v, scheme, 0, pos, AttnPlan(sink_logits=torch.full((4,), -50.0)), ctx(), "sdpa")
        high = attend(q, k, v, scheme, 0, pos, AttnPlan(sink_logits=torch.full((4,), 50.0)), ctx(), "sdpa")
    torch.testing.assert_close(low, plain)
    assert high.abs().max() < 1e-10


@pytest.mark.parametrize("window", [None, 5])
def test_sink_gradients_on_sdpa_equal_the_explicit_path(window):
    """Training on the CPU takes the SDPA path: the sinks' gradient (through
    the extra query channel) and q, k, v's equal the explicit softmax's."""
    scheme = build_scheme({"name": "rope"}, DIMS)
    pos = torch.arange(20)
    grads = []
    for kernel in ("explicit", "sdpa"):
        q, k, v = (t.requires_grad_() for t in qkv(20, seed=3))
        sink = SINKS.clone().requires_grad_()
        out = attend(q, k, v, scheme, 0, pos, AttnPlan(window=window, sink_logits=sink), ctx(), kernel)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        grads.append([sink.grad, q.grad, k.grad, v.grad])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert grads[0][0].abs().min() > 0


def test_streaming_llm_reads_the_sinks_from_just_before_the_window():
    """sink_positions=cache: a query past window + sinks reads sink j at index
    distance w + k - 1 - j (StreamingLLM's rolling cache), a query before
    that at its own distance; keys in the window at their own distance."""
    T, w, n_sinks = 20, 5, 2
    scheme = build_scheme({"name": "rope"}, DIMS)
    method = build_scaling({"name": "window", "window": w, "sinks": n_sinks})
    c = PosContext(seq_len=T, train_len=L, scaling=method)
    pos = torch.arange(T)
    plan = method.attention_plan(pos, c)
    q, k, v = qkv(T, seed=6)
    qr, kr = scheme.rotate(q, k, pos, pos, 0, c)
    slot = torch.tensor([min(i, w + n_sinks - 1) for i in range(T)])
    q_far, _ = scheme.rotate(q, k, slot, pos, 0, c)
    want = by_hand(qr, kr, v, streaming_mask(T, w, n_sinks), far=(q_far, w))
    with torch.no_grad():
        for kernel in ("explicit", "sdpa"):
            torch.testing.assert_close(attend(q, k, v, scheme, 0, pos, plan, c, kernel), want, atol=1e-5, rtol=1e-4)
        text = build_scaling({"name": "window", "window": w, "sinks": n_sinks, "sink_positions": "text"})
        plain = attend(q, k, v, scheme, 0, pos, text.attention_plan(pos, c), c, "sdpa")
        torch.testing.assert_close(plain, by_hand(qr, kr, v, streaming_mask(T, w, n_sinks)), atol=1e-5, rtol=1e-4)
        assert not torch.allclose(plain, want)
    with pytest.raises(ConfigError, match="sink_positions=text"):
        check_fit(config(), {"name": "alibi"}, {"name": "window", "window": w, "sinks": n_sinks}, 40)
    check_fit(config(), {"name": "alibi"}, {"name": "window", "window": w, "sinks": 2, "sink_positions": "text"}, 40)


def test_window_method_sinks_and_their_label():
    m = build_scaling({"name": "window", "window": 8, "sinks": 4})
    c = PosContext(seq_len=40, train_len=L, scaling=m)
    plan = m.attention_plan(torch.arange(40), c)
    assert (plan.window, plan.sink_tokens) == (8, 4)
    short = lambda n: PosContext(seq_len=n, train_len=L, scaling=m)  # noqa: E731
    assert m.attention_plan(torch.arange(12), short(12)).window is None  # window + sinks cover every key
    assert m.attention_plan(torch.arange(13), short(13)).window == 8
    # A KV cache planned for 40 tokens reads its first 12 with the plan of the 40-token forward.
    assert m.attention_plan(torch.arange(12), c).window == 8
    assert method_label({"name": "window", "window": 8, "sinks": 4, "logn": True}) == "window-sinks4+logn"
    assert method_label({"name": "window", "sinks": 4, "sink_positions": "text"}) == "window-sinks4-text"
    assert method_label({"name": "window"}) == "window"
    # log-n counts the sink tokens among the keys in view: n = min(i + 1, window + sinks)
    m = build_scaling({"name": "window", "window": 8, "sinks": 4, "logn": True})
    scale = m.attention_plan(torch.arange(40), PosContext(seq_len=40, train_len=4, scaling=m)).q_scale
    torch.testing.assert_close(scale[-1], torch.tensor(math.log(12) / math.log(4)))
    with pytest.raises(ConfigError, match="scaling.sinks"):
        build_scaling({"name": "window", "sinks": -1})
    with pytest.raises(ConfigError, match="scaling.sink_positions"):
        build_scaling({"name": "window", "sinks": 4, "sink_positions": "cached"})
    with open(f"{ROOT}/conf/scaling/streaming_llm.yaml") as f:
        assert build_scaling(yaml.safe_load(f)).sinks == 4


# --- the model: temperature, SSMax and sinks per layer ------------------------------


def config(n_layer=2, **extra):
    return layout_config(n_layer=n_layer, **extra)


def model(pos="nope", scaling=None, seed=0, n_layer=2, **extra):
    return layout_model(extra.pop("layout", None), {"name": pos}, scaling, seed, n_layer=n_layer, **extra)


def attention_by_hand(attn, x, rows_scale, allowed, sink=None):
    """One NoPE attention layer written out: q scaled row by row (and head by
    head), then the hand softmax."""
    B, T, _ = x.shape
    q, k, v = attn.split_qkv(x)
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    y = by_hand(q * rows_scale, k, v, allowed, sink)
    return attn.proj(y.transpose(1, 2).reshape(B, T, -1))


def test_llama4_temperature_by_hand():
    """transformers' Llama4TextAttention: q *= log1p(floor((i + 1) / floor_scale)) * attn_scale + 1."""
    T, floor_scale, attn_scale = 30, 4, 0.3
    m = model(softmax={"temperature": {"floor_scale": floor_scale, "attn_scale": attn_scale}})
    attn, x = m.blocks[0].attn, torch.randn(2, T, 32)
    rows = torch.tensor([math.log(math.floor((i + 1) / floor_scale) + 1) * attn_scale + 1 for i in range(T)])
    assert rows[2] == 1 and rows[-1] > 1.5  # identity before floor_scale, growing after it
    want = attention_by_hand(attn, x, rows[:, None], streaming_mask(T, T, 0))
    scheme, pos = m._layer_schemes[0], torch.arange(T)
    with torch.no_grad():
        for kernel in ("explicit", "sdpa"):
            attn.kernel = kernel
            got = attn(x, scheme, pos, AttnPlan(), m.context(T))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("window,sink_tokens", [(None, 0), (6, 0), (6, 2)])
def test_ssmax_by_hand(window, sink_tokens):
    """Scalable-Softmax: logits x s_h log n, n the keys the query sees; with
    learned sinks in the same layer."""
    T = 20
    m = model(softmax={"ssmax": {"init": "auto"}, "sink_logits": True})
    attn, x = m.blocks[0].attn, torch.randn(2, T, 32)
    s = attn.ssmax.detach()
    n = torch.tensor([min(i + 1, window + sink_tokens) if window else i + 1 for i in range(T)], dtype=torch.float32)
    rows = s[:, None, None] * n.log()[None, :, None]
    want = attention_by_hand(attn, x, rows, streaming_mask(T, window or T, sink_tokens), attn.sinks.detach())
    plan = AttnPlan(window=window, sink_tokens=sink_tokens)
    with torch.no_grad():
        for kernel in ("explicit", "sdpa"):
            attn.kernel = kernel
            got = attn(x, m._layer_schemes[0], torch.arange(T), plan, m.context(T))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_ssmax_starts_at_one_over_log_L_and_learns():
    m = model(softmax={"ssmax": {"init": "auto"}})
    assert torch.allclose(
        TransformerLM(config(softmax={"ssmax": {"init": "auto"}}), {"name": "nope"}).blocks[1].attn.ssmax,
        torch.full((4,), 1 / math.log(L)),
    )
    assert model(softmax={"ssmax": {"init": 0.5}}).blocks[0].attn.ssmax.shape == (4,)
    m.train()
    m(tokens(20)).logsumexp(-1).mean().backward()
    assert all(b.attn.ssmax.grad.abs().min() > 0 for b in m.blocks)


def test_default_models_keep_their_state_dict():
    plain = model()
    assert not any("sinks" in n or "ssmax" in n for n in plain.state_dict())
    both = model(softmax={"ssmax": {"init": "auto"}, "sink_logits": True})
    assert set(both.state_dict()) - set(plain.state_dict()) == {
        f"blocks.{i}.attn.{p}" for i in range(2) for p in ("ssmax", "sinks")
    }


def test_per_layer_options_merge_over_the_model_options():
    """Llama 4: temperature on the NoPE layers only; a layer's null turns an option off."""
    with open(f"{ROOT}/conf/layout/llama4.yaml") as f:
        layout = yaml.safe_load(f)
    m = model(pos="rope", n_layer=4, layout=layout, softmax={"sink_logits": True})
    assert [b.attn.softmax.temperature for b in m.blocks] == [False, False, False, True]
    assert [b.attn.sinks is not None for b in m.blocks] == [True] * 4
    off = {"pattern": [None, {"softmax": {"sink_logits": None}}]}
    m = model(pos="rope", layout=off, softmax={"sink_logits": True})
    assert [b.attn.sinks is not None for b in m.blocks] == [True, False]
    # The temperature layer's output differs from the same weights without it, the RoPE layers' do not.
    idx = tokens(300)
    plain = model(pos="rope", n_layer=4, layout={"pattern": [None, None, None, {"pos": {"name": "nope"}}]})
    tuned = model(pos="rope", n_layer=4, layout=layout)
    with torch.no_grad():
        assert not torch.allclose(plain(idx), tuned(idx))
        torch.testing.assert_close(plain(idx[:, :100]), tuned(idx[:, :100]))  # floor((i + 1) / 128) = 0


@pytest.mark.parametrize(
    "options",
    [
        {"softmax": {"sink_logits": True}},
        {"softmax": {"ssmax": {"init": "auto"}, "temperature": {"floor_scale": 3, "attn_scale": 0.2}}},
        {
            "softmax": {"sink_logits": True, "ssmax": {"init": 0.4}},
            "scaling": {"name": "window", "window": 6, "sinks": 2},
        },
        {"softmax": {"sink_logits": True}, "layout": {"pattern": [{"window": 5, "sinks": 3}, None]}},
    ],
)
@pytest.mark.parametrize("pos", ["rope", "alibi", "shaw"])
def test_cached_decoding_equals_one_forward(options, pos):
    """A prefill, single tokens and a chunk (the KV cache's offset kernels,
    and the explicit path for Shaw's content terms) give the full forward's
    logits: temperature and SSMax rows at the tokens' global indices, sinks
    in every step's softmax."""
    options = dict(options)
    scaling = options.pop("scaling", None)
    if scaling and pos != "rope":  # only a rotation re-reads the sinks at cache positions
        scaling = {**scaling, "sink_positions": "text"}
    m = model(pos=pos, scaling=scaling, **options)
    idx = tokens(30)
    with torch.no_grad():
        full = m(idx)
        for planned in (30, None):
            cache, out, start = KVCache(planned), [], 0
            for n in (9, 1, 1, 7, 1, 11):
                out.append(m(idx[:, start : start + n], cache=cache))
                start += n
            torch.testing.assert_close(torch.cat(out, 1), full, atol=2e-5, rtol=1e-4)


def test_sink_logits_train_on_the_model():
    m = model(softmax={"sink_logits": True})
    m.train()
    m(tokens(20)).logsumexp(-1).mean().backward()
    assert all(b.attn.sinks.grad.abs().min() > 0 for b in m.blocks)


@pytest.mark.parametrize(
    "softmax,match",
    [
        ({"temprature": {}}, "unknown key"),
        ({"temperature": {"floor_scale": 0, "attn_scale": 0.1}}, "floor_scale"),
        ({"temperature": {"floor_scale": 8192}}, "attn_scale"),
        ({"ssmax": {"init": -1}}, "ssmax.init"),
        ({"ssmax": True}, "ssmax"),
        ({"sink_logits": "yes"}, "sink_logits"),
        ("on", "model.softmax"),
    ],
)
def test_bad_options_are_one_paragraph(softmax, match):
    with pytest.raises(ConfigError, match=match):
        config(softmax=softmax).validate()


def test_bad_layer_options_name_the_layer():
    with pytest.raises(ConfigError, match="layer 1's layout softmax"):
        config(layout={"pattern": [None, {"softmax": {"ssmax": {"init": 0}}}]}).validate()
    with pytest.raises(ConfigError, match="sinks=2 keeps the first tokens visible to a sliding window"):
        config(layout={"pattern": [{"sinks": 2}]}).validate()


@pytest.mark.parametrize("name", ["sink_logits", "ssmax", "llama4_temperature"])
def test_config_files_build(name):
    with open(f"{ROOT}/conf/softmax/{name}.yaml") as f:
        softmax = yaml.safe_load(f)
    m = model(softmax=softmax)
    with torch.no_grad():
        assert torch.isfinite(m(tokens(20))).all()


# --- against transformers' own code -------------------------------------------------


def test_sink_logits_equal_transformers_gpt_oss():
    """gpt-oss's eager attention (the reference its fused kernels follow)."""
    from types import SimpleNamespace

    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    T = 18
    q, k, v = qkv(T, seed=4)
    k, v = k[:, :2], v[:, :2]  # grouped: 2 key/value heads for 4 query heads
    causal = torch.zeros(T, T).masked_fill(~streaming_mask(T, T, 0), float("-inf"))[None, None]
    module = SimpleNamespace(sinks=SINKS, num_key_value_groups=2, training=False)
    want, _ = eager_attention_forward(module, q, k, v, causal, scaling=8**-0.5)
    scheme = build_scheme({"name": "nope"}, DIMS)
    with torch.no_grad():
        for kernel in ("explicit", "sdpa"):
            got = attend(q, k, v, scheme, 0, torch.arange(T), AttnPlan(sink_logits=SINKS), ctx(), kernel)
            torch.testing.assert_close(got.transpose(1, 2), want, atol=1e-5, rtol=1e-4)


def test_temperature_equals_transformers_llama4_on_a_nope_layer():
    """Llama4TextAttention on a NoPE layer (no_rope_layers[0] = 0) with
    attn_temperature_tuning, our attention layer on the same weights."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    T, floor_scale, attn_scale = 26, 4, 0.3
    hf_cfg = Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=1,
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
        use_qk_norm=False,
        attention_bias=False,
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = Llama4TextAttention(hf_cfg, 0).eval()
    m = model(softmax={"temperature": {"floor_scale": floor_scale, "attn_scale": attn_scale}})
    attn = m.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat((hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight)))
        attn.proj.weight.copy_(hf.o_proj.weight)
        x = torch.randn(2, T, 32)
        causal = torch.zeros(T, T).masked_fill(~streaming_mask(T, T, 0), float("-inf"))[None, None]
        want, _ = hf(x, position_embeddings=None, attention_mask=causal)
        got = attn(x, m._layer_schemes[0], torch.arange(T), AttnPlan(), m.context(T))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_run_with_the_options_trains_and_evaluates(tiny_data_options, tmp_path):
    """One command: Llama 4's layout with its temperature, SSMax and learned
    sinks on every layer, evaluated past L with StreamingLLM's sinks."""
    run = tmp_path / "run"
    args = [a.replace("model.n_layer=2", "model.n_layer=4") for a in cli_overrides(tiny_data_options, run)]
    done = forked.run(
        [
            sys.executable,
            "train.py",
            "+layout=llama4",
            "+softmax=[ssmax,sink_logits]",
            "scaling=streaming_llm",
            *args,
            "trainer.max_steps=6",
            "trainer.val_every_n_steps=3",
            "trainer.ckpt_every_n_steps=3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(run / "results.json") as f:
        results = json.load(f)
    model_config = results["config"]["model"]
    assert model_config["softmax"] == {"ssmax": {"init": "auto"}, "sink_logits": True}
    assert model_config["layout"]["name"] == "llama4"
    assert {r["method"] for r in results["results"]} == {"window-sinks4"}
    assert all(r["ppl"] > 0 for r in results["results"]) and max(r["length"] for r in results["results"]) > 16


def test_diagnostics_see_the_tuned_softmax():
    """Attention probabilities for diagnostics (rope_lm/probes/diagnostics.py) are
    those of the tuned softmax: they reproduce each layer's output, and the
    sinks take weight (rows sum to less than one)."""
    from rope_lm.probes import diagnostics

    m = model(
        pos="rope",
        softmax={"ssmax": {"init": 0.7}, "sink_logits": True, "temperature": {"floor_scale": 3, "attn_scale": 0.5}},
    )
    actual, mine = {}, {}
    hooks = [b.attn.register_forward_hook(lambda mod, a, o: actual.__setitem__(mod.layer, o)) for b in m.blocks]
    try:
        with torch.no_grad(), diagnostics.on_attention(m, lambda layer, p, out: mine.__setitem__(layer, (p, out))):
            m(tokens(24))
    finally:
        for h in hooks:
            h.remove()
    for layer, (probs, out) in mine.items():
        torch.testing.assert_close(out, actual[layer], atol=2e-5, rtol=1e-4)
        assert float(probs.sum(-1).max()) < 1


def test_results_and_run_folders_name_the_softmax_options():
    """rope+ssmax is told from rope in results.json's scheme and in run folder names (the layouts study's
    SSMax arm would otherwise read `rope`); every option of softmax_options.KEYS is named."""
    from omegaconf import OmegaConf

    from rope_lm.cli import register_resolvers
    from rope_lm.model.layout import scheme_label
    from rope_lm.model.softmax_options import KEYS

    layout = {"name": "nope_every_4", "pattern": [None, {"pos": {"name": "nope"}}]}
    for key in KEYS:
        assert scheme_label({"name": "rope"}, {"softmax": {key: {}}}) == f"rope+{key}"
    assert (
        scheme_label({"name": "rope"}, {"layout": layout, "softmax": {"ssmax": {"init": "auto"}}})
        == "rope+nope_every_4+ssmax"
    )
    assert scheme_label({"name": "rope"}, {"softmax": None}) == scheme_label({"name": "rope"}, {}) == "rope"
    register_resolvers()
    tag = "${layout_tag:${oc.select:model.layout,null},${oc.select:model.softmax,null}}"
    assert OmegaConf.create({"model": {"softmax": {"ssmax": {"init": "auto"}}}, "t": tag}).t == "+ssmax"
    assert OmegaConf.create({"model": {}, "t": tag}).t == ""
