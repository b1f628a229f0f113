"""Issue 26, round three, through the command line: an export never writes
over a model folder (item 1); a retrieval run with too many needles is one
paragraph, and a refused retrieval or diagnostic run leaves no folder behind
to push the next run's number up (item 6)."""

import hashlib
import os
import sys

import pytest

from tests import forked
from tests.conftest import ROOT
from tests.test_diagnostics import save_tiny_checkpoint

# A Llama-shaped rope-lm model: the one shape export_hf writes.
LLAMA = {
    "name": "llama",
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
    "dropout": 0.0,
    "attention": "auto",
}


def script(name, *args, cwd):
    return forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", name), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def one_paragraph(done, status, *words):
    err = done.stderr.strip()
    assert done.returncode == status, err[-3000:]
    # The scripts' progress lines ([rope_lm...], stderr) may come first; the error is the one paragraph after them.
    *progress, paragraph = err.split("\n\n")
    assert "Traceback" not in err + done.stdout and paragraph.startswith("rope-lm:"), err
    assert all(line.startswith("[rope_lm") for part in progress for line in part.splitlines()), err
    flat = " ".join(paragraph.split())
    for word in words:
        assert word in flat, err


def digest(folder) -> dict:
    """Every file under folder (hidden ones included) -> its SHA-1; every folder -> None."""
    out = {}
    for here, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(here, d), folder)] = None
        for f in files:
            path = os.path.join(here, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = hashlib.sha1(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def run_dir(tiny_cache, tiny_data_options, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    save_tiny_checkpoint(
        str(run / "checkpoints" / "last.ckpt"),
        tiny_cache,
        tiny_data_options,
        pos={"name": "rope", "base": 10000.0},
        model=LLAMA,
    )
    return run


# --- item 1: export_hf over a model folder ----------------------------------------------


@pytest.mark.parametrize("held", ["config.json", "model.safetensors", "tokenizer.json"])
def test_export_refuses_a_folder_that_holds_a_model(run_dir, tmp_path, held):
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / held).write_text('{"the user\'s": "own file"}')
    before = digest(tmp_path)
    done = script("export_hf.py", f"ckpt={run_dir}", f"out={mine}", cwd=tmp_path)
    one_paragraph(done, 2, f"out={mine}", "already holds a model", held, "new folder")
    assert digest(tmp_path) == before


def test_export_writes_a_new_folder_and_refuses_to_write_it_twice(run_dir, tmp_path):
    out = tmp_path / "exported"
    done = script("export_hf.py", f"ckpt={run_dir}", f"out={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    before = digest(tmp_path)
    one_paragraph(script("export_hf.py", f"ckpt={run_dir}", f"out={out}", cwd=tmp_path), 2, "already holds a model")
    assert digest(tmp_path) == before


# --- item 6: retrieval's needles, and no folder for a refused run -------------------------


def test_retrieval_with_more_needles_than_words_is_one_paragraph(run_dir, tmp_path):
    before = digest(run_dir)
    done = script("retrieval.py", f"ckpt={run_dir}", "tasks=[multikey]", "needles=1000", cwd=tmp_path)
    one_paragraph(done, 2, "needles=1000", "between 2 and 30", "multikey")
    assert digest(run_dir) == before and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "script_name,args,words",
    [
        (
            "retrieval.py",
            ["tasks=[multikey]", "needles=20", "lengths=[32]", "samples=1"],
            ["multikey prompt", "too short"],
        ),
        (
            "retrieval.py",
            ["tasks=[passkey]", "lengths=[100000]", "samples=1"],
            ["fewer than one 100000-token haystack"],
        ),
        ("attention_entropy.py", ["windows=100000", "length=32"], ["fewer than 100000 windows"]),
    ],
)
def test_a_refused_run_leaves_no_folder(run_dir, tmp_path, script_name, args, words):
    """The default folder (<run>/diagnostics/<name>) is made only once the
    inputs are checked, so the next run is not numbered past an empty one."""
    before = digest(run_dir)
    one_paragraph(script(script_name, f"ckpt={run_dir}", *args, cwd=tmp_path), 2, *words)
    assert digest(run_dir) == before and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "script_name,args",
    [
        ("passkey.py", ["lengths=[128]", "depths=[0.5]", "samples=1"]),
        ("retrieval.py", ["tasks=[passkey]", "lengths=[32]", "depths=[0.5]", "samples=1", "bootstrap=0"]),
    ],
)
def test_a_diagnostic_never_writes_over_a_folder_holding_results(run_dir, tmp_path, script_name, args):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "passkey.json").write_text('{"kept": true}')
    (out / "retrieval.json").write_text('{"kept": true}')
    before = digest(out)
    done = script(script_name, f"ckpt={run_dir}", *args, f"out={out}", cwd=tmp_path)
    one_paragraph(done, 2, f"out={out} already holds files", "never writes over earlier results")
    assert digest(out) == before
