"""Nothing lost, round two: each fault a hostile first week found, driven
through the command line as a user would meet it (exit status, one paragraph
and no traceback on stderr, the files before and after)."""

import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rope_lm.train.checkpointing import read_checkpoint
from rope_lm.train.lit import warmup_cosine
from tests import forked
from tests.conftest import ROOT, cli_overrides, write_corpus

FAST = {
    "trainer.max_steps": 6,
    "trainer.val_every_n_steps": 3,
    "trainer.ckpt_every_n_steps": 3,
    "trainer.log_every_n_steps": 1,
}


def train(args, cwd=ROOT, script=None, env=None):
    cmd = [sys.executable, script or os.path.join(ROOT, "train.py"), *args]
    return forked.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def run_args(data_options, run_dir, **extra):
    return cli_overrides(data_options, run_dir, **{**FAST, **extra})


def one_paragraph(proc, status):
    assert proc.returncode == status, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    message = proc.stderr.strip().split("\n\n")[-1]
    assert message.startswith("rope-lm: "), proc.stderr[-2000:]
    return " ".join(message.split())


def digest(run_dir) -> dict:
    """sha1 of every file a run owns (results, checkpoints, plots)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "*"), recursive=True)):
        rel = os.path.relpath(path, run_dir)
        if os.path.isfile(path) and rel.split(os.sep)[0] in (
            "results.json",
            "results.md",
            "ppl_vs_length.png",
            "checkpoints",
            "run.yaml",
        ):
            out[rel] = hashlib.sha1(open(path, "rb").read()).hexdigest()
    return out


def results(run_dir) -> dict:
    with open(os.path.join(run_dir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trained_once(tiny_data_options, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("trained") / "run")
    done = train(run_args(tiny_data_options, run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture
def finished_run(trained_once, tmp_path):
    """A finished 6-step run of its own (a copy of one trained once: resume
    takes the folder from the command line, and results name no folder it needs)."""
    import shutil

    run_dir = str(tmp_path / "run")
    shutil.copytree(trained_once, run_dir, ignore=shutil.ignore_patterns(".run.lock"))
    return run_dir


# --- "train longer" -----------------------------------------------------------------


def test_train_longer_extends_a_finished_run(finished_run, tiny_data_options):
    before = results(finished_run)
    assert before["training"]["steps"] == 6 and before["training"]["val_loss"] is not None
    done = train([f"resume={finished_run}", "trainer.max_steps=10"])
    assert done.returncode == 0, done.stderr[-3000:]
    after = results(finished_run)
    assert after["status"] == "complete" and after["training"]["steps"] == 10
    assert read_checkpoint(os.path.join(finished_run, "checkpoints", "last.ckpt"))["global_step"] == 10
    # No validation ran in steps 6-9 (every 3rd step: 9 did): the losses are measured, never None.
    assert after["training"]["train_loss"] is not None and after["training"]["val_loss"] is not None
    # The schedule is re-planned over the new total from step 6 on (README, "Resume, stop, faults").
    import csv

    resumed = os.path.join(finished_run, "csv", "version_1", "metrics.csv")
    lrs = [float(row["lr-AdamW/pg1"]) for row in csv.DictReader(open(resumed)) if row.get("lr-AdamW/pg1")]
    optim = before["config"]["optim"]
    want = [
        optim["lr"] * warmup_cosine(step, optim["warmup_steps"], 10, optim["min_lr_ratio"]) for step in range(6, 10)
    ]
    assert len(lrs) == 4 and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(lrs, want)), (lrs, want)


def test_train_longer_refuses_a_total_that_adds_no_steps(finished_run):
    before = digest(finished_run)
    for steps in (6, 4):
        message = one_paragraph(train([f"resume={finished_run}", f"trainer.max_steps={steps}"]), 2)
        assert f"already trained 6 steps, and trainer.max_steps={steps} asks for no more" in message
        assert "trainer.max_steps=12" in message
    assert digest(finished_run) == before


def test_an_extended_run_that_is_interrupted_resumes_again(finished_run):
    # Stop the extension right after its first new checkpoint (step 9), as a kill would.
    stopper = os.path.join(os.path.dirname(finished_run), "stop_at_9.py")
    with open(stopper, "w") as f:
        f.write(
            textwrap.dedent(f"""
            import os, runpy, signal, sys
            import lightning as L
            class Stop(L.Callback):
                def on_train_batch_end(self, trainer, *a):
                    if trainer.global_step == 9:
                        os.kill(os.getpid(), signal.SIGTERM)
            import rope_lm.runs.pipeline as P
            real = P.trainer_kwargs
            def with_stop(*a, **k):
                kw = real(*a, **k)
                kw["callbacks"].append(Stop())
                return kw
            P.trainer_kwargs = with_stop
            sys.argv[0] = {os.path.join(ROOT, "train.py")!r}
            runpy.run_path(sys.argv[0], run_name="__main__")
        """)
        )
    stopped = train([f"resume={finished_run}", "trainer.max_steps=14"], script=stopper)
    assert stopped.returncode != 0 and "Traceback" not in stopped.stderr
    assert results(finished_run)["status"] == "interrupted"
    assert results(finished_run)["training"]["steps"] == 9
    done = train([f"resume={finished_run}"])  # the extended total (14) is the run's own setting now
    assert done.returncode == 0, done.stderr[-3000:]
    assert results(finished_run)["training"]["steps"] == 14 and results(finished_run)["status"] == "complete"


# --- one run, one folder --------------------------------------------------------------


def test_two_runs_started_together_get_their_own_folders(tiny_data_options, tmp_path):
    args = [a for a in run_args(tiny_data_options, "unused") if not a.startswith("hydra.run.dir")]
    procs = [
        forked.start(
            [sys.executable, os.path.join(ROOT, "train.py"), *args, f"seed={s}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in (1, 2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    runs = sorted(glob.glob(str(tmp_path / "outputs" / "*" / "*")))
    assert len(runs) == 2
    assert sorted(results(r)["config"]["seed"] for r in runs) == [1, 2]


def test_a_folder_holding_another_run_is_refused(finished_run, tiny_data_options):
    before = digest(finished_run)
    message = one_paragraph(train(run_args(tiny_data_options, finished_run, seed=5)), 2)
    assert f"The run folder {finished_run} already holds another run's files" in message
    assert f"python train.py resume={finished_run}" in message
    assert digest(finished_run) == before


# --- the checkpoint's corpus and tokenizer ------------------------------------------------


def test_resuming_on_a_changed_corpus_is_refused(tiny_data_options, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    options = {**tiny_data_options, "path": corpus}
    run_dir = str(tmp_path / "run")
    assert train(run_args(options, run_dir)).returncode == 0
    old = results(run_dir)["corpus"]["fingerprint"]
    with open(os.path.join(corpus, "bisect.txt"), "a") as f:
        f.write("\n# one more line\n")
    before = digest(run_dir)
    message = one_paragraph(train([f"resume={run_dir}", "trainer.max_steps=10"]), 2)
    assert "The corpus has changed" in message and f"trained on fingerprint {old}" in message
    new = message.split("now has fingerprint ")[1].split(",")[0]
    assert new != old and len(new) == 16
    assert digest(run_dir) == before


def test_a_finetune_with_another_tokenizer_is_refused(finished_run, tiny_data_options, tmp_path):
    other = tmp_path / "other_tokenizer.json"
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(other))
    args = run_args(tiny_data_options, tmp_path / "ft", **{"data.seq_len": 32})
    message = one_paragraph(train([*args, f"init_from={finished_run}", f"data.tokenizer_file={other}"]), 2)
    assert "is not the tokenizer init_from=" in message and "leave data.tokenizer_file unset" in message
    assert not os.path.exists(tmp_path / "ft" / "checkpoints")


# --- evaluation beside training ---------------------------------------------------------


def test_evaluation_writes_its_own_folder_and_keeps_results(finished_run):
    before = digest(finished_run)
    script = os.path.join(ROOT, "scripts", "eval_extrapolation.py")
    for n in (1, 2):
        done = forked.run(
            [sys.executable, script, f"ckpt={finished_run}", "eval.token_budget=256", "eval.multipliers=[1,2]"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert digest(finished_run) == before  # the training run's own files are untouched
    assert results(os.path.join(finished_run, "eval", "none"))["results"]
    assert results(os.path.join(finished_run, "eval", "none-2"))["results"]
    refused = forked.run(
        [sys.executable, script, f"ckpt={finished_run}", f"out={finished_run}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    message = one_paragraph(refused, 2)
    assert f"out={finished_run} already holds results" in message
    assert digest(finished_run) == before


@pytest.mark.parametrize(
    "content,pattern",
    [
        (b"", "is empty (0 bytes)"),
        (b"not a checkpoint at all\n" * 10, "is not a checkpoint"),
        (None, "is a torch file but not a rope-lm checkpoint"),
    ],
)
def test_evaluating_something_that_is_not_a_checkpoint(tmp_path, content, pattern):
    path = tmp_path / "model.ckpt"
    if content is None:
        torch.save({"weights": torch.zeros(2)}, path)
    else:
        path.write_bytes(content)
    script = os.path.join(ROOT, "scripts", "eval_extrapolation.py")
    done = forked.run([sys.executable, script, f"ckpt={path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert pattern in one_paragraph(done, 2)


# --- sweeps -------------------------------------------------------------------------------


def test_one_bad_job_does_not_end_a_sweep(tiny_data_options, tmp_path):
    sweep = tmp_path / "sweep"
    args = [a for a in run_args(tiny_data_options, "unused") if not a.startswith(("hydra.run.dir", "model.d_model"))]
    done = train(["-m", *args, "model.d_model=33,32", f"hydra.sweep.dir={sweep}"])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    text = " ".join(done.stderr.split())
    assert "rope-lm sweep: 1 of 2 jobs failed" in text
    assert "job 0 [" in text and "model.d_model=33 is not divisible by model.n_head=2" in text
    jobs = json.load(open(sweep / "jobs.json"))
    assert [j["status"] for j in jobs] == ["failed", "complete"]
    assert results(jobs[1]["output_dir"])["status"] == "complete"  # the job after the failure ran
    assert results(jobs[0]["output_dir"])["status"] == "failed"
    compared = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), f"path={sweep}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert "FAILED: `" in compared.stdout and "is not divisible" in compared.stdout


# --- the disk -----------------------------------------------------------------------------


def _inject(tmp_path, code: str) -> str:
    path = tmp_path / "inject.py"
    path.write_text(
        textwrap.dedent(code)
        + textwrap.dedent(f"""
        import runpy, sys
        sys.argv[0] = {os.path.join(ROOT, "train.py")!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
    """)
    )
    return str(path)


def test_a_full_disk_while_checkpointing(tiny_data_options, tmp_path):
    # The third checkpoint write (step 6) meets a full disk, as torch reports it.
    script = _inject(
        tmp_path,
        """
        import torch
        real, calls = torch.save, []
        def save(obj, f, *a, **k):
            calls.append(f)
            if len(calls) > 2:
                open(f, "wb").write(b"PK" * 100)
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4310")
            return real(obj, f, *a, **k)
        torch.save = save
    """,
    )
    run_dir = tmp_path / "run"
    message = one_paragraph(train(run_args(tiny_data_options, run_dir), script=script), 1)
    assert "Could not write" in message and "the disk is full" in message and "is untouched" in message
    saved = read_checkpoint(str(run_dir / "checkpoints" / "last.ckpt"))  # the last good one
    assert saved["global_step"] == 3
    assert not glob.glob(str(run_dir / "checkpoints" / ".tmp-*"))


def test_an_output_folder_that_becomes_unwritable(tiny_data_options, tmp_path):
    # Training and its checkpoints succeed; writing the results then meets a permission error.
    script = _inject(
        tmp_path,
        """
        import errno, tempfile
        real = tempfile.mkstemp
        def mkstemp(*a, **k):
            if "results" in (k.get("prefix") or ""):
                raise PermissionError(errno.EACCES, "Permission denied")
            return real(*a, **k)
        tempfile.mkstemp = mkstemp
    """,
    )
    run_dir = tmp_path / "run"
    message = one_paragraph(train(run_args(tiny_data_options, run_dir), script=script), 1)
    assert (
        "Could not write" in message and "results.json" in message and "is not writable (Permission denied)" in message
    )
    assert read_checkpoint(str(run_dir / "checkpoints" / "last.ckpt"))["global_step"] == 6


# --- types and records ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("data.seq_len=abc", "data.seq_len='abc' has the wrong type: it must be an integer"),
        ("trainer.gradient_clip_val=lots", "trainer.gradient_clip_val='lots' has the wrong type"),
        ("eval.batch_tokens=0", "eval.batch_tokens=0 must be a positive integer"),
        ("pos.base=ten", "pos.base='ten' has the wrong type: it must be a number"),
    ],
)
def test_wrong_types_on_the_command_line(tiny_data_options, tmp_path, override, pattern):
    options = {**tiny_data_options, "cache_dir": str(tmp_path / "cache")}
    args = [a for a in run_args(options, tmp_path / "run") if not a.startswith(override.split("=")[0] + "=")]
    assert pattern in one_paragraph(train([*args, override]), 2)
    assert not os.path.exists(tmp_path / "cache")  # refused before the cache was built
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_bad_records_are_refused_or_skipped_and_counted(tiny_data_options, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    corpus = write_corpus(tmp_path / "c")
    good = [{"text": open(os.path.join(corpus, n)).read()} for n in sorted(os.listdir(corpus))]
    lines = [json.dumps(r) for r in good[:6]] + ['{"text": null}'] + [json.dumps(r) for r in good[6:]] + ['["a list"]']
    (data / "docs.jsonl").write_text("\n".join(lines) + "\n")
    options = {**tiny_data_options, "path": str(data)}
    message = one_paragraph(train(run_args(options, tmp_path / "run")), 2)
    assert f"{data / 'docs.jsonl'}, line 7: the field 'text' is null, not a string" in message
    assert "data.skip_bad_records=true" in message
    done = train([*run_args(options, tmp_path / "run2"), "data.skip_bad_records=true"])
    assert done.returncode == 0, done.stderr[-2000:]
    log = done.stdout + done.stderr  # Hydra's job logging writes to stdout
    assert "Skipped 2 bad record(s)" in log and "line 7, line 14" in log
    assert results(tmp_path / "run2")["corpus"]["documents"]["train"] + sum(
        results(tmp_path / "run2")["corpus"]["documents"][s] for s in ("valid", "test")
    ) == len(good)
