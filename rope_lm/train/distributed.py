"""Jobs whose processes a launcher started: torchrun on each node, or SLURM's srun.

Lightning starts the other processes of a one-node run itself (trainer.devices=N): they are its
children and take rank 0's claim of the run folder from its environment
(runs/run_folder.hand_to_ranks). Under a launcher every process starts on its own, on its own
node, with the same command, and Lightning only joins them (its TorchElasticEnvironment and
SLURMEnvironment, which this module reads the same way). Before any of them writes, they meet, on
a key-value store at the launcher's rendezvous address (torch.distributed.rendezvous, env://:
torchrun's agent store, or one that global rank 0 hosts at MASTER_ADDR:MASTER_PORT under srun):

1. `connect`, within trainer.rendezvous_timeout_s: a process that cannot reach the address, or a
   job where some processes never come, ends in one paragraph, not a hang;
2. `meet`: every process posts a hash of its settings, its run folder and the error its own
   checks raised, if any; settings or folders that differ, or any error, stop every process;
3. `share`: global rank 0 alone claims the run folder and posts what the run does there;
4. `ready`, right before Lightning's fit: every process posts whether its own preparations
   (the checkpoint, the token cache, the trainer) worked; then the default process group is made
   on the store they met at, with the backend Lightning would choose (nccl for CUDA devices, gloo
   otherwise) and torch's default timeout, and Lightning, finding it made, uses it.

`StopTogether` is the training-time half: a stop (SIGTERM, Ctrl-C) that reaches one process is
agreed at the end of every step, so every process stops after the same step and rank 0 writes a
checkpoint all of them reached.
"""

import atexit
from dataclasses import dataclass, field
import datetime
import hashlib
import json
import logging
import os
import re
import signal
import socket
import textwrap

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from rope_lm.core.errors import ConfigError, RopeLMError

log = logging.getLogger("rope_lm")

DEFAULT_RENDEZVOUS_S = 600.0  # trainer.rendezvous_timeout_s left null: torchrun's own join timeout


class JobFailed(RopeLMError):
    """The processes of a launcher-started job could not meet, or another one stopped."""


@dataclass
class Job:
    """This process's place in a job a launcher started (more than one process)."""

    launcher: str  # "torchrun" or "srun"
    rank: int
    world: int
    node: int
    nodes: int
    per_node: int
    address: str
    port: int
    attempt: str  # the launcher's restart count: keys of an earlier attempt on the same store are not this one's
    store: object = None
    rounds: int = 0  # runs this process began in the job (a sweep runs several)
    waiting: set = field(default_factory=set)  # stages this process still owes the others an answer for

    @property
    def where(self) -> str:
        return f"rank {self.rank} of {self.world} (node {self.node} of {self.nodes}, host {socket.gethostname()})"


_JOB: Job | None = None
_LOOKED = False


