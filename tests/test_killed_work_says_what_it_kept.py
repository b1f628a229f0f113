"""Long work stopped by SIGTERM (or Ctrl-C) says what it kept on disk and the
command that finishes it, in one paragraph, with the shell's exit status for
the signal (143, 130) and no traceback: a task run (scripts/task.py), a
search (scripts/search.py, which existing=continue goes on with, only for the
same model by content and the same settings), lm-evaluation-harness
(scripts/lm_eval_harness.py, which keeps nothing but its caches), a
comparison (scripts/compare.py) and an export (scripts/export_hf.py), which
leave what was there before as it was."""

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rope_lm.eval import search as S
from rope_lm.eval.longrope_search import Evolution, evolve
from tests.conftest import ROOT, write_corpus
from tests.test_compare import write_run

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")  # RoPE, trained at 16 tokens, vocab 300
ENV = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def flat(text: str) -> str:
    return " ".join(text.split())


def one_paragraph(text: str, status: int, returncode: int) -> str:
    """The stop's paragraph, checked: the status, no traceback, the paragraph last."""
    assert returncode == status, text
    assert "Traceback" not in text, text
    paragraph = text.strip().split("\n\n")[-1]
    assert paragraph.startswith("rope-lm: run stopped: Stopped by a signal"), text
    return flat(paragraph)


def stop_when(args: list[str], ready, log_path, timeout: float = 240) -> tuple[int, str]:
    """Start a script, send SIGTERM once ready() holds (its first file is written, or a line is logged),
    and return (exit status, output)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.05)
        assert proc.poll() is None, open(log_path).read()[-3000:]
        assert ready(), "the work did not start in time"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    with open(log_path) as f:
        return proc.returncode, f.read()


def run(args: list[str], timeout: float = 300) -> tuple[int, str]:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=ENV, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def finishing(text: str, marker: str, script: str) -> list[str]:
    """The command a stop's message gives, as arguments after the script."""
    command = shlex.split(text.split(marker, 1)[1])
    assert command[:2] == ["python", f"scripts/{script}"], command
    return [os.path.join("scripts", script), *command[2:]]


# --- scripts/task.py ----------------------------------------------------------------

TINY_TASK = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=16",
    "train.steps=300",
    "train.examples=200",
    "train.log_every=100",
    "sizes.train_max=4",
    "eval.samples=8",
    "eval.bootstrap=0",
]


def test_task_run(tmp_path):
    out = tmp_path / "task"
    rc, text = stop_when(
        [os.path.join("scripts", "task.py"), f"hydra.run.dir={out}", *TINY_TASK],
        lambda: (out / "run.yaml").exists(),
        tmp_path / "log",
    )
    said = one_paragraph(text, 143, rc)
    assert "nothing of the task run's results was written" in said and "model.pt" in said, said
    assert f"{out} holds only the record of its settings (run.yaml)" in said
    assert not (out / "task_results.json").exists() and not (out / "model.pt").exists()
    args = finishing(said, "finish it with: ", "task.py")
    assert "existing=continue" in args and f"hydra.run.dir={out}" in args and "train.steps=300" in args
    rc, text = run(args)
    assert rc == 0, text
    with open(out / "task_results.json") as f:
        assert json.load(f)["status"] == "complete"


# --- scripts/search.py ----------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def search_args(ckpt, out, corpus, *extra) -> list[str]:
    return [
        os.path.join("scripts", "search.py"),
        f"ckpt={ckpt}",
        "multiplier=4",
        "val_tokens=128",
        "test_tokens=128",
        "batch_tokens=256",
        "bootstrap=20",
        "device=cpu",
        f"+data.path={corpus}",
        f"+data.cache_dir={os.path.dirname(out)}/cache",
        f"out={out}",
        *extra,
    ]


def trials_of(out) -> list[dict]:
    with open(os.path.join(out, "trials.json")) as f:
        return json.load(f)


