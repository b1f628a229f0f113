"""A memory plan before the run (scripts/plan_memory.py): what one device
holds during a training step, from the same checked settings as train.py.

Nothing is guessed from formulas of a generic transformer: a training
step of the run's own model, loss and optimizer is traced with fake
tensors (torch's FakeTensorMode: shapes, dtypes and devices, no memory and
no arithmetic), and torch's MemTracker records every tensor as it is made
and freed, so the kernels the run would take, the chunked loss
(rope_lm/model/head.py) and the recomputation of activation checkpointing are
counted as they are. The optimizer state is made before the traced step,
as every step after the first holds it.

What the trace cannot hold, sharding over devices, is applied to its
figures: DDP keeps a second copy of the gradients (its buckets); FSDP
(trainer=fsdp) keeps 1/N of the weights, gradients and optimizer state,
plus the whole weights of the root unit and of two blocks (the one running
and the one prefetched) and one block's whole gradients before they are
reduce-scattered. Activations are per device and do not shrink with N.
"""

from dataclasses import dataclass
import math

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.model.head import CHUNK_TOKENS
from rope_lm.model.layout import UNRESOLVED
from rope_lm.model.recompute import SETTING
from rope_lm.model.transformer import build_model
from rope_lm.train.lit import OptimConfig, TrainingLoss, build_optimizer

GiB = 2**30


@dataclass
class Trace:
    """One traced training step, bytes per device of one process."""

    peak: int  # the most held at once
    at_peak: tuple  # (weights and buffers, gradients, optimizer state) held at that moment
    params: int  # weights and buffers
    grads: int  # every weight's gradient (held whole at the end of backward)
    optimizer: int  # AdamW's two moments
    activations: int  # held for backward at the step's peak
    attention: int  # the most one layer's attention adds above its input, in forward
    block_params: int  # the largest block's weights (an FSDP unit)
    root_params: int  # what is outside the blocks (the root FSDP unit)


def trace_step(
    model: dict,
    pos: dict,
    scaling: dict | None,
    vocab_size: int,
    seq_len: int,
    batch: int,
    checkpointing: bool,
    precision: str = "32-true",
    optim: OptimConfig | None = None,
    layers=UNRESOLVED,
) -> Trace:
    """A training step of this model at (batch, seq_len) under fake tensors,
    its optimizer state made beforehand (as the second and later steps hold it);
    `layers`: the model's resolved layer specs (RunConfig.layers)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    optim = optim or OptimConfig()
    autocast = precision in ("bf16-mixed", "16-mixed")
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    with FakeTensorMode():
        net = build_model(
            {**{k: v for k, v in model.items() if k != "name"}, SETTING: checkpointing},
            pos,
            scaling,
            vocab_size,
            seq_len,
            layers=layers,
        )
        if precision in ("bf16-true", "16-true"):
            net = net.to(dtype)
        net.train()
        loss_fn = TrainingLoss(net)
        opt, _ = build_optimizer(net, optim, 1)
        x = torch.zeros(batch, seq_len, dtype=torch.long)
        y = torch.zeros(batch, seq_len, dtype=torch.long)
        # The optimizer state as every step after the first holds it (a step on zero gradients makes it,
        # untraced); then the one traced step.
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(net, opt, x, y)
        attn = net.blocks[0].attn
        with tracker:
            with torch.autocast("cpu", dtype=dtype, enabled=autocast):
                loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        stats = tracker.memory_tracking[attn]
        peak_snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
        params = sum(p.numel() * p.element_size() for p in net.parameters())
        params += sum(b.numel() * b.element_size() for b in net.buffers())
        blocks = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in net.blocks]
    device = next(iter(stats.local_peak))
    entered = min(s[device]["Total"] for s in stats.snapshots.get(_state("PRE_FW"), []) or [{device: {"Total": 0}}])
    grads = sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)
    at_peak = tuple(int(_category(peak_snap, k)) for k in ("PARAM", "GRAD", "OPT"))
    at_peak = (at_peak[0] + int(_category(peak_snap, "BUFFER")),) + at_peak[1:]
    return Trace(
        peak=int(peak_snap["Total"]),
        at_peak=at_peak,
        params=params,
        grads=grads,
        optimizer=int(_category(peak_snap, "OPT")),
        activations=int(_category(peak_snap, "ACT")),
        attention=max(0, int(stats.local_peak[device] - entered)),
        block_params=max(blocks),
        root_params=params - sum(blocks),
    )


def _state(name):
    from torch.distributed._tools.mem_tracker import _ModState

    return getattr(_ModState, name)


def _category(snap, name):
    from torch.distributed._tools.mem_tracker import _MemRefType

    return snap.get(getattr(_MemRefType, name), 0)


@dataclass
class Setup:
    """What the plan is for: the run's devices and how they share the model."""

    devices: int = 1  # trainer.devices x trainer.num_nodes
    strategy: str = "single"  # single | ddp | fsdp
    precision: str = "32-true"


