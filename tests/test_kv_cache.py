"""The KV cache (rope_lm/model/kv_cache.py): a sequence read as a prefill, single
tokens and a second chunk gives the logits of one full forward, for every
registered scheme and every method that applies to it (driven by the
registries, so a scheme or method added later is covered); and, unplanned,
what the cache documents as the length grows."""

from conftest import ROOT
import pytest
import torch
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.model.kv_cache import KVCache
from rope_lm.model.transformer import ModelConfig, TransformerLM, check_fit
from rope_lm.positional import SCHEMES
from rope_lm.scaling import METHODS

L, T = 16, 40  # trained at 16, read at 40: past L, where windows, groups and factors bite
# Sizes at which buckets, clipping and normalisers switch within 40 tokens.
SMALL = {
    "t5": {"num_buckets": 8, "max_distance": 12},
    "deberta": {"position_buckets": 8, "max_relative_positions": 16},
    "shaw": {"max_relative_position": 4},
    "fire": {"mlp_width": 8, "init_L": 8.0},
    "learned": {"max_positions": 64},
}
METHOD_OPTIONS = {
    "window": {"window": 8},
    "rerope": {"window": 6},
    "leaky_rerope": {"window": 6},
    "self_extend": {"window": 6},
    # head_dim 8: four rotary pairs, each with its own factor
    "longrope": {"long_factor": [1.0, 1.5, 2.5, 4.0], "short_factor": [1.0, 1.1, 1.2, 1.3]},
}


def pos_options(name):
    with open(f"{ROOT}/conf/pos/{name}.yaml") as f:
        return {**yaml.safe_load(f), **SMALL.get(name, {})}


def method_options(name, **extra):
    with open(f"{ROOT}/conf/scaling/{name}.yaml") as f:
        return {**yaml.safe_load(f), **METHOD_OPTIONS.get(name, {}), **extra}


def config(**extra):
    return ModelConfig(**{**dict(vocab_size=61, train_len=L, n_layer=2, n_head=4, n_kv_head=2, d_model=32), **extra})


def pairs():
    """Every (scheme, method) the model accepts at length T."""
    out = []
    for scheme in SCHEMES.names():
        for method in METHODS.names():
            try:
                check_fit(config(), pos_options(scheme), method_options(method), T)
            except ConfigError:
                continue
            out.append((scheme, method))
    return out


PAIRS = pairs()


def model(scheme, method, seed=0, **extra):
    torch.manual_seed(seed)
    m = TransformerLM(config(**extra), pos_options(scheme), method_options(method))
    with torch.no_grad():  # off the initial values, so every parameter (bias tables, gates) matters
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def tokens(n, batch=2, seed=1):
    return torch.randint(0, 61, (batch, n), generator=torch.Generator().manual_seed(seed))


def read_in_pieces(m, idx, cache, pieces):
    out = []
    start = 0
    for n in pieces:
        out.append(m(idx[:, start : start + n], cache=cache))
        start += n
    return torch.cat(out, dim=1)


PIECES = (13, 1, 1, 1, 1, 1, 22)  # prefill, five single-token steps, a second chunk


def test_every_scheme_and_method_is_covered():
    schemes = {s for s, _ in PAIRS}
    methods = {m for _, m in PAIRS}
    assert schemes == set(SCHEMES.names()) and methods == set(METHODS.names())
    assert len(PAIRS) > 60


@pytest.mark.parametrize("scheme,method", PAIRS)
def test_cached_reading_equals_one_full_forward(scheme, method):
    m = model(scheme, method)
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)
        cache = KVCache(planned_len=T)
        cached = read_in_pieces(m, idx, cache, PIECES)
    assert cache.length == T
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4, msg=f"{scheme} under {method}")


def test_grouped_heads_stay_grouped_in_the_cache():
    m = model("rope", "self_extend")
    cache = KVCache(planned_len=T)
    with torch.no_grad():
        m(tokens(20), cache=cache)
    buffers = cache.layer(0).buffers
    assert set(buffers) == {"keys", "values", "far_keys"}
    assert all(b.shape == (2, 2, T, 8) for b in buffers.values())  # 2 key/value heads of 4 query heads


