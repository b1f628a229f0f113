"""The 2025 families (rope_lm/hf/families.py): tiny random SmolLM3, Qwen3,
Gemma 3 and Cohere2 models saved with save_pretrained load into rope-lm with
transformers' logits, inside and past max_position_embeddings and under
YaRN; their layers become a layout (NoPE layers, windows, per-type bases);
they export back to transformers with the same logits and tensors; what does
not map is refused naming the field."""

import json
import os

import pytest
import torch

pytest.importorskip("transformers")
from test_hf import edit_config, randomize, tokens  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Cohere2Config,
    Cohere2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from rope_lm.core.errors import ConfigError  # noqa: E402
from rope_lm.hf import export_hf, hf_lit, load_hf  # noqa: E402
from rope_lm.model.transformer import ModelConfig, build_model  # noqa: E402
from tests import forked

hf_logging.set_verbosity_error()

VOCAB, MAX_POS, N_LAYER = 300, 32, 4
# float32 sums in another order, relative to the logits' size (Gemma's
# sqrt(d) embeddings and post norms give logits of ~10, the others ~3).
RTOL = 4e-6
SLIDING, FULL = "sliding_attention", "full_attention"
GEMMA_TYPES = [SLIDING, FULL, SLIDING, FULL]
GEMMA_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
    FULL: {"rope_type": "default", "rope_theta": 1e6},
}