def per_device(t: Trace, setup: Setup) -> dict:
    """The trace's figures as one device of `setup` holds them (bytes)."""
    weights, grads, optimizer = t.at_peak
    total = t.peak
    row = {"parameters": t.params, "gradients": t.grads, "optimizer state": t.optimizer}
    if setup.strategy == "fsdp":
        n = setup.devices
        gathered = 2 if setup.precision in ("bf16-mixed", "16-mixed") else 4
        unsharded = (t.root_params + 2 * t.block_params) * gathered // 4
        row = {
            "parameters": t.params // n + unsharded,
            "gradients": t.grads // n + t.block_params,
            "optimizer state": t.optimizer // n,
        }
        total -= weights + grads + optimizer
        total += weights // n + unsharded + optimizer // n + (grads // n + t.block_params if grads else 0)
    elif setup.strategy == "ddp":
        row["gradients"] = 2 * t.grads  # the reducer's buckets hold a second copy, from the first step on
        total += t.grads
    return {**row, "activations": t.activations, "attention workspace": t.attention, "total": total}


def loss_bytes(tokens: int, vocab_size: int) -> int:
    """The loss's logits at their largest: up to CHUNK_TOKENS tokens at a time
    (rope_lm/model/head.py), float32, with their log-softmax (or its gradient)."""
    return 2 * min(tokens, CHUNK_TOKENS) * vocab_size * 4


def plan(
    model: dict,
    pos: dict,
    scaling: dict | None,
    vocab_size: int,
    seq_len: int,
    batch: int,
    setup: Setup,
    optim: OptimConfig | None = None,
    device_gb: float | None = None,
    layers=UNRESOLVED,
) -> dict:
    """Per device, without and with activation checkpointing: each part, the
    total, and (given device_gb) the longest data.seq_len whose total fits.
    `layers`: the model's resolved layer specs (RunConfig.layers), for every
    model traced."""
    out = {"seq_len": seq_len, "batch": batch, "setup": setup, "columns": {}}
    for on in (False, True):
        t = trace_step(model, pos, scaling, vocab_size, seq_len, batch, on, setup.precision, optim, layers)
        column = per_device(t, setup)
        column["loss / logits"] = loss_bytes(batch * seq_len, vocab_size)
        if device_gb:
            column["longest seq_len"] = longest_fit(
                model,
                pos,
                scaling,
                vocab_size,
                batch,
                setup,
                optim,
                on,
                device_gb * GiB,
                seq_len,
                column["total"],
                layers,
            )
        out["columns"]["with checkpointing" if on else "without checkpointing"] = column
    return out


