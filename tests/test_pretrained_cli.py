"""A pretrained model through the command line, as README "Pretrained models"
shows it: a tiny random Llama saved to disk is evaluated under five methods,
fine-tuned at twice its length, exported, and reloaded by transformers with
the same logits."""

import json
import os
import sys

import pytest
import torch

from rope_lm.data.corpus import SourceConfig, load_documents
from rope_lm.data.token_cache import train_tokenizer
from tests import forked
from tests.conftest import ROOT, write_corpus

transformers = pytest.importorskip("transformers")

MAX_POS = 32


def run(args, script):
    done = forked.run(
        [sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random Llama with a byte-level BPE tokenizer.json, as save_pretrained writes it."""
    tmp = tmp_path_factory.mktemp("llama")
    corpus = write_corpus(tmp / "corpus")
    docs = load_documents(SourceConfig(source="files", path=corpus))
    tok = train_tokenizer(docs["train"], 300, 200_000)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    directory = tmp / "tiny-llama"
    model.save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    return str(directory), corpus


def data_args(corpus, cache):
    return [
        "data=local_files",
        f"data.path={corpus}",
        "data.vocab_size=300",
        "data.batch_size=4",
        "data.valid_fraction=0.2",
        "data.test_fraction=0.2",
        "data.val_tokens=256",
        f"data.cache_dir={cache}",
    ]


def test_evaluate_finetune_export_reload(tiny_llama, tmp_path):
    directory, corpus = tiny_llama
    cache = tmp_path / "cache"
    # Five methods, one table, on the model's own tokenizer.
    run(
        [
            f"hf={directory}",
            "scaling=none,pi,ntk,yarn,rerope",
            f"out={tmp_path / 'eval'}",
            "eval.multipliers=[1,2,4]",
            "eval.token_budget=512",
            *[a for a in data_args(corpus, cache) if not a.startswith("data=")],
        ],
        "scripts/eval_extrapolation.py",
    )
    results = json.load(open(tmp_path / "eval" / "results.json"))
    assert {r["method"] for r in results["results"]} == {"none", "pi", "ntk", "yarn", "rerope"}
    assert results["train_len"] == MAX_POS and all(r["ppl"] > 1 for r in results["results"])
    # Fine-tune at 2x its length under YaRN.
    ft = tmp_path / "ft"
    run(
        [
            f"init_from=hf:{directory}",
            f"data.seq_len={2 * MAX_POS}",
            "scaling=yarn",
            "scaling.factor=2.0",
            "trainer.max_steps=3",
            "trainer.val_every_n_steps=3",
            "trainer.enable_progress_bar=false",
            "logger=none",
            "eval.multipliers=[1,2]",
            "eval.token_budget=512",
            f"hydra.run.dir={ft}",
            *data_args(corpus, cache),
        ],
        "train.py",
    )
    trained = json.load(open(ft / "results.json"))
    assert trained["status"] == "complete" and trained["training"]["steps"] == 3
    assert trained["config"]["model"]["n_kv_head"] == 2  # the imported architecture, not conf/model/tiny
    # Export and reload with transformers: the same logits.
    out = tmp_path / "exported"
    run([f"ckpt={ft}", f"out={out}"], "scripts/export_hf.py")
    from rope_lm.runs.trained import open_model

    lit = open_model(str(ft), "cpu").lit
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
    idx = torch.randint(0, lit.model.cfg.vocab_size, (1, 2 * MAX_POS + 8))
    with torch.no_grad():
        diff = (lit.model(idx) - theirs(idx).logits).abs().max().item()
    assert diff < 2e-5, diff


def test_diagnostics_read_an_imported_model(tiny_llama, tmp_path):
    directory, _ = tiny_llama
    out = tmp_path / "decay"
    run(
        [
            f"ckpt=hf:{directory}",
            "scaling=yarn",
            "scaling.factor=2.0",
            f"length={2 * MAX_POS}",
            "bases=[]",
            "max_distance=64",
            f"out={out}",
        ],
        "scripts/rope_decay.py",
    )
    curves = json.load(open(out / "rope_decay.json"))["curves"]
    assert len(curves) == 1 and curves[0]["head_dim"] == 16 and curves[0]["attention_factor"] > 1  # YaRN's factor
    assert json.load(open(out / "rope_decay.json"))["train_len"] == MAX_POS


def test_retrieval_battery_on_an_imported_model(tiny_llama, tmp_path):
    directory, corpus = tiny_llama
    out = tmp_path / "retrieval"
    data = [
        f"+data.path={corpus}",
        "+data.source=files",
        "+data.name=local_files",
        "+data.vocab_size=300",
        "+data.valid_fraction=0.2",
        "+data.test_fraction=0.2",
        f"+data.cache_dir={tmp_path / 'cache'}",
    ]
    run(
        [
            f"ckpt=hf:{directory}",
            "scaling=yarn",
            "tasks=[passkey,vartrack]",
            "lengths=[512]",
            "depths=[0,1]",
            "needles=2",
            "samples=2",
            "bootstrap=0",
            f"out={out}",
            *data,
        ],
        "scripts/retrieval.py",
    )
    result = json.load(open(out / "retrieval.json"))
    assert result["train_len"] == MAX_POS and result["method"] == "yarn"
    assert set(result["tasks"]) == {"passkey", "vartrack"}
    for task in result["tasks"].values():
        assert task["lengths"] == [512] and task["depths"] == [0, 1] and task["samples"] == 2
        assert all(0 <= a <= 1 for row in task["accuracy"] for a in row)
    assert (out / "retrieval_passkey.png").exists() and (out / "retrieval_vartrack.png").exists()


def test_passkey_names_an_imported_model_as_the_user_gave_it(tiny_llama, tmp_path):
    """hf:<folder> is a model name, not a path under the current folder: the
    result records `hf:<folder>` as given (it once read <cwd>/hf:<folder>)."""
    directory, _ = tiny_llama
    given = f"hf:{os.path.relpath(directory, tmp_path)}"
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "passkey.py"),
            f"ckpt={given}",
            "lengths=[96]",
            "depths=[0.5]",
            "samples=1",
            "out=pk",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    result = json.load(open(tmp_path / "pk" / "passkey.json"))
    assert result["checkpoint"] == given and result["source"] == given


def test_the_documented_pg19_command_offline_times_methods_and_names_the_files(tiny_llama, tmp_path):
    """docs/pretrained.md's `data=pg19` (with data.path= for a local copy, as
    offline): the corpus group is taken (it once failed with Hydra's "Could
    not override 'data'"), the log names the files scored, and results.json
    holds each method's wall time."""
    directory, corpus = tiny_llama
    done = run(
        [
            f"hf={directory}",
            "scaling=none,yarn",
            "data=pg19",
            f"data.path={corpus}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "eval.multipliers=[1,2]",
            "eval.token_budget=256",
            f"out={tmp_path / 'eval'}",
        ],
        "scripts/eval_extrapolation.py",
    )
    result = json.load(open(tmp_path / "eval" / "results.json"))
    assert result["config"]["data"]["name"] == "pg19" and result["config"]["data"]["hf_name"] == "deepmind/pg19"
    assert all(m["seconds"] > 0 for m in result["methods"].values()) and len(result["methods"]) == 2
    test_files = result["corpus"]["files"]["test"]
    assert test_files and all(name.endswith(".txt") for name in test_files)
    assert (
        f"[rope_lm] Scoring the test split of {corpus}: {len(test_files)} file(s): {', '.join(test_files)}"
        in done.stderr
    )
    assert any(name.startswith("pg19-") for name in os.listdir(tmp_path / "cache"))


def test_an_imported_models_own_corpus_is_named_after_the_model(tiny_llama, tmp_path):
    from rope_lm.runs.trained import checkpoint_token_cache, open_model

    directory, corpus = tiny_llama
    trained = open_model(f"hf:{directory}", "cpu")
    options = {"path": corpus, "vocab_size": 300, "cache_dir": str(tmp_path / "cache")}
    cache, used = checkpoint_token_cache(trained.lit, options, str(tmp_path / "work"), trained.path)
    assert used["name"] == f"tiny-llama-{os.path.basename(corpus)}"
    assert os.path.basename(cache.dir).startswith(f"tiny-llama-{os.path.basename(corpus)}-")
    named = checkpoint_token_cache(trained.lit, {**options, "name": "mine"}, str(tmp_path / "work"), trained.path)[1]
    assert named["name"] == "mine"  # a name given is kept