FAMILIES = {
    # name: (config class, model class, config overrides)
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {}),
    # layers 2 and 3 slide (max_window_layers), with a window shorter than the sequences
    "qwen3-sliding": (
        Qwen3Config,
        Qwen3ForCausalLM,
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
    ),
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM, {"no_rope_layer_interval": 2}),  # layers 1 and 3 NoPE
    "smollm3-sliding": (
        SmolLM3Config,
        SmolLM3ForCausalLM,
        {"no_rope_layers": [1, 1, 1, 0], "use_sliding_window": True, "sliding_window": 8},
    ),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        {"sliding_window": 8, "layer_types": GEMMA_TYPES, "query_pre_attn_scalar": 24, "rope_parameters": GEMMA_ROPE},
    ),
    "cohere2": (Cohere2Config, Cohere2ForCausalLM, {"sliding_window": 8, "logit_scale": 0.5}),
    # gpt-oss: 6 experts, 2 a token, sink logits, alternating sliding (8) and full layers; a clamp of 0.5
    # (7 in the released models) so that the clamps act on these small activations
    "gpt_oss": (
        GptOssConfig,
        GptOssForCausalLM,
        {
            "intermediate_size": 48,
            "num_local_experts": 6,
            "num_experts_per_tok": 2,
            "sliding_window": 8,
            "swiglu_limit": 0.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    # Llama 4's dense form: no experts, no chunked attention, no L2 q/k norm, no temperature tuning
    "llama4": (
        Llama4TextConfig,
        Llama4ForCausalLM,
        {
            "intermediate_size_mlp": 96,
            "moe_layers": [],
            "attention_chunk_size": None,
            "use_qk_norm": False,
            "attn_temperature_tuning": False,
        },
    ),
    # with its query temperature on the NoPE layers (h5's softmax option); floor_scale 8 so it acts within 24 tokens
    "llama4-temperature": (
        Llama4TextConfig,
        Llama4ForCausalLM,
        {
            "intermediate_size_mlp": 96,
            "moe_layers": [],
            "attention_chunk_size": None,
            "use_qk_norm": False,
            "attn_temperature_tuning": True,
            "floor_scale": 8,
            "attn_scale": 0.1,
        },
    ),
}
# what each becomes, layer by layer: (scheme, window)
EXPECTED_LAYERS = {
    "qwen3": [("rope", None)] * 4,
    "qwen3-sliding": [("rope", None), ("rope", None), ("rope", 8), ("rope", 8)],
    "smollm3": [("rope", None), ("nope", None)] * 2,
    "smollm3-sliding": [("rope", None)] * 3 + [("nope", 8)],
    "gemma3": [("rope", 8), ("rope", None)] * 2,
    "cohere2": [("rope", 8)] * 3 + [("nope", None)],
    "llama4": [("rope", None)] * 3 + [("nope", None)],
    "gpt_oss": [("rope", 8), ("rope", None)] * 2,
    "llama4-temperature": [("rope", None)] * 3 + [("nope", None)],
}


def save_family(tmp_path, case, **overrides):
    Config, Model, extra = FAMILIES[case]
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=N_LAYER,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(extra)
    kwargs.update(overrides)
    model = randomize(Model(Config(**kwargs))).eval()
    with torch.no_grad():  # sink logits of O(1), so that they weigh in every softmax
        for name, p in model.named_parameters():
            if name.endswith("self_attn.sinks"):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    model.config._attn_implementation = "eager"
    directory = str(tmp_path / case)
    model.save_pretrained(directory)
    return directory, model


def relative_diff(ours, theirs, T):
    idx = tokens(T)
    with torch.no_grad():
        expected = theirs(idx).logits
        return ((ours(idx) - expected).abs().max() / expected.abs().max().clamp(min=1)).item()


def assert_parity(ours, theirs, lengths, label):
    for T in lengths:
        diff = relative_diff(ours, theirs, T)
        assert diff < RTOL, f"{label} at T={T}: max |logit difference| / max |logit| = {diff:.2e}"


def layers_of(model):
    return [
        (s.name, None if model.layout is None else model.layout[i].window) for i, s in enumerate(model._layer_schemes)
    ]


# ------------------------------------------------------------------ import


@pytest.mark.parametrize("case", FAMILIES)
def test_families_match_transformers_inside_and_past_max_positions(tmp_path, case):
    directory, theirs = save_family(tmp_path, case)
    ours, _, info = load_hf(directory)
    assert info.family == case.split("-")[0] and ours.scaling.name == "none" and ours.cfg.train_len == MAX_POS
    assert layers_of(ours) == EXPECTED_LAYERS[case]
    # windows of 8 are far shorter than both lengths: a wrong window or a missing one shows
    assert_parity(ours, theirs, (MAX_POS - 8, 2 * MAX_POS + 6), case)


def test_llama4_temperature_is_on_its_nope_layers_only(tmp_path):
    directory, _ = save_family(tmp_path, "llama4-temperature")
    ours, _, _ = load_hf(directory)
    assert [b.attn.softmax.temperature for b in ours.blocks] == [False, False, False, True]
    assert (ours.blocks[3].attn.softmax.floor_scale, ours.blocks[3].attn.softmax.attn_scale) == (8.0, 0.1)


def test_gemma3_local_and_global_layers_keep_their_own_bases(tmp_path):
    directory, _ = save_family(tmp_path, "gemma3")
    ours, _, _ = load_hf(directory)
    assert [s.base for s in ours._layer_schemes] == [1e4, 1e6, 1e4, 1e6]
    assert ours.cfg.embed_scale == 64**0.5 and ours.cfg.attn_scale == 24**-0.5


def test_a_longrope_search_is_seeded_from_the_layers_its_factors_act_on(tmp_path):
    """Gemma 3's first layer is local (base 10k); LongRoPE acts on its global layers (base 1M), so the
    search's PI, NTK and YaRN seeds are theirs: YaRN's ramp at base 10k would be another candidate."""
    from types import SimpleNamespace

    from rope_lm.eval.longrope_search import Evolution, constrain, seeds
    from rope_lm.probes.diagnostics import checkpoint_rope_frequencies
    from rope_lm.probes.search_run import _run

    directory, _ = save_family(tmp_path, "gemma3")
    ours, _, info = load_hf(directory)
    train_len, target = info.settings["train_len"], 4 * info.settings["train_len"]
    spec = ours.scaled_rotary()
    assert (spec.rot_dim, spec.base) == (16, 1e6) and ours.pos_scheme.rotary.base == 1e4
    # scripts/rope_decay.py's curve of a checkpoint is that of the same layers
    assert "d=16, base 1e+06" in checkpoint_rope_frequencies(ours, 64)[2]

    class Objective(SimpleNamespace):  # scripts/search.py's objective, scored without text
        def __call__(self, config):
            return float(sum(config["long_factor"]))

    obj = Objective(model=ours, ratio=4.0, train_len=train_len, target=target)
    kept = []
    _run("longrope", obj, SimpleNamespace(seed=0), Evolution(3, 1, 1), str(tmp_path / "t.json"), [], kept)
    yarn = next(r["factors"] for r in kept if r["origin"] == "yarn")
    expected = {b: constrain(seeds(16, b, train_len, target)["yarn"], 4.0, 1.25) for b in (1e6, 1e4)}
    assert yarn == pytest.approx(expected[1e6].tolist()) and yarn != pytest.approx(expected[1e4].tolist())

    every, _, _ = load_hf(directory, scaled_layers="all")
    with pytest.raises(ConfigError, match=r"different frequencies \(layers \[0, 2\]: 16 rotary dims at base 10000"):
        every.scaled_rotary()


def test_a_rhythm_that_does_not_divide_the_layers_is_a_cut_pattern(tmp_path):
    """Gemma 3 1B repeats 5 local + 1 global over 26 layers; here 1 + 1 over 5."""
    directory, theirs = save_family(tmp_path, "gemma3", num_hidden_layers=5, layer_types=GEMMA_TYPES + [SLIDING])
    ours, _, info = load_hf(directory)
    assert len(info.settings["model"]["layout"]["pattern"]) == 2
    assert layers_of(ours) == EXPECTED_LAYERS["gemma3"] + [("rope", 8)]
    assert_parity(ours, theirs, (40,), "gemma3, 5 layers")


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0}


