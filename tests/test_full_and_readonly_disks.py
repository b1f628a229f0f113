"""Issue 50, nothing lost on a full or read-only disk: each case ends in one
paragraph that names the file or setting and what would work, a non-zero exit
status, and nothing already written lost or overwritten. The disks are real:
a small tmpfs (full: a few KiB free; read-only: mounted ro), mounted for the
test and always unmounted after it; without the right to mount, the tests skip."""

import errno
import glob
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from rope_lm.core.errors import OutputError, write_failure
from rope_lm.core.files import atomic_write, written_together
from rope_lm.train.checkpointing import read_checkpoint
from tests import forked
from tests.conftest import ROOT, cli_overrides
from tests.test_diagnostics import save_tiny_checkpoint
from tests.test_export_and_probe_folders import LLAMA

FAST = {"trainer.max_steps": 4, "trainer.val_every_n_steps": 2, "trainer.ckpt_every_n_steps": 2}


# --- the disks ------------------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, kib, read_only=False, free_kib=None) -> a folder on a tmpfs of its own; with free_kib,
    a filler file leaves about that much room. Every mount is undone when the test ends."""
    mounted = []

    def mount(name: str, kib: int, read_only: bool = False, free_kib: int | None = None) -> str:
        where = tmp_path / name
        where.mkdir()
        options = f"{'ro,' if read_only else ''}size={kib}k"
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not permitted'})")
        mounted.append(str(where))
        if free_kib is not None:
            with open(where / "filler", "wb") as f:
                f.write(b"\0" * ((kib - free_kib) * 1024))
        return str(where)

    if not shutil.which("mount"):
        pytest.skip("no mount command")
    try:
        yield mount
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", where], capture_output=True)


def digest(folder) -> dict:
    """Every file under folder -> its SHA-1; every folder -> None (hidden ones included)."""
    out = {}
    for here, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(here, d), folder)] = None
        for name in files:
            with open(os.path.join(here, name), "rb") as f:
                out[os.path.relpath(os.path.join(here, name), folder)] = hashlib.sha1(f.read()).hexdigest()
    return out


# --- the commands ---------------------------------------------------------------------------


def command(script, *args, cwd=ROOT):
    return forked.run(
        [sys.executable, os.path.join(ROOT, script), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def one_paragraph(done, *words, absent=()) -> str:
    """The error paragraph of a failed command (non-zero exit, no traceback), holding `words`."""
    err = done.stderr.strip()
    assert done.returncode != 0, err[-3000:]
    assert "Traceback" not in err + done.stdout, err[-3000:]
    paragraph = err.split("\n\n")[-1]
    assert paragraph.startswith("rope-lm:"), err[-3000:]
    flat = " ".join(paragraph.split())
    for word in words:
        assert word in flat, flat
    for word in absent:
        assert word not in flat, flat
    return flat


def train(data_options, run_dir, **extra):
    return command("train.py", *cli_overrides(data_options, run_dir, **{**FAST, **extra}))


@pytest.fixture(scope="module")
def trained(tiny_data_options, tmp_path_factory):
    """A finished 4-step run (results and checkpoints) on a roomy disk: what the comparisons read, and the
    size of one checkpoint of this model, to size a disk that takes the first checkpoint but not the next."""
    run_dir = str(tmp_path_factory.mktemp("trained") / "run")
    done = train(tiny_data_options, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def llama_ckpt(tiny_cache, tiny_data_options, tmp_path_factory):
    """A run folder holding a Llama-shaped checkpoint: the one shape export_hf writes."""
    run = tmp_path_factory.mktemp("llama")
    save_tiny_checkpoint(
        str(run / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, pos={"name": "rope"}, model=LLAMA
    )
    return str(run)


# --- 1. the token cache ---------------------------------------------------------------------


@pytest.mark.parametrize("script", ["scripts/prepare_data.py", "train.py"])
def test_a_token_cache_build_on_a_full_disk(tiny_data_options, tmpfs, tmp_path, script):
    disk = tmpfs("cache", 256, free_kib=32)
    cache_dir = os.path.join(disk, "cache")
    os.makedirs(cache_dir)
    with open(os.path.join(cache_dir, "notes.txt"), "w") as f:
        f.write("the user's own file")
    before = digest(cache_dir)
    options = {**tiny_data_options, "cache_dir": cache_dir}
    run_dir = tmp_path / "run"
    if script == "train.py":
        args = cli_overrides(options, run_dir, **FAST)
    else:
        args = ["data=local_files", *(f"data.{k}={v}" for k, v in options.items()), f"hydra.run.dir={run_dir}"]
    one_paragraph(
        command(script, *args),
        f"data.cache_dir='{cache_dir}'",
        "the disk is full",
        "were free when the build started",
        "takes at most about",
        "The partial cache was removed",
        "point data.cache_dir at a folder on a disk with more room",
        "run the same command again",
        absent=("resume", "Errno"),
    )
    # The partial cache is gone (no folder, no temporary folder); what was there before is as it was.
    assert not [n for n in os.listdir(cache_dir) if os.path.isdir(os.path.join(cache_dir, n))]
    assert {k: v for k, v in digest(cache_dir).items() if not k.endswith(".lock")} == before
    # What the message says works: the same command, once there is room.
    os.remove(os.path.join(disk, "filler"))
    done = command(script, *args)
    assert done.returncode == 0, done.stderr[-3000:]


# --- 2. export_hf ----------------------------------------------------------------------------


def test_export_hf_onto_a_full_disk_leaves_no_folder(llama_ckpt, tmpfs, tmp_path):
    disk = tmpfs("export", 64, free_kib=48)  # the weights alone take about 270 KiB
    before = digest(disk)
    out = os.path.join(disk, "models", "my-llama")
    one_paragraph(
        command("scripts/export_hf.py", f"ckpt={llama_ckpt}", f"out={out}", f"hydra.run.dir={tmp_path / 'hy'}"),
        f"Could not write {out}/model.safetensors",
        "the disk is full",
        f"{out} was not made",
        "The export takes about",
        "set out= to a folder on a disk with more room",
        absent=("resume", "SafetensorError"),
    )
    assert digest(disk) == before  # no folder, no parent folder, no temporary folder


def test_export_hf_onto_a_full_disk_into_a_users_folder(llama_ckpt, tmpfs, tmp_path):
    disk = tmpfs("export", 64, free_kib=48)
    mine = os.path.join(disk, "mine")
    os.makedirs(mine)
    with open(os.path.join(mine, "README.md"), "w") as f:
        f.write("my notes")
    before = digest(disk)
    one_paragraph(
        command("scripts/export_hf.py", f"ckpt={llama_ckpt}", f"out={mine}", f"hydra.run.dir={tmp_path / 'hy'}"),
        "the disk is full",
        f"{mine} is as it was",
        "out=",
    )
    assert digest(disk) == before


def test_export_hf_into_a_read_only_folder(llama_ckpt, tmpfs, tmp_path):
    disk = tmpfs("export", 64, read_only=True)
    out = os.path.join(disk, "my-llama")
    one_paragraph(
        command("scripts/export_hf.py", f"ckpt={llama_ckpt}", f"out={out}", f"hydra.run.dir={tmp_path / 'hy'}"),
        "read-only file system",
        "Set out= to a writable place",
        absent=("disk is full",),
    )


# --- 3. a training run whose folder fills ---------------------------------------------------


def test_a_run_folder_that_fills_before_its_first_checkpoint(tiny_data_options, tmpfs):
    disk = tmpfs("runs", 4096, free_kib=128)  # room for the run's small files, not for a checkpoint
    run_dir = os.path.join(disk, "run")
    message = one_paragraph(
        train(tiny_data_options, run_dir),
        f"Could not write {run_dir}/checkpoints/last.ckpt",
        "the disk is full",
        f"no checkpoint had been written in {run_dir}",
        "run the same command again",
        "hydra.run.dir",
        absent=("resume=",),
    )
    assert "untouched" not in message
    assert not glob.glob(os.path.join(run_dir, "checkpoints", "*"))
    # What the message says works: the same command, in that folder, once there is room.
    os.remove(os.path.join(disk, "filler"))
    done = train(tiny_data_options, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_checkpoint(os.path.join(run_dir, "checkpoints", "last.ckpt"))["global_step"] == 4


def test_a_full_disk_during_a_checkpoint_save_keeps_the_previous_one(trained, tiny_data_options, tmpfs):
    # Room for the step-2 checkpoints (last and best) and the run's small files, not for a third checkpoint.
    ckpt = os.path.getsize(os.path.join(trained, "checkpoints", "last.ckpt")) // 1024
    room = int(2.5 * ckpt) + 48
    disk = tmpfs("runs", room + 4096, free_kib=room)
    run_dir = os.path.join(disk, "run")
    one_paragraph(
        train(tiny_data_options, run_dir),
        f"Could not write {run_dir}/checkpoints/",
        "the disk is full",
        "is untouched",
        f"python train.py resume={run_dir} existing=continue",
        absent=("nothing to resume",),
    )
    kept = os.path.join(run_dir, "checkpoints", "last.ckpt")
    assert read_checkpoint(kept)["global_step"] == 2  # the previous checkpoint, whole
    assert not glob.glob(os.path.join(run_dir, "checkpoints", ".tmp-*"))
    # resume= works from it once there is room.
    os.remove(os.path.join(disk, "filler"))
    done = command("train.py", f"resume={run_dir}", "existing=continue")
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_checkpoint(kept)["global_step"] == 4


def test_a_hydra_run_dir_on_a_full_disk(tiny_data_options, tmpfs):
    # Hydra writes the job's settings (.hydra/) before any of rope-lm's code runs: refused before that.
    disk = tmpfs("runs", 64, free_kib=0)
    run_dir = os.path.join(disk, "run")
    one_paragraph(
        train(tiny_data_options, run_dir),
        f"Could not write {run_dir}",
        "the disk is full",
        "Nothing was started or written there",
        "set hydra.run.dir to a folder on a disk with more room",
        absent=("resume", "Errno"),
    )
    assert sorted(os.listdir(disk)) == ["filler"]


def test_a_read_only_hydra_run_dir(tiny_data_options, tmpfs):
    run_dir = os.path.join(tmpfs("runs", 64, read_only=True), "run")
    one_paragraph(
        train(tiny_data_options, run_dir),
        "read-only file system",
        "hydra.run.dir",
        absent=("resume", "disk is full"),
    )
    assert not os.path.exists(run_dir)


# --- 4. generate's out= -------------------------------------------------------------------------


def test_generate_out_in_a_read_only_folder(llama_ckpt, tmpfs, tmp_path):
    out = os.path.join(tmpfs("gen", 64, read_only=True), "generations.json")
    one_paragraph(
        command(
            "scripts/generate.py",
            f"ckpt={llama_ckpt}",
            "prompt=hello",
            "max_new_tokens=2",
            f"out={out}",
            f"hydra.run.dir={tmp_path / 'hy'}",
        ),
        "read-only file system",
        "out=",
        absent=("disk is full", "resume"),
    )


def test_generate_out_on_a_full_disk(llama_ckpt, tmpfs, tmp_path):
    disk = tmpfs("gen", 16, free_kib=0)
    before = digest(disk)
    out = os.path.join(disk, "new", "generations.json")
    done = command(
        "scripts/generate.py",
        f"ckpt={llama_ckpt}",
        "prompt=hello",
        "max_new_tokens=2",
        f"out={out}",
        f"hydra.run.dir={tmp_path / 'hy'}",
    )
    one_paragraph(
        done,
        f"Could not write {out}",
        "the disk is full",
        "The generations are printed above",
        "set out= to a folder on a disk with more room",
        absent=("resume",),
    )
    assert "=== prompt 0" in done.stdout
    assert digest(disk) == before  # no file, no folder made for it


# --- 5. results, comparisons, retrieval ---------------------------------------------------------


def test_an_evaluations_results_on_a_full_disk(trained, tmpfs, tmp_path):
    disk = tmpfs("eval", 64, free_kib=4)
    out = os.path.join(disk, "eval")
    args = [f"ckpt={trained}", f"out={out}", "eval.token_budget=256", "eval.batch_tokens=256", "eval.multipliers=[1,2]"]
    one_paragraph(
        command("scripts/eval_extrapolation.py", *args, f"hydra.run.dir={tmp_path / 'hy'}"),
        "the disk is full",
        "set out= to a folder on a disk with more room",
        absent=("resume=",),
    )
    assert not os.path.exists(out)


def test_an_evaluation_stopped_part_way_by_a_full_disk_says_how_to_finish(trained, tmpfs, tmp_path):
    disk = tmpfs("eval", 48, free_kib=24)  # results.json, results.md and the tokenizer fit; the plot does not
    out = os.path.join(disk, "eval")
    args = [f"ckpt={trained}", f"out={out}", "eval.token_budget=256", "eval.batch_tokens=256", "eval.multipliers=[1,2]"]
    one_paragraph(
        command("scripts/eval_extrapolation.py", *args, f"hydra.run.dir={tmp_path / 'hy'}"),
        "the disk is full",
        f"out={out} existing=continue",
        absent=("resume=",),
    )
    assert os.path.exists(os.path.join(out, "results.json"))


def test_a_comparison_onto_a_full_disk(trained, tmpfs, tmp_path):
    disk = tmpfs("cmp", 48, free_kib=16)  # the tables fit, the plots do not
    earlier = os.path.join(disk, "earlier")
    os.makedirs(earlier)
    for name in ("compare.md", "compare.csv", "ppl_vs_length.png"):
        with open(os.path.join(earlier, name), "w") as f:
            f.write(f"an earlier {name}")
    before = digest(disk)
    for out, words in (
        (os.path.join(disk, "new"), ["was not made"]),
        (earlier, [f"No file of this comparison was written: {earlier} is as it was"]),
    ):
        one_paragraph(
            command("scripts/compare.py", f"path={trained}", f"out={out}", f"hydra.run.dir={tmp_path / 'hy'}"),
            "the disk is full",
            "set out= to a folder on a disk with more room",
            *words,
            absent=("resume",),
        )
        assert digest(disk) == before  # the earlier comparison whole: no new table beside an old plot


def test_a_retrieval_battery_onto_a_full_disk(llama_ckpt, tmpfs, tmp_path):
    args = [f"ckpt={llama_ckpt}", "tasks=[passkey]", "lengths=[128,256]", "depths=[0.5]", "samples=2", "bootstrap=0"]
    args.append(f"hydra.run.dir={tmp_path / 'hy'}")
    # No room for the first cell: nothing is left behind.
    disk = tmpfs("nothing", 16, free_kib=0)
    one_paragraph(
        command("scripts/retrieval.py", *args, f"out={disk}/ret"),
        "the disk is full",
        "set out= to a folder",
        absent=("resume", "existing=continue"),
    )
    assert not os.path.exists(os.path.join(disk, "ret"))
    # Room for the cells, not for the plots: the cells are kept, and the message says how to finish from them.
    disk = tmpfs("some", 48, free_kib=24)
    out = os.path.join(disk, "ret")
    one_paragraph(
        command("scripts/retrieval.py", *args, f"out={out}"),
        "the disk is full",
        "cell(s) scored so far are kept",
        f"out={out} existing=continue",
        absent=("resume",),
    )
    assert os.path.getsize(os.path.join(out, "cells.jsonl")) > 0


# --- the one place that words a failed write ------------------------------------------------------


@pytest.mark.parametrize(
    "error,words",
    [
        (OSError(errno.ENOSPC, "No space left on device"), ["the disk is full"]),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), ["the disk is full"]),
        (OSError(errno.EROFS, "Read-only file system"), ["is not writable (Read-only file system)"]),
        (PermissionError(errno.EACCES, "Permission denied"), ["is not writable (Permission denied)"]),
        (PermissionError(errno.EPERM, "Operation not permitted"), ["is not writable (Operation not permitted)"]),
        (OSError(errno.EIO, "Input/output error"), ["OSError: [Errno 5] Input/output error"]),
        # Errors of libraries that name the errno only in their text (safetensors, tokenizers, torch's zip writer).
        (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), ["disk is full"]),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4310"), ["disk is full"]),
        (Exception("Read-only file system (os error 30)"), ["is not writable (Read-only file system)"]),
    ],
)
def test_a_failed_write_is_told_by_its_cause(tmp_path, error, words):
    message = str(write_failure(str(tmp_path / "out.json"), error, setting="out="))
    assert message.startswith(f"Could not write {tmp_path / 'out.json'}: ")
    for word in words:
        assert word in message
    assert "resume" not in message and "run the same command again" in message
    if "full" in words[0]:
        assert "set out= to a folder on a disk with more room" in message
    elif "writable" in words[0]:
        assert "set out= to a writable folder" in message and "disk is full" not in message


def test_files_written_together_replace_theirs_only_all_at_once(tmp_path):
    import rope_lm.core.files as files

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.md").write_text("old a")

    # The second file's write fails (as a full disk makes it fail): the first is not replaced either.
    def failing_write(path, data):
        if path.endswith("b.csv"):
            raise write_failure(path, OSError(errno.ENOSPC, "No space left on device"))
        atomic_write(path, data)

    with pytest.raises(OutputError, match="No file of this comparison was written"):
        with written_together(str(folder), "out=", "comparison"):
            failing_write(str(folder / "a.md"), "new a")
            failing_write(str(folder / "b.csv"), "new b")
    assert (folder / "a.md").read_text() == "old a" and sorted(os.listdir(folder)) == ["a.md"]
    # A block that ends well replaces them all; one that fails in a folder it made removes the folder.
    with written_together(str(folder)):
        atomic_write(str(folder / "a.md"), "new a")
    assert (folder / "a.md").read_text() == "new a"
    new = tmp_path / "new" / "deeper"
    with pytest.raises(OutputError, match="was not made"):
        with written_together(str(new), "out="):
            atomic_write(str(new / "a.md"), "a")
            failing_write(str(new / "b.csv"), "b")
    assert not os.path.exists(tmp_path / "new")
    assert files._STAGED.get() is None


def test_a_retrieval_comparison_onto_a_full_disk(llama_ckpt, tmpfs, tmp_path):
    battery = tmp_path / "battery"
    args = [f"ckpt={llama_ckpt}", "tasks=[passkey]", "lengths=[128]", "depths=[0.5]", "samples=2", "bootstrap=0"]
    done = command("scripts/retrieval.py", *args, f"out={battery}", f"hydra.run.dir={tmp_path / 'hy'}")
    assert done.returncode == 0, done.stderr[-3000:]
    disk = tmpfs("cmp", 16, free_kib=4)  # the table fits, the CSV does not
    out = os.path.join(disk, "cmp")
    one_paragraph(
        command("scripts/compare.py", f"path={battery}", f"out={out}", f"hydra.run.dir={tmp_path / 'hy'}"),
        "the disk is full",
        f"{out} was not made",
        "set out= to a folder on a disk with more room",
    )
    assert sorted(os.listdir(disk)) == ["filler"]


def test_a_comparison_into_a_read_only_folder(trained, tmpfs, tmp_path):
    disk = tmpfs("cmp", 16, read_only=True)
    one_paragraph(
        command("scripts/compare.py", f"path={trained}", f"out={disk}", f"hydra.run.dir={tmp_path / 'hy'}"),
        f"{disk} is not writable (Read-only file system)",
        "set out= to a writable folder",
        absent=("disk is full", "resume"),
    )


TASK = [
    "task=reverse",
    "pos=alibi",
    "logger=csv",
    "train.steps=4",
    "train.batch_size=4",
    "train.examples=40",
    "sizes.train_max=3",
    "sizes.bucket=3",
    "eval.samples=4",
    "eval.bootstrap=50",
    "optim.warmup_steps=1",
]


def test_a_task_runs_results_on_a_full_disk(tmpfs, tmp_path):
    # The model (about 1.5 MiB) does not fit: no results file says "complete" beside a missing or cut
    # model.pt, and the metrics log's own failure does not hide the error.
    disk = tmpfs("task", 2048, free_kib=64)
    run_dir = os.path.join(disk, "run")
    one_paragraph(
        command("scripts/task.py", *TASK, f"hydra.run.dir={run_dir}", cwd=tmp_path),
        f"Could not write {run_dir}/model.pt",
        "the disk is full",
        "No file of this task run's results was written",
        "set hydra.run.dir to a folder on a disk with more room",
        absent=("resume",),
    )
    assert not {"model.pt", "task_results.json", "task_results.md", "accuracy_vs_length.png"} & set(os.listdir(run_dir))
    assert not glob.glob(os.path.join(run_dir, ".tmp-*"))
    os.remove(os.path.join(disk, "filler"))
    done = command("scripts/task.py", *TASK, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.exists(os.path.join(run_dir, "model.pt"))
    # Their comparison onto a full disk: the tables and plots are one set, not made at all.
    full = tmpfs("cmp", 32, free_kib=8)
    out = os.path.join(full, "cmp")
    one_paragraph(
        command("scripts/compare.py", f"path={run_dir}", f"out={out}", f"hydra.run.dir={tmp_path / 'hy'}"),
        "the disk is full",
        f"{out} was not made",
        "set out= to a folder on a disk with more room",
    )
    assert sorted(os.listdir(full)) == ["filler"]


def test_a_run_trained_to_the_end_whose_last_writes_meet_a_full_disk(trained, tiny_data_options, tmpfs):
    # Two steps, one checkpoint step: its checkpoint fits, what the run writes after it does not.
    ckpt = os.path.getsize(os.path.join(trained, "checkpoints", "last.ckpt")) // 1024
    room = int(2.2 * ckpt)
    disk = tmpfs("runs", room + 4096, free_kib=room)
    run_dir = os.path.join(disk, "run")
    two_steps = {"trainer.max_steps": 2}
    one_paragraph(
        train(tiny_data_options, run_dir, **two_steps),
        "the disk is full",
        f"python train.py resume={run_dir} existing=continue",
    )
    os.remove(os.path.join(disk, "filler"))
    done = command("train.py", f"resume={run_dir}", "existing=continue")
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(run_dir, "results.json")) as f:
        assert '"status": "complete"' in f.read()


@pytest.mark.parametrize(
    "script,args",
    [
        ("passkey.py", ["lengths=[128]", "depths=[0.5]", "samples=1"]),
        ("rope_decay.py", ["max_distance=512"]),
        ("pos_similarity.py", ["positions=64"]),
    ],
)
def test_a_diagnostic_onto_a_full_disk(llama_ckpt, tmpfs, tmp_path, script, args):
    # Its JSON fits, its plot does not (or the other way round): neither is kept, so the same command is not
    # then refused for a folder "holding results"; a folder of the user's stays, even empty.
    if script != "pos_similarity.py":  # a rotary checkpoint has no position vectors to compare
        args = [f"ckpt={llama_ckpt}", *args]
    disk = tmpfs("diag", 1024, free_kib=8)
    mine = os.path.join(disk, "mine")
    os.makedirs(mine)
    for out, words in ((os.path.join(disk, "new"), ["was not made"]), (mine, [f"{mine} is as it was"])):
        done = command(f"scripts/{script}", *args, f"out={out}", f"hydra.run.dir={tmp_path}/hy")
        one_paragraph(done, "the disk is full", "set out= to a folder on a disk with more room", *words)
        assert sorted(os.listdir(disk)) == ["filler", "mine"] and os.listdir(mine) == []
    os.remove(os.path.join(disk, "filler"))
    done = command(f"scripts/{script}", *args, f"out={mine}", f"hydra.run.dir={tmp_path}/hy")
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_sweeps_job_record_on_a_full_disk(tmpfs, capsys):
    """jobs.json cannot be written: Hydra would make the callback's error a warning of its own; the summary
    says which file lacks the record and how to fill it in, and the sweep goes on."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from rope_lm.cli import SweepSummary

    disk = tmpfs("sweep", 16, free_kib=0)
    summary = SweepSummary()
    summary.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": disk}}}))
    config = OmegaConf.create({"hydra": {"job": {"num": 0}, "runtime": {"output_dir": f"{disk}/0_rope"}}})
    summary.on_job_end(config, JobReturn(overrides=["pos=rope"], status=JobStatus.COMPLETED, _return_value={}))
    summary.print_summary()
    err = " ".join(capsys.readouterr().err.split())
    assert f"{disk}/jobs.json could not be written (the disk is full" in err
    assert "existing=continue" in err and "all 1 jobs completed" in err
    assert not os.path.exists(f"{disk}/jobs.json")


