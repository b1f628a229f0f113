"""A memory plan before the run (scripts/plan_memory.py): what one device
holds during a training step, from the same checked settings as train.py,
and the longest data.seq_len that fits a device.

Nothing is guessed from formulas of a generic transformer: a training step
of the run's own model, loss and optimizer is traced with fake tensors
(torch's FakeTensorMode: shapes, dtypes and devices, no memory and no
arithmetic), and torch's MemTracker records every tensor as it is made and
freed, so the kernels the run would take, the chunked loss
(rope_lm/model/head.py) and the recomputation of activation checkpointing
are counted as they are. The optimizer state is made before the traced
step, as every step after the first holds it.

A step's peak is the largest of its *moments*: each stretch of the step
between two module hooks (a module's forward or backward entered or left;
the modules run in the same order at every length) and the optimizer step.
Once the length is past the last point where the kernels change their shape
(the loss in two whole chunks and more: batch x length > 2 x CHUNK_TOKENS; the
explicit attention's query blocks capped: MAX_SCORE_ELEMENTS), each moment is
a polynomial of degree at most 2 in the length (linear kernels give a line, a
score matrix the square). So each moment, and the activations and attention
workspace, are fitted through traces at three lengths there and evaluated
analytically at any length, the total as the largest fitted moment (the phase
that peaks changes with the length: `base` with checkpointing peaks in the
loss at 16k and in a recomputed block at 64k, so a fit of the peak alone is
wrong by 2x there). The fit is checked against a direct trace at a held-out,
longer length; where it is off by more than FIT_TOLERANCE the fitted range is
moved up, and at last the plan falls back to direct traces. Lengths below the
fitted range are traced directly (they are short, so fast). A length's
figures are the most a step of that length or a shorter one holds (the whole
loss of up to CHUNK_TOKENS tokens holds more than the chunked loss just past
it), so every figure grows with the length, and the longest length that fits
is the same whatever length the plan is asked at, in seconds at any length.

What the trace cannot hold, sharding over devices, is applied to each
moment: DDP keeps a second copy of the gradients (its buckets); FSDP
(trainer=fsdp) keeps 1/N of the weights, gradients and optimizer state,
plus the whole weights of the root unit and of two blocks (the one running
and the one prefetched) and one block's whole gradients before they are
reduce-scattered. Activations are per device and do not shrink with N.

Under context parallelism (trainer.context_parallel=K) the traced step is one
device's: its T/K tokens of each sequence (its share of every activation and
of the loss), the keys and values of all K gathered in each layer (a buffer of
the whole sequence's, made in the trace as the gather makes it), and its
queries' scores over every key (rope_lm/kernels/sharded_sequence.py); FSDP
shards the weights, gradients and optimizer state over the K devices of a
sequence (the context dimension of the mesh). Lengths are then planned in
multiples of both 64 and 2K (the shards' chunks).
"""

from dataclasses import dataclass, field
import math

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.sequence_shards import SequenceShards, head_tail_order
from rope_lm.kernels.offset_sdpa import MAX_SCORE_ELEMENTS
from rope_lm.model.head import CHUNK_TOKENS, mean_cross_entropy
from rope_lm.model.layout import UNRESOLVED
from rope_lm.model.recompute import SETTING
from rope_lm.model.transformer import ModelConfig, build_model, check_fit
from rope_lm.train.lit import OptimConfig, build_optimizer

GiB = 2**30
STEP = 64  # lengths are planned in multiples of 64 tokens
FIT_TOLERANCE = 0.01  # the fit against a direct trace at the held-out length: the total and the activations
# ... and the attention workspace, whose query blocks (explicit scores) are sized by a floor division
# (MAX_SCORE_ELEMENTS // (batch x heads x length)): measured 1.5-2.1% off for ALiBi at 16k, exact for RoPE
ATTENTION_TOLERANCE = 0.05
FIT_POINTS = (1.0, 1.25, 1.5)  # the fitted lengths, as multiples of the first
HELD_OUT = 2.0  # the held-out length the fit is checked at (an extrapolation past the fitted ones)
WIDENINGS = 2  # times the fitted range is moved up (x2) when the check fails, before direct traces
MAX_LENGTH = 2**40  # past this the plan says "all lengths" for a model without a limit of its own