def test_search(tmp_path, corpus):
    out = tmp_path / "search"
    rc, text = stop_when(
        search_args(FIXTURE, out, corpus, "method=yarn", "trials=30"),
        lambda: (out / "trials.json").exists(),
        tmp_path / "log",
    )
    said = one_paragraph(text, 143, rc)
    kept = trials_of(out)
    assert 0 < len(kept) < 30
    assert f"{len(kept)} of 30 trials kept in {out / 'trials.json'} (best so far: validation PPL" in said, said
    with open(out / "search.json") as f:
        head = json.load(f)
    assert head["status"] == "searching" and head["model"]["step"] == 3 and head["compared"]["trials"] == 30
    args = finishing(said, "Finish it with: ", "search.py")
    assert args[-2:] == [f"out={out}", "existing=continue"]
    rc, text = run(args)
    assert rc == 0, text
    trials = trials_of(out)
    assert len(trials) == 30 and trials[: len(kept)] == kept  # the kept trials, then the ones left
    assert [t["number"] for t in trials] == list(range(30)) and trials[0]["origin"] == "defaults"
    with open(out / "search.json") as f:
        summary = json.load(f)
    assert summary["status"] == "complete" and summary["trials"] == 30
    assert summary["validation"]["best_ppl"] == min(t["ppl"] for t in trials if t["ppl"] is not None)


def stop_part_way(out, keep: int) -> list[dict]:
    """The folder of a finished search as a stop after `keep` trials leaves it."""
    trials = trials_of(out)
    with open(os.path.join(out, "search.json")) as f:
        summary = json.load(f)
    head = {k: summary[k] for k in ("checkpoint", "model", "method", "target", "train_len", "compared")}
    for name in os.listdir(out):
        if name not in ("tokenizer.json",):
            os.remove(os.path.join(out, name))
    with open(os.path.join(out, "search.json"), "w") as f:
        json.dump({"status": "searching", **head}, f)
    with open(os.path.join(out, "trials.json"), "w") as f:
        json.dump(trials[:keep], f)
    return trials


@pytest.fixture
def stopped_search(tmp_path, corpus):
    out = tmp_path / "search"
    rc, text = run(search_args(FIXTURE, out, corpus, "method=yarn", "trials=3"))
    assert rc == 0, text
    return out, stop_part_way(out, 2)


def test_search_continue_with_the_same_checkpoint_by_another_path(stopped_search, tmp_path, corpus):
    out, trials = stopped_search
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURE, copy)
    rc, text = run(
        search_args(copy / "checkpoints" / "last.ckpt", out, corpus, "method=yarn", "trials=3", "existing=continue")
    )
    assert rc == 0, text
    again = trials_of(out)
    assert len(again) == 3 and again[:2] == trials[:2]


def test_search_continue_of_another_model_is_refused_naming_both(stopped_search, tmp_path, corpus):
    out, _ = stopped_search
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for key in saved["state_dict"]:
        if key.endswith("blocks.0.attn.qkv.weight"):
            saved["state_dict"][key] = saved["state_dict"][key] + 1.0
    torch.save(saved, run_dir / "checkpoints" / "last.ckpt")
    with open(out / "search.json") as f:
        before = json.load(f)["model"]["weights"]
    rc, text = run(search_args(run_dir, out, corpus, "method=yarn", "trials=3", "existing=continue"))
    said = flat(text)
    assert rc == 2 and "holds a search of another model" in said and f"weights {before} at step 3" in said, said
    now = said.split("where this one has weights ")[1].split(" ")[0]
    assert now != before and len(trials_of(out)) == 2


@pytest.mark.parametrize(
    "change,shown", [("val_tokens=256", "val_tokens: 128 before, 256 now"), ("trials=5", "trials: 3 before, 5 now")]
)
def test_search_continue_with_other_settings_is_refused(stopped_search, corpus, change, shown):
    out, _ = stopped_search
    args = [a for a in search_args(FIXTURE, out, corpus, "method=yarn", "trials=3", "existing=continue")]
    key = change.split("=")[0]
    args = [a for a in args if not a.startswith(key + "=")] + [change]
    rc, text = run(args)
    said = flat(text)
    assert rc == 2 and "holds a search with other settings" in said and shown in said, said
    assert len(trials_of(out)) == 2


