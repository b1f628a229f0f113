"""CoPE's synthetic tasks (rope_lm/tasks/synthetic/counting.py,
selective_copy.py, flip_flop.py): every answer equals one computed from the
prompt alone by an interpreter written apart from the generator, the
generators draw what the papers describe (operation weights, blank counts,
instruction probabilities), instances are a function of the seed, and the
task runner trains on small sizes and scores longer ones under pos=cope."""

import random
import re

import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.probes import task_run as T
from rope_lm.tasks.synthetic import build_task

NEW = ("counting", "selective_copy", "flip_flop")


def draws(name, size, n=300, seed=0, **knobs):
    task = build_task({"name": name, **knobs})
    rng = random.Random(seed)
    return task, [task.instance(rng, size) for _ in range(n)]


def run_program(tokens):
    """The counting program run statement by statement: 'v = 0 ;' resets v,
    'v ++;' adds one, 'pass;' does nothing; then 'print v'. Anything else in
    the program fails here."""
    *body, verb, name = tokens
    assert verb == "print"
    values, n = {}, 0
    while n < len(body):
        if body[n] == "pass;":
            n += 1
        elif body[n + 1 : n + 4] == ["=", "0", ";"]:
            values[body[n]] = 0
            n += 4
        else:
            assert body[n + 1] == "++;", body[n : n + 2]
            values[body[n]] += 1  # a KeyError here: an increment of a variable never set
            n += 2
    return values[name]


@pytest.mark.parametrize("variables", [1, 3, 5])
@pytest.mark.parametrize("size", [1, 4, 30, 120])
def test_counting_answers_are_the_program_run(size, variables):
    task, items = draws("counting", size, n=150, variables=variables)
    for prompt, answer in items:
        statements = sum(t in ("=", "++;", "pass;") for t in prompt)
        assert statements == size and prompt[-2] == "print"
        assert answer == [str(run_program(prompt))]
        assert set(prompt[:-2]) <= {*"abcdefghijklmnopqrstuvwxyz"[:variables], "=", "0", ";", "++;", "pass;"}
        assert len(task.sequence(prompt, answer)) <= task.max_tokens(size)


def test_counting_draws_the_papers_mix_and_never_counts_past_ten():
    """Statement weights 1 : 50 : 7 (reset, pass, increment) as the paper's
    generator draws them, increments redrawn where they would pass 10."""
    _, items = draws("counting", 200, n=60, variables=1)
    tokens = [t for prompt, _ in items for t in prompt[:-2]]
    passes, resets, increments = tokens.count("pass;"), tokens.count("="), tokens.count("++;")
    total = passes + resets + increments
    assert total == 200 * 60
    assert 0.80 < passes / total < 0.92 and 0.08 < increments / total < 0.15 and 0.005 < resets / total < 0.04
    assert max(int(a[0]) for _, a in items) <= 10 and max(int(a[0]) for _, a in items) >= 5


def test_selective_copy_answers_are_the_symbols_without_blanks():
    for blanks, size in ((1.0, 1), (1.0, 17), (0.5, 9), (3.0, 6), (0.0, 5)):
        task, items = draws("selective_copy", size, blanks=blanks)
        for prompt, answer in items:
            assert answer == [t for t in prompt if t != "_"]
            assert len(answer) == size and prompt.count("_") == round(blanks * size)
            assert len(task.sequence(prompt, answer)) <= task.max_tokens(size)
    _, items = draws("selective_copy", 6, n=2000)
    firsts = {prompt.index(answer[0]) for prompt, answer in items}
    assert firsts == set(range(7))  # the first symbol anywhere from place 0 to 6 of 12: places drawn, not fixed


def flip_flop_reading(prompt):
    """The flip-flop language read left to right: a write stores its bit,
    every read inside the prompt must carry the stored bit."""
    assert prompt[0] == "w" and prompt[-1] == "r" and len(prompt) % 2 == 1
    stored = None
    for op, bit in zip(prompt[0:-1:2], prompt[1:-1:2]):
        assert op in "wir" and bit in "01"
        if op == "w":
            stored = bit
        elif op == "r":
            assert bit == stored, prompt
    return stored


@pytest.mark.parametrize("ignore", [0.0, 0.8, 0.98])
@pytest.mark.parametrize("size", [1, 2, 10, 64])
def test_flip_flop_reads_answer_the_last_write(size, ignore):
    task, items = draws("flip_flop", size, ignore=ignore)
    for prompt, answer in items:
        assert len(prompt) == 2 * size + 1 and answer == [flip_flop_reading(prompt)]
        assert len(task.sequence(prompt, answer)) <= task.max_tokens(size)


