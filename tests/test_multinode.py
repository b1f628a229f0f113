"""Many nodes (rope_lm/train/distributed.py): processes a launcher starts on every node, joined by
Lightning, on this machine's CPU over gloo, as docs/training.md#many-nodes runs them.

* torchrun --nnodes=2 --nproc-per-node=1 (two torchrun processes, a c10d rendezvous on 127.0.0.1)
  trains the loss curve of one node with two devices (trainer.devices=2, DDP), one run folder,
  evaluated once by global rank 0;
* two processes with the environment srun gives them (SLURM_PROCID, SLURM_NNODES, ...) do the
  same; a SIGTERM to the second one stops both after the same step with a checkpoint that
  resumes on one node with two devices and continues the curve as if never stopped; a SIGKILL
  to it ends the first at once, in one paragraph;
* a process that cannot reach its rendezvous (or a job where the others never come), settings
  or folders that differ between the processes, rank 0's refusal of the folder, and a launch
  that does not fit trainer.num_nodes / trainer.devices are one paragraph each, in every
  process, within the rendezvous timeout;
* the data order is one sequence of samples over all processes, and a checkpoint resumes on
  another number of them at the next sample.
"""

import csv
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

from conftest import ROOT
import pytest
import torch

from rope_lm.core.errors import ConfigError
from tests import forked

STEPS = 4  # the torchrun job's
REFERENCE_STEPS = 12  # the reference's: the stopped job resumes to a few steps past its stop
# Tiny, and a constant learning rate, so that a job stopped at any step and resumed to N steps follows the
# schedule of one planned for N from the start.
SETTINGS = [
    "model.n_layer=2",
    "model.n_head=4",
    "model.d_model=32",
    "optim.warmup_steps=0",
    "optim.min_lr_ratio=1.0",
    "trainer.accelerator=cpu",
    "trainer.strategy=ddp",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=3",
    "trainer.ckpt_every_n_steps=2",
    "trainer.enable_progress_bar=false",
    "logger=csv",
    "eval.multipliers=[1,2]",
    "eval.token_budget=64",
    "eval.batch_tokens=64",
    "eval.bootstrap=0",
]
TWO_NODES = ["trainer.num_nodes=2", "trainer.devices=1"]
ONE_NODE = ["trainer.num_nodes=1", "trainer.devices=2"]
TIMEOUT = 180  # a bound on every process: none of them may hang