@pytest.mark.parametrize("scheme", [n for n in SCHEMES.names() if SCHEMES.get(n).owns_attention])
def test_a_scheme_that_owns_its_attention_keeps_raw_keys_and_its_terms(scheme):
    """For such a scheme the cache keeps keys as the layer made them (no
    rotation: the scheme sees raw keys in a full forward too), values, and
    every per-token term it reads off the layer's input, each as token_terms
    gives it for those tokens, grouped key/value heads left grouped."""
    m = model(scheme, "none")
    idx = tokens(T)
    cache = KVCache(planned_len=T)
    with torch.no_grad():
        read_in_pieces(m, idx, cache, PIECES)
        layer = m.blocks[1]
        x = m.blocks[0](
            m.embed_tokens(idx),
            m.pos_scheme,
            torch.arange(T),
            m.scaling.attention_plan(torch.arange(T), m.context(T)),
            m.context(T),
        )
        x = layer.norm1(x)
        _, k, v = layer.attn.split_qkv(x)
        terms = m.pos_scheme.token_terms(1, x, m.context(T)) if m.pos_scheme.reads_input else {}
    buffers = cache.layer(1).buffers
    assert set(buffers) == {"keys", "values", *(f"term:{name}" for name in terms)}
    torch.testing.assert_close(buffers["keys"], k, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(buffers["values"], v, atol=1e-5, rtol=1e-4)
    assert k.shape[1] == 2  # 2 key/value heads of 4 query heads
    for name, t in terms.items():
        torch.testing.assert_close(buffers[f"term:{name}"], t, atol=1e-5, rtol=1e-4, msg=lambda msg: f"{name}: {msg}")


LENGTH_DEPENDENT = ("pi", "ntk", "yarn", "dynamic_ntk", "longrope", "self_extend")


@pytest.mark.parametrize("method", LENGTH_DEPENDENT)
def test_a_planned_cache_evaluates_length_dependent_settings_at_its_plan(method):
    """The plan, not the tokens so far, sets the length: a cache planned for
    T reads its first 20 tokens as a full forward at T does, not as one of 20."""
    m = model("rope", method)
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)[:, :20]
        short = m(idx[:, :20])
        cached = m(idx[:, :20], cache=KVCache(planned_len=T))
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)
    assert (cached - short).abs().max() > 1e-3, f"{method} does not depend on the length: drop it from the list"


@pytest.mark.parametrize(
    "scheme,method",
    [
        ("rope", "none"),
        ("rope", "yarn"),
        ("alibi", "none"),
        ("t5", "none"),
        ("rope", "rerope"),
        ("recurrent", "none"),
        ("learned", "pi"),
    ],
)
def test_an_unplanned_cache_equals_the_full_forward_where_nothing_depends_on_the_length(scheme, method):
    extra = {"factor": 4.0} if method in ("yarn", "pi") else {}
    torch.manual_seed(0)
    m = TransformerLM(config(), pos_options(scheme), method_options(method, **extra)).eval()
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)
        cached = read_in_pieces(m, idx, KVCache(), PIECES)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


def test_unplanned_two_pass_regroups_its_far_keys_as_the_length_grows():
    """Self-Extend's auto group grows with the length; unplanned, each call
    rotates every far key at the current grouping (raw keys are kept), so
    the last token of each call sees what a full forward of the tokens so
    far gives it."""
    # One layer: its keys depend on the tokens alone, so the check is exact.
    idx = tokens(T)
    one = model("rope", "self_extend", n_layer=1)
    cache = KVCache()
    with torch.no_grad():
        one(idx[:, :10], cache=cache)
        for n in range(11, T + 1):
            step = one(idx[:, n - 1 : n], cache=cache)
            torch.testing.assert_close(step, one(idx[:, :n])[:, -1:], atol=2e-5, rtol=1e-4)
    assert "raw_keys" in cache.layer(0).buffers and "far_keys" not in cache.layer(0).buffers


