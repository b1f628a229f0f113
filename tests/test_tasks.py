"""Synthetic length-generalization tasks: generators are deterministic and
their answers right (each checked by an independent computation from the
prompt), the loss mask and exact-match score on hand-made predictions, the
buckets and intervals, refusals before any work, and scripts/task.py end to
end (one run, and a two-job sweep with its closing table and compare.py)."""

import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.probes import task_run as T
from rope_lm.tasks.synthetic import SPECIALS, SYNTHETIC_TASKS, build_task
from tests import forked
from tests.conftest import ROOT


def instances(name, size, n=200, seed=0, **knobs):
    task = build_task({"name": name, **knobs})
    rng = random.Random(seed)
    return task, [task.instance(rng, size) for _ in range(n)]


def test_every_registered_task_is_covered_here():
    """The contract tests below run on every registered task; this list is the one deliberate edit a new task
    needs: add it here together with an independent check of its answers (as addition, scan, ... have)."""
    assert set(SYNTHETIC_TASKS.names()) == {
        *("copy", "reverse", "sort", "addition", "parity", "summation", "scan"),
        *("counting", "selective_copy", "flip_flop"),  # independent checks: tests/test_cope_tasks.py
    }


def test_both_task_registries_load_every_module_without_torch():
    """tests/test_architecture.py follows static imports; the registries import
    their modules at run time, so a fresh interpreter loads every synthetic and
    retrieval task and must still hold no torch (a cache build stays light)."""
    code = (
        "import sys\n"
        "from rope_lm.tasks.synthetic import SYNTHETIC_TASKS\n"
        "from rope_lm.tasks.retrieval import RETRIEVAL_TASKS, task_names\n"
        "assert SYNTHETIC_TASKS.names() and task_names() and RETRIEVAL_TASKS is not SYNTHETIC_TASKS\n"
        "loaded = [m for m in sys.modules if m.startswith('rope_lm.tasks.')]\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'pytorch_lightning')]\n"
        "print(len(loaded), heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    count, heavy = done.stdout.split(" ", 1)
    assert int(count) >= 15 and heavy.strip() == "[]", done.stdout


@pytest.mark.parametrize("name", SYNTHETIC_TASKS.names())
def test_sets_are_deterministic_in_the_seed(name):
    task = build_task({"name": name})
    sizes = T.Sizes(train_min=1, train_max=4)
    a, b = T.training_set(task, sizes, 50, seed=3), T.training_set(task, sizes, 50, seed=3)
    assert a == b
    assert T.training_set(task, sizes, 50, seed=4) != a
    t1, _ = T.test_set(task, 6, 20, 3, seen=set())
    t2, _ = T.test_set(task, 6, 20, 3, seen=set())
    assert t1 == t2 and t1 != T.test_set(task, 6, 20, 4, seen=set())[0]


@pytest.mark.parametrize("size", [1, 5, 17])
def test_sequence_tasks(size):
    for name, expect in (
        ("copy", lambda x: x),
        ("reverse", lambda x: x[::-1]),
        ("sort", lambda x: [str(v) for v in sorted(int(c) for c in x)]),
    ):
        _, items = instances(name, size)
        for prompt, answer in items:
            assert len(prompt) == size and answer == expect(prompt)


def test_sort_with_letters_is_alphabetical():
    _, items = instances("sort", 9, alphabet=20)
    for prompt, answer in items:
        assert answer == sorted(prompt) and set(prompt) <= set("abcdefghijklmnopqrst")


@pytest.mark.parametrize("rev", [True, False])
@pytest.mark.parametrize("size", [1, 3, 12])
def test_addition_matches_integer_arithmetic(rev, size):
    _, items = instances("addition", size, reversed=rev)
    for prompt, answer in items:
        text = "".join(prompt)
        a, b = text.split("+")
        assert len(a) == len(b) == size
        if rev:
            a, b, got = a[::-1], b[::-1], "".join(answer)[::-1]
        else:
            got = "".join(answer)
        assert (size == 1 or a[0] != "0") and int(got) == int(a) + int(b) and not (len(got) > 1 and got[0] == "0")


@pytest.mark.parametrize("name,m", [("parity", 2), ("summation", 10)])
def test_modular_sum(name, m):
    _, items = instances(name, 13)
    for prompt, answer in items:
        assert set(prompt) <= set("0123456789"[:m]) and answer == [str(sum(map(int, prompt)) % m)]


def scan_reference(words: list[str]) -> list[str]:
    """An interpreter written apart from the generator: split on the last
    connective (the grammar is left-associative), a table for directions."""
    for i in range(len(words) - 1, -1, -1):
        if words[i] in ("and", "after"):
            left, right = scan_reference(words[:i]), scan_reference(words[i + 1 :])
            return left + right if words[i] == "and" else right + left
    times = {"twice": 2, "thrice": 3}.get(words[-1], 1)
    core = words[:-1] if times > 1 else words
    act = [] if core[0] == "turn" else [core[0].upper()]
    rest = " ".join(core[1:])
    table = {"": act}
    for side, t in (("left", "LTURN"), ("right", "RTURN")):
        table[side] = [t] + act
        table["opposite " + side] = [t, t] + act
        table["around " + side] = ([t] + act) * 4
    return table[rest] * times


def test_scan_reference_on_hand_examples():
    assert scan_reference("jump left".split()) == ["LTURN", "JUMP"]
    assert scan_reference("run twice after walk opposite right".split()) == ["RTURN", "RTURN", "WALK", "RUN", "RUN"]
    assert scan_reference("turn around left".split()) == ["LTURN"] * 4
    assert scan_reference("look and jump after walk".split()) == ["WALK", "LOOK", "JUMP"]


@pytest.mark.parametrize("around", [False, True])
@pytest.mark.parametrize("size", [1, 2, 6])
def test_scan_matches_an_independent_interpreter(around, size):
    task, items = instances("scan", size, n=300, around=around)
    for prompt, answer in items:
        assert sum(w in ("and", "after") for w in prompt) == size - 1
        assert answer == scan_reference(prompt)
        assert len(task.sequence(prompt, answer)) <= task.max_tokens(size)
        assert around or "around" not in prompt


@pytest.mark.parametrize("name", SYNTHETIC_TASKS.names())
def test_max_tokens_bounds_every_instance_and_the_vocabulary_covers_it(name):
    task = build_task({"name": name})
    vocab = task.vocabulary()
    assert vocab.symbols[: len(SPECIALS)] == list(SPECIALS)
    for size in (1, 4, 9):
        for prompt, answer in instances(name, size, n=100)[1]:
            seq = task.sequence(prompt, answer)
            assert len(seq) <= task.max_tokens(size)
            assert vocab.decode(vocab.encode(seq)) == seq


# --- loss mask and scoring -----------------------------------------------------------


def test_loss_mask_covers_answer_and_eos_only():
    task = build_task({"name": "copy"})
    vocab = task.vocabulary()
    batch = [(["1", "2"], ["1", "2"]), (["3", "4", "5"], ["3", "4", "5"])]
    x, y = T.encode_batch(task, vocab, batch)
    # <bos> 1 2 <sep> 1 2 <eos>: inputs drop the last token, targets are answer + <eos> at the predicting positions.
    assert vocab.decode(x[0, :6].tolist()) == ["<bos>", "1", "2", "<sep>", "1", "2"]
    assert x[0, 6:].tolist() == [vocab.pad] * (x.shape[1] - 6)
    assert y[0].tolist() == [-100, -100, -100] + vocab.encode(["1", "2", "<eos>"]) + [-100] * (y.shape[1] - 6)
    assert (y[1] != -100).sum() == 4


def one_hot(ids, vocab_size):
    logits = torch.zeros(*ids.shape, vocab_size)
    logits.scatter_(-1, ids.clamp(min=0).unsqueeze(-1), 1.0)
    return logits


def test_exact_match_on_hand_made_predictions():
    task = build_task({"name": "reverse"})
    vocab = task.vocabulary()
    batch = [(["1", "2", "3"], ["3", "2", "1"]), (["4", "5"], ["5", "4"]), (["6"], ["6"])]
    x, y = T.encode_batch(task, vocab, batch)
    pred = y.clone()
    pred[1, 5] = vocab.index["9"]  # second instance: <eos> predicted as 9 (a wrong stop is a wrong answer)
    pred[2, 2] = vocab.index["7"]  # third: its only answer token wrong
    pred[pred == -100] = vocab.index["0"]  # whatever the model says outside the answer does not count
    ok, tok = T.exact_match(one_hot(pred, len(vocab)), y)
    assert ok.tolist() == [True, False, False]
    assert tok.tolist() == pytest.approx([1.0, 2 / 3, 1 / 2])


def test_buckets_and_scores_on_hand_made_outcomes():
    sizes = T.Sizes(train_min=1, train_max=5, test_factor=2, bucket=2)
    assert T.buckets(sizes) == [(1, 2), (3, 4), (5, 5), (6, 7), (8, 9), (10, 10)]
    task = build_task({"name": "copy"})
    tests = {s: [(["1"] * s, ["1"] * s)] * 4 for s in range(1, 11)}
    outcome = {s: [s <= 5] * 4 for s in tests}
    outcome[5] = [True, True, False, False]
    scored = {
        s: {"correct": outcome[s], "token_accuracy": [float(c) for c in outcome[s]], "predictions": [["1"]] * 4}
        for s in tests
    }
    result = T.score(sizes, task, tests, scored, resamples=200, seed=0, n_examples=1)
    acc = {b["label"]: b["accuracy"] for b in result["buckets"]}
    assert acc == {"1-2": 1.0, "3-4": 1.0, "5": 0.5, "6-7": 0.0, "8-9": 0.0, "10": 0.0}
    assert [b["inside"] for b in result["buckets"]] == [True] * 3 + [False] * 3
    assert result["inside"]["accuracy"] == pytest.approx(18 / 20) and result["beyond"]["accuracy"] == 0.0
    assert result["inside"]["accuracy_lo"] < 0.9 < result["inside"]["accuracy_hi"] <= 1.0
    five = next(b for b in result["buckets"] if b["label"] == "5")
    assert len(five["failed_examples"]) == 1 and five["accuracy_lo"] < 0.5 < five["accuracy_hi"]


# --- settings ----------------------------------------------------------------------


def settings(**over):
    cfg = {
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "attention": "sdpa"},
        "pos": {"name": "nope"},
        "task": {"name": "copy"},
        "sizes": {"train_max": 4, "test_factor": 2, "bucket": 2},
        "train": {"steps": 3, "batch_size": 4, "examples": 50, "log_every": 1},
        "eval": {"samples": 3, "bootstrap": 50},
        "optim": {"warmup_steps": 1},
        "seed": 0,
    }
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    return cfg


