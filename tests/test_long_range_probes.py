"""scripts/long_range_probes.py and its run (rope_lm/probes/long_range_run.py): both probes into one
folder, written as each result comes; existing=continue goes on only with the same model (by its
weights, not its path, the evaluator's too) and the same settings, keeping what was scored; a stop
says what it kept and the command that finishes; bad settings are one paragraph before any work; an
imported model (hf:, a tiny random Llama saved to a temp folder) goes through the command line."""

import json
import os
import shlex
import shutil
import sys

import numpy as np
import pytest
import torch

from rope_lm.core.errors import ConfigError, Interrupted
from rope_lm.core.stops import Terminated
from rope_lm.probes import key_tokens as K
from rope_lm.probes import long_range_run as LR
from rope_lm.probes import repeated_span as RS
from tests import forked
from tests.conftest import ROOT, write_corpus

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")  # RoPE, trained at 16 tokens, 3 steps


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The fixture's corpus (its run.yaml names a relative `corpus` folder) and a token cache for it."""
    where = tmp_path_factory.mktemp("long_range")
    return {"path": write_corpus(where / "corpus"), "cache_dir": str(where / "cache")}


def settings(corpus, where, **changes):
    base = dict(
        ckpt=FIXTURE,
        probes=["repeated_span", "key_tokens"],
        repeated_span={"span": 4, "distances": [8, 32], "samples": 4},
        key_tokens={"evaluator": FIXTURE, "lengths": [32], "token_budget": 256},
        data=dict(corpus),
        bootstrap=50,
        batch_tokens=512,
        device="cpu",
        out=str(where),
    )
    return LR.LongRangeSettings(**{**base, **changes})