@pytest.mark.parametrize(
    "case,overrides,scaled",
    [
        ("qwen3", {"rope_parameters": YARN}, [0, 1, 2, 3]),
        ("smollm3", {"rope_parameters": YARN}, [0, 2]),  # the NoPE layers take no method (transformers: no rotation)
        ("cohere2", {"rope_parameters": YARN}, [0, 1, 2]),
        ("llama4", {"rope_parameters": YARN}, [0, 1, 2]),
        (
            "gpt_oss",
            {"rope_parameters": {**YARN, "truncate": False}},
            [0, 1, 2, 3],
        ),  # gpt-oss's own YaRN is untruncated
        # Gemma 3 scales its global layers only (its 27B config: linear factor 8 on full_attention)
        ("gemma3", {"rope_parameters": {SLIDING: GEMMA_ROPE[SLIDING], FULL: {**YARN, "rope_theta": 1e6}}}, [1, 3]),
    ],
)
def test_yarn_acts_where_transformers_applies_it(tmp_path, case, overrides, scaled):
    directory, theirs = save_family(tmp_path, case, max_position_embeddings=64, **overrides)
    ours, _, info = load_hf(directory)
    assert ours.scaling.name == "yarn" and ours.scaling.factor == 4.0 and info.settings["train_len"] == 16
    assert ours.scaled_layers == scaled
    assert_parity(ours, theirs, (12, 24, 80), f"{case} yarn")


def test_config_without_layer_types_derives_them_as_transformers_does(tmp_path):
    """Files written before layer_types existed: Gemma's sliding_window_pattern
    and Cohere's default of three sliding layers to one global."""
    directory, theirs = save_family(tmp_path, "cohere2")
    config = json.load(open(os.path.join(directory, "config.json")))
    del config["layer_types"]
    json.dump(config, open(os.path.join(directory, "config.json"), "w"))
    ours, _, _ = load_hf(directory)
    assert layers_of(ours) == EXPECTED_LAYERS["cohere2"]
    assert_parity(ours, theirs, (40,), "cohere2 without layer_types")