def test_search_continue_of_longrope_replays_the_evolution_exactly(tmp_path, corpus):
    out = tmp_path / "search"
    small = ["method=longrope", "longrope.population=4", "longrope.generations=1", "longrope.parents=2"]
    rc, text = run(search_args(FIXTURE, out, corpus, *small))
    assert rc == 0, text
    whole = stop_part_way(out, 3)
    rc, text = run(search_args(FIXTURE, out, corpus, *small, "existing=continue"))
    assert rc == 0, text
    assert trials_of(out) == whole  # the same candidates, in the same order, with the same PPLs


def test_search_continue_gives_optuna_the_recorded_trials():
    class Bowl:
        train_len, target, ratio = 16, 128, 8.0

        def __init__(self):
            self.calls = 0

        def __call__(self, options):
            self.calls += 1
            if options.get("window") == 1:
                raise S.ConfigError("refused")
            return 10 + math.log(options["window"] / 5) ** 2 + math.log(options["group"] / 7) ** 2

    first = Bowl()
    kept = json.loads(json.dumps(S.optuna_search("self_extend", first, trials=6, seed=0)))
    later = Bowl()
    history = S.optuna_search("self_extend", later, trials=10, seed=0, done=kept)
    assert later.calls == 4 and history[:6] == kept and [r["number"] for r in history] == list(range(10))
    assert all(r["origin"] == "tpe" for r in history[6:])


def test_search_continue_of_the_evolution_evaluates_no_recorded_candidate():
    goal = 1 + 7 * np.linspace(0, 1, 8) ** 1.5
    calls = []

    def distance(factors):
        calls.append(factors)
        return 1.0 + float(np.sum((np.log(factors) - np.log(goal)) ** 2))

    settings = Evolution(population=8, generations=2, parents=3)
    whole = json.loads(json.dumps(evolve(distance, 16, 10000.0, 32, 256, settings, seed=1)))
    calls.clear()
    reported = []
    again = evolve(distance, 16, 10000.0, 32, 256, settings, seed=1, on_candidate=reported.append, done=whole[:9])
    assert again == whole and len(calls) == len(whole) - 9 and reported == whole[9:]


# --- scripts/lm_eval_harness.py -------------------------------------------------------


def test_lm_eval_harness(tmp_path, corpus):
    texts = [open(os.path.join(corpus, n)).read()[:3000] for n in sorted(os.listdir(corpus))]
    with open(tmp_path / "docs.jsonl", "w") as f:
        f.writelines(json.dumps({"text": texts[i % len(texts)]}) + "\n" for i in range(200))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "ppl.yaml").write_text(
        f"task: rope_lm_stopped_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'docs.jsonl'}\n  cache_dir: {tmp_path / 'hf_cache'}\ntest_split: test\n"
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n"
    )
    log = tmp_path / "log"
    args = [
        "--model",
        "rope-lm",
        "--model_args",
        f"ckpt={FIXTURE},max_length=16",
        "--tasks",
        "rope_lm_stopped_ppl",
        "--include_path",
        str(tmp_path / "tasks"),
        "--batch_size",
        "1",
        "--device",
        "cpu",
        "--output_path",
        str(tmp_path / "out"),
    ]
    rc, text = stop_when(
        [os.path.join("scripts", "lm_eval_harness.py"), *args],
        lambda: "rope-lm loglikelihood_rolling" in log.read_text(),
        log,
    )
    said = one_paragraph(text, 143, rc)
    assert "lm-eval runs its own loop and keeps no partial results" in said and "--use_cache <path>" in said, said
    assert said.split("Run the same command again: ")[1].startswith(
        "python scripts/lm_eval_harness.py " + shlex.join(args)
    )
    assert not (tmp_path / "out").exists()