def test_flip_flop_draws_instructions_as_ffl_p():
    _, items = draws("flip_flop", 100, n=200, ignore=0.8)
    ops = [op for prompt, _ in items for op in prompt[2:-1:2]]  # between the first write and the final read
    assert len(ops) == 99 * 200
    share = {op: ops.count(op) / len(ops) for op in "wir"}
    assert abs(share["i"] - 0.8) < 0.02 and abs(share["w"] - 0.1) < 0.015 and abs(share["r"] - 0.1) < 0.015
    answers = [a[0] for _, a in items]
    assert 0.35 < answers.count("1") / len(answers) < 0.65


@pytest.mark.parametrize("name", NEW)
def test_instances_are_a_function_of_the_seed(name):
    task = build_task({"name": name})
    sizes = T.Sizes(train_min=1, train_max=6)
    a = T.training_set(task, sizes, 40, seed=5)
    assert a == T.training_set(task, sizes, 40, seed=5) and a != T.training_set(task, sizes, 40, seed=6)
    assert draws(name, 20, n=30, seed=2)[1] == draws(name, 20, n=30, seed=2)[1] != draws(name, 20, n=30, seed=3)[1]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"name": "counting", "variables": 0}, "task.variables=0"),
        ({"name": "selective_copy", "blanks": -1.0}, "task.blanks=-1.0"),
        ({"name": "selective_copy", "alphabet": 1}, "task.alphabet=1"),
        ({"name": "flip_flop", "ignore": 1.0}, "task.ignore=1.0"),
    ],
)
def test_bad_knobs_are_one_paragraph(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_task(options)


@pytest.mark.parametrize("name", NEW)
def test_the_task_runner_trains_and_scores_past_the_trained_sizes_under_cope(name, tmp_path):
    cfg = {
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "attention": "auto"},
        "pos": {"name": "cope"},
        "task": {"name": name},
        "sizes": {"train_max": 4, "test_factor": 2, "bucket": 2},
        "train": {"steps": 3, "batch_size": 4, "examples": 40, "log_every": 1},
        "eval": {"samples": 3, "bootstrap": 20},
        "optim": {"warmup_steps": 1},
        "seed": 0,
    }
    result = T.run_task(T.resolve_task_run(cfg), str(tmp_path))
    assert [b["label"] for b in result["buckets"]] == ["1-2", "3-4", "5-6", "7-8"]
    assert [b["inside"] for b in result["buckets"]] == [True, True, False, False]
    assert all(b["n"] == 6 and 0 <= b["accuracy"] <= 1 for b in result["buckets"])


SPLITS = {
    "selective_copy": {"sparse": {"blanks": 2.0}, "dense": {"blanks": 0.5}},
    "flip_flop": {"sparse": {"ignore": 0.98}},
}


def split_config(task="selective_copy", splits=SPLITS):
    return {
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "attention": "auto"},
        "pos": {"name": "cope"},
        "task": {"name": task},
        "sizes": {"train_max": 4, "test_factor": 2, "bucket": 2},
        "train": {"steps": 3, "batch_size": 4, "examples": 40, "log_every": 1},
        "eval": {"samples": 3, "bootstrap": 20, "splits": splits},
        "optim": {"warmup_steps": 1},
        "seed": 0,
    }