def test_sliding_window_ignore_gives_the_sliding_layers_full_attention(tmp_path):
    """Exact up to the window's length, as for Mistral."""
    directory, theirs = save_family(tmp_path, "cohere2")
    ours, _, _ = load_hf(directory, sliding_window="ignore")
    assert layers_of(ours) == [("rope", None)] * 3 + [("nope", None)]
    assert_parity(ours, theirs, (8,), "cohere2, windows ignored, within the window")
    assert relative_diff(ours, theirs, 24) > 1e-3  # past it the windows matter


def test_hf_lit_builds_every_layer_scheme(tmp_path):
    """The LitLM is built on the meta device: each layer's scheme (two bases
    here) gets its computed buffers back."""
    directory, theirs = save_family(tmp_path, "gemma3")
    lit = hf_lit(directory)
    lit.model.eval()
    assert_parity(lit.model, theirs, (40,), "gemma3 via hf_lit")


@pytest.mark.parametrize("case", ["gemma3", "cohere2", "smollm3-sliding", "gpt_oss"])
def test_cached_decoding_equals_one_forward(tmp_path, case):
    """The new options sit in the projections and the block, so the KV cache
    reads them as the full forward does: prefill then one token at a time."""
    from rope_lm.model.kv_cache import KVCache

    directory, _ = save_family(tmp_path, case)
    ours, _, _ = load_hf(directory)
    idx = tokens(20)
    with torch.no_grad():
        full = ours(idx)
        cache = KVCache(planned_len=20)
        pieces = [ours(idx[:, :12], cache=cache)] + [ours(idx[:, t : t + 1], cache=cache) for t in range(12, 20)]
    diff = (torch.cat(pieces, dim=1) - full).abs().max() / full.abs().max()
    assert diff < RTOL, f"{case}: cached decoding differs by {diff:.2e} of the largest logit"