@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_a_benchmarks_results_file_on_a_disk_that_cannot_take_it_is_refused_before_timing(tmpfs, disk):
    """The benchmark's out= is checked before minutes of timing; a full disk names its own free space
    (the tmpfs mount, not the disk of the folder above it)."""
    where = tmpfs("bench", 16, free_kib=0) if disk == "full" else tmpfs("bench", 16, read_only=True)
    done = command("benchmarks/bench.py", f"out={where}/bench.json", "steps=1")
    words = [f"0 bytes free in {where}", "Nothing was started"] if disk == "full" else ["not writable", "out="]
    one_paragraph(done, *words)
    assert "measured CPU peak" not in done.stderr


@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_a_search_into_a_disk_that_cannot_take_it(trained, tmpfs, disk):
    """A read-only out= is refused before the model is opened (it was a makedirs traceback); a full one names
    out= as the setting that moves it."""
    where = tmpfs("search", 16, free_kib=0) if disk == "full" else tmpfs("search", 16, read_only=True)
    args = ["method=yarn", "trials=1", "multiplier=2", "val_tokens=64", "test_tokens=64", "bootstrap=10"]
    done = command("scripts/search.py", f"ckpt={trained}", *args, f"out={where}/s", "device=cpu")
    one_paragraph(done, "out=", *(["disk is full"] if disk == "full" else ["not writable"]))


def test_a_task_run_folder_on_a_full_disk_names_the_setting_that_moves_it(tmpfs):
    """The first file of a task run (run.yaml) on a full disk: the paragraph names hydra.run.dir."""
    disk = tmpfs("task", 16, free_kib=0)
    done = command("scripts/task.py", "task=copy", f"hydra.run.dir={disk}/run")
    one_paragraph(done, "disk is full", "set hydra.run.dir to")
