"""Hugging Face interchange (rope_lm.hf): tiny random transformers models
saved to a temp folder are loaded into rope-lm with the same logits, inside
and past max_position_embeddings, for every family and rope_type; rope-lm
models are exported and reloaded by transformers with the same logits."""

import json
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")
from conftest import ROOT  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from rope_lm.core.errors import ConfigError  # noqa: E402
from rope_lm.hf import export_hf, hf_init, load_hf  # noqa: E402
from rope_lm.model.transformer import build_model  # noqa: E402
from tests import forked

hf_logging.set_verbosity_error()

VOCAB, MAX_POS = 300, 32
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
# float32 logits of O(1) after two layers; the two implementations order
# their sums differently, nothing more.
ATOL = 2e-5


def randomize(model, seed=0):
    """Weights of O(0.1) (HF's 0.02 init leaves logits ~0, which any RoPE
    would match) and norm weights off 1, so every tensor matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model


def save_hf(tmp_path, family="llama", seed=0, **overrides):
    Config, Model = FAMILIES[family]
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    if family == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    model = randomize(Model(Config(**kwargs)), seed).eval()
    model.config._attn_implementation = "eager"
    directory = str(tmp_path / f"{family}-{seed}")
    model.save_pretrained(directory)
    return directory, model


def tokens(T, seed=1):
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


def max_diff(ours, theirs, T):
    idx = tokens(T)
    with torch.no_grad():
        return (ours(idx) - theirs(idx).logits).abs().max().item()


def assert_parity(ours, theirs, lengths, label):
    for T in lengths:
        diff = max_diff(ours, theirs, T)
        assert diff < ATOL, f"{label} at T={T}: max |logit difference| {diff:.2e}"


# ------------------------------------------------------------------ import


@pytest.mark.parametrize(
    "family,extra",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1, "head_dim": 24}),  # MQA, head_dim != d/H
        ("mistral", {}),
        ("qwen2", {}),  # q/k/v biases, none on o_proj
    ],
)
def test_families_match_transformers_inside_and_past_max_positions(tmp_path, family, extra):
    directory, theirs = save_hf(tmp_path, family, **extra)
    ours, tokenizer, info = load_hf(directory)
    assert info.family == family and ours.scaling.name == "none" and ours.cfg.train_len == MAX_POS
    assert tokenizer is None and info.notes  # these directories carry no tokenizer.json
    assert_parity(ours, theirs, (MAX_POS - 8, 2 * MAX_POS), family)


ROPE_SCALING = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, "pi"),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, "dynamic_ntk"),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, "yarn"),
    "yarn-betas-mscale": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 0.8,
            "mscale_all_dim": 0.5,
        },
        "yarn",
    ),
    # beta_slow 0.5 puts the ramp's upper end at pair 1.41 for head_dim 16, L 16: rounding it changes pair 1
    "yarn-untruncated": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_slow": 0.5,
            "truncate": False,
        },
        "yarn",
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
        "llama3",
    ),
    "longrope": (
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "long_factor": [1.0 + 0.7 * i for i in range(8)],
            "short_factor": [1.0 + 0.05 * i for i in range(8)],
        },
        "longrope",
    ),
}


@pytest.mark.parametrize("case", ROPE_SCALING)
def test_rope_scaling_types_match_transformers(tmp_path, case):
    params, method = ROPE_SCALING[case]
    directory, theirs = save_hf(
        tmp_path, "llama", max_position_embeddings=64, rope_parameters={"rope_theta": 10000.0, **params}
    )
    ours, _, info = load_hf(directory)
    assert ours.scaling.name == method and ours.scaling.factor == params["factor"]
    L = info.settings["train_len"]
    # within the original length (longrope: short factors), past it, and past max_position_embeddings
    assert_parity(ours, theirs, (L - 4, L + 8, 80), case)


def test_legacy_rope_theta_and_rope_scaling_keys(tmp_path):
    """config.json of transformers 4.x: rope_theta and rope_scaling at the top level."""
    directory, theirs = save_hf(
        tmp_path,
        "llama",
        max_position_embeddings=64,
        rope_parameters={
            "rope_theta": 5000.0,
            "rope_type": "llama3",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    )
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    json.dump(config, open(path, "w"))
    ours, _, _ = load_hf(directory)
    assert ours.pos_scheme.base == 5000.0 and ours.scaling.name == "llama3"
    assert_parity(ours, theirs, (40,), "legacy keys")


def test_mistral_sliding_window_is_the_window_method(tmp_path):
    directory, theirs = save_hf(tmp_path, "mistral", sliding_window=8)
    ours, _, info = load_hf(directory)
    assert ours.scaling.name == "window" and ours.scaling.window == 8
    assert_parity(ours, theirs, (24, 48), "mistral window 8")
    full, _, _ = load_hf(directory, sliding_window="ignore")
    assert full.scaling.name == "none"
    assert max_diff(full, theirs, 24) > 1e-3  # the window matters at 24 tokens, so the check above has teeth
    assert max_diff(full, theirs, 8) < ATOL  # and not within it


def test_tokenizer_json_is_read(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory, _ = save_hf(tmp_path)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(directory, "tokenizer.json"))
    _, tokenizer, info = load_hf(directory)
    assert tokenizer.encode("hello world").ids == [1, 2]
    assert json.loads(info.tokenizer_json)["model"]["vocab"]["world"] == 2


def edit_config(directory, **changes):
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    config.update(changes)
    json.dump(config, open(path, "w"))


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"architectures": ["GPTNeoXForCausalLM"]}, r"GPTNeoXForCausalLM.*parallel residual"),
        ({"architectures": ["PhiForCausalLM"]}, r"PhiForCausalLM.*parallel attention"),
        ({"architectures": ["SomethingNew"]}, r"'SomethingNew' cannot be loaded.*Supported: LlamaForCausalLM"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu'"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
            r"partial_rotary_factor=0.5",
        ),
        ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1e4}}, r"rope_type='axial'"),
        ({"attention_bias": True}, r"attention_bias=True with mlp_bias=False"),
    ],
)
def test_unsupported_architectures_and_options_are_refused(tmp_path, changes, message):
    directory, _ = save_hf(tmp_path)
    edit_config(directory, **changes)
    with pytest.raises(ConfigError, match=message):
        load_hf(directory)


def test_mistral_window_with_rope_scaling_is_refused(tmp_path):
    directory, _ = save_hf(
        tmp_path, "mistral", sliding_window=8, rope_parameters={"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}
    )
    with pytest.raises(ConfigError, match=r"sliding_window=8 and rope_type=linear.*sliding_window='ignore'"):
        load_hf(directory)


def test_missing_and_misshapen_weights_are_refused(tmp_path):
    directory, _ = save_hf(tmp_path)
    edit_config(directory, intermediate_size=128)
    with pytest.raises(ConfigError, match=r"mlp\.\w+_proj.weight' has shape .*96.*implies .*128"):
        load_hf(directory)
    edit_config(directory, intermediate_size=96, num_hidden_layers=3)
    with pytest.raises(ConfigError, match=r"lack .*model.layers.2"):
        load_hf(directory)


def test_loading_holds_one_copy_of_the_weights(tmp_path):
    """Peak resident memory grows by about the weights' size, not twice it
    (a state_dict loaded beside a randomly initialised model would)."""
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "big")
    size = os.path.getsize(tmp_path / "big" / "model.safetensors")
    small, _ = save_hf(tmp_path)
    code = (
        "import sys, torch, rope_lm.hf, rope_lm.model.transformer, safetensors, tokenizers\n"
        "def status(key):\n"
        "    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(key))\n"
        "rope_lm.hf.load_hf(sys.argv[2])  # first use: lazy imports and allocator pools, not weights\n"
        "open('/proc/self/clear_refs', 'w').write('5')  # reset the peak (VmHWM) to the current RSS\n"
        "before = status('VmRSS:')\n"
        "model, _, _ = rope_lm.hf.load_hf(sys.argv[1])\n"
        "print(status('VmHWM:') - before)\n"
    )
    out = forked.run(
        [sys.executable, "-c", code, str(tmp_path / "big"), small],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        check=True,
    )
    grown = int(out.stdout.strip().splitlines()[-1])
    assert size > 100e6
    assert 0.9 * size < grown < 1.25 * size, f"peak RSS grew by {grown / 1e6:.0f} MB for {size / 1e6:.0f} MB of weights"


# ------------------------------------------------------------------ export

LLAMA_SHAPED = {
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "d_model": 64,
    "head_dim": 16,
    "mlp": "swiglu",
    "mlp_hidden": 96,
    "norm_eps": 1e-5,
    "tie_embeddings": False,
    "bias": False,
}


def rope_lm_model(scaling, train_len=16, seed=0, **model):
    torch.manual_seed(seed)
    m = build_model({**LLAMA_SHAPED, **model}, {"name": "rope", "base": 10000.0}, scaling, VOCAB, train_len)
    return randomize(m, seed).eval()


EXPORTABLE = {
    "none": {"name": "none"},
    "pi": {"name": "pi", "factor": 2.0},
    "dynamic_ntk": {"name": "dynamic_ntk", "factor": 2.0},
    "yarn": {"name": "yarn", "factor": 4.0, "beta_fast": 16, "beta_slow": 2},
    "yarn-untruncated": {"name": "yarn", "factor": 4.0, "beta_slow": 0.5, "truncate": False},
    "llama3": {"name": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {"name": "longrope", "factor": 4.0, "long_factor": [1.0 + 0.7 * i for i in range(8)]},
}


@pytest.mark.parametrize("method", EXPORTABLE)
def test_export_is_reloaded_by_transformers_with_the_same_logits(tmp_path, method):
    ours = rope_lm_model(EXPORTABLE[method])
    export_hf(ours, None, str(tmp_path / "out"))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    assert_parity(ours, theirs, (12, 24, 80), f"export {method}")


@pytest.mark.parametrize(
    "model,arch",
    [
        ({"qkv_bias": True}, "Qwen2ForCausalLM"),
        ({"bias": True, "tie_embeddings": True, "n_kv_head": 1}, "LlamaForCausalLM"),  # attention_bias + mlp_bias
        ({"norm_eps": None}, "LlamaForCausalLM"),  # torch's default eps written out
    ],
)
def test_export_of_other_shapes(tmp_path, model, arch):
    ours = rope_lm_model({"name": "none"}, **model)
    export_hf(ours, None, str(tmp_path / "out"))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    assert type(theirs).__name__ == arch
    assert_parity(ours, theirs, (24,), arch)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"pos": {"name": "alibi"}}, r"positional scheme 'alibi'"),
        ({"pos": {"name": "rope", "pairing": "interleaved"}}, r"pairing=interleaved"),
        ({"pos": {"name": "rope", "rotary_fraction": 0.5}}, r"rotates 8 of 16 channels"),
        ({"model": {"mlp": "gelu"}}, r"model.mlp=gelu"),
        ({"model": {"bias": True, "qkv_bias": False}}, r"bias=true with qkv_bias=false"),
        ({"scaling": {"name": "yarn"}}, r"factor=auto.*fixed factor"),
        ({"scaling": {"name": "ntk", "factor": 2.0}}, r"'ntk' has no transformers rope_type"),
        ({"scaling": {"name": "rerope"}}, r"'rerope' has no transformers rope_type"),
        ({"scaling": {"name": "pi", "factor": 2.0, "logn": True}}, r"log-n"),
        ({"model": {"softmax": {"sink_logits": True}}}, r"model.softmax .* acts on layers \[0, 1\]"),
    ],
)
def test_export_refuses_what_transformers_cannot_express(tmp_path, change, message):
    model = build_model(
        {**LLAMA_SHAPED, **change.get("model", {})},
        change.get("pos", {"name": "rope"}),
        change.get("scaling"),
        VOCAB,
        16,
    )
    with pytest.raises(ConfigError, match=message):
        export_hf(model, None, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")  # refused before writing anything


def test_import_export_round_trip(tmp_path):
    from safetensors.torch import load_file

    directory, theirs = save_hf(
        tmp_path,
        "qwen2",
        max_position_embeddings=64,
        rope_parameters={
            "rope_theta": 10000.0,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    ours, _, _ = load_hf(directory)
    export_hf(ours, None, str(tmp_path / "again"))
    before, after = (
        load_file(os.path.join(directory, "model.safetensors")),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert sorted(before) == sorted(after)
    for name in before:
        assert torch.equal(before[name], after[name]), name
    config = json.load(open(tmp_path / "again" / "config.json"))
    original = json.load(open(os.path.join(directory, "config.json")))
    for key in (
        "architectures",
        "hidden_size",
        "intermediate_size",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
    ):
        assert config[key] == original[key], key
    assert {k: config["rope_parameters"][k] for k in original["rope_parameters"]} == original["rope_parameters"]


def test_hf_init_starts_a_rope_lm_fine_tune(tmp_path):
    """hf_init's hparams build a LitLM whose model, given the loaded weights,
    is the transformers model; the fine-tune's own method replaces HF's."""
    from rope_lm.train.lit import LitLM

    directory, theirs = save_hf(tmp_path, "llama")
    model, tokenizer_json, hparams = hf_init(directory)
    lit = LitLM(**hparams, optim={}, max_steps=1)
    lit.model.load_state_dict(model.state_dict())
    lit.eval()
    assert_parity(lit.model, theirs, (24,), "hf_init")
    lit2 = LitLM(**{**hparams, "scaling": {"name": "yarn", "factor": 2.0}}, optim={}, max_steps=1)
    assert lit2.model.scaling.name == "yarn"


def test_export_script_writes_a_trained_checkpoint(tiny_config, tmp_path):
    """train.py's pipeline trains a Llama-shaped rope-lm model under YaRN with
    a fixed factor; scripts/export_hf.py writes it; transformers reloads it
    with the same logits and its tokenizer with the same ids."""
    from transformers import AutoTokenizer

    from rope_lm.runs.pipeline import train_and_evaluate
    from rope_lm.runs.trained import open_model

    tiny_config["model"].update(
        {k: v for k, v in LLAMA_SHAPED.items() if k not in ("n_layer", "d_model")}, d_model=64, head_dim=16
    )
    tiny_config["scaling"] = {"name": "yarn", "factor": 2.0}
    tiny_config["trainer"].update(max_steps=2, val_every_n_steps=2, ckpt_every_n_steps=2)
    train_and_evaluate(tiny_config, str(tmp_path / "run"))
    out = tmp_path / "exported"
    result = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "export_hf.py"), f"ckpt={tmp_path / 'run'}", f"out={out}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lit = open_model(str(tmp_path / "run"), "cpu").lit
    theirs = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    idx = torch.randint(0, lit.model.cfg.vocab_size, (1, 40))
    with torch.no_grad():
        diff = (lit.model(idx) - theirs(idx).logits).abs().max().item()
    assert diff < ATOL
    text = "def heappush(heap, item):"
    assert AutoTokenizer.from_pretrained(str(out))(text)["input_ids"] == lit_tokenizer_ids(lit, text)


def lit_tokenizer_ids(lit, text):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(lit.tokenizer_json).encode(text).ids


def test_export_script_refuses_a_model_transformers_cannot_express(tiny_config, tmp_path):
    from rope_lm.runs.pipeline import train_and_evaluate

    tiny_config["trainer"].update(max_steps=1, val_every_n_steps=1, ckpt_every_n_steps=1)
    train_and_evaluate(tiny_config, str(tmp_path / "run"))  # GELU MLP
    result = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "export_hf.py"),
            f"ckpt={tmp_path / 'run'}",
            f"out={tmp_path / 'x'}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "model.mlp=gelu" in result.stderr


def test_bf16_weights_are_converted_while_read(tmp_path):
    """A bfloat16 checkpoint loads into float32 (the one-tensor conversion
    buffer path) or stays bfloat16, holding the file's values either way."""
    directory, theirs = save_hf(tmp_path)
    theirs.to(torch.bfloat16).save_pretrained(directory)
    # reloaded rather than .float(): .to(bfloat16) also rounded HF's inv_freq buffer
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    ours, _, _ = load_hf(directory)
    assert ours.wte.weight.dtype == torch.float32
    assert_parity(ours, theirs, (24,), "bf16 file")
    half, _, _ = load_hf(directory, dtype=torch.bfloat16)
    assert half.wte.weight.dtype == torch.bfloat16 and torch.equal(half.wte.weight.float(), ours.wte.weight)