def launched_job() -> Job | None:
    """The job this process belongs to, when a launcher (torchrun, srun) started it with others;
    None for a process on its own or one Lightning started (it learns its place from rank 0).
    Read from the environment the way Lightning's cluster environments read it, torchrun first."""
    global _JOB, _LOOKED
    if _LOOKED:
        return _JOB
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    job = None
    if TorchElasticEnvironment.detect():
        env = TorchElasticEnvironment()
        world = env.world_size()
        nodes = int(os.environ.get("GROUP_WORLD_SIZE") or 1)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or max(1, world // nodes))
        if world > 1:
            job = Job(
                "torchrun",
                env.global_rank(),
                world,
                env.node_rank(),
                nodes,
                per_node,
                env.main_address,
                env.main_port,
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
            )
    elif SLURMEnvironment.detect() and int(os.environ.get("SLURM_NTASKS") or 1) > 1:
        try:
            env = SLURMEnvironment()
        except RuntimeError as e:  # Lightning's own check of srun's variables
            raise ConfigError(f"This SLURM job cannot be run: {' '.join(str(e).split())}") from None
        world = env.world_size()
        nodes = int(os.environ.get("SLURM_NNODES") or 1)
        job = Job(
            "srun",
            env.global_rank(),
            world,
            env.node_rank(),
            nodes,
            _tasks_per_node(world, nodes),
            env.main_address,
            env.main_port,
            os.environ.get("SLURM_RESTART_COUNT", "0"),
        )
    if job is not None:
        # Lightning reads the rank for its rank-zero-only writes (loggers) from the environment when it is
        # imported and again when its strategy starts; a process forked from one that imported it earlier
        # (a test harness's server) would take itself for rank 0 until then.
        from lightning.fabric.utilities.rank_zero import rank_zero_only
        from lightning_utilities.core.rank_zero import rank_zero_only as utilities_rank_zero_only

        rank_zero_only.rank = utilities_rank_zero_only.rank = job.rank
    _JOB, _LOOKED = job, True
    return job


def _tasks_per_node(world: int, nodes: int) -> int:
    given = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    head = given.split("(")[0].split(",")[0]  # "2(x3)" and "2,2" are srun's forms for several nodes
    return int(head) if head.isdigit() else max(1, world // max(1, nodes))


def is_other_rank(job: Job | None) -> bool:
    """A process of a launched job that is not global rank 0: it writes nothing of the run's own."""
    return job is not None and job.rank != 0


def check_launch(job: Job | None, trainer: dict) -> None:
    """The trainer settings fit the processes the launcher started; several nodes need a launcher.
    `trainer`: the trainer.* settings as composed."""
    nodes, devices = trainer.get("num_nodes", 1), trainer.get("devices", "auto")
    if job is None:
        if isinstance(nodes, int) and nodes > 1:
            raise ConfigError(
                f"trainer.num_nodes={nodes}: a run over several nodes is started by a launcher on every node, "
                f"which rope-lm joins: torchrun (torchrun --nnodes={nodes} --nproc-per-node=<devices per node> "
                f"--rdzv-backend=c10d --rdzv-endpoint=<first node>:29400 train.py ...) or SLURM's srun (one task per "
                f"device). Started as a plain python command, each node's first process would claim the run folder "
                f"as a run of its own. docs/training.md#many-nodes has both, with the sbatch script."
            )
        return
    how = "torchrun --nnodes" if job.launcher == "torchrun" else "SLURM's --nodes"
    if nodes != job.nodes:
        raise ConfigError(
            f"trainer.num_nodes={nodes}, but the launcher started this job on {job.nodes} node(s) ({how}={job.nodes}, "
            f"{job.world} processes). Set trainer.num_nodes={job.nodes} on every node."
        )
    per = "torchrun --nproc-per-node" if job.launcher == "torchrun" else "SLURM's --ntasks-per-node"
    if isinstance(devices, int) and devices != job.per_node:
        raise ConfigError(
            f"trainer.devices={devices}, but the launcher started {job.per_node} process(es) on each node "
            f"({per}={job.per_node}): one process drives one device. Set trainer.devices={job.per_node}."
        )


def settings_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def rendezvous_seconds(trainer: dict) -> float:
    """trainer.rendezvous_timeout_s as composed (resolve_run checks it; here it is needed before)."""
    value = trainer.get("rendezvous_timeout_s")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else DEFAULT_RENDEZVOUS_S


# --- meeting -------------------------------------------------------------------------------


def connect(job: Job, timeout_s: float) -> None:
    """Reach the job's store (once a process), or one paragraph within `timeout_s`."""
    if job.store is not None:
        return
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", job.address)
    os.environ.setdefault("MASTER_PORT", str(job.port))
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous("env://", job.rank, job.world, timeout=timeout))
    except Exception as e:  # a DistNetworkError, DistStoreError or TimeoutError: all mean "not reached"
        reason = " ".join(str(e).split()) or type(e).__name__
        if job.rank == 0 and job.launcher == "srun":
            then = (
                f"only some of the {job.world} processes came: start every one of them (srun starts one task per "
                f"device; python train.py alone inside an sbatch script starts one)"
            )
        else:
            then = (
                f"no process served {job.address}:{job.port}: check that the first node is up and reachable from "
                f"this one at that address and port (MASTER_ADDR, MASTER_PORT"
                f"{'' if job.launcher == 'srun' else '; the rendezvous endpoint of torchrun'})"
            )
        raise JobFailed(
            f"{job.where} could not meet the others of this {job.launcher} job at {job.address}:{job.port} within "
            f"trainer.rendezvous_timeout_s={timeout_s:g} s: {then}. Nothing was trained. ({type(e).__name__}: "
            f"{_clip(reason)})"
        ) from None
    job.store = store


def exchange(job: Job, stage: str, payload: dict, timeout_s: float, only=None) -> list[dict | None]:
    """Post this process's `payload` for `stage` and read every process's (those in `only`, when
    given; None for the others), each within `timeout_s`."""
    prefix = f"rope_lm/{job.attempt}/{job.rounds}/{stage}"
    job.store.set(f"{prefix}/{job.rank}", json.dumps(payload))
    job.waiting.discard(stage)
    ranks = range(job.world) if only is None else only
    keys = [f"{prefix}/{r}" for r in ranks]
    try:
        job.store.wait(keys, datetime.timedelta(seconds=timeout_s))
        posted = {r: json.loads(job.store.get(k)) for r, k in zip(ranks, keys)}
    except Exception as e:
        missing = [r for r, k in zip(ranks, keys) if not _has(job.store, k)]
        reason = " ".join(str(e).split()) or type(e).__name__
        who = f"rank(s) {', '.join(map(str, missing))}" if missing else "rank 0, which holds the store,"
        raise JobFailed(
            f"{job.where}: {who} did not answer at the {stage!r} stage of the job's start within {timeout_s:g} s "
            f"(it stopped, or is stuck): see that process's own output. ({type(e).__name__}: {_clip(reason)})"
        ) from None
    return [posted.get(r) for r in range(job.world)]


def _has(store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False


def _clip(text: str, limit: int = 300) -> str:
    return textwrap.shorten(text, limit, placeholder=" ...")


def begin(job: Job) -> None:
    """A run begins in this process (the first, or a sweep's next): its stages are new keys."""
    job.rounds += 1
    job.waiting = {"meet", "claim", "ready"}


def error_payload(error: BaseException | None) -> dict:
    if error is None:
        return {}
    return {"error": str(error), "config": isinstance(error, ConfigError)}


def stop_for(job: Job, posted: list[dict | None], own: BaseException | None) -> None:
    """Raise this process's own error, or another's as its own paragraph, if any process posted one."""
    if own is not None:
        raise own
    for rank, answer in enumerate(posted):
        if answer and answer.get("error"):
            kind = ConfigError if answer.get("config") else JobFailed
            raise kind(f"rank {rank} of this {job.launcher} job stopped it: {answer['error']}")


def meet(job: Job, config: dict, out_dir: str, own: BaseException | None, timeout_s: float, differences) -> None:
    """Every process of the job shows its settings and run folder; all stop unless they agree.
    `differences(a, b)`: the (key, a's, b's) of two settings (the runs layer's comparison)."""
    mine = {"hash": settings_hash(config), "dir": os.path.abspath(out_dir), "host": socket.gethostname()}
    posted = exchange(job, "meet", {**mine, "config": config, **error_payload(own)}, timeout_s)
    first = posted[0]
    if all("hash" in answer for answer in posted):  # else a process failed on its way here: its error is the news
        for rank, other in enumerate(posted):
            if other["hash"] != first["hash"]:
                differ = differences(first["config"], other["config"])[:4]
                shown = "; ".join(f"{k}: {a!r} on rank 0, {b!r} on rank {rank}" for k, a, b in differ)
                raise ConfigError(
                    f"The processes of this {job.launcher} job were given different settings ({shown or 'their hashes differ'}), "
                    f"so none of them started: every process must train the same run. Give every node the same "
                    f"command and config files (one checkout, or the same commit), then start the job again."
                )
        for rank, other in enumerate(posted):
            if other["dir"] != first["dir"]:
                raise ConfigError(
                    f"The processes of this {job.launcher} job were given different run folders ({first['dir']} on "
                    f"rank 0, {other['dir']} on rank {rank}, host {other['host']}): Hydra's default folder is named by "
                    f"the time and a random id in each process, so every node would make its own. Give every process "
                    f"one folder on a file system all nodes share: hydra.run.dir=<folder> (e.g. "
                    f"hydra.run.dir=outputs/job-$SLURM_JOB_ID under srun), and resume= or existing=continue in it "
                    f"after a stop."
                )
    stop_for(job, posted, own)


def share(job: Job, decision: dict | None, own: BaseException | None, timeout_s: float) -> dict:
    """Rank 0 posts what the run does in its folder (or its error); every process returns it."""
    if job.rank == 0:
        exchange(job, "claim", decision if own is None else error_payload(own), timeout_s, only=[0])
        if own is not None:
            raise own
        return decision
    posted = exchange(job, "claim", {}, timeout_s, only=[0])
    stop_for(job, posted, None)
    return posted[0]


def ready(job: Job, own: BaseException | None, trainer=None) -> None:
    """Every process is prepared (or all stop); then the process group Lightning will use is made.
    Rank 0 may still be building the token cache that the others wait for: torch's own collective
    timeout (30 minutes) bounds this wait."""
    import torch.distributed as dist

    timeout = dist.default_pg_timeout
    posted = exchange(job, "ready", error_payload(own), timeout.total_seconds())
    stop_for(job, posted, own)
    if dist.is_initialized():  # a sweep's next run: the job's group is made once
        return
    cuda = trainer is not None and trainer.strategy.root_device.type == "cuda"
    job.store.set_timeout(timeout)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=dist.PrefixStore("default_pg", job.store),  # the prefix torch's own env:// start gives it
        rank=job.rank,
        world_size=job.world,
        timeout=timeout,
    )
    atexit.register(_end_group)  # as Lightning does for the group it makes (torch warns of an NCCL one left)


def _end_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def owe(job: Job | None, error: BaseException) -> None:
    """A process that fails while the others wait for its answer at some stage posts the failure
    there, so they stop with its paragraph instead of waiting out the timeout."""
    if job is None or job.store is None:
        return
    for stage in ("meet", "claim", "ready"):
        if stage in job.waiting and (stage != "claim" or job.rank == 0):
            try:
                job.store.set(
                    f"rope_lm/{job.attempt}/{job.rounds}/{stage}/{job.rank}", json.dumps(error_payload(error))
                )
            except Exception:
                pass  # the store went away: the others find that out themselves
    job.waiting.clear()


def lost_peer(job: Job | None, error: BaseException) -> JobFailed | None:
    """The paragraph for a collective that failed because another process of the job ended without
    a stop (SIGKILL, a lost node): gloo sees the closed connection at once, NCCL at its timeout."""
    import torch.distributed as dist

    if job is None or not isinstance(error, RuntimeError):
        return None
    text = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(error).split()))  # gloo's source line first: not the news
    closed = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
    if not isinstance(error, dist.DistError) and not any(words in text for words in closed):
        return None
    return JobFailed(
        f"{job.where}: another process of this {job.launcher} job ended while this one waited for it in training "
        f"({type(error).__name__}: {_clip(text, 200)}); its own output says why (a SIGKILL or a lost node leaves "
        f"none). The run folder keeps its last checkpoint: start the job again with existing=continue, or "
        f"python train.py resume=<run folder> on any number of nodes, to train on from it."
    )