def test_unplanned_dynamic_ntk_keeps_what_was_written_as_transformers_does(tmp_path):
    """Dynamic NTK unplanned: each new token is rotated at the scale of the
    current length, keys written earlier keep theirs, which is what
    transformers' dynamic RoPE does with its cache; the logits of every step
    equal transformers' cached decoding."""
    pytest.importorskip("transformers")
    from test_hf import save_hf

    from rope_lm.hf import load_hf

    directory, theirs = save_hf(
        tmp_path,
        "llama",
        max_position_embeddings=16,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0},
    )
    ours, _, _ = load_hf(directory)
    assert ours.scaling.name == "dynamic_ntk"
    idx = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(3))
    cache = KVCache()
    with torch.no_grad():
        mine = [ours(idx[:, :12], cache=cache)[:, -1]]
        mine += [ours(idx[:, n : n + 1], cache=cache)[:, -1] for n in range(12, 30)]
        out = theirs(idx[:, :12], use_cache=True)
        past, theirs_logits = out.past_key_values, [out.logits[:, -1]]
        for n in range(12, 30):
            out = theirs(idx[:, n : n + 1], cache=past, use_cache=True)
            past = out.past_key_values
            theirs_logits.append(out.logits[:, -1])
        full_last = ours(idx)[:, -1]
    for step, (a, b) in enumerate(zip(mine, theirs_logits)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"step {step}")
    # and the kept keys make it differ from a full forward past the trained length
    assert (mine[-1] - full_last).abs().max() > 1e-4


def test_a_cache_refuses_what_it_cannot_continue():
    m = model("rope", "none")
    cache = KVCache(planned_len=20)
    with torch.no_grad():
        m(tokens(15), cache=cache)
        with pytest.raises(ConfigError, match="planned for 20 tokens and holds 15"):
            m(tokens(6), cache=cache)
        with pytest.raises(ConfigError, match="holds 2 sequences"):
            m(tokens(1, batch=3), cache=cache)
    with pytest.raises(ConfigError, match="positive number of tokens"):
        KVCache(planned_len=0)
    with pytest.raises(ValueError, match="exclude each other"):
        m(tokens(2), pos=torch.arange(2), cache=KVCache())


def test_positions_are_global_a_sequence_in_slices_equals_one_run():
    """Slices of one long sequence, each read at its offset (what a device of
    context parallelism holds), give the one-run logits: the cache's chunks
    at sizes that do not divide the length."""
    for scheme, method in (("rope", "yarn"), ("alibi", "none"), ("fire", "none"), ("xpos", "none")):
        m = model(scheme, method)
        idx = tokens(T)
        with torch.no_grad():
            torch.testing.assert_close(
                read_in_pieces(m, idx, KVCache(planned_len=T), (7, 7, 7, 7, 7, 5)), m(idx), atol=2e-5, rtol=1e-4
            )


SHORT_PROMPT = (2,) + (1,) * 14 + (24,)  # a prompt shorter than any window, decoded across it, then a chunk


def streaming_llm(**extra):
    """conf/scaling/streaming_llm.yaml (window with sinks) at the tests' sizes."""
    with open(f"{ROOT}/conf/scaling/streaming_llm.yaml") as f:
        return {**yaml.safe_load(f), "window": 8, **extra}


@pytest.mark.parametrize("scheme,method", PAIRS)
def test_a_short_prompt_decoded_past_every_window_equals_one_full_forward(scheme, method):
    """A prefill that ends before a window, a far pass or a group begins; the
    steps after it cross where they begin: the cache must hold what those need."""
    m = model(scheme, method)
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)
        cached = read_in_pieces(m, idx, KVCache(planned_len=T), SHORT_PROMPT)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4, msg=f"{scheme} under {method}")


@pytest.mark.parametrize("scheme", ["rope", "alibi", "nope", "t5"])
@pytest.mark.parametrize("sink_positions", ["cache", "text"])
@pytest.mark.parametrize("planned", [True, False])
def test_streaming_llm_decodes_from_any_prompt_length(scheme, sink_positions, planned):
    """StreamingLLM (a window with 4 sinks): a 2-token prompt decoded past sinks + window equals the full forward."""
    options = streaming_llm(sink_positions=sink_positions)
    try:
        check_fit(config(), pos_options(scheme), options, T)
    except ConfigError:
        pytest.skip(f"{scheme} does not take sink_positions={sink_positions}")
    torch.manual_seed(0)
    m = TransformerLM(config(), pos_options(scheme), options).eval()
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)
        cached = read_in_pieces(m, idx, KVCache(planned_len=T if planned else None), SHORT_PROMPT)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["local_global", "gemma3"])