def read(out):
    with open(os.path.join(out, LR.RESULTS)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "out"
    LR.run_long_range(settings(corpus, out))
    return out


def test_both_probes_are_written_with_the_model_and_evaluator_by_content(finished):
    record = read(finished)
    assert record["status"] == "complete" and record["model"]["step"] == 3 and record["train_len"] == 16
    assert [r["distance"] for r in record["repeated_span"]["rows"]] == [8, 32]
    for row in record["repeated_span"]["rows"]:
        assert row["samples"] == 4 and len(row["per_sample"]["copy"]) == 4 and row["sequence"] == row["distance"] + 4
        assert row["drop"]["loss"] == pytest.approx(
            np.mean(np.subtract(row["per_sample"]["nocopy"], row["per_sample"]["copy"]))
        )
    evaluator = record["key_tokens"]["evaluator"]
    assert evaluator["identity"] == record["model"] and (evaluator["short"], evaluator["stride"]) == (16, 4)
    (row,) = record["key_tokens"]["rows"]
    assert (row["length"], row["windows"], row["tokens"], row["candidates"]) == (32, 8, 256, 8 * 16)
    assert row["ppl"] > 1 and len(row["selection"]) == 16
    assert os.path.exists(row["evaluator_losses"]) and os.path.dirname(os.path.abspath(row["evaluator_losses"])) == str(
        finished
    )
    text = open(os.path.join(finished, LR.REPORT)).read()
    assert "## Repeated span" in text and "## Key-token perplexity (LongPPL)" in text and row["selection"] in text


def test_the_key_tokens_are_the_evaluators_losses_thresholded(finished, corpus):
    """The row's numbers from the cached evaluator losses and the model's own losses, by hand."""
    from rope_lm.eval.evaluation import token_losses
    from rope_lm.runs.trained import open_model

    row = read(finished)["key_tokens"]["rows"][0]
    with np.load(row["evaluator_losses"]) as f:
        long, short = torch.from_numpy(f["long"]), torch.from_numpy(f["short"])
    trained = open_model(FIXTURE, "cpu")
    tokens, _ = LR._split_tokens(trained, "test", dict(corpus))
    x, y = K.windows(tokens, 32, 8)
    assert K.text_digest(x, y) == row["text"]
    key = (torch.arange(32) >= 16) & (short - long > 2.0) & (-long > -2.0)
    assert row["key_tokens"] == int(key.sum()) and row["selection"] == K.selection_id(row["text"], key)
    losses = token_losses(trained.model, x, y, 512).double()
    assert row["ppl"] == pytest.approx(float(torch.exp(losses.mean())), rel=1e-6)
    assert torch.allclose(long, losses.float(), atol=1e-5)  # the evaluator is this model: its long losses are these


def test_continue_keeps_what_was_scored_and_adds_only_what_is_new(finished, corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = read(out)
    scored = []
    real = RS.score_distance
    monkeypatch.setattr(RS, "score_distance", lambda *a, **k: scored.append(a[5]) or real(*a, **k))
    more = settings(
        corpus, out, existing="continue", key_tokens={"evaluator": FIXTURE, "lengths": [32, 64], "token_budget": 256}
    )
    after = LR.run_long_range(more)
    assert scored == []  # both distances kept
    assert after["repeated_span"]["rows"] == before["repeated_span"]["rows"]
    assert after["key_tokens"]["rows"][0] == before["key_tokens"]["rows"][0]
    assert [r["length"] for r in after["key_tokens"]["rows"]] == [32, 64] and after["status"] == "complete"


def test_a_stop_says_what_it_kept_and_the_same_command_finishes(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real, calls = RS.score_distance, []

    def stop_at_the_second(*a, **k):
        calls.append(a[5])
        if len(calls) == 2:
            raise Terminated
        return real(*a, **k)

    monkeypatch.setattr(RS, "score_distance", stop_at_the_second)
    argv = [f"ckpt={FIXTURE}", "repeated_span.span=4", f"out={out}"]
    with pytest.raises(Interrupted) as stopped:
        LR.run_long_range(settings(corpus, out), argv)
    message = " ".join(str(stopped.value).split())
    assert stopped.value.exit_status == 143
    assert "1 of 2 repeated-span distances and 0 of 1 key-token lengths are kept in" in message
    assert (
        f"python scripts/long_range_probes.py ckpt={FIXTURE} repeated_span.span=4 out={out} existing=continue"
        in message
    )
    assert read(out)["status"] == "running" and [r["distance"] for r in read(out)["repeated_span"]["rows"]] == [8]
    first = read(out)["repeated_span"]["rows"][0]
    calls.clear()
    monkeypatch.setattr(RS, "score_distance", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    done = LR.run_long_range(settings(corpus, out, existing="continue"))
    assert calls == [32] and done["repeated_span"]["rows"][0] == first and done["status"] == "complete"


STOP_AT_THE_SECOND_DISTANCE = """
import os, runpy, signal, sys
from rope_lm.probes import repeated_span
original, calls = repeated_span.score_distance, []
def stopped(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return original(*args, **kwargs)
repeated_span.score_distance = stopped
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_sigterm_through_the_command_line_is_one_paragraph_and_its_command_finishes(corpus, tmp_path):
    stopper = tmp_path / "stop_at_the_second_distance.py"
    stopper.write_text(STOP_AT_THE_SECOND_DISTANCE)
    out = tmp_path / "out"
    args = [
        f"ckpt={FIXTURE}",
        "probes=[repeated_span]",
        "repeated_span.span=4",
        "repeated_span.distances=[8,16,32]",
        "repeated_span.samples=3",
        f"+data.path={corpus['path']}",
        f"+data.cache_dir={corpus['cache_dir']}",
        "bootstrap=20",
        "device=cpu",
        f"out={out}",
    ]
    script = os.path.join(ROOT, "scripts", "long_range_probes.py")
    done = forked.run(
        [sys.executable, str(stopper), script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    text = done.stdout + done.stderr
    assert done.returncode == 143 and "Traceback" not in text, text
    paragraph = " ".join(text.strip().split("\n\n")[-1].split())
    assert paragraph.startswith("rope-lm: run stopped: Stopped by a signal: 1 of 3 repeated-span distances"), text
    command = shlex.split(paragraph.split("Finish the run with: ", 1)[1])
    assert command[:2] == ["python", "scripts/long_range_probes.py"] and command[-1] == "existing=continue"
    finish = forked.run([sys.executable, script, *command[2:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr[-3000:]
    assert "distance 8: kept from the earlier run" in finish.stderr
    assert read(out)["status"] == "complete" and [r["distance"] for r in read(out)["repeated_span"]["rows"]] == [
        8,
        16,
        32,
    ]


def test_a_stop_after_the_evaluator_keeps_its_losses_and_the_continue_reads_them(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    only_keys = dict(probes=["key_tokens"])

    def stop(*a, **k):
        raise Terminated

    monkeypatch.setattr(LR, "token_losses", stop)  # the model under test's pass, after the evaluator's
    with pytest.raises(Interrupted) as stopped:
        LR.run_long_range(settings(corpus, out, **only_keys))
    message = " ".join(str(stopped.value).split())
    (kept,) = [n for n in os.listdir(out) if n.endswith(".npz")]
    assert f"no distance or length was finished. The key-token evaluator's losses are kept in {out / kept}" in message
    assert "existing=continue" in message and not (out / LR.RESULTS).exists()
    with pytest.raises(ConfigError, match=f"holds the results of an earlier long-range run \\({kept}\\)"):
        LR.run_long_range(settings(corpus, out, **only_keys))
    monkeypatch.undo()
    monkeypatch.setattr(K, "evaluator_losses", lambda *a, **k: pytest.fail("the kept losses were computed again"))
    done = LR.run_long_range(settings(corpus, out, existing="continue", **only_keys))
    assert done["status"] == "complete" and done["key_tokens"]["rows"][0]["evaluator_losses"].endswith(kept)


def test_a_full_disk_part_way_names_what_is_kept_and_how_to_finish(corpus, tmp_path, monkeypatch):
    import errno

    from rope_lm.core.errors import OutputError, write_failure

    out, real, writes = tmp_path / "out", LR.write_json, []

    def full_at_the_second(path, obj):
        writes.append(path)
        if len(writes) == 2:
            raise write_failure(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return real(path, obj)

    monkeypatch.setattr(LR, "write_json", full_at_the_second)
    with pytest.raises(OutputError) as failed:
        LR.run_long_range(settings(corpus, out, probes=["repeated_span"]), [f"ckpt={FIXTURE}"])
    message = " ".join(str(failed.value).split())
    assert "the disk is full" in message and f"The results scored so far are kept in {out / LR.RESULTS}" in message
    assert (
        f"finish the run from them: python scripts/long_range_probes.py ckpt={FIXTURE} out={out} existing=continue"
        in message
    )
    assert [r["distance"] for r in read(out)["repeated_span"]["rows"]] == [8]


def test_a_continue_with_another_model_or_other_settings_is_refused_naming_both(finished, corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for key in saved["state_dict"]:
        if key.endswith("blocks.0.attn.qkv.weight"):
            saved["state_dict"][key] = saved["state_dict"][key] + 1.0
    torch.save(saved, run / "checkpoints" / "last.ckpt")
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    weights = read(out)["model"]["weights"]
    with pytest.raises(ConfigError, match=f"weights {weights} at step 3 .* where ckpt={run} has weights"):
        LR.run_long_range(settings(corpus, out, ckpt=str(run), existing="continue"))
    other_evaluator = {"evaluator": str(run), "lengths": [32], "token_budget": 256}
    with pytest.raises(ConfigError, match=f"where key_tokens.evaluator={run} has weights"):
        LR.run_long_range(settings(corpus, out, key_tokens=other_evaluator, existing="continue"))
    with pytest.raises(
        ConfigError, match=r"repeated_span results scored with other settings \(span: 4 before, 8 now\)"
    ):
        LR.run_long_range(
            settings(corpus, out, repeated_span={"span": 8, "distances": [8], "samples": 4}, existing="continue")
        )
    with pytest.raises(ConfigError, match=r"seed: 0 before, 1 now"):
        LR.run_long_range(settings(corpus, out, seed=1, existing="continue"))
    record = read(out)
    record["text"]["digest"] = "0" * 16  # as if the corpus had changed under the same data.path
    with open(out / LR.RESULTS, "w") as f:
        json.dump(record, f)
    with pytest.raises(ConfigError, match="holds results scored on other text: the test split had"):
        LR.run_long_range(settings(corpus, out, existing="continue"))
    shutil.copy(finished / LR.RESULTS, out / LR.RESULTS)
    # The same checkpoint by another path continues.
    copy = tmp_path / "copied"
    shutil.copytree(FIXTURE, copy)
    same = settings(corpus, out, ckpt=str(copy / "checkpoints" / "last.ckpt"), existing="continue")
    assert LR.run_long_range(same)["status"] == "complete"


def _kept(finished, where):
    """The evaluator's kept losses from the finished run, alone in a folder of their own."""
    where.mkdir()
    for name in os.listdir(finished):
        if name.startswith("key_tokens-"):
            shutil.copy(finished / name, where / name)
    return where


def test_the_evaluators_kept_losses_stand_in_for_it(finished, corpus, tmp_path, monkeypatch):
    kept = _kept(finished, tmp_path / "kept")
    monkeypatch.setattr(K, "evaluator_losses", lambda *a, **k: pytest.fail("the evaluator's losses were computed"))
    real_open = LR.open_model

    def open_model(source, device, scaling, setting="ckpt"):
        assert setting == "ckpt", "the evaluator was opened"
        return real_open(source, device, scaling)

    monkeypatch.setattr(LR, "open_model", open_model)
    # Neither lengths nor K and S given: the files' 8 windows of 32 with K = 16, S = 4, not the evaluator's multiples.
    record = LR.run_long_range(
        settings(
            corpus,
            tmp_path / "out",
            probes=["key_tokens"],
            key_tokens={"evaluator_losses": str(kept), "token_budget": 256},
        )
    )
    before, after = read(finished)["key_tokens"], record["key_tokens"]
    assert (
        after["evaluator"]["source"] == str(kept) and after["evaluator"]["identity"] == before["evaluator"]["identity"]
    )
    assert (after["evaluator"]["short"], after["evaluator"]["stride"], after["evaluator"]["train_len"]) == (16, 4, 16)
    (b,), (a,) = before["rows"], after["rows"]
    for name in ("length", "selection", "key_tokens", "ppl", "key_ppl", "key_ppl_lo", "evaluator_key_ppl"):
        assert a[name] == b[name], name
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith(".npz")]  # read from kept/, nothing new written


def _rewrite(path, **changes):
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    for name, value in changes.items():
        if value is None:
            arrays.pop(name)
        else:
            arrays[name] = np.array(json.dumps({**json.loads(str(arrays[name])), **value}))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "change,files,message",
    [
        (dict(lengths=[64]), None, r"holds no losses for \d+ windows of 64 tokens .* it holds 8 windows of 32 tokens "),
        (dict(short=8), None, r"with K = 8 and S = 2; it holds 8 windows of 32 tokens with K = 16, S = 4"),
        (dict(evaluator=FIXTURE), None, "are both given: the key tokens are chosen by one evaluator"),
        (dict(cache="x"), None, "have nothing to act on"),
        ({}, dict(about={"tokenizer": "0123456789abcdef"}), "carry different tokenizers"),
        ({}, dict(about=None), "was written before kept losses named their evaluator"),
        ({}, "empty", r"holds no key_tokens-\*.npz file"),
    ],
)
def test_kept_losses_that_cannot_stand_in_are_refused_before_any_model_reads_a_token(
    finished, corpus, tmp_path, monkeypatch, change, files, message
):
    kept = _kept(finished, tmp_path / "kept")
    if files == "empty":
        for name in os.listdir(kept):
            os.remove(kept / name)
    elif files:
        (name,) = os.listdir(kept)
        _rewrite(kept / name, **files)
    monkeypatch.setattr(LR, "token_losses", lambda *a, **k: pytest.fail("a model read a token"))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=message):
        LR.run_long_range(
            settings(corpus, out, probes=["key_tokens"], key_tokens={"evaluator_losses": str(kept), **change})
        )
    assert not out.exists()


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(key_tokens={}), "key_tokens.evaluator= is required for the key_tokens probe"),
        (dict(probes=["passkey"]), r"probes=\['passkey'\]: give one or both of repeated_span, key_tokens"),
        (dict(existing="continue", out=None), "existing=continue goes on in the out= folder"),
        (dict(repeated_span={"samples": 0}), "repeated_span.samples=0 must be at least 1"),
        (dict(repeated_span={"multipliers": [1, -2]}), r"repeated_span.multipliers=\[1, -2\]: -2 is not a positive"),
        (dict(repeated_span={"spam": 3}), r"Unknown repeated_span setting\(s\) repeated_span.spam"),
        (dict(key_tokens={"evaluator": "x", "stride": 0}), "the stride S between 1 and K"),
        (dict(key_tokens={"evaluator": "x", "evaluator_scaling": {"name": "yarn", "factr": 2}}), "factr"),
        (dict(data={"pathh": "x"}), r"Unknown data setting\(s\) data.pathh"),
        (dict(bootstrap=-1), "bootstrap=-1 must be a whole number"),
        (dict(repeated_span={"span": 16, "distances": [8, 32]}), r"the distance 8 is shorter than the span"),
        (
            dict(key_tokens={"evaluator": FIXTURE, "lengths": [16]}),
            "the length 16 is not longer than the short context",
        ),
        (dict(ckpt=os.path.join(ROOT, "no-such-run")), "no-such-run"),
    ],
)
def test_bad_settings_are_one_paragraph_before_any_work(corpus, tmp_path, monkeypatch, change, message):
    monkeypatch.setattr(
        LR, "_split_tokens", lambda *a: pytest.fail("the text was read before the settings were checked")
    )
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=message):
        LR.run_long_range(settings(corpus, out, **change))
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, corpus):
    """A random Llama with its own byte-level BPE tokenizer.json, as save_pretrained writes it."""
    transformers = pytest.importorskip("transformers")
    from rope_lm.data.corpus import SourceConfig, load_documents
    from rope_lm.data.token_cache import train_tokenizer

    docs = load_documents(SourceConfig(source="files", path=corpus["path"]))
    tok = train_tokenizer(docs["train"], 300, 200_000)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("llama") / "tiny-llama"
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    return str(directory)