def longest_fit(
    model, pos, scaling, vocab_size, batch, setup, optim, checkpointing, budget, seq_len, total, layers=UNRESOLVED
):
    """The longest multiple of 64 tokens whose traced total fits the budget:
    the totals at seq_len, 2 x and 4 x fix a quadratic in the length (linear
    kernels give a line, a T x T score matrix the square), solved for the
    budget, then checked by a trace there and stepped down until it fits."""
    lengths = [seq_len, 2 * seq_len, 4 * seq_len]
    totals = [total] + [
        per_device(
            trace_step(model, pos, scaling, vocab_size, n, batch, checkpointing, setup.precision, optim, layers), setup
        )["total"]
        for n in lengths[1:]
    ]
    a, b, c = _quadratic(lengths, totals)
    guess = _solve(a, b, c - budget)
    if guess is None:
        return None
    n = max(64, int(guess) // 64 * 64)
    for _ in range(8):  # the fit is close; a few steps down at most
        got = per_device(
            trace_step(model, pos, scaling, vocab_size, n, batch, checkpointing, setup.precision, optim, layers), setup
        )["total"]
        if got <= budget or n <= 64:
            return n if got <= budget else None
        n = max(64, int(n * budget / got) // 64 * 64)
    return n


def _quadratic(xs, ys):
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d
    c = (x1 * x2 * (x1 - x2) * y0 + x2 * x0 * (x2 - x0) * y1 + x0 * x1 * (x0 - x1) * y2) / d
    return a, b, c


def _solve(a, b, c):
    """The positive root of a x^2 + b x + c = 0 (a line where a is ~0), or None."""
    if abs(a) < 1e-9:
        return -c / b if b > 0 else None
    disc = b * b - 4 * a * c
    if disc < 0:
        return None
    root = (-b + math.sqrt(disc)) / (2 * a)
    return root if root > 0 else None


def setup_of(trainer) -> Setup:
    """The devices, strategy and precision of a checked trainer config
    (rope_lm.train.trainer.TrainerConfig), as train.py would run them here."""
    lightning = trainer.lightning
    devices, nodes = lightning.get("devices", "auto"), lightning.get("num_nodes", 1) or 1
    if not isinstance(devices, int):
        if isinstance(devices, (list, tuple)):
            devices = len(devices)
        else:
            devices = torch.cuda.device_count() if torch.cuda.is_available() and devices in ("auto", -1, "-1") else 1
    world = max(1, devices) * nodes
    strategy = lightning.get("strategy", "auto")
    if trainer.sharded:
        kind = "fsdp"
    elif world > 1 and str(strategy).startswith("ddp") or strategy == "auto" and world > 1:
        kind = "ddp"
    elif world == 1:
        kind = "single"
    else:
        raise ConfigError(
            f"trainer.strategy={strategy!r} is not one the memory plan knows; it plans one device, "
            f"DDP (trainer.strategy=ddp) and FSDP (trainer=fsdp)."
        )
    precision = trainer.precision
    if precision == "auto":
        precision = "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"
    return Setup(devices=world, strategy=kind, precision=precision)


def format_plan(p: dict, device_gb: float | None) -> str:
    s = p["setup"]
    head = (
        f"Memory plan per device: data.seq_len={p['seq_len']}, data.batch_size={p['batch']} per device, "
        f"{s.devices} device(s), {s.strategy}, precision {s.precision}"
    )
    cols = list(p["columns"])
    names = [
        "parameters",
        "gradients",
        "optimizer state",
        "activations",
        "attention workspace",
        "loss / logits",
        "total",
    ]
    width = max(len(n) for n in names + ["longest seq_len"]) + 2
    lines = [head, "", " " * width + "".join(f"{c:>24}" for c in cols)]
    for name in names:
        lines.append(f"{name:<{width}}" + "".join(f"{_gib(p['columns'][c][name]):>24}" for c in cols))
    if device_gb:
        fits = [p["columns"][c].get("longest seq_len") for c in cols]
        lines.append(
            f"{'longest seq_len':<{width}}"
            + "".join(f"{(str(f) if f else 'none'):>24}" for f in fits)
            + f"   (fits {device_gb:g} GiB)"
        )
    lines += [
        "",
        "activations: held for backward at the step's peak; attention workspace: the most one layer's "
        "attention adds in forward; total: the traced peak of a step (parts overlap in time).",
    ]
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"