@pytest.mark.parametrize(
    "case,changes,message",
    [
        ("qwen3", {"attention_bias": True}, r"attention_bias=True with no MLP biases in Qwen3ForCausalLM"),
        ("smollm3", {"attention_bias": True, "mlp_bias": False}, r"attention_bias=True with mlp_bias=False"),
        ("gemma3", {"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50.0"),
        ("gemma3", {"final_logit_softcapping": 30.0}, r"final_logit_softcapping=30.0"),
        ("gemma3", {"use_bidirectional_attention": True}, r"use_bidirectional_attention=True"),
        ("gemma3", {"hidden_activation": "gelu"}, r"hidden_activation='gelu'"),
        (
            "gemma3",
            {
                "rope_parameters": {
                    SLIDING: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                    FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                }
            },
            r"different scalings per layer type",
        ),
        ("cohere2", {"layer_types": [SLIDING, "chunked_attention", SLIDING, FULL]}, r"layer_types=.*chunked_attention"),
        (
            "qwen3",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            r"partial_rotary_factor=0.5",
        ),
        ("smollm3", {"no_rope_layers": [1, 0]}, r"no_rope_layers of 2 entries for num_hidden_layers=4"),
        ("llama4", {"moe_layers": [1, 3]}, r"moe_layers=\[1, 3\]: Llama 4.s mixture of experts"),
        ("llama4", {"attention_chunk_size": 8}, r"attention_chunk_size=8: chunked attention"),
        ("llama4", {"use_qk_norm": True}, r"use_qk_norm=True: an L2 norm of q and k"),
    ],
)
def test_what_does_not_map_is_refused_naming_the_field(tmp_path, case, changes, message):
    directory, _ = save_family(tmp_path, case)
    edit_config(directory, **changes)
    with pytest.raises(ConfigError, match=message):
        load_hf(directory)


def test_a_llama4_config_without_moe_layers_is_refused_by_its_default(tmp_path):
    """transformers reads a missing moe_layers as every layer a mixture of experts."""
    directory, _ = save_family(tmp_path, "llama4")
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    del config["moe_layers"]
    json.dump(config, open(path, "w"))
    with pytest.raises(ConfigError, match=r"moe_layers=None \(its default\): Llama 4.s mixture of experts"):
        load_hf(directory)


# ------------------------------------------------------------------ export


@pytest.mark.parametrize("case", FAMILIES)
def test_import_export_round_trip(tmp_path, case):
    """Loaded, written back: the same tensors, the same settings, and
    transformers reads the result with the original's logits."""
    from safetensors.torch import load_file

    directory, theirs = save_family(
        tmp_path, case, max_position_embeddings=64, rope_parameters=(GEMMA_ROPE if case == "gemma3" else YARN)
    )
    ours, _, _ = load_hf(directory)
    export_hf(ours, None, str(tmp_path / "again"))
    before = load_file(os.path.join(directory, "model.safetensors"))
    after = load_file(tmp_path / "again" / "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name
    original = json.load(open(os.path.join(directory, "config.json")))
    config = json.load(open(tmp_path / "again" / "config.json"))
    # Llama 4's intermediate_size is its experts' width, which a dense model does not have
    width = "intermediate_size_mlp" if case.startswith("llama4") else "intermediate_size"
    for key in (
        "architectures",
        "model_type",
        "hidden_size",
        width,
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "layer_types",
        "sliding_window",
        "no_rope_layers",
        "query_pre_attn_scalar",
        "logit_scale",
        "rms_norm_eps",
        "layer_norm_eps",
        "attn_temperature_tuning",
        "attention_bias",
    ):
        assert config.get(key) == original.get(key), key
    if case == "gpt_oss":  # (Llama 4's dense form carries expert fields it does not read)
        for key in ("num_local_experts", "num_experts_per_tok", "swiglu_limit", "swiglu_alpha"):
            assert config[key] == original[key], key
    if original.get("attn_temperature_tuning"):  # its settings are read only when it is on
        assert (config["floor_scale"], config["attn_scale"]) == (original["floor_scale"], original["attn_scale"])
    assert written_as(config["rope_parameters"], original["rope_parameters"])
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "again"), attn_implementation="eager").eval()
    assert_parity(ours, again, (24, 80), f"{case} exported")


def written_as(exported, original) -> bool:
    """Every setting of the original, at any depth, has its value in the
    export (which also writes the defaults out)."""
    if isinstance(original, dict):
        return isinstance(exported, dict) and all(
            k in exported and written_as(exported[k], v) for k, v in original.items()
        )
    return exported == original


LLAMA_SHAPED = {
    "n_layer": N_LAYER,
    "n_head": 4,
    "n_kv_head": 2,
    "d_model": 64,
    "head_dim": 16,
    "mlp": "swiglu",
    "mlp_hidden": 96,
    "norm_eps": 1e-5,
    "tie_embeddings": False,
}


def scratch_model(layout, scaling=None, **model):
    torch.manual_seed(0)
    m = build_model({**LLAMA_SHAPED, "layout": layout, **model}, {"name": "rope", "base": 10000.0}, scaling, VOCAB, 16)
    return randomize(m).eval()