# --- stopping together ---------------------------------------------------------------------


class StopTogether(L.Callback):
    """SIGTERM to any process of a multi-process run stops all of them after the same step.

    Lightning's own handler stops only the process it reached (it shares rank 0's signal, never
    another's), and that process then waits in the checkpoint's barrier while the others wait in
    the next step's all-reduce: a hang. Here the handler only records the signal; at the end of
    every step the processes agree (an all-reduce of one flag: any signal, or a Ctrl-C that
    checkpointing.GracefulStop recorded) and all raise Lightning's SIGTERMException, after which
    GracefulStop saves the checkpoint (written by rank 0) and the partial results. A process on
    its own is left to Lightning's handler and GracefulStop, as before."""

    def __init__(self, graceful=None):
        self.graceful = graceful
        self.signalled = False

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size == 1:
            return

        # After Lightning registered its handlers (Trainer._run), which its teardown puts back as they were.
        def handler(signum, frame):
            if not self.signalled:
                log.warning("SIGTERM: stopping every process after this step and saving a checkpoint.")
            self.signalled = True

        try:
            signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread
            pass

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.world_size == 1:
            return
        ctrl_c = bool(getattr(self.graceful, "requested", False))
        if trainer.strategy.reduce_boolean_decision(self.signalled or ctrl_c, all=False):
            # The shell's status for the signal this process got; a stop another process got ends it as SIGTERM does.
            raise SIGTERMException(128 + (signal.SIGINT if ctrl_c and not self.signalled else signal.SIGTERM))


def quiet_file_logs(out_dir: str) -> None:
    """A process other than rank 0 keeps its log lines on its own output: Hydra's log file in the
    run folder (every process of the job opens the same one) is rank 0's."""
    root = logging.getLogger()
    inside = os.path.abspath(out_dir) + os.sep
    for handler in list(root.handlers):
        path = getattr(handler, "baseFilename", None)
        if path and os.path.abspath(path).startswith(inside):
            root.removeHandler(handler)
            handler.close()