def test_lm_eval_harness_names_its_caches():
    from lm_eval.caching.cache import PATH

    from rope_lm.probes.lm_eval_model import lm_eval_stopped

    argv = ["--model", "rope-lm", "--tasks", "x", "--use_cache", "/tmp/answers", "--cache_requests"]
    stop = lm_eval_stopped(argv, KeyboardInterrupt())
    said = str(stop)
    assert stop.exit_status == 130 and "response cache /tmp/answers_rank0.db (--use_cache" in said
    assert f"request cache {PATH} (--cache_requests)" in said and "keeps no partial results" not in said
    assert said.endswith("Run the same command again: python scripts/lm_eval_harness.py " + shlex.join(argv))


# --- scripts/compare.py and scripts/export_hf.py: written as a set ------------------------

STOP_IN = """
import os, runpy, signal, sys
module, name, script = sys.argv[1:4]
target = __import__(module, fromlist=[name])
original = getattr(target, name)
def stopped(*args, **kwargs):  # a stop while the set is being written
    os.kill(os.getpid(), signal.SIGTERM)
    return original(*args, **kwargs)
setattr(target, name, stopped)
sys.argv = [script, *sys.argv[4:]]
runpy.run_path(script, run_name="__main__")
"""


def stopped_in(module: str, name: str, script: str, *args) -> tuple[int, str]:
    return run(["-c", STOP_IN, module, name, os.path.join(ROOT, "scripts", script), *args])


def snapshot(folder) -> dict:
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def test_compare(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "a", "rope")
    write_run(runs / "b", "alibi")
    out = tmp_path / "cmp"
    rc, text = run([os.path.join("scripts", "compare.py"), f"path={runs}", f"out={out}"])
    assert rc == 0, text
    before = snapshot(out)
    write_run(runs / "b", "alibi", methods={"none": lambda L: 3.0 * L})  # the next comparison differs
    args = (f"path={runs}", f"out={out}")
    rc, text = stopped_in("rope_lm.compare.ppl", "plot_ppl", "compare.py", *args)  # after compare.md and .csv
    said = one_paragraph(text, 143, rc)
    assert "nothing of this comparison was written" in said and f"{out} is as it was before" in said, said
    assert "Run the same command again." in said
    assert snapshot(out) == before  # the earlier comparison, whole, and no temporary file
    rc, text = run([os.path.join("scripts", "compare.py"), *args])
    assert rc == 0, text
    assert snapshot(out)["compare.md"] != before["compare.md"]


@pytest.fixture
def llama_shaped(tiny_cache, tiny_data_options, tmp_path_factory):
    """A checkpoint transformers can express (the fixture run's GELU MLP it cannot)."""
    from tests.conftest import TINY_MODEL
    from tests.test_diagnostics import save_tiny_checkpoint
    from tests.test_hf import LLAMA_SHAPED

    path = str(tmp_path_factory.mktemp("llama") / "checkpoints" / "last.ckpt")
    return save_tiny_checkpoint(path, tiny_cache, tiny_data_options, model={**TINY_MODEL, **LLAMA_SHAPED})


def test_export_hf(tmp_path, llama_shaped):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    args = (f"ckpt={llama_shaped}", f"out={out}")
    rc, text = stopped_in("rope_lm.hf.export", "_write_weights", "export_hf.py", *args)
    said = one_paragraph(text, 143, rc)
    assert "nothing of this export was written" in said and "Run the same command again." in said, said
    assert os.listdir(out) == ["notes.txt"]
    new = tmp_path / "new"
    rc, text = stopped_in("rope_lm.hf.export", "_write_weights", "export_hf.py", f"ckpt={llama_shaped}", f"out={new}")
    said = one_paragraph(text, 143, rc)
    assert f"{new} was not made" in said and not new.exists() and os.listdir(tmp_path) == ["hf"]
    rc, text = run([os.path.join("scripts", "export_hf.py"), *args])
    assert rc == 0, text
    assert {"config.json", "model.safetensors", "notes.txt"} <= set(os.listdir(out))