def test_test_splits_score_the_trained_sizes_drawn_at_their_own_settings(tmp_path):
    """eval.splits: each of the run's own task's splits is a second test set at every size, drawn
    with the split's settings (CoPE's sparse selective copy: twice the blanks, the same symbols),
    read by compare.py and the claims as the task `<task>@<split>`."""
    from rope_lm.compare import published as P
    from rope_lm.compare.task_compare import compare_tasks

    run = T.resolve_task_run(split_config())
    assert run.raw["eval"]["splits"] == SPLITS["selective_copy"]  # the flip_flop entry is not this run's
    result = T.run_task(run, str(tmp_path / "run"))
    assert set(result["splits"]) == {"sparse", "dense"}
    for name, blanks in (("sparse", 2.0), ("dense", 0.5)):
        split = result["splits"][name]
        assert split["task_options"] == {"blanks": blanks}
        assert [b["label"] for b in split["buckets"]] == ["1-2", "3-4", "5-6", "7-8"]
        task = build_task({"name": "selective_copy", "blanks": blanks})
        assert [b["max_tokens"] for b in split["buckets"]] == [task.max_tokens(hi) for hi in (2, 4, 6, 8)]
        for size in (1, 4, 8):  # the split's instances: `size` symbols among round(blanks x size) blanks
            drawn, _ = T.test_set(task, size, 3, 0, set(), split=name)
            assert all(len(p) == size + round(blanks * size) and p.count("_") == round(blanks * size) for p, _ in drawn)
    assert result["splits"]["sparse"]["buckets"] != result["buckets"]
    written = (tmp_path / "run" / T.TASK_MD).read_text()
    main, sparse = written.split("### Split sparse (blanks=2.0)")[0], written.split("### Split sparse (blanks=2.0)")[1]
    assert "| 1-2 | train |" in main and "| 1-2 | inside |" in sparse and "| train |" not in sparse
    # compare.py and the claims read a split as a task of its own, its trained sizes as `inside`
    compare_tasks([str(tmp_path / "run")], str(tmp_path / "cmp"))
    for rows in (P.task_rows([str(tmp_path / "cmp")]), P.task_rows([str(tmp_path / "run")])):
        by_task = {r["task"]: r for r in rows}
        assert set(by_task) == {"selective_copy", "selective_copy@sparse", "selective_copy@dense"}
        for name in ("sparse", "dense"):
            inside = by_task[f"selective_copy@{name}"]["inside"]
            assert inside["n"] == result["splits"][name]["inside"]["n"] == 12
            assert inside["accuracy"] == pytest.approx(result["splits"][name]["inside"]["accuracy"])


def test_a_run_is_the_same_run_whatever_splits_other_tasks_name():
    """A run records its own task's splits only: a flip-flop run given selective copy's splits is
    the run recorded before eval.splits existed (existing=continue finds it complete)."""
    from rope_lm.runs.run_settings import TASK_BOOKKEEPING, settings_differences

    before = split_config("flip_flop", {})
    del before["eval"]["splits"]
    given = T.resolve_task_run(split_config("flip_flop", {"selective_copy": SPLITS["selective_copy"]}))
    assert given.raw["eval"]["splits"] == {}
    assert settings_differences(before, given.raw, TASK_BOOKKEEPING) == []
    with_own = T.resolve_task_run(split_config("flip_flop", SPLITS))
    assert settings_differences(before, with_own.raw, TASK_BOOKKEEPING) == [
        ("eval.splits", None, {"sparse": {"ignore": 0.98}})
    ]


@pytest.mark.parametrize(
    "splits,message",
    [
        ({"nosuch": {"sparse": {"blanks": 2.0}}}, "eval.splits.nosuch: 'nosuch' is not a task"),
        ({"selective_copy": {}}, "eval.splits.selective_copy={} must map split names"),
        ({"selective_copy": {"Sparse!": {"blanks": 2.0}}}, "split name 'Sparse!' must be lowercase"),
        ({"selective_copy": {"sparse": {"name": "copy"}}}, "not the task's name"),
        ({"selective_copy": {"sparse": {"blank": 2.0}}}, "eval.splits.selective_copy.sparse"),
        ({"selective_copy": {"sparse": {"blanks": -1.0}}}, "task.blanks=-1.0"),
        ({"selective_copy": {"letters": {"alphabet": 5}}}, "changes the task's symbols"),
        ({"counting": {"five": {"variables": 5}}}, "eval.splits.counting.five changes the task's symbols"),
        ("sparse", "eval.splits='sparse' must map a task"),
    ],
)
def test_bad_splits_are_one_paragraph_before_any_training(splits, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        T.resolve_task_run(split_config(splits=splits))


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "task=selective_copy",
            "pos=cope",
            "eval.splits={selective_copy: {dense: {blanks: 0.5}, sparse: {blanks: 2.0}}}",
        ],
        ["+experiment=content_tasks", "task=selective_copy", "pos=cope"],
    ],
)
def test_splits_are_given_as_the_docs_write_them(overrides):
    """The command line of docs/evaluation.md and the content_tasks preset reach the run as its own
    task's splits (Hydra refuses new keys under an empty mapping, so the default is null)."""
    import os

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.conftest import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose(config_name="task_run", overrides=overrides)
    run = T.resolve_task_run(OmegaConf.to_container(cfg, resolve=True))
    assert run.eval.splits == {"dense": {"blanks": 0.5}, "sparse": {"blanks": 2.0}}