@pytest.mark.parametrize(
    "over,message",
    [
        ({"task": {"name": "bogus"}}, "Unknown task 'bogus'"),
        ({"task": {"name": "addition", "reversed": "yes"}}, "task.reversed='yes' has the wrong type"),
        ({"sizes": {"train_max": 0}}, "sizes.train_min=1 and sizes.train_max=0"),
        ({"sizes": {"test_factor": 0.5}}, "sizes.test_factor=0.5"),
        ({"pos": {"name": "learned", "max_positions": 12}}, "learned"),
        ({"bogus": 1}, "Unknown setting(s) bogus"),
        ({"threads": 0}, "threads=0"),
    ],
)
def test_bad_settings_are_refused_before_any_work(over, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        T.resolve_task_run(settings(**over))


def test_learned_positions_serve_the_longest_test_when_the_table_covers_it():
    run = T.resolve_task_run(settings(pos={"name": "learned", "max_positions": 64}))
    assert run.pos["max_positions"] == 64


def test_run_task_in_process(tmp_path):
    run = T.resolve_task_run(settings(task={"name": "addition"}))
    result = T.run_task(run, str(tmp_path))
    assert [b["label"] for b in result["buckets"]] == ["1-2", "3-4", "5-6", "7-8"]
    assert all(b["n"] == 6 for b in result["buckets"]) and result["train"]["steps"] == 3
    again = T.run_task(T.resolve_task_run(settings(task={"name": "addition"})), str(tmp_path / "again"))
    assert [b["accuracy"] for b in again["buckets"]] == [b["accuracy"] for b in result["buckets"]]
    assert again["train"]["final_loss"] == pytest.approx(result["train"]["final_loss"])


# --- the command line ----------------------------------------------------------------

SMALL = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "train.steps=4",
    "train.batch_size=4",
    "train.examples=40",
    "sizes.train_max=3",
    "sizes.bucket=3",
    "eval.samples=4",
    "eval.bootstrap=50",
    "optim.warmup_steps=1",
]