def test_an_evaluator_with_another_tokenizer_is_refused(corpus, tiny_llama, tmp_path):
    other = {"evaluator": f"hf:{tiny_llama}", "lengths": [32]}
    with pytest.raises(ConfigError, match="carry different tokenizers, so the evaluator cannot read the tokens"):
        LR.run_long_range(settings(corpus, tmp_path / "out", key_tokens=other))
    assert not (tmp_path / "out").exists()


def test_the_command_line_scores_an_imported_model(corpus, tiny_llama, tmp_path):
    out = tmp_path / "out"
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "long_range_probes.py"),
            f"ckpt=hf:{tiny_llama}",
            f"key_tokens.evaluator=hf:{tiny_llama}",
            "key_tokens.multipliers=[2]",
            "key_tokens.token_budget=128",
            "repeated_span.span=4",
            "repeated_span.multipliers=[0.5,2]",
            "repeated_span.samples=3",
            "scaling=yarn",
            "scaling.factor=2.0",
            f"+data.path={corpus['path']}",
            f"+data.cache_dir={tmp_path / 'cache'}",
            "bootstrap=20",
            "device=cpu",
            f"out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = read(out)
    assert record["checkpoint"] == f"hf:{tiny_llama}" and record["method"].startswith("yarn")
    assert [r["distance"] for r in record["repeated_span"]["rows"]] == [8, 32]
    assert record["key_tokens"]["evaluator"]["identity"]["weights"] == record["model"]["weights"]
    assert record["key_tokens"]["rows"][0]["length"] == 32 and "| distance |" in done.stdout
    # The evaluator shares the weights but runs without the model's YaRN: the warning says so, not "the same model".
    said = " ".join((done.stdout + done.stderr).split())
    assert "has the weights of the model under test (under method none where the model under test runs yarn" in said