@dataclass
class Trace:
    """One traced training step, bytes per device of one process."""

    peak: int  # the most held at once
    params: int  # weights and buffers
    grads: int  # every weight's gradient (held whole at the end of backward)
    optimizer: int  # AdamW's two moments
    activations: int  # held for backward as the model's forward ends (the loss's own: loss_bytes)
    attention: int  # the most one layer's attention adds above its input, in forward
    block_params: int  # the largest block's weights (an FSDP unit)
    root_params: int  # what is outside the blocks (the root FSDP unit)
    # moment (a module's peak in forward or in backward, the optimizer step) -> (total, weights and
    # buffers, gradients, optimizer state) held then
    moments: dict = field(default_factory=dict)
    step_peak: tuple = (0, 0, 0, 0)  # the same at forward and backward's peak (the largest module moment)


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
    context: int = 1,
) -> Trace:
    """A training step of this model at (batch, seq_len) under fake tensors,
    its optimizer state made beforehand (as the second and later steps hold it);
    `layers`: the model's resolved layer specs (RunConfig.layers); `context`:
    the devices that share each sequence, of which this is one (K)."""
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
        shards = _TracedShards.of(seq_len, context) if context > 1 else None
        step = _Step(net, shards)
        opt, _ = build_optimizer(net, optim, 1)
        x = torch.zeros(batch, seq_len // context, dtype=torch.long)
        y = torch.zeros(batch, seq_len // context, dtype=torch.long)
        # The optimizer state as every step after the first holds it (a step on zero gradients makes it,
        # untraced); then the one traced step: forward and backward, then the optimizer's step.
        for p in net.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker = _segment_tracker(net.blocks[0].attn)
        tracker.track_external(net, opt, x, y)
        with tracker:
            with torch.autocast("cpu", dtype=dtype, enabled=autocast):
                loss = step(x, y)
            loss.backward()
        moments = dict(tracker.segments)
        ended = next(iter(tracker.memory_tracking[step.body].snapshots[_state("POST_FW")][-1].values()))
        step_peak = max(moments.values())
        entered, most = tracker.watched[:2] if tracker.watched else (0, 0)
        del loss
        stepper = MemTracker()
        stepper.track_external(net, opt)
        with stepper:
            opt.step()
            opt.zero_grad(set_to_none=True)
        moments["optimizer step"] = _moment(next(iter(stepper.get_tracker_snapshot("peak").values())))
        params = sum(p.numel() * p.element_size() for p in net.parameters())
        params += sum(b.numel() * b.element_size() for b in net.buffers())
        blocks = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in net.blocks]
        grads = sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)
        attention = max(0, int(most - entered))
    return Trace(
        peak=max(step_peak[0], moments["optimizer step"][0]),
        params=params,
        grads=grads,
        optimizer=step_peak[3],
        activations=int(_category(ended, "ACT")),
        attention=attention,
        block_params=max(blocks),
        root_params=params - sum(blocks),
        moments=moments,
        step_peak=step_peak,
    )


