"""Nothing lost, round three: the run-folder faults, driven through the
command line (exit status, one paragraph and no traceback, the files before
and after): read-only places, refused evaluations that left folders behind,
a stop during the evaluation, and a rerun that called a run's own folder
"another run"."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests import forked
from tests.conftest import ROOT
from tests.test_lost_work import digest, one_paragraph, run_args, train

EVAL = os.path.join(ROOT, "scripts", "eval_extrapolation.py")


def _can_mount_read_only() -> bool:
    probe = "d=$(mktemp -d) && mount --bind $d $d && mount -o remount,ro,bind $d && ! touch $d/x 2>/dev/null"
    try:
        return forked.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mount = pytest.mark.skipif(
    not _can_mount_read_only(), reason="needs `unshare -rm` and bind mounts to make a read-only file system"
)


def run_read_only(folder, args, cwd):
    """args run with `folder` on a read-only file system (a bind mount in a
    private mount namespace), as a user on a read-only share meets it."""
    q = shlex.quote
    script = (
        f"mount --bind {q(str(folder))} {q(str(folder))} && mount -o remount,ro,bind {q(str(folder))} "
        f'&& cd {q(str(cwd))} && exec "$@"'
    )
    return forked.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def no_hydra_dir(args):
    return [a for a in args if not a.startswith("hydra.run.dir=")]


@needs_mount
def test_a_read_only_current_directory(tiny_data_options, tmp_path):
    ro = tmp_path / "share"
    ro.mkdir()
    args = no_hydra_dir(run_args(tiny_data_options, "unused"))
    done = run_read_only(ro, [sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ro)
    message = one_paragraph(done, 1)
    assert "is not writable" in message and "read-only file system" in message
    assert "Set hydra.run.dir to a writable place, or run from a writable directory" in message
    assert os.listdir(ro) == []  # nothing half-made


@needs_mount
@pytest.mark.parametrize("setting", ["hydra.run.dir", "data.cache_dir"])
def test_a_read_only_run_or_cache_folder(setting, tiny_data_options, tmp_path):
    ro = tmp_path / "share"
    ro.mkdir()
    run_dir = tmp_path / "run" if setting == "data.cache_dir" else ro / "run"
    args = run_args(tiny_data_options, run_dir)
    if setting == "data.cache_dir":
        args = [a for a in args if not a.startswith("data.cache_dir=")] + [f"data.cache_dir={ro / 'cache'}"]
    done = run_read_only(ro, [sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT)
    message = one_paragraph(done, 1)
    assert "is not writable" in message and f"Set {setting} to a writable place" in message
    assert not run_dir.exists() and os.listdir(ro) == []  # no run folder left half-made


@pytest.fixture(scope="module")
def ckpt_run(tiny_data_options, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    done = train(run_args(tiny_data_options, run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def evaluate(args, script=EVAL):
    return forked.run(
        [sys.executable, script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def copy_run(run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run, target, ignore=shutil.ignore_patterns(".run.lock", "eval"))
    return target


def test_a_refused_evaluation_leaves_no_folder_and_the_next_takes_the_first_name(ckpt_run, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    refused = evaluate([f"ckpt={run}", f"data.path={tmp_path / 'no-such-corpus'}", "eval.multipliers=[1,2]"])
    one_paragraph(refused, 2)
    assert not (run / "eval").exists()
    done = evaluate([f"ckpt={run}", "eval.multipliers=[1,2]"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.listdir(run / "eval") == ["none"]


STOP_AFTER = """
    import os, signal, sys
    import rope_lm.runs.eval_run as E
    real = E.write_views
    def write_views(results, out_dir, draw=True):
        real(results, out_dir, draw)
        if len(results["results"]) == {rows}:  # the signal arrives while the evaluation goes on
            os.kill(os.getpid(), signal.{signal})
    E.write_views = write_views
    import runpy
    sys.argv[0] = {script!r}
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def stopping(tmp_path, script, rows, signal="SIGTERM"):
    path = tmp_path / "stop_after.py"
    path.write_text(textwrap.dedent(STOP_AFTER).format(rows=rows, script=script, signal=signal))
    return str(path)