def task_script(*args, cwd, status=0):
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "task.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == status, done.stderr[-3000:]
    return done


def test_task_script_one_run(tmp_path):
    out = tmp_path / "run"
    done = task_script("task=reverse", "pos=alibi", "logger=csv", *SMALL, f"hydra.run.dir={out}", cwd=tmp_path)
    result = json.load(open(out / T.TASK_JSON))
    assert result["task"] == "reverse" and result["scheme"] == "alibi" and result["test_max"] == 9
    assert [b["label"] for b in result["buckets"]] == ["1-3", "4-6", "7-9"]
    for name in (T.TASK_MD, T.TASK_PNG, T.MODEL_FILE):
        assert (out / name).stat().st_size > 0
    assert "| 4-6 | beyond |" in done.stdout
    (metrics,) = list(out.glob("csv/version_*/metrics.csv"))  # through the run's logger
    header = open(metrics).readline()
    assert "train/loss" in header and "task/accuracy_beyond" in header and "task/accuracy@4-6" in header


def test_task_script_refuses_a_bad_task_in_one_paragraph(tmp_path):
    done = task_script("task.name=bogus", cwd=tmp_path, status=2)
    err = " ".join(done.stderr.split())
    assert "Unknown task 'bogus'" in err and "copy" in err and "Traceback" not in done.stderr


