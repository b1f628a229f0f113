"""Activation checkpointing, measured: peak memory and time of one training
step at each length, with and without model.activation_checkpointing, and
the memory plan's figure (rope_lm/train/memory_plan.py) beside each measured peak.

    python benchmarks/activation_memory.py                         # small at 2k, 4k, 8k
    python benchmarks/activation_memory.py models=[tiny] seq_lens=[256,512]

Each cell runs in a fresh process (a process's peak memory mark only goes
up): the model, its AdamW and one warm step (the optimizer state exists from
then on), then the measured step. On a GPU the peak is torch's allocator
peak; on a CPU it is the process's peak resident memory (VmHWM), the step's
own share read after handing freed heap back to the system. Printed:

* peak: the most the process held during the step, from before the model
  was built (weights, gradients, optimizer state, activations, workspaces);
* step memory: the peak above what the process held as the step began (the
  activations and the step's workspaces and gradients);
* the ratios with / without checkpointing of step memory and step time, the
  plan's total against the measured peak (how far below it: "plan below").

Random weights and tokens: memory and time depend on neither.
"""

import ctypes
import multiprocessing as mp
import os
import time

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")

# How far below the measured peak the memory plan's total sits on a CPU (fraction of the peak): measured
# 1.4% to 12.3% (7 to 12 MiB, glibc's and the runtime's slack) for tiny and small at 1k and 2k, with and
# without checkpointing (docs/benchmarks.md, 2026-11-28); tests/test_memory_plan.py holds the plan to this band.
PLAN_BELOW_PEAK = (0.0, 0.15)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # the peak mark back to the current RSS (Linux >= 4.0)
        f.write("5")


def _hand_back_freed_memory() -> None:
    """glibc's fixed thresholds: a freed block of 128 KiB or more goes back to
    the system at once (by default the threshold rises with the blocks freed,
    and freed memory stays in the heap), so the resident memory follows what
    the tensors hold, as torch's allocator statistics do on a GPU."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def _trim() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)  # freed heap back to the system, so RSS is what is held
    except (OSError, AttributeError):
        pass


def measure(spec: dict) -> dict:
    """One cell, in this (fresh) process: bytes and seconds of the measured step."""
    import torch

    from rope_lm.model.transformer import build_model
    from rope_lm.train.lit import OptimConfig, TrainingLoss, build_optimizer

    torch.set_num_threads(spec["threads"])
    device = spec["device"]
    cuda = device == "cuda"
    if not cuda:
        _hand_back_freed_memory()
    _warm_runtime(device)
    _trim()
    before = torch.cuda.memory_allocated() if cuda else _status_kb("VmRSS") * 1024
    torch.manual_seed(0)
    model = (
        build_model(
            {**spec["model"], "activation_checkpointing": spec["checkpointing"]},
            spec["pos"],
            None,
            spec["vocab_size"],
            spec["seq_len"],
        )
        .to(device)
        .train()
    )
    loss_fn = TrainingLoss(model)
    opt, _ = build_optimizer(model, OptimConfig(), 10)
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randint(0, spec["vocab_size"], (spec["batch_size"], spec["seq_len"]), generator=g).to(device)
        for _ in range(2)
    )
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    def step():
        with autocast:
            loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm: the optimizer state, allocator pools, lazy initialisation
    if cuda:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        _trim()
        start = _status_kb("VmRSS") * 1024
        _reset_peak()
    t0 = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kb("VmHWM") * 1024
    return {"peak": peak - before, "step_memory": peak - start, "seconds": seconds}


def _warm_runtime(device: str) -> None:
    """One step of a one-layer, eight-wide model first: the runtime's own
    one-time memory (autograd's threads, the math libraries' buffers, the
    CUDA context) is then held before the measurement starts, as it is in a
    process that has trained before; the plan counts the model's memory only."""
    import torch

    from rope_lm.model.transformer import build_model
    from rope_lm.train.lit import TrainingLoss

    model = build_model({"n_layer": 1, "n_head": 1, "d_model": 8}, {"name": "rope"}, None, 16, 8).to(device)
    x = torch.zeros(1, 8, dtype=torch.long, device=device)
    TrainingLoss(model)(x, x).backward()