def test_streaming_llm_under_a_layout_decodes_from_a_short_prompt(layout):
    """The layouts with windowed local layers, under StreamingLLM, from a 2-token prompt: equal to the full forward."""
    with open(f"{ROOT}/conf/layout/{layout}.yaml") as f:
        spec = yaml.safe_load(f)
    for entry in spec.get("pattern") or spec.get("layers") or []:
        if isinstance(entry, dict) and entry.get("window"):
            entry["window"] = 6  # local windows the 40 tokens cross
    cfg = config(n_layer=len(spec.get("pattern") or spec.get("layers")), layout=spec)
    options = streaming_llm()
    try:
        check_fit(cfg, pos_options("rope"), options, T)
    except ConfigError as e:
        pytest.skip(f"{layout} does not take StreamingLLM: {e}")
    torch.manual_seed(0)
    m = TransformerLM(cfg, pos_options("rope"), options).eval()
    idx = tokens(T)
    with torch.no_grad():
        full = m(idx)
        cached = read_in_pieces(m, idx, KVCache(planned_len=T), SHORT_PROMPT)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("planned", [True, False])
def test_local_layers_let_go_of_the_keys_past_their_window(planned):
    """Gemma 3's layout (local layers of a 6-key window, global ones): decoded from a short prompt, the
    local layers keep only about their window of keys, as transformers' sliding cache does, the global
    layers every key, and the output still equals one full forward."""
    with open(f"{ROOT}/conf/layout/gemma3.yaml") as f:
        spec = yaml.safe_load(f)
    for entry in spec.get("pattern") or spec.get("layers") or []:
        if isinstance(entry, dict) and entry.get("window"):
            entry["window"] = 6
    cfg = config(n_layer=len(spec.get("pattern") or spec.get("layers")), layout=spec)
    torch.manual_seed(0)
    m = TransformerLM(cfg, pos_options("rope"), {"name": "none"}).eval()
    n = 300
    idx = torch.randint(0, cfg.vocab_size, (2, n), generator=torch.Generator().manual_seed(1))
    cache = KVCache(planned_len=n if planned else None)
    with torch.no_grad():
        full = m(idx)
        cached = read_in_pieces(m, idx, cache, (2,) + (1,) * 200 + (98,))
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)
    local = [i for i, s in enumerate(m.layout) if s.window]
    assert local and len(local) < cfg.n_layer
    for i, held in cache.layers.items():
        rows = {b.shape[2] for b in held.buffers.values()}
        if i in local:
            assert held.first >= n - 2 * 6 and max(rows) <= 2 * 98  # the last chunk's 98 queries and their window
        else:
            assert held.first == 0 and min(rows) >= n


@pytest.mark.parametrize("sinks", [0, 2])
def test_the_planned_cache_size_bounds_what_decoding_holds_and_counts_the_windows(sinks):
    """held_rows (what generation's memory check plans): every layer's buffers, read after each step of a
    40-token prompt and 260 single tokens through Gemma 3's layout, never exceed it; without sinks the
    windowed layers count as about two windows, so it is well under every layer holding every token, and
    with sinks (every key kept) it is exactly that."""
    from rope_lm.model.kv_cache import held_rows

    with open(f"{ROOT}/conf/layout/gemma3.yaml") as f:
        spec = yaml.safe_load(f)
    for entry in spec.get("pattern") or spec.get("layers") or []:
        if isinstance(entry, dict) and entry.get("window"):
            entry["window"], entry["sinks"] = 40, sinks
    cfg = config(n_layer=len(spec.get("pattern") or spec.get("layers")), layout=spec)
    torch.manual_seed(0)
    m = TransformerLM(cfg, pos_options("rope"), {"name": "none"}).eval()
    prompt, n = 40, 300
    idx = torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))
    cache = KVCache(planned_len=n)
    most = 0
    with torch.no_grad():
        m(idx[:, :prompt], cache=cache)
        for t in range(prompt, n):
            m(idx[:, t : t + 1], cache=cache)
            most = max(most, sum(layer.buffers["keys"].shape[2] for layer in cache.layers.values()))
    planned = held_rows(m, prompt, n)
    assert most <= planned
    if sinks:
        assert planned == most == cfg.n_layer * n
    else:
        local = [i for i, s in enumerate(m.layout) if s.window]
        # 2 x 40 rows a window layer, in a buffer doubled from 64: 128 (what it held before its first cut)
        assert planned == (cfg.n_layer - len(local)) * n + len(local) * 128 < cfg.n_layer * n
        assert max(cache.layers[i].buffers["keys"].shape[2] for i in local) <= 128