def test_sweep_prints_the_table_and_compare_reads_it(tmp_path):
    done = task_script("-m", "task=copy,parity", "pos=nope,rope", *SMALL, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert "| task (train sizes → tested) | nope | rope |" in done.stdout
    assert re.search(r"\| copy \(1-3 → 9\) \| \d+% .* / \d+% ", done.stdout)
    assert (tmp_path / "sweep" / "tasks.md").exists()
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmp = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), "path=sweep"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    assert "## parity" in cmp.stdout and "| rope |" in cmp.stdout
    rows = open(tmp_path / "sweep" / "compare" / "compare_tasks.csv").read().splitlines()
    assert len(rows) == 1 + 4 * 3  # header + 4 runs x 3 buckets
    assert (tmp_path / "sweep" / "compare" / "accuracy_vs_length_copy.png").exists()


def test_a_folder_another_process_is_running_is_skipped_or_refused(tmp_path):
    from filelock import FileLock

    out = tmp_path / "run"
    out.mkdir()
    args = ["task=copy", "pos=nope", *SMALL, f"hydra.run.dir={out}"]
    with FileLock(str(out / ".run.lock")):  # another process's run in progress there
        skipped = task_script(*args, "existing=continue", cwd=tmp_path)
        assert "another process is running it; skipped" in skipped.stdout
        refused = task_script(*args, cwd=tmp_path, status=2)
        assert "Another rope-lm process is running a task in" in " ".join(refused.stderr.split())
    assert not (out / T.TASK_JSON).exists()  # neither trained there
    task_script(*args, "existing=continue", cwd=tmp_path)  # once it is free, the run is done
    assert (out / T.TASK_JSON).exists()


def test_a_task_run_again_is_refused_or_skipped(tmp_path):
    out = tmp_path / "run"
    args = ["task=copy", "pos=nope", *SMALL, f"hydra.run.dir={out}"]
    task_script(*args, cwd=tmp_path)
    first = (out / T.TASK_JSON).read_bytes()
    refused = task_script(*args, cwd=tmp_path, status=2)
    assert "already holds a task run's results" in " ".join(refused.stderr.split())
    skipped = task_script(*args, "existing=continue", cwd=tmp_path)
    assert "results are complete; skipped" in skipped.stdout
    assert (out / T.TASK_JSON).read_bytes() == first
    elsewhere = task_script(*args, "existing=continue", "threads=2", "train.log_every=1", cwd=tmp_path)
    assert "results are complete; skipped" in elsewhere.stdout  # bookkeeping only: the same experiment
    other = task_script(
        "task=copy",
        "pos=nope",
        *SMALL,
        "train.steps=5",
        f"hydra.run.dir={out}",
        "existing=continue",
        cwd=tmp_path,
        status=2,
    )
    assert "holds a task run with other settings" in " ".join(other.stderr.split())
