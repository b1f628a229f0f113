"""Context parallelism on CPU ranks (trainer.context_parallel; rope_lm/train/context_parallel.py),
measured: training tokens/s of one sequence split over 2 processes against one
process holding all of it, and each process's peak memory against the memory
plan's figure (rope_lm/train/memory_plan.py, context=2).

    python benchmarks/context_parallel.py                          # tiny, RoPE, 2k, 4k, 8k
    python benchmarks/context_parallel.py seq_lens=[1024] steps=2
    python benchmarks/context_parallel.py device=cuda seq_lens=[8192,32768]   # a node with 2 GPUs

Each cell runs in fresh processes over gloo, as train.py runs them: the model
under FSDP2 on a (data 1 x context 2) mesh for the two ranks (what
ContextParallelStrategy builds), alone for one process; AdamW; one warm step,
then `steps` timed steps (forward, backward, optimizer), the median printed.
One process is timed with one thread and with two (the two cores the two ranks
use), so the ratios say what the split costs in communication and duplicated
work on the same cores. With device=cuda each rank has a GPU of its own (NCCL;
two GPUs needed), bf16-mixed as train.py's default there, and memory is
torch's allocator peak. Memory: each process's peak resident memory during a
step above what it held before the model was built (as benchmarks/activation_memory.py
reads it), the larger of the two ranks; the plan's total for the same step beside it.

Random weights and tokens: time and memory depend on neither.
"""

import os
import socket
import statistics
import time

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")


def _worker(rank: int, world: int, port: int, spec: dict, results) -> None:
    from activation_memory import _hand_back_freed_memory, _reset_peak, _status_kb, _trim, _warm_runtime
    import torch

    device = spec["device"]
    cuda = device == "cuda"
    torch.set_num_threads(spec["threads"])
    if cuda:
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        _hand_back_freed_memory()
    shards = None
    if world > 1:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        mesh = init_device_mesh(
            "cuda" if cuda else "cpu", (1, world), mesh_dim_names=("data_parallel", "tensor_parallel")
        )
    _warm_runtime(device)
    if not cuda:
        _trim()
    before = torch.cuda.memory_allocated() if cuda else _status_kb("VmRSS") * 1024

    from rope_lm.model.transformer import build_model
    from rope_lm.train.lit import OptimConfig, TrainingLoss, build_optimizer

    torch.manual_seed(0)
    model = build_model(spec["model"], {"name": spec["pos"]}, None, spec["vocab_size"], spec["seq_len"])
    model = model.to(device).train()
    loss_fn = TrainingLoss(model)
    precision = "bf16-mixed" if cuda else "32-true"  # as train.py's default on each
    if world > 1:
        from rope_lm.train.context_parallel import sequence_shards, split
        from rope_lm.train.sharding import shard

        shard(loss_fn, model.blocks, mesh, precision)
        shards = sequence_shards(mesh, spec["seq_len"], device)
    opt, _ = build_optimizer(model, OptimConfig(), 10)
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randint(0, spec["vocab_size"], (spec["batch_size"], spec["seq_len"]), generator=g).to(device)
        for _ in range(2)
    )
    if shards is not None:
        x, y = split(x, y, shards)
    # One process: bf16 autocast on CUDA, as Lightning's bf16-mixed; two: FSDP2's bf16 compute (sharding.shard).
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and world == 1)

    def step():
        with autocast:
            loss = loss_fn(x, y, None, shards)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm: the optimizer state, the process group's buffers, CUDA's kernels
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        _trim()
        _reset_peak()
    seconds = []
    for _ in range(spec["steps"]):
        if world > 1:
            torch.distributed.barrier()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if cuda else _status_kb("VmHWM") * 1024) - before
    results[rank] = {"seconds": statistics.median(seconds), "peak": peak}
    if world > 1:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(spec: dict, world: int) -> dict:
    """One cell in fresh processes: the median step time (the slowest rank's)
    and the largest peak of the ranks."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), spec, results), nprocs=world, join=True)
        got = [results[r] for r in range(world)]
    return {"seconds": max(r["seconds"] for r in got), "peak": max(r["peak"] for r in got)}


def planned(spec: dict, context: int, device: str = "cpu") -> int:
    """The memory plan's total for one device of the cell (in bf16-mixed on CUDA)."""
    from rope_lm.train.memory_plan import Setup, per_device, trace_step

    precision = "bf16-mixed" if device == "cuda" else "32-true"
    t = trace_step(
        spec["model"],
        {"name": spec["pos"]},
        None,
        spec["vocab_size"],
        spec["seq_len"],
        spec["batch_size"],
        False,
        precision,
        context=context,
    )
    setup = Setup(devices=context, strategy="fsdp" if context > 1 else "single", precision=precision, context=context)
    return per_device(t, setup)["total"]