def _segment_tracker(watch):
    """A MemTracker that also keeps, for each stretch of the step between two
    module hooks (a module's forward or backward entered or left, named by the
    module, the hook and its count), the most held within it: the step's
    moments. The modules run in the same order at every length (the loops
    over loss chunks and query blocks run inside modules), so a moment is the
    same stretch of the step at every length."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.distributed._tools.mem_tracker import MemTracker

    class Segments(MemTracker):
        def __init__(self, watch):
            super().__init__()
            self.segments = {}
            self._key = "start"
            self._seen = {}
            self._watch = watch  # the module whose forward's own peak is kept (block 0's attention)
            self.watched = None  # [held as it was entered, the most held within it]

        def _event(self, module, name):
            fqn = self._mod_tracker.get_known_fqn(module) if module is not None else None
            n = self._seen[fqn, name] = self._seen.get((fqn, name), 0) + 1
            self._key = f"{fqn} {name} #{n}"
            if module is self._watch and n == 1 and name in ("forward", "forward done"):
                held = self._held()
                self.watched = [held, held] if name == "forward" else self.watched + ["done"]
            self._record()

        def _held(self):
            snap = next(iter(self._curr_mem_snap.values()), None)
            return snap["Total"] if snap else 0

        def _record(self):
            snap = next(iter(self._curr_mem_snap.values()), None)
            if snap is None:
                return
            if snap["Total"] > self.segments.get(self._key, (-1,))[0]:
                self.segments[self._key] = _moment(snap)
            if self.watched is not None and len(self.watched) == 2:
                self.watched[1] = max(self.watched[1], snap["Total"])

        def _update_peak_stats(self, peak_state):
            # MemTracker's own per-module peaks (a pass over every module at every op) are not read here:
            # the segments hold the step's peaks.
            self._record()

        def _pre_fw_hook(self, module, inputs):
            super()._pre_fw_hook(module, inputs)
            self._event(module, "forward")

        def _post_fw_hook(self, module, inputs, outputs):
            super()._post_fw_hook(module, inputs, outputs)
            self._event(module, "forward done")

        def _pre_bw_hook(self, module, args):
            super()._pre_bw_hook(module, args)
            self._event(module, "backward")

        def _post_bw_hook(self, module, args):
            super()._post_bw_hook(module, args)
            self._event(module, "backward done")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            except DataDependentOutputException:
                if func is not torch.ops.aten._local_scalar_dense.default:
                    raise
                # A value read out of a tensor (a learned table's check of its positions' range): fake
                # tensors hold none. Zero, of the tensor's kind: shapes, and so memory, come from the lengths.
                return args[0].dtype.is_floating_point and 0.0 or (False if args[0].dtype == torch.bool else 0)

    return Segments(watch)


class _Step(torch.nn.Module):
    """lit.TrainingLoss's step (the model's hidden states, then the chunked
    loss: rope_lm.model.head.mean_cross_entropy) with its two halves as
    modules of their own, so the loss has a peak of its own in the trace."""

    def __init__(self, net, shards=None):
        super().__init__()
        self.body = _Hidden(net, shards)
        self.head = _Loss(net)

    def forward(self, x, y):
        return self.head(self.body(x), y)


class _Hidden(torch.nn.Module):
    def __init__(self, net, shards=None):
        super().__init__()
        self.net = net
        self.shards = shards

    def forward(self, x):
        return self.net.hidden(x, None, shards=self.shards)


class _TracedShards(SequenceShards):
    """Device 0 of K sharing each sequence, in a trace of one process: the
    gather makes the whole sequence's keys and values as the all-gather does
    (from this device's, repeated: the trace counts bytes, not values)."""

    @classmethod
    def of(cls, seq_len: int, context: int):
        return cls(seq_len, 0, context, "", head_tail_order(seq_len, context))

    def gather(self, k, v):
        return torch.cat([k] * self.size, 2), torch.cat([v] * self.size, 2)


class _Loss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        object.__setattr__(self, "net", net)  # registered once, under _Hidden

    def forward(self, h, y):
        return mean_cross_entropy(h, self.net.lm_head.weight, y)


def _moment(snap) -> tuple:
    return (
        int(snap["Total"]),
        int(_category(snap, "PARAM") + _category(snap, "BUFFER")),
        int(_category(snap, "GRAD")),
        int(_category(snap, "OPT")),
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
    context: int = 1  # devices sharing each sequence (trainer.context_parallel; FSDP shards over these)

    @property
    def shards(self) -> int:
        """The devices FSDP splits the weights, gradients and optimizer state over."""
        return self.context if self.context > 1 else self.devices

    @property
    def step(self) -> int:
        """Planned lengths are multiples of this: 64, and 2K under context parallelism."""
        return math.lcm(STEP, 2 * self.context) if self.context > 1 else STEP


def _sharded(t: Trace, setup: Setup, moment: tuple) -> int:
    """One moment's total as one device of `setup` holds it."""
    total, weights, grads, optimizer = moment
    if setup.strategy == "fsdp":
        n = setup.shards
        total -= weights + grads + optimizer
        total += weights // n + _unsharded(t, setup) + optimizer // n + (grads // n + t.block_params if grads else 0)
    elif setup.strategy == "ddp":
        total += t.grads  # the reducer's buckets hold a second copy, from the first step on
    return total


def _unsharded(t: Trace, setup: Setup) -> int:
    gathered = 2 if setup.precision in ("bf16-mixed", "16-mixed") else 4
    return (t.root_params + 2 * t.block_params) * gathered // 4


def per_device(t: Trace, setup: Setup) -> dict:
    """The trace's figures as one device of `setup` holds them (bytes); the
    total is the largest moment, each sharded as `setup` shards it."""
    row = {"parameters": t.params, "gradients": t.grads, "optimizer state": t.optimizer}
    if setup.strategy == "fsdp":
        n = setup.shards
        row = {
            "parameters": t.params // n + _unsharded(t, setup),
            "gradients": t.grads // n + t.block_params,
            "optimizer state": t.optimizer // n,
        }
    elif setup.strategy == "ddp":
        row["gradients"] = 2 * t.grads
    total = max(_sharded(t, setup, m) for m in [t.step_peak, *t.moments.values()])
    return {**row, "activations": t.activations, "attention workspace": t.attention, "total": total}


def loss_bytes(tokens: int, vocab_size: int) -> int:
    """The loss's logits at their largest: up to CHUNK_TOKENS tokens at a time
    (rope_lm/model/head.py), float32, with their log-softmax (or its gradient)."""
    return 2 * min(tokens, CHUNK_TOKENS) * vocab_size * 4


# --- the fit -----------------------------------------------------------------------


@dataclass
class Poly:
    """a n^2 + b n + c with a >= 0 (fit's), read as never decreasing: left of
    its vertex, its minimum."""

    a: float
    b: float
    c: float

    def __call__(self, n: float) -> float:
        if self.a > 0 and -self.b / (2 * self.a) > n:
            n = -self.b / (2 * self.a)
        return self.a * n * n + self.b * n + self.c

    def longest(self, budget: float, start: float) -> float:
        """The largest n >= start with self(n) <= budget (math.inf: every n; start - 1: none)."""
        if self(start) > budget:
            return start - 1
        a, b, c = self.a, self.b, self.c - budget
        if a > 0:
            return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
        return -c / b if b > 0 else math.inf


def fit(lengths, values) -> Poly:
    """The polynomial of degree <= 2 through three (length, value) points; a
    line (least squares) where the three points bend down, which only
    rounding can make."""
    (x0, x1, x2), (y0, y1, y2) = lengths, values
    d = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d
    c = (x1 * x2 * (x1 - x2) * y0 + x2 * x0 * (x2 - x0) * y1 + x0 * x1 * (x0 - x1) * y2) / d
    if a < 0:
        mx, my = sum(lengths) / 3, sum(values) / 3
        b = sum((x - mx) * (y - my) for x, y in zip(lengths, values)) / sum((x - mx) ** 2 for x in lengths)
        a, b = 0.0, max(0.0, b)
        c = my - b * mx
    return Poly(a, b, c)


@dataclass
class Fit:
    """Each part of a step, and each moment, as a polynomial of the length from
    `start` on; `lengths`: those traced for it, `held_out`: the length it was
    checked at, `error`: the worst relative error there of the total and the
    activations (inf where the attention workspace is off by more than
    ATTENTION_TOLERANCE)."""

    start: int
    lengths: tuple
    held_out: int
    error: float
    trace: Trace  # the trace at `start` (its constant parts)
    parts: dict  # activations, attention workspace -> Poly
    moments: dict  # moment name -> Poly (the per-device total of that moment)

    def column(self, n: int, setup: Setup, vocab_size: int, batch: int) -> dict:
        row = per_device(self.trace, setup)
        for name, poly in self.parts.items():
            row[name] = int(round(poly(n)))
        row["total"] = int(round(max(p(n) for p in self.moments.values())))
        row["loss / logits"] = loss_bytes(batch * n // setup.context, vocab_size)
        return row


def fit_start(batch: int, n_head: int, context: int = 1, step: int = STEP) -> int:
    """The first length, a multiple of `step`, past every point where the kernels
    change shape: the loss in two whole chunks and more (batch x length / K > 2 x CHUNK_TOKENS) and the
    attention's query blocks capped (batch x heads x length^2 / K >= MAX_SCORE_ELEMENTS; K: the
    devices sharing each sequence, 1 without context parallelism)."""
    n = max(
        2 * CHUNK_TOKENS * context // batch + 1,
        math.isqrt(MAX_SCORE_ELEMENTS * context // max(1, batch * n_head)) + 1,
        4 * step,
    )
    return -(-n // step) * step


# --- the plan ----------------------------------------------------------------------


class Planner:
    """The plan of one run's step at any length, with or without activation
    checkpointing: traces cached by length, the fit made once."""

    def __init__(self, model, pos, scaling, vocab_size, batch, setup, optim=None, layers=UNRESOLVED, limit=None):
        self.args = (model, pos, scaling, vocab_size)
        self.batch, self.setup, self.optim, self.layers = batch, setup, optim, layers
        self.vocab_size = vocab_size
        self.limit = limit  # the longest length the model takes (None: no limit of its own)
        self.traces = {}
        self.fits = {}

    def trace(self, n: int, checkpointing: bool) -> Trace:
        key = (n, checkpointing)
        if key not in self.traces:
            self.traces[key] = trace_step(
                *self.args,
                n,
                self.batch,
                checkpointing,
                self.setup.precision,
                self.optim,
                self.layers,
                self.setup.context,
            )
        return self.traces[key]

    def direct(self, n: int, checkpointing: bool) -> dict:
        row = per_device(self.trace(n, checkpointing), self.setup)
        row["loss / logits"] = loss_bytes(self.batch * n // self.setup.context, self.vocab_size)
        return row

    def fit(self, checkpointing: bool) -> Fit | None:
        """The fit from fit_start on, checked at its held-out length; moved up
        (x2) where the check fails; None where it never holds, or the model's
        limit comes first."""
        if checkpointing in self.fits:
            return self.fits[checkpointing]
        start = self.start()
        found = None
        for _ in range(WIDENINGS + 1):
            step = self.setup.step
            lengths = tuple(int(start * k) // step * step for k in FIT_POINTS)
            held = int(start * HELD_OUT) // step * step
            if self.limit is not None and held > self.limit:
                break
            found = self._fit_at(lengths, held, checkpointing)
            if found.error <= FIT_TOLERANCE:
                break
            found, start = None, start * 2
        self.fits[checkpointing] = found
        return found

    def _fit_at(self, lengths, held, checkpointing) -> Fit:
        traces = [self.trace(n, checkpointing) for n in lengths]
        names = set(traces[0].moments)
        if any(set(t.moments) != names for t in traces):
            return Fit(lengths[0], lengths, held, math.inf, traces[0], {}, {})
        moments = {
            name: fit(lengths, [_sharded(t, self.setup, t.moments[name]) for t in traces]) for name in sorted(names)
        }
        parts = {
            "activations": fit(lengths, [t.activations for t in traces]),
            "attention workspace": fit(lengths, [t.attention for t in traces]),
        }
        got = Fit(lengths[0], lengths, held, 0.0, traces[0], parts, moments)
        want = self.direct(held, checkpointing)
        have = got.column(held, self.setup, self.vocab_size, self.batch)
        got.error = max(abs(have[k] - want[k]) / max(1, want[k]) for k in ("total", "activations"))
        key = "attention workspace"
        if abs(have[key] - want[key]) > ATTENTION_TOLERANCE * want[key]:
            got.error = math.inf
        return got

    def column(self, n: int, checkpointing: bool) -> dict:
        """Each part at length n, as the most a step of this length or a shorter
        one holds: a batch of up to CHUNK_TOKENS tokens takes the loss whole (its
        logits kept for backward), and holds more than the chunked loss just
        past it; so every part grows with the length, and a length that fits
        says every shorter one fits too."""
        row = self._raw(n, checkpointing)
        for switch in self.switches():
            if switch < n:
                before = self._raw(switch, checkpointing)
                row = {k: max(v, before[k]) for k, v in row.items()}
        return row

    def switches(self) -> list[int]:
        """The lengths past which a step holds less than at them: the last whole-loss length."""
        last = CHUNK_TOKENS * self.setup.context // self.batch
        if self.setup.context > 1:  # a length the shards divide (2K chunks)
            last = last // (2 * self.setup.context) * (2 * self.setup.context)
        return [last] if last >= 1 and (self.limit is None or last <= self.limit) else []

    def _raw(self, n: int, checkpointing: bool) -> dict:
        """Each part at length n: from the fit at and past its start, traced below it."""
        if n < self.start():
            return self.direct(n, checkpointing)
        f = self.fit(checkpointing)
        if f is not None and n >= f.start:
            return f.column(n, self.setup, self.vocab_size, self.batch)
        return self.direct(n, checkpointing)

    def start(self) -> int:
        return fit_start(self.batch, self.args[0].get("n_head", 1), self.setup.context, self.setup.step)

    def longest(self, budget: float, checkpointing: bool):
        """The longest multiple of the setup's step (64, or a multiple of 2K
        under context parallelism) whose total fits `budget` bytes: an int,
        ("all", limit) where every length the model takes fits, or None where
        not even one step's tokens fit."""
        step = self.setup.step
        top = self.limit if self.limit is not None else MAX_LENGTH
        f = self.fit(checkpointing)
        if f is not None and self.column(f.start, checkpointing)["total"] <= budget:
            # Past the fit's start the step holds more than at any switch before it (checked just above).
            n = min(p.longest(budget, f.start) for p in f.moments.values())
            if n >= top:
                return ("all", self.limit)
            n = int(n) // step * step
            while n > f.start and self.column(n, checkpointing)["total"] > budget:  # rounding at the edge
                n -= step
            return n
        hi = f.start if f is not None else (top if self.limit is not None else None)
        lo = step
        if self.column(lo, checkpointing)["total"] > budget:
            return None
        if hi is None:  # no fit: double until it does not fit (direct traces, slow at long lengths)
            hi = 2 * step
            while self.column(hi, checkpointing)["total"] <= budget:
                lo, hi = hi, 2 * hi
                if hi > top:
                    return ("all", self.limit)
        elif self.column(hi, checkpointing)["total"] <= budget:
            return ("all", self.limit) if self.limit is not None and hi >= self.limit else hi
        while hi - lo > step:  # lo fits, hi does not
            mid = (lo + hi) // 2 // step * step
            if self.column(mid, checkpointing)["total"] <= budget:
                lo = mid
            else:
                hi = mid
        return lo


def length_limit(model: dict, pos: dict, scaling: dict | None, vocab_size: int, layers=UNRESOLVED) -> int | None:
    """The longest data.seq_len the model trains at (a learned position table's
    rows, a method's own limit), by the same check resolve_run makes
    (model.transformer.check_fit); None where every length to MAX_LENGTH passes."""

    def takes(n):
        cfg = ModelConfig(vocab_size=vocab_size, train_len=n, **{k: v for k, v in model.items() if k != "name"})
        try:
            check_fit(cfg, pos, scaling, n, layers)
        except ConfigError:
            return False
        return True

    if takes(MAX_LENGTH):
        return None
    lo, hi = 1, MAX_LENGTH  # lo is taken (resolve_run checked the run's own length), hi is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if takes(mid) else (lo, mid)
    return lo


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
    limit: int | None = None,
) -> dict:
    """Per device, without and with activation checkpointing: each part, the
    total, and (given device_gb) the longest data.seq_len whose total fits.
    `layers`: the model's resolved layer specs (RunConfig.layers); `limit`: the
    longest length the model takes (length_limit)."""
    planner = Planner(model, pos, scaling, vocab_size, batch, setup, optim, layers, limit)
    out = {"seq_len": seq_len, "batch": batch, "setup": setup, "columns": {}, "fits": {}, "limit": limit}
    for on in (False, True):
        name = "with checkpointing" if on else "without checkpointing"
        column = planner.column(seq_len, on)
        if device_gb:
            column["longest seq_len"] = planner.longest(device_gb * GiB, on)
            if column["longest seq_len"] is None:
                column["smallest"] = planner.column(setup.step, on)["total"]
        out["columns"][name] = column
        if on in planner.fits:
            out["fits"][name] = planner.fits[on]
    return out


def setup_of(trainer) -> Setup:
    """The devices, strategy and precision of a built lightning.Trainer (what
    rope_lm.train.trainer.build_trainer makes of the run's settings, with its
    refusals), as train.py would run them here."""
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    from rope_lm.train.sharding import BlockShardedStrategy

    world = max(1, trainer.num_devices) * max(1, trainer.num_nodes)
    strategy = trainer.strategy
    context = getattr(strategy, "context_parallel", 1)  # train/context_parallel.ContextParallelStrategy
    if isinstance(strategy, BlockShardedStrategy):
        kind = "fsdp"
    elif isinstance(strategy, DDPStrategy):
        kind = "ddp"
    elif isinstance(strategy, SingleDeviceStrategy) and world == 1:
        kind = "single"
    else:
        raise ConfigError(
            f"trainer.strategy={type(strategy).__name__} is not one the memory plan knows; it plans one device, "
            f"DDP (trainer.strategy=ddp) and FSDP (trainer=fsdp)."
        )
    return Setup(devices=world, strategy=kind, precision=str(trainer.precision), context=context)


def format_plan(p: dict, device_gb: float | None) -> str:
    s = p["setup"]
    head = (
        f"Memory plan per device: data.seq_len={p['seq_len']}, data.batch_size={p['batch']} per device, "
        f"{s.devices} device(s), {s.strategy}, precision {s.precision}"
    )
    if s.context > 1:
        head += (
            f"; context parallelism: each sequence split over {s.context} devices ({p['seq_len'] // s.context} "
            f"tokens each, every layer's keys and values gathered whole), FSDP over those {s.context}"
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
    notes = []
    if device_gb:
        fits = [p["columns"][c].get("longest seq_len") for c in cols]
        lines.append(f"{'longest seq_len':<{width}}" + "".join(f"{_longest(f):>24}" for f in fits))
        for c, f in zip(cols, fits):
            if f is None:
                notes.append(
                    f"{c}: none fits {device_gb:g} GiB; not even data.seq_len={s.step} does (it needs "
                    f"{_gib(p['columns'][c]['smallest'])})."
                )
            elif isinstance(f, tuple):
                notes.append(
                    f"{c}: every data.seq_len the model takes fits {device_gb:g} GiB (its limit: {f[1]}, "
                    f"{_limit_reason(p)})."
                )
            else:
                notes.append(f"{c}: the longest data.seq_len that fits {device_gb:g} GiB is {f}.")
    lines += (
        [""]
        + notes
        + [
            "activations: what the model keeps for backward as its forward ends (the loss's logits: their own "
            "row); attention workspace: the most one layer's attention adds in forward; total: the traced peak "
            "of a step (parts overlap in time). Each figure is the most a step of this length or a shorter one "
            f"holds (up to {CHUNK_TOKENS} tokens a batch takes the loss whole, which holds more than the chunked "
            "loss just past it), so a length that fits says every shorter one fits too.",
            _method(p),
        ]
    )
    return "\n".join(lines)


def _longest(f) -> str:
    if f is None:
        return "none"
    if isinstance(f, tuple):
        return f"all up to {f[1]}" if f[1] is not None else "all lengths"
    return str(f)


def _limit_reason(p) -> str:
    return "what the model's scheme or method takes, e.g. pos.max_positions rows of a learned table"


def _method(p: dict) -> str:
    parts = []
    if not p["fits"]:
        return "method: every figure traced at the length asked."
    for name, f in p["fits"].items():
        if f is None:
            parts.append(f"{name}: traced at each length asked (no fit held)")
        else:
            parts.append(
                f"{name}: from {f.start} tokens a fit in the length (traced at {', '.join(map(str, f.lengths))}; "
                f"{f.error:.2%} off a trace at {f.held_out}), traced below"
            )
    return (
        "method: "
        + "; ".join(parts)
        + f"; a fit is used where its total and activations are within {FIT_TOLERANCE:.0%} of the trace "
        f"(its attention workspace within {ATTENTION_TOLERANCE:.0%})."
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"
