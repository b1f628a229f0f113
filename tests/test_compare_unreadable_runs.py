"""Issue 26 item 9, the comparison's part, through scripts/compare.py: a
half-written results.json is listed as unreadable while every other run is
compared, and a run compared with its own evaluation is labelled by what
really differs between them, not by the options one of them lacks."""

import hashlib
import os
import sys

from tests import forked
from tests.conftest import ROOT
from tests.test_compare import write_run

SCRIPT = os.path.join(ROOT, "scripts", "compare.py")


def compare(tmp_path, *args):
    return forked.run(
        [sys.executable, SCRIPT, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_a_half_written_results_file_does_not_block_the_others(tmp_path):
    write_run(tmp_path / "sweep" / "0_rope", "rope")
    write_run(tmp_path / "sweep" / "1_alibi", "alibi")
    bad = tmp_path / "sweep" / "2_nope" / "results.json"
    write_run(bad.parent, "nope")
    text = bad.read_text()
    bad.write_text(text[: text.index('"scheme": "nope') + len('"scheme": "no')])  # killed inside a string
    before = digest(bad)
    done = compare(tmp_path, f"path={tmp_path / 'sweep'}", f"out={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "| rope |" in done.stdout and "| alibi |" in done.stdout
    note = next(line for line in done.stdout.splitlines() if "UNREADABLE" in line)
    assert "2_nope" in note and "not valid JSON" in note and "at at" not in note
    assert digest(bad) == before  # the evidence is left as it was


def test_only_unreadable_results_is_one_paragraph(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text('{"scheme": "ro')
    done = compare(tmp_path, f"path={tmp_path / 'run'}", f"out={tmp_path / 'out'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    flat = " ".join(done.stderr.split())  # the paragraph is wrapped at 100 columns
    assert "not valid JSON" in flat and "at at" not in flat
    assert len(done.stderr.strip().split("\n\n")) == 1
    assert not (tmp_path / "out").exists()


def test_a_run_and_its_own_evaluation_are_labelled_by_what_differs(tmp_path):
    trained = {
        "optim": {"lr": 0.002, "warmup_steps": 2},
        "trainer": {"max_steps": 4, "precision": "auto"},
        "scaling": {"name": "none", "logn": False},
        "init_from": None,
        "eval": {"multipliers": [1, 2, 4]},
        "model": {"d_model": 32},
        "pos": {"name": "rope"},
        "data": {"vocab_size": 4096, "tokenizer_file": None},
    }
    run = write_run(tmp_path / "run", "rope", config=trained)
    evaluated = {
        "methods": [{"name": "none"}, {"name": "pi", "factor": "auto"}],
        "trained_scaling": {"name": "none", "logn": False},
        "eval": {"multipliers": [1, 2]},
        "model": {"d_model": 32},
        "pos": {"name": "rope"},
        "data": {"vocab_size": 4096, "tokenizer_file": f"{run}/eval/none-pi/tokenizer.json"},
    }
    ev = write_run(
        tmp_path / "run" / "eval" / "none-pi", "rope", {"none": lambda L: 10.0, "pi": lambda L: 11.0}, config=evaluated
    )
    done = compare(tmp_path, f"paths=[{run},{ev}]", f"out={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| rope")]
    assert "None" not in "".join(rows)
    labels = {row.split(" | ")[0][2:] for row in rows}
    # The lengths an evaluation covered are no setting of its rows (compare.labels.EVALUATION_SCOPE): the same
    # model under the same method twice is told apart by its folder.
    assert labels == {"rope (run)", "rope (run/eval/none-pi)", "rope + pi"}


def test_the_same_settings_in_a_run_and_its_evaluation_are_named_by_folder(tmp_path):
    from rope_lm.compare.ppl import compare as compare_runs

    config = {"eval": {"multipliers": [1, 2]}, "optim": {"lr": 0.002}}
    run = write_run(tmp_path / "run", "rope", config=config)
    ev = write_run(tmp_path / "run" / "eval" / "none", "rope", config={"eval": {"multipliers": [1, 2]}})
    summary = compare_runs([run, ev], str(tmp_path / "out"))
    assert {s.label for g in summary["groups"] for s in g.series} == {"rope (run)", "rope (run/eval/none)"}


def test_a_half_written_task_results_file_does_not_block_the_others(tmp_path):
    from rope_lm.compare.task_compare import compare_tasks
    from tests.test_compare import _task_run

    _task_run(tmp_path, "0_copy_rope", "copy", "rope", 1000, 0.5)
    (tmp_path / "1_copy_alibi").mkdir()
    (tmp_path / "1_copy_alibi" / "task_results.json").write_text('{"kind": "ta')
    out = compare_tasks([str(tmp_path)], str(tmp_path / "cmp"))
    md = open(out["files"]["markdown"]).read()
    assert [r["scheme"] for r in out["runs"]] == ["rope"]
    assert "UNREADABLE: `" in md and "1_copy_alibi" in md and "not valid JSON" in md