def data_overrides(options):
    return ["data=local_files"] + [f"data.{k}={v}" for k, v in {**options, "batch_size": 2}.items()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    """This process's environment without any launcher's variables, plus `extra`."""
    launcher = ("SLURM_", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_", "MASTER_", "ROPE_LM_CLAIMED")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher)}
    return {**env, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **extra}


def slurm_env(rank: int, port: int, tasks: int = 2) -> dict:
    """What srun gives task `rank` of `tasks`, one task on each of `tasks` nodes (Lightning's
    SLURMEnvironment reads SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
    SLURM_NTASKS_PER_NODE, SLURM_JOB_NAME; MASTER_ADDR and MASTER_PORT, else the first host of
    SLURM_NODELIST and a port from SLURM_JOB_ID)."""
    return clean_env(
        SLURM_NTASKS=str(tasks),
        SLURM_NTASKS_PER_NODE="1",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID="0",
        SLURM_NODEID=str(rank),
        SLURM_NNODES=str(tasks),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="rope-lm",
        SLURM_NODELIST="127.0.0.1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def train_py(args, env, cwd=ROOT):
    """train.py as a process of its own (forked from the tests' server: its imports are done)."""
    return forked.start(
        [sys.executable, os.path.join(ROOT, "train.py"), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ended(proc, status=0):
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"a process of the job did not end within {TIMEOUT} s") from None
    assert proc.returncode == status, out[-4000:]
    return " ".join(out.split())  # a paragraph is wrapped at 100 columns


def curve(run_dir) -> list[float]:
    """The logged train/loss over every sitting of the run (csv/version_N), in order."""
    rows = []
    for path in sorted(glob.glob(os.path.join(run_dir, "csv", "version_*", "metrics.csv"))):
        with open(path) as f:
            rows += [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]
    return rows


@pytest.fixture(scope="module")
def reference(tiny_data_options, tmp_path_factory):
    """One node, two devices (Lightning starts the second process): the curve every form must give.
    Trained once a session: test workers (pytest-xdist) share it through their common folder."""
    from filelock import FileLock

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    kept = shared / "multinode_reference.json"
    with FileLock(str(kept) + ".lock"):
        if kept.exists():
            return json.loads(kept.read_text())
        run = tmp_path_factory.mktemp("one_node") / "run"
        args = [*data_overrides(tiny_data_options), *SETTINGS, *ONE_NODE, f"trainer.max_steps={REFERENCE_STEPS}"]
        ended(train_py([*args, f"hydra.run.dir={run}"], clean_env()))
        got = curve(run)
        assert len(got) == REFERENCE_STEPS and len({round(v, 4) for v in got}) == REFERENCE_STEPS  # it trained
        kept.write_text(json.dumps(got))
        return got


def test_torchrun_two_nodes_train_like_one_node_with_two_devices(reference, tiny_data_options, tmp_path):
    run = tmp_path / "job"
    port = free_port()
    node = [
        sys.executable,
        "-m",
        "torch.distributed.run",  # torchrun
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        os.path.join(ROOT, "train.py"),
        *data_overrides(tiny_data_options),
        *SETTINGS,
        *TWO_NODES,
        f"trainer.max_steps={STEPS}",
        f"hydra.run.dir={run}",
    ]
    started = time.monotonic()
    nodes = [
        subprocess.Popen(node, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [ended(p) for p in nodes]
    print(f"torchrun job: {time.monotonic() - started:.1f} s")

    assert curve(run) == pytest.approx(reference[:STEPS], rel=1e-6, abs=0)
    # One folder, one evaluation: results.md printed by the node that holds global rank 0 alone.
    assert sum("Results: " in out for out in outputs) == 1
    assert os.listdir(tmp_path) == ["job"]
    with open(run / "results.json") as f:
        results = json.load(f)
    assert results["status"] == "complete" and len(results["results"]) == 2
    assert results["training"]["steps"] == STEPS
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["LMDataModule"] == {"samples": STEPS * 2 * 2, "step": STEPS}  # steps x processes x batch


def training_srun_job(tiny_data_options, run):
    """Two processes as srun starts them, training for good (max_steps out of reach), once their
    first checkpoint (step 2) is on disk."""
    port = free_port()
    args = [
        *data_overrides(tiny_data_options),
        *SETTINGS,
        *TWO_NODES,
        "trainer.max_steps=100000",
        f"hydra.run.dir={run}",
    ]
    started = time.monotonic()
    tasks = [train_py(args, slurm_env(rank, port)) for rank in (0, 1)]
    while not (run / "checkpoints" / "last.ckpt").exists():
        assert all(t.poll() is None for t in tasks), [t.communicate()[0][-3000:] for t in tasks if t.poll() is not None]
        assert time.monotonic() - started < TIMEOUT
        time.sleep(0.02)
    return tasks


def test_srun_tasks_stop_together_on_sigterm_and_resume_on_one_node(reference, tiny_data_options, tmp_path):
    run = tmp_path / "job"
    last = run / "checkpoints" / "last.ckpt"
    started = time.monotonic()
    tasks = training_srun_job(tiny_data_options, run)
    tasks[1].send_signal(signal.SIGTERM)  # the second node's process only; rank 0 writes the checkpoint
    outputs = [ended(t, 128 + signal.SIGTERM) for t in tasks]
    print(f"srun job, stopped: {time.monotonic() - started:.1f} s")

    saved = torch.load(last, map_location="cpu", weights_only=False)
    stop = saved["global_step"]
    assert 2 <= stop <= REFERENCE_STEPS - 2, stop
    assert all(f"Stopped at step {stop};" in out for out in outputs)
    with open(run / "results.json") as f:
        results = json.load(f)
    assert results["status"] == "interrupted" and results["training"]["steps"] == stop

    # Resumed on one node with two devices (Lightning starts the second process), to two steps past the stop.
    ended(train_py([f"resume={run}", *ONE_NODE, f"trainer.max_steps={stop + 2}"], clean_env()))
    assert curve(run) == pytest.approx(reference[: stop + 2], rel=1e-6, abs=0)
    with open(run / "results.json") as f:
        assert json.load(f)["status"] == "complete"


def test_a_process_killed_outright_ends_the_others_in_one_paragraph(tiny_data_options, tmp_path):
    """SIGKILL leaves no stop to agree on: the other process finds the closed connection in its next
    collective and ends at once, in one paragraph, the last checkpoint kept for a resume."""
    run = tmp_path / "job"
    tasks = training_srun_job(tiny_data_options, run)
    killed = time.monotonic()
    tasks[1].kill()
    out = ended(tasks[0], 1)
    assert time.monotonic() - killed < 30
    assert "rank 0 of 2 (node 0 of 2, host" in out
    assert "another process of this srun job ended while this one waited for it in training" in out
    assert "Traceback" not in out
    tasks[1].wait(TIMEOUT)
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] >= 2


@pytest.mark.parametrize("present", [0, 1])
def test_a_process_that_cannot_meet_the_others_fails_in_one_paragraph(present, tiny_data_options, tmp_path):
    """Only one process of a two-process srun job comes: rank 1 finds no store at MASTER_ADDR:MASTER_PORT,
    rank 0 waits for a process that never comes; both end within the rendezvous timeout."""
    run = tmp_path / "job"
    args = [*data_overrides(tiny_data_options), *SETTINGS, *TWO_NODES, "trainer.rendezvous_timeout_s=2"]
    started = time.monotonic()
    out = ended(train_py([*args, f"hydra.run.dir={run}"], slurm_env(present, free_port())), 1)
    assert time.monotonic() - started < 60
    assert "could not meet the others of this srun job" in out and "rendezvous_timeout_s=2 s" in out
    assert ("only some of the 2 processes came" in out) == (present == 0)
    assert "Traceback" not in out
    assert not (run / "checkpoints").exists() and not (run / "run.yaml").exists()


@pytest.mark.parametrize("case", ["settings", "folders", "taken"])
def test_a_refusal_in_one_process_stops_every_process(case, tiny_data_options, tmp_path):
    """Settings or folders that differ between the processes, and a refusal by the rank 0 that claims
    the folder (it holds another run's files): every process ends with the paragraph, none waits."""
    port = free_port()
    base = [*data_overrides(tiny_data_options), *SETTINGS, *TWO_NODES, "trainer.rendezvous_timeout_s=60"]
    job = f"hydra.run.dir={tmp_path / 'job'}"
    if case == "settings":  # one folder; the second node runs another seed
        argv = [[*base, job], [*base, "seed=7", job]]
    elif case == "folders":  # Hydra's default folder: named by the time and a random id in each process
        argv = [base, base]
    else:
        (tmp_path / "job").mkdir()
        (tmp_path / "job" / "results.json").write_text(json.dumps({"status": "complete", "config": {"seed": 1}}))
        argv = [[*base, job], [*base, job]]
    tasks = [train_py(argv[rank], slurm_env(rank, port), cwd=tmp_path) for rank in (0, 1)]
    outputs = [ended(t, 2) for t in tasks]
    for rank, out in enumerate(outputs):
        assert "Traceback" not in out
        if case == "settings":
            assert "were given different settings (seed: 1337 on rank 0, 7 on rank 1)" in out
        elif case == "folders":
            assert "were given different run folders" in out and "hydra.run.dir=<folder>" in out
        else:
            assert ("rank 0 of this srun job stopped it: " in out) == (rank == 1)
            assert f"The run folder {tmp_path / 'job'} already holds another run's files (results.json)" in out
    if case == "folders":  # rank 0's folder records the refusal; the other's, Hydra's alone, is gone
        made = glob.glob(str(tmp_path / "outputs" / "*" / "*"))
        assert len(made) == 1 and "results.json" in os.listdir(made[0])
        with open(os.path.join(made[0], "results.json")) as f:
            assert json.load(f)["status"] == "failed"
    elif case == "taken":  # the other run's record is untouched
        assert json.loads((tmp_path / "job" / "results.json").read_text())["status"] == "complete"
    else:
        assert not (tmp_path / "job" / "checkpoints").exists()


def test_the_rendezvous_timeout_is_a_positive_number_of_seconds():
    from rope_lm.train.trainer import trainer_config

    assert trainer_config({"rendezvous_timeout_s": 30}).rendezvous_timeout_s == 30
    assert trainer_config({}).rendezvous_timeout_s is None  # 600 s, and an older run.yaml compares equal
    with pytest.raises(ConfigError, match=r"trainer.rendezvous_timeout_s=0(\.0)? must be a positive number of seconds"):
        trainer_config({"rendezvous_timeout_s": 0})


def test_launches_that_do_not_fit_the_trainer_settings_are_refused(monkeypatch):
    from rope_lm.train import distributed

    with pytest.raises(ConfigError, match=r"trainer.num_nodes=2: a run over several nodes is started by a launcher"):
        distributed.check_launch(None, {"num_nodes": 2})
    distributed.check_launch(None, {"num_nodes": 1, "devices": 4})  # Lightning starts a node's processes itself

    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "_JOB", None)  # this process's own answer comes back after the test
    monkeypatch.setattr(distributed, "_LOOKED", False)
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)
    job = distributed.launched_job()
    assert (job.launcher, job.rank, job.world, job.node, job.nodes, job.per_node) == ("torchrun", 3, 4, 1, 2, 2)
    assert rank_zero_only.rank == 3 and distributed.is_other_rank(job)
    distributed.check_launch(job, {"num_nodes": 2, "devices": 2})
    distributed.check_launch(job, {"num_nodes": 2, "devices": "auto"})
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=1, but the launcher started this job on 2 node"):
        distributed.check_launch(job, {"num_nodes": 1})
    with pytest.raises(ConfigError, match=r"trainer.devices=1, but the launcher started 2 process\(es\) on each"):
        distributed.check_launch(job, {"num_nodes": 2, "devices": 1})


def test_a_resume_on_another_number_of_processes_reads_the_next_samples(tiny_cache, tiny_data_options):
    """The data order is one sequence of samples over all processes: rank r of W reads every W-th from
    r. A checkpoint records how many were read, so a resume with another world (and so another
    global batch) starts at the next one, where counting steps x its own global batch would not."""
    from types import SimpleNamespace

    from rope_lm.data.loaders import LMDataModule
    from rope_lm.data.token_cache import DataConfig

    cfg = DataConfig(**{k: v for k, v in tiny_data_options.items() if k in DataConfig.__dataclass_fields__})
    cfg.batch_size = 2

    def loader(world, rank, step, state=None):
        module = LMDataModule(tiny_cache, cfg, seed=3)
        if state is not None:
            module.load_state_dict(state)
        module.trainer = SimpleNamespace(world_size=world, global_rank=rank, global_step=step)
        return module, iter(module.train_dataloader().sampler)

    def take(sampler, n):
        return [next(sampler) for _ in range(n)]

    # Two processes of batch 2 read the global batches of one process of batch 4, step by step.
    _, alone = loader(1, 0, 0)
    ranks = [loader(2, r, 0)[1] for r in (0, 1)]
    for _ in range(3):
        per_rank = [take(s, 2) for s in ranks]
        assert sorted(per_rank[0] + per_rank[1]) == sorted(take(alone, 4))

    # Stopped after 3 steps on 2 processes: 12 samples read. Resumed on one process (batch 2 a step).
    two, _ = loader(2, 0, 3)
    state = two.state_dict()
    assert state == {"samples": 12, "step": 3}
    _, resumed = loader(1, 0, 3, state)
    _, order = loader(1, 0, 0)
    sequence = take(order, 20)
    assert take(resumed, 4) == sequence[12:16]
    one, _ = loader(1, 0, 5, state)  # two steps later on the one process: 12 + 2 x 2
    assert one.state_dict() == {"samples": 16, "step": 5}
    # A checkpoint from before the count was kept resumes as it always did: steps x this global batch.
    _, old = loader(1, 0, 3)
    assert take(old, 2) == sequence[6:8]