@pytest.mark.parametrize(
    "layout,model,arch",
    [
        # a rope-lm layout study's model: NoPE every 4th layer, windows elsewhere
        ({"pattern": [{"window": 6}, {"window": 6}, {"window": 6}, "nope"]}, {}, "SmolLM3ForCausalLM"),
        (None, {"qk_norm": True}, "Qwen3ForCausalLM"),
        (
            {"pattern": [{"window": 6, "pos": {"base": 1e4}}, {"pos": {"base": 1e6}}]},
            {
                "norm": "rms_offset",
                "qk_norm": True,
                "post_norms": True,
                "mlp": "geglu",
                "embed_scale": 8.0,
                "attn_scale": 20**-0.5,
                "tie_embeddings": True,
            },
            "Gemma3ForCausalLM",
        ),
        (
            {"pattern": [{"window": 6, "pos": {"pairing": "interleaved"}}, "nope"]},
            {"norm": "layer", "parallel": True, "logit_scale": 0.25},
            "Cohere2ForCausalLM",
        ),
        # gpt-oss's parts on a rope-lm model: experts, sink logits, biases on q/k/v/o, windows every other layer
        (
            {"pattern": [{"window": 6}, {}]},
            {"mlp": "moe", "experts": {"count": 4, "top_k": 2}, "bias": True, "softmax": {"sink_logits": True}},
            "GptOssForCausalLM",
        ),
        # Llama's block, interleaved pairs, every 4th layer NoPE and no windows: Llama 4's dense form,
        # here with its temperature on the NoPE layers (conf/layout/llama4.yaml's rhythm)
        (
            {
                "pattern": [{"pos": {"pairing": "interleaved"}}] * 3
                + [{"pos": {"name": "nope"}, "softmax": {"temperature": {"floor_scale": 8, "attn_scale": 0.1}}}]
            },
            {},
            "Llama4ForCausalLM",
        ),
    ],
)
def test_rope_lm_models_export_to_the_family_that_expresses_them(tmp_path, layout, model, arch):
    ours = scratch_model(layout, {"name": "yarn", "factor": 4.0}, **model)
    export_hf(ours, None, str(tmp_path / "out"))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    assert type(theirs).__name__ == arch
    assert_parity(ours, theirs, (12, 40), arch)


@pytest.mark.parametrize(
    "layout,model,message",
    [
        ({"pattern": ["rope", "alibi"]}, {}, r"layer 1 uses positional scheme 'alibi'"),
        (
            {"pattern": [{"window": 4, "pos": {"pairing": "interleaved"}}, "nope"]},
            {},
            r"sliding windows; Llama4ForCausalLM has none",
        ),
        (
            {
                "pattern": [
                    {
                        "pos": {"pairing": "interleaved"},
                        "softmax": {"temperature": {"floor_scale": 8, "attn_scale": 0.1}},
                    },
                    "nope",
                ]
            },
            {},
            r"temperature is on layers \[0, 2\]; Llama4ForCausalLM tunes exactly its NoPE",
        ),
        (
            None,
            {"qk_norm": True, "softmax": {"sink_logits": True}},
            r"layer 0 has learned sink logits; Qwen3ForCausalLM has neither",
        ),
        ({"pattern": [{"window": 4}, {"window": 8}]}, {}, r"sliding windows differ \(\[4, 8\]\)"),
        ({"pattern": ["rope", {"pos": {"p_rope": 0.5}}, "rope", "nope"]}, {}, r"layer 1 rotates .* p_rope=0.5"),
        (
            {"pattern": [{"window": 4, "pos": {"pairing": "interleaved"}}, {"pos": {"pairing": "interleaved"}}]},
            {"norm": "layer", "parallel": True},
            r"NoPE on exactly its global",
        ),
        ({"pattern": ["rope", "nope"]}, {"qk_norm": True}, r"NoPE on layers \[1, 3\].*RoPE on every layer"),
        (
            {"pattern": [{"window": 4}, {}]},
            {
                "norm": "rms_offset",
                "qk_norm": True,
                "post_norms": True,
                "mlp": "geglu",
                "embed_scale": 8.0,
                "attn_scale": 0.3,
            },
            r"attn_scale=0.3 is not s\^-1/2",
        ),
        (
            {"pattern": [{"window": 4}, {}]},
            {"norm": "rms_offset", "qk_norm": True, "post_norms": True, "mlp": "geglu"},
            r"model.embed_scale=None; Gemma3ForCausalLM has embed_scale=8.0",
        ),
        (
            {"layers": ["rope", {"scaling": False}, "rope", "rope"]},
            {"qk_norm": True},
            r"acts on some full_attention layers and not on others",
        ),
        (None, {"norm": "layer"}, r"model.norm=layer in a block no transformers family has"),
        (
            {"pattern": [{"window": 6}, {}]},
            {"mlp": "moe", "experts": {"count": 4, "top_k": 2}},
            r"layer 0 has no sink logits; GptOssForCausalLM has sink logits on every layer",
        ),
        ({"pattern": ["rope", "nope"]}, {"mlp": "gelu"}, r"a per-layer layout with .*mlp=gelu"),
    ],
)
def test_export_refuses_what_no_family_expresses(tmp_path, layout, model, message):
    ours = scratch_model(layout, {"name": "pi", "factor": 2.0}, **model)
    with pytest.raises(ConfigError, match=message):
        export_hf(ours, None, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


# ------------------------------------------------------------------ the model options


def test_default_options_add_no_modules():
    """Today's models: no q/k norms, no post norms, the same parameter names."""
    m = build_model({"n_layer": 2, "d_model": 32, "n_head": 4}, {"name": "rope"}, None, 50, 16)
    names = [n for n, _ in m.named_parameters()]
    assert not any(k in n for n in names for k in ("q_norm", "k_norm", "post_norm"))
    assert all(b.norm2 is not None for b in m.blocks)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"norm": "batch"}, r"model.norm='batch' is not a norm kind; use one of rms, rms_offset, layer"),
        ({"qk_norm": "yes"}, r"model.qk_norm='yes' must be true or false"),
        ({"parallel": True, "post_norms": True}, r"parallel=true with model.post_norms=true"),
        ({"attn_scale": 0}, r"model.attn_scale=0 must be a positive number"),
        ({"logit_scale": -1.0}, r"model.logit_scale=-1.0 must be a positive number"),
        ({"mlp": "reglu"}, r"model.mlp='reglu' is not an MLP kind; use one of gelu, swiglu, geglu, moe"),
        ({"mlp": "moe"}, r"model.mlp=moe needs model.experts"),
        ({"mlp": "moe", "experts": {"count": 2, "top_k": 3}}, r"top_k=3 exceeds model.experts.count=2"),
        ({"mlp": "swiglu", "experts": {"count": 2, "top_k": 1}}, r"experts need model.mlp=moe"),
    ],
)
def test_bad_options_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(vocab_size=50, train_len=16, **change).validate()