def _in_fresh_process(spec: dict) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(measure, (spec,))


def planned(spec: dict) -> int:
    """The memory plan's total for the cell (one device, the cell's precision)."""
    from rope_lm.train.memory_plan import Setup, per_device, trace_step

    precision = "bf16-mixed" if spec["device"] == "cuda" else "32-true"
    t = trace_step(
        spec["model"],
        spec["pos"],
        None,
        spec["vocab_size"],
        spec["seq_len"],
        spec["batch_size"],
        spec["checkpointing"],
        precision,
    )
    return per_device(t, Setup(precision=precision))["total"]


def model_shape(name: str) -> dict:
    import yaml

    with open(os.path.join(CONF, "model", f"{name}.yaml")) as f:
        return {k: v for k, v in yaml.safe_load(f).items() if k != "name"}


def run(a: dict) -> dict:
    import torch

    device = a["device"] if a["device"] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name in a["models"]:
        for seq_len in a["seq_lens"]:
            cell = {}
            for on in (False, True):
                spec = {
                    "model": model_shape(name),
                    "pos": {"name": a["pos"]},
                    "vocab_size": a["vocab_size"],
                    "seq_len": seq_len,
                    "batch_size": a["batch_size"],
                    "checkpointing": on,
                    "device": device,
                    "threads": a["threads"],
                }
                got = _in_fresh_process(spec)
                got["plan"] = planned(spec)
                cell[on] = got
            off, on = cell[False], cell[True]
            rows.append(
                {
                    "model": name,
                    "seq_len": seq_len,
                    "without": off,
                    "with": on,
                    "step_memory_ratio": on["step_memory"] / off["step_memory"],
                    "time_ratio": on["seconds"] / off["seconds"],
                    "plan_vs_measured": [off["plan"] / off["peak"], on["plan"] / on["peak"]],
                }
            )
    return {"device": device, "settings": a, "rows": rows}


def table(result: dict) -> str:
    mb = 2**20
    lines = [
        f"Training step, one device ({result['device']}), batch {result['settings']['batch_size']}: "
        f"without / with activation checkpointing",
        "",
        "| model | seq_len | peak MB (plan) | peak MB with (plan) | step MB | step MB with | step MB ratio "
        "| step s | step s with | time ratio | plan below | plan below with |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        off, on = r["without"], r["with"]
        lines.append(
            f"| {r['model']} | {r['seq_len']} | {off['peak'] / mb:.0f} ({off['plan'] / mb:.0f}) | "
            f"{on['peak'] / mb:.0f} ({on['plan'] / mb:.0f}) | {off['step_memory'] / mb:.0f} | "
            f"{on['step_memory'] / mb:.0f} | {r['step_memory_ratio']:.2f} | {off['seconds']:.3f} | "
            f"{on['seconds']:.3f} | {r['time_ratio']:.2f} | {1 - r['plan_vs_measured'][0]:.1%} | "
            f"{1 - r['plan_vs_measured'][1]:.1%} |"
        )
    return "\n".join(lines)


def report(result: dict, text: str, out: str | None) -> None:
    """The table printed, the rows written as JSON where `out` says (the memory benchmarks' ending)."""
    print(text)
    if out:
        from rope_lm.core.files import write_json

        write_json(out, result)
        print(f"wrote {out}")


@hydra.main(config_path="../conf", config_name="bench_activation_memory", version_base="1.3")
@hydra_task
def main(cfg):
    a = OmegaConf.to_container(cfg, resolve=True)
    result = run(a)
    report(result, table(result), a.get("out"))


if __name__ == "__main__":
    main()