def test_sigterm_during_an_evaluation_says_what_was_kept_and_existing_continue_finishes_it(ckpt_run, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    out = tmp_path / "eval"
    args = [f"ckpt={run}", "scaling=none,pi", "scaling.factor=2", "eval.multipliers=[1,2,4]", f"out={out}"]
    stopped = evaluate(args, script=stopping(tmp_path, EVAL, rows=4))  # none's 3 lengths, then pi's first
    message = one_paragraph(stopped, 143)
    assert "Stopped by a signal during the evaluation of method pi" in message
    assert "1 of 3 lengths of it kept, and 1 of 2 method(s) complete" in message
    assert f"out={out} existing=continue" in message
    partial = json.loads((out / "results.json").read_text())
    assert partial["status"] == "evaluating" and len(partial["results"]) == 4
    kept = [r for r in partial["results"] if r["method"] == "none"]

    again = evaluate(args)  # without existing=continue a folder holding results is refused, untouched
    assert "existing=continue" in one_paragraph(again, 2)
    assert json.loads((out / "results.json").read_text()) == partial

    finished = evaluate(args + ["existing=continue"])
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "[none] kept from the earlier evaluation" in finished.stderr
    final = json.loads((out / "results.json").read_text())
    assert final["status"] == "complete" and len(final["results"]) == 6
    assert [r for r in final["results"] if r["method"] == "none"] == kept  # measured once, kept as it was


def test_sigterm_during_the_final_evaluation_of_a_train_run(tiny_data_options, tmp_path):
    run = tmp_path / "run"
    script = stopping(tmp_path, os.path.join(ROOT, "train.py"), rows=1)
    stopped = train(run_args(tiny_data_options, run), script=script)
    message = one_paragraph(stopped, 143)
    assert "Stopped by a signal during the evaluation of method none" in message
    assert "1 of 3 lengths of it kept" in message
    assert f"To finish it: python train.py resume={run} existing=continue" in message
    assert json.loads((run / "results.json").read_text())["status"] == "evaluating"
    before = digest(run)

    finished = train([f"resume={run}", "existing=continue"])
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "evaluating its final checkpoint" in finished.stderr
    after = digest(run)
    assert {k: v for k, v in after.items() if k.startswith("checkpoints")} == {
        k: v for k, v in before.items() if k.startswith("checkpoints")
    }  # not trained again
    final = json.loads((run / "results.json").read_text())
    assert final["status"] == "complete" and len(final["results"]) == 3


def test_a_rerun_of_the_same_command_is_told_about_existing_continue(ckpt_run, tiny_data_options, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    before = digest(run)
    again = train(run_args(tiny_data_options, run))
    message = one_paragraph(again, 2)
    assert (
        "already holds a training run's results from these same settings" in message and "existing=continue" in message
    )
    assert "another run" not in message
    assert digest(run) == before
    other = train(run_args(tiny_data_options, run, **{"trainer.max_steps": 8}))
    assert "already holds another run's files" in one_paragraph(other, 2)
    assert digest(run) == before


def test_a_run_refused_before_training_can_be_run_again_fixed_in_the_same_folder(tiny_data_options, tmp_path):
    run = tmp_path / "run"
    refused = train(run_args(tiny_data_options, run, **{"data.path": "/dev/zero"}))
    assert "is a character device" in one_paragraph(refused, 2)
    assert json.loads((run / "results.json").read_text())["status"] == "failed"  # the failure is on record
    fixed = train(run_args(tiny_data_options, run))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["status"] == "complete"


def test_resume_with_existing_continue_skips_a_complete_run(ckpt_run, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    before = digest(run)
    done = train([f"resume={run}", "existing=continue"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "its results are complete; skipped" in done.stderr
    assert digest(run) == before  # not evaluated again, nothing rewritten


def test_ckpt_and_hf_together_are_refused(ckpt_run, tmp_path):
    done = evaluate([f"ckpt={ckpt_run}", f"hf={tmp_path}"])
    assert "are both set; give one" in one_paragraph(done, 2)


def test_a_status_word_this_version_does_not_know_is_never_complete(tmp_path):
    from rope_lm.runs.run_folder import RunFolder, Status

    (tmp_path / "results.json").write_text(json.dumps({"status": "finished-ish", "results": []}))
    assert RunFolder(str(tmp_path)).state()["state"] == Status.NO_RESULTS
    assert Status.read("completed") == Status.COMPLETE and Status.read(None) == Status.COMPLETE  # older files


def test_a_run_yaml_that_is_not_yaml_is_named(ckpt_run, tiny_data_options, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    (run / "run.yaml").write_text("model: [unclosed\n")
    resumed = train([f"resume={run}"])
    assert "run.yaml cannot be read" in one_paragraph(resumed, 2)
    continued = train(run_args(tiny_data_options, run, existing="continue"))
    assert "run.yaml (the settings this folder's run recorded) cannot be read" in one_paragraph(continued, 2)


def test_a_damaged_last_checkpoint_names_the_intact_one_beside_it(ckpt_run, tmp_path):
    run = copy_run(ckpt_run, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:4096])  # cut short, as a copy or a disk can leave it
    message = one_paragraph(train([f"resume={run}", "trainer.max_steps=8"]), 2)
    best = run / "checkpoints" / "best.ckpt"
    assert "is not a checkpoint" in message and f"intact checkpoint: {best} (step" in message
    assert f"ckpt_path={best}" in message
    again = train([f"resume={run}", f"ckpt_path={best}", "trainer.max_steps=8"])  # the command it names
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["training"]["steps"] == 8


def test_ctrl_c_during_an_evaluation_is_one_paragraph_with_the_shells_status(ckpt_run, tmp_path):
    out = tmp_path / "eval"
    args = [f"ckpt={ckpt_run}", "eval.multipliers=[1,2,4]", f"out={out}"]
    stopped = evaluate(args, script=stopping(tmp_path, EVAL, rows=2, signal="SIGINT"))
    message = one_paragraph(stopped, 130)
    assert "Stopped by a signal during the evaluation of method none" in message and "2 of 3 lengths" in message