def test_a_trained_gemma_shaped_layout_exports_through_the_script(tiny_config, tmp_path):
    """train.py's pipeline trains a rope-lm model with Gemma 3's block and a
    local/global layout (the model options checked like any other setting);
    scripts/export_hf.py writes it; transformers reloads it with its logits."""
    import sys

    from conftest import ROOT

    from rope_lm.runs.pipeline import train_and_evaluate
    from rope_lm.runs.trained import open_model

    tiny_config["model"].update(
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        d_model=64,
        head_dim=16,
        mlp="geglu",
        mlp_hidden=96,
        norm="rms_offset",
        qk_norm=True,
        post_norms=True,
        embed_scale=8.0,
        attn_scale=0.25,
        norm_eps=1e-6,
        layout={"pattern": [{"window": 8, "pos": {"base": 1e4}}, {"pos": {"base": 1e6}}]},
    )
    tiny_config["trainer"].update(max_steps=2, val_every_n_steps=2, ckpt_every_n_steps=2)
    train_and_evaluate(tiny_config, str(tmp_path / "run"))
    out = tmp_path / "exported"
    result = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "export_hf.py"), f"ckpt={tmp_path / 'run'}", f"out={out}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    config = json.load(open(out / "config.json"))
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["query_pre_attn_scalar"] == 16
    assert config["layer_types"] == [SLIDING, FULL] and config["sliding_window"] == 8
    model = open_model(str(tmp_path / "run"), "cpu").lit.model.eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    assert_parity(model, theirs, (40,), "trained Gemma-shaped layout")
