"""existing=continue: a study's command run again finishes what is missing
(complete runs skipped, an interrupted run resumed, a half-done evaluation
finished) and ends with the results of one uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

from filelock import FileLock
import pytest

from rope_lm.core.errors import ConfigError
from rope_lm.runs.config import resolve_run
from rope_lm.runs.pipeline import claim_train
from rope_lm.runs.run_folder import RUN_CONFIG, Skip, Start, describe
from tests import forked
from tests.conftest import ROOT, cli_overrides

STEPS = 60


def sweep_cmd(tiny_data_options, sweep_dir):
    args = cli_overrides(
        tiny_data_options,
        "unused",
        **{
            "trainer.max_steps": STEPS,
            "trainer.val_every_n_steps": 30,
            "trainer.ckpt_every_n_steps": 5,
            "trainer.log_every_n_steps": 10,
            "existing": "continue",
        },
    )
    args = [a for a in args if not a.startswith("hydra.run.dir=")]
    return [sys.executable, "train.py", "-m", "pos=rope,alibi", *args, f"hydra.sweep.dir={sweep_dir}"]


def rows(run_dir):
    with open(os.path.join(run_dir, "results.json")) as f:
        results = json.load(f)
    return results["status"], [(r["length"], r["ppl"], r["ppl_beyond"]) for r in results["results"]]


def jobs(sweep_dir):
    with open(os.path.join(sweep_dir, "jobs.json")) as f:
        return [(os.path.basename(j["output_dir"]), j["status"]) for j in json.load(f)]


def test_a_study_in_sittings_ends_like_one_uninterrupted_run(tiny_data_options, tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    done = forked.run(sweep_cmd(tiny_data_options, whole), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(d for d in os.listdir(whole) if d[0].isdigit())
    assert names == ["0_rope_none_L16", "1_alibi_none_L16"]

    # Sitting 1: killed while the second run trains (after one of its checkpoints).
    proc = forked.start(
        sweep_cmd(tiny_data_options, parts), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpt = os.path.join(parts, names[1], "checkpoints", "last.ckpt")
    deadline = time.time() + 300
    while not os.path.exists(ckpt) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (
        not os.path.exists(os.path.join(parts, names[1], "results.json"))
        or rows(os.path.join(parts, names[1]))[0] != "complete"
    )
    # ... and the first run's evaluation is cut short too: one length missing, as a crash there leaves it.
    first = os.path.join(parts, names[0], "results.json")
    with open(first) as f:
        results = json.load(f)
    results["results"], results["status"] = results["results"][:-1], "evaluating"
    with open(first, "w") as f:
        json.dump(results, f)

    # Sitting 2: the same command finishes the first run's evaluation and resumes the second.
    again = forked.run(sweep_cmd(tiny_data_options, parts), cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "evaluating its final checkpoint" in again.stderr and "resuming from step" in again.stderr
    for name in names:
        assert rows(os.path.join(parts, name)) == rows(os.path.join(whole, name))
    assert jobs(parts) == jobs(whole) == [(names[0], "complete"), (names[1], "complete")]

    # Sitting 3: nothing left; nothing is touched.
    stamps = {n: os.path.getmtime(os.path.join(parts, n, "results.json")) for n in names}
    third = forked.run(sweep_cmd(tiny_data_options, parts), cwd=ROOT, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-3000:]
    assert third.stderr.count("its results are complete; skipped") == 2
    assert "2 of them skipped" in third.stderr
    assert stamps == {n: os.path.getmtime(os.path.join(parts, n, "results.json")) for n in names}
    assert jobs(parts) == jobs(whole)


def settings(tiny_data_options, **extra):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [a for a in cli_overrides(tiny_data_options, "unused", **extra) if not a.startswith("hydra.")]
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return resolve_run(OmegaConf.to_container(cfg, resolve=True))


def test_continue_refuses_a_folder_with_other_settings(tiny_data_options, tmp_path):
    run = settings(tiny_data_options, **{"trainer.max_steps": 10, "existing": "continue"})
    import yaml

    (tmp_path / RUN_CONFIG).write_text(yaml.safe_dump({**run.raw, "trainer": {**run.raw["trainer"], "max_steps": 20}}))
    with pytest.raises(ConfigError, match=r"other settings \(trainer.max_steps: 20 there, 10 now\)"):
        claim_train(run, str(tmp_path))


def test_continue_takes_a_folder_whose_run_differs_only_in_bookkeeping(tiny_data_options, tmp_path):
    # The same study finished on another machine: its token cache elsewhere, validating more often.
    run = settings(tiny_data_options, **{"trainer.max_steps": 10, "existing": "continue"})
    import yaml

    saved = {
        **run.raw,
        "data": {**run.raw["data"], "cache_dir": "/elsewhere/cache", "num_proc": 8},
        "trainer": {**run.raw["trainer"], "val_every_n_steps": 7, "ckpt_every_n_steps": 3},
    }
    (tmp_path / RUN_CONFIG).write_text(yaml.safe_dump(saved))
    assert describe(claim_train(run, str(tmp_path))[1]) == "starting"
    saved["data"]["seq_len"] = run.raw["data"]["seq_len"] * 2  # but not a setting that changes the model
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / RUN_CONFIG).write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match=r"other settings \(data.seq_len: "):
        claim_train(run, str(tmp_path / "other"))


def test_continue_skips_a_folder_another_process_holds(tiny_data_options, tmp_path):
    run = settings(tiny_data_options, **{"existing": "continue"})
    with FileLock(str(tmp_path / ".run.lock")):
        assert claim_train(run, str(tmp_path))[1] == Skip("another process is running it")


def test_continue_starts_a_run_that_stopped_before_its_first_checkpoint(tiny_data_options, tmp_path):
    run = settings(tiny_data_options, **{"existing": "continue"})
    (tmp_path / "results.json").write_text(json.dumps({"status": "failed", "error": "killed", "results": []}))
    start = claim_train(run, str(tmp_path))[1]
    assert start == Start(None) and describe(start) == "starting"
    assert not (tmp_path / "results.json").exists() and (tmp_path / RUN_CONFIG).exists()


def test_a_study_script_skips_an_evaluation_step_whose_results_are_complete(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import study_common

    from tests.test_compare import write_run

    out = tmp_path / "zero_shot"
    write_run(out, "rope", {"none": lambda L: 10.0, "pi": lambda L: 12.0})
    results = json.loads((out / "results.json").read_text())
    results["config"]["methods"] = [{"name": "none"}, {"name": "pi"}]
    (out / "results.json").write_text(json.dumps(results))
    ran = []
    monkeypatch.setattr(study_common, "run_step", lambda title, args: ran.append(args))
    study_common.evaluate("ckpt", ["none", "pi"], str(out), [])
    assert ran == [] and "is complete; skipped" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="holds an evaluation of other methods"):
        study_common.evaluate("ckpt", ["none", "yarn"], str(out), [])
    results["results"] = results["results"][:-1]  # one length missing: the step runs again, from the start
    (out / "results.json").write_text(json.dumps(results))
    study_common.evaluate("ckpt", ["none", "pi"], str(out), [])
    assert len(ran) == 1 and not (out / "results.json").exists()


def test_a_sweep_stopped_by_sigterm_says_so_and_the_same_command_finishes_it(tiny_data_options, tmp_path):
    sweep = str(tmp_path / "sweep")
    proc = forked.start(
        sweep_cmd(tiny_data_options, sweep), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ckpt = os.path.join(sweep, "0_rope_none_L16", "checkpoints", "last.ckpt")
    deadline = time.time() + 300
    while not os.path.exists(ckpt) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the first job ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    err = " ".join(proc.communicate(timeout=120)[1].split())
    assert "rope-lm sweep: interrupted at job 0" in err and "jobs completed" not in err
    assert jobs(sweep) == [("0_rope_none_L16", "interrupted")]
    again = forked.run(sweep_cmd(tiny_data_options, sweep), cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert jobs(sweep) == [("0_rope_none_L16", "complete"), ("1_alibi_none_L16", "complete")]


def test_two_processes_finishing_one_sweep_keep_each_others_records_in_jobs_json(tmp_path):
    """Each process skips the run the other one trains; the record must end with
    both runs completed, whichever process writes last."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from rope_lm.cli import SweepSummary

    def ended(summary, num, name, skipped=None):
        config = OmegaConf.create({"hydra": {"job": {"num": num}, "runtime": {"output_dir": str(tmp_path / name)}}})
        ret = JobReturn(
            overrides=[f"pos={name}"],
            status=JobStatus.COMPLETED,
            _return_value={"skipped": skipped} if skipped else {"ppl": 1.0},
        )
        summary.on_job_end(config, ret)

    a, b = SweepSummary(), SweepSummary()
    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    a.on_multirun_start(sweep)
    b.on_multirun_start(sweep)
    ended(b, 0, "rope", skipped="another process is running it")
    ended(a, 0, "rope")
    ended(b, 1, "alibi")
    ended(a, 1, "alibi", skipped="another process is running it")
    ended(b, 2, "t5", skipped="another process is running it")  # t5 is still running in a third process
    with open(tmp_path / "jobs.json") as f:
        record = [(os.path.basename(j["output_dir"]), j["status"], j.get("reason")) for j in json.load(f)]
    assert record == [
        ("rope", "complete", None),
        ("alibi", "complete", None),
        ("t5", "skipped", "another process is running it"),
    ]
    # An earlier sitting was stopped by a signal in a fourth run (what print_summary records then).
    a._record(
        {
            "num": 3,
            "status": "interrupted",
            "overrides": [],
            "output_dir": str(tmp_path / "kerple"),
            "error": "stopped by a signal",
        },
        keep_overrides=True,
    )
    # The third process and the interrupted run ended without a record of their own (finished elsewhere);
    # a later sitting's skip tells what is true now, and leaves completed runs as they were.
    c = SweepSummary()
    c.on_multirun_start(sweep)
    ended(c, 0, "rope", skipped="its results are complete")
    ended(c, 2, "t5", skipped="its results are complete")
    ended(c, 3, "kerple", skipped="its results are complete")
    with open(tmp_path / "jobs.json") as f:
        record = [(os.path.basename(j["output_dir"]), j["status"], j.get("reason")) for j in json.load(f)]
    assert record == [
        ("rope", "complete", None),
        ("alibi", "complete", None),
        ("t5", "skipped", "its results are complete"),
        ("kerple", "skipped", "its results are complete"),
    ]
    a.printed = b.printed = c.printed = True  # no summary at the test process's exit