def model_shape(name: str) -> dict:
    import yaml

    with open(os.path.join(CONF, "model", f"{name}.yaml")) as f:
        return {k: v for k, v in yaml.safe_load(f).items() if k != "name"}


def run(a: dict) -> dict:
    import torch

    from rope_lm.core.errors import ConfigError

    if a["device"] == "cuda" and torch.cuda.device_count() < 2:
        raise ConfigError(
            f"device=cuda times two processes on two GPUs, one each (NCCL puts one rank on a GPU), but this "
            f"machine has {torch.cuda.device_count()}. Run it on a node with two GPUs or more, or with device=cpu."
        )
    rows = []
    for seq_len in a["seq_lens"]:
        spec = {
            "model": model_shape(a["model"]),
            "pos": a["pos"],
            "vocab_size": a["vocab_size"],
            "seq_len": seq_len,
            "batch_size": a["batch_size"],
            "steps": a["steps"],
            "device": a["device"],
        }
        one = measure({**spec, "threads": 1}, 1)
        one_two = measure({**spec, "threads": 2}, 1)
        split = measure({**spec, "threads": 1}, 2)
        row = {"seq_len": seq_len, "one": one, "one_two_threads": one_two, "two_ranks": split}
        for key, value in (("one", one), ("one_two_threads", one_two), ("two_ranks", split)):
            value["tokens_per_s"] = a["batch_size"] * seq_len / value["seconds"]
        row["one"]["plan"] = planned(spec, 1, a["device"])
        row["two_ranks"]["plan"] = planned(spec, 2, a["device"])
        rows.append(row)
        print(table({"settings": a, "rows": [row]}).splitlines()[-1], flush=True)
    return {"settings": a, "rows": rows}


def table(result: dict) -> str:
    mb = 2**20
    a = result["settings"]
    lines = [
        f"Training step of `{a['model']}` ({a['pos']}, batch {a['batch_size']}) on CPU: one process holding the whole "
        f"sequence against two sharing it (trainer.context_parallel=2, gloo); median of {a['steps']} steps",
        "",
        "| seq_len | 1 rank, 1 thread tok/s | 1 rank, 2 threads tok/s | 2 ranks x 1 thread tok/s "
        "| 2 ranks / 1 rank (2 threads) | 2 ranks / 1 rank (1 thread) | peak MB 1 rank (plan) "
        "| peak MB per rank, 2 ranks (plan) | plan / measured, 2 ranks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        one, two_t, two = r["one"], r["one_two_threads"], r["two_ranks"]
        lines.append(
            f"| {r['seq_len']} | {one['tokens_per_s']:,.0f} | {two_t['tokens_per_s']:,.0f} | "
            f"{two['tokens_per_s']:,.0f} | {two['tokens_per_s'] / two_t['tokens_per_s']:.2f} | "
            f"{two['tokens_per_s'] / one['tokens_per_s']:.2f} | {one['peak'] / mb:.0f} ({one['plan'] / mb:.0f}) | "
            f"{two['peak'] / mb:.0f} ({two['plan'] / mb:.0f}) | {two['plan'] / two['peak']:.2f} |"
        )
    return "\n".join(lines)


@hydra.main(config_path="../conf", config_name="bench_context_parallel", version_base="1.3")
@hydra_task
def main(cfg):
    from activation_memory import report

    a = OmegaConf.to_container(cfg, resolve=True)
    result = run(a)
    report(result, table(result), a.get("out"))


if __name__ == "__main__":
    main()