@pytest.mark.parametrize("tied", [False, True])
def test_hf_lit_is_a_lightning_module_with_the_weights_once(tmp_path, tied):
    """hf_lit: the LitLM a fine-tune or an evaluation starts from. Its model
    gives transformers' logits, every parameter is a real tensor listed once
    (a tied head is the embedding, not a second parameter the optimizer
    would step twice), and the fine-tune's method replaces HF's."""
    from rope_lm.hf import hf_lit

    directory, theirs = save_hf(tmp_path, "qwen2", tie_word_embeddings=tied)
    lit = hf_lit(directory).eval()
    assert_parity(lit.model, theirs, (24, 48), "hf_lit")
    params = list(lit.model.parameters())
    assert not any(p.is_meta for p in params) and not any(b.is_meta for b in lit.model.buffers())
    assert sum(p.numel() for p in params) == sum(p.numel() for p in theirs.parameters())
    assert (lit.model.lm_head.weight is lit.model.wte.weight) == tied
    opt = lit.configure_optimizers()["optimizer"]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(params)
    tuned = hf_lit(directory, scaling={"name": "yarn", "factor": 2.0}, max_steps=5)
    assert tuned.model.scaling.name == "yarn" and tuned.hparams["scaling"]["name"] == "yarn"


def test_hf_checkpoint_reads_like_a_rope_lm_checkpoint(tmp_path):
    """hf_checkpoint has the keys init_from reads from torch.load(ckpt); a
    model built from its hyper_parameters and given its 'model.' weights is
    the transformers model."""
    from rope_lm.hf import hf_checkpoint

    directory, theirs = save_hf(tmp_path, "mistral", tie_word_embeddings=True)
    saved = hf_checkpoint(directory)
    hp = saved["hyper_parameters"]
    weights = {k[len("model.") :]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    model = build_model(hp["model"], hp["pos"], hp["scaling"], hp["vocab_size"], hp["train_len"]).eval()
    model.load_state_dict(weights)
    assert_parity(model, theirs, (24, 48), "hf_checkpoint")
    assert saved["tokenizer_json"] is None
