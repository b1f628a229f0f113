"""Throughput and memory of rope-lm against the peers a user would pick.

Training (forward + backward + clip + optimizer step, tokens/s) for each model
size and positional scheme, on the same machine, dimensions and batches:

* ``hf``: Hugging Face ``LlamaForCausalLM`` with SDPA attention, sized to
  match (see ``hf_config``), driven by a plain PyTorch loop, in a process set
  up as a user's would be;
* ``hf+keepmem`` (CPU): the same with rope-lm's allocator setting
  (rope_lm.allocator.keep_freed_memory), which separates what the model does
  from what the process setting does;
* ``plain``: our model, the same plain loop (bounds framework overhead);
* ``plain+fused``: the same with AdamW's fused kernel (``optim.fused=true``; on
  CPU the default is the foreach kernel);
* ``lightning``: our model through ``LitLM`` and ``lightning.Trainer`` built
  by the pipeline's own trainer_kwargs, steps timed by a callback;
* ``plain+compile`` / ``lightning+compile`` with ``compile=True``.

Every peer runs in a process of its own (so allocator state, process-wide
flags and peak RSS are its own) and only one computes at a time; repeats are
interleaved round-robin (A, B, C, A, B, C, ...) so that background load falls
on every peer alike, and ratios are medians of per-round ratios.

Evaluation (forward + per-token loss, the code path of rope_lm.evaluation) at
long lengths, one window per forward, with peak memory: every measurement in
a fresh process, reading its peak RSS (reset after warm-up) on CPU, or
``max_memory_allocated`` after a reset on CUDA.

benchmarks/bench.py is the command line; this module reads no config file and
uses rope_lm's public API only.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
import datetime
import gc
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

PEERS = ("hf", "hf+keepmem", "plain", "plain+fused", "lightning")
_RESULT_MARK = "@@bench-result@@"

# Dense bf16 tensor-core peaks (TFLOP/s) used for MFU when --peak-tflops is not given.
CUDA_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0,
                    "RTX 4090": 165.0, "A6000": 155.0}


@dataclass
class BenchSettings:
    models: dict[str, dict]  # label -> `model.*` settings (a conf/model preset)
    schemes: dict[str, dict]  # label -> `pos.*` settings
    optim: dict  # `optim.*` as in conf/config.yaml
    trainer: dict  # `trainer.*` as in conf/trainer/default.yaml
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    warmup: int = 2  # untimed steps per peer before the first repeat
    steps: int = 3  # timed steps per repeat
    repeats: int = 5
    eval_lengths: list[int] = field(default_factory=lambda: [2048, 4096, 8192, 16384])
    eval_batch: int = 1
    eval_repeats: int = 2
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    hf_mlp: str = "matched"  # matched: SwiGLU width 2/3 * mlp_ratio * d (equal parameters); ratio: mlp_ratio * d
    compile: bool = False
    device: str = "cpu"
    threads: int | None = None
    peak_tflops: float | None = None
    seed: int = 0
    imports: list[str] = field(default_factory=list)  # modules that register extra schemes
    deterministic: bool | None = None  # None: as the pipeline resolves trainer.deterministic

    def validate(self):
        from rope_lm.errors import ConfigError

        bad = set(self.peers) - set(PEERS)
        if bad:
            raise ConfigError(f"Unknown bench peer(s) {', '.join(sorted(bad))}; choose from {', '.join(PEERS)}.")
        if self.hf_mlp not in ("matched", "ratio"):
            raise ConfigError(f"hf_mlp={self.hf_mlp!r}: use matched or ratio.")
        for key in ("seq_len", "batch_size", "steps", "eval_batch", "eval_repeats", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"bench setting {key}={getattr(self, key)} must be a positive integer.")
        if self.repeats < 0 or self.warmup < 0:
            raise ConfigError("bench settings repeats and warmup must be >= 0 (repeats=0 skips training).")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for, but torch sees no CUDA device.")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: use cpu or cuda.")


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info(device: str, threads: int) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def v(package):  # without importing it: the coordinator never needs these modules
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    info = {"nproc": usable_cpus(), "cpu": cpu_model(), "threads": threads, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": v("transformers"), "lightning": v("lightning"),
            "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_kb() -> int:
    hwm = _status_kb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ----------------------------------------------------------------------------- models


def _seeded(seed: int):
    torch.manual_seed(seed)


def build_ours(model_cfg: dict, pos_cfg: dict, vocab: int, train_len: int):
    from rope_lm.model import build_model

    return build_model(model_cfg, pos_cfg, None, vocab_size=vocab, train_len=train_len)


def hf_config(model_cfg: dict, pos_cfg: dict, vocab: int, max_len: int, hf_mlp: str):
    """A LlamaConfig with our dimensions. Differences that remain: Llama's MLP
    is SwiGLU (three matrices) where ours is GELU (two), so 'matched' sizes it
    at 2/3 of mlp_ratio * d for equal parameters; Llama projects q, k, v
    separately where we use one fused matrix."""
    from transformers import LlamaConfig

    d, heads = model_cfg["d_model"], model_cfg["n_head"]
    ratio = model_cfg.get("mlp_ratio", 4.0)
    inter = int(round(2 * ratio * d / 3)) if hf_mlp == "matched" else int(ratio * d)
    return LlamaConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=inter, num_hidden_layers=model_cfg["n_layer"],
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=d // heads, max_position_embeddings=max_len,
        rope_parameters={"rope_type": "default", "rope_theta": float(pos_cfg.get("base", 10000.0))},
        tie_word_embeddings=model_cfg.get("tie_embeddings", True), attention_bias=model_cfg.get("bias", False),
        mlp_bias=model_cfg.get("bias", False), rms_norm_eps=torch.finfo(torch.float32).eps,
        attention_dropout=model_cfg.get("dropout", 0.0), use_cache=False, attn_implementation="sdpa",
    )


class HFLogits(torch.nn.Module):
    """LlamaForCausalLM as idx -> logits, no KV cache (as for our model)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, idx):
        return self.hf(input_ids=idx, use_cache=False).logits


def build_hf(model_cfg: dict, pos_cfg: dict, vocab: int, max_len: int, hf_mlp: str) -> HFLogits:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(hf_config(model_cfg, pos_cfg, vocab, max_len, hf_mlp))
    if hf.config._attn_implementation != "sdpa":
        raise RuntimeError(f"transformers chose attention {hf.config._attn_implementation!r}, not sdpa")
    return HFLogits(hf)


def param_counts(model) -> dict:
    """Total (tied matrices once) and without the token embedding."""
    if isinstance(model, HFLogits):
        total = sum(p.numel() for p in model.parameters())
        emb = model.hf.get_input_embeddings().weight.numel()
    else:
        total = model.num_params(non_embedding=False)
        emb = model.wte.weight.numel()
    return {"params": total, "params_non_embedding": total - emb}


def flops_per_token(counts: dict, model_cfg: dict, vocab: int, seq_len: int, training: bool) -> float:
    """6N + 12 L T d for a training token (2N + 4 L T d for a forward-only one),
    N the non-embedding parameters plus the output projection, whose matmul
    is real work even when it is tied to the embedding."""
    n = counts["params_non_embedding"] + vocab * model_cfg["d_model"]
    if not model_cfg.get("tie_embeddings", True):
        n = counts["params_non_embedding"]
    attn = model_cfg["n_layer"] * seq_len * model_cfg["d_model"]
    return 6 * n + 12 * attn if training else 2 * n + 4 * attn


def detect_peak_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    for key, tflops in CUDA_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    return None


def matmul_peak_tflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 TFLOP/s of an n x n x n matmul on this CPU with `threads`
    threads: the measured ceiling CPU MFU is taken against (not a datasheet)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    finally:
        torch.set_num_threads(before)
    return 2 * n ** 3 / best / 1e12


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()


def _sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- training peers


def make_batches(n: int, batch: int, seq_len: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, seq_len), generator=g), torch.randint(0, vocab, (batch, seq_len), generator=g))
            for _ in range(n)]


def _optimizer_like_lit(model, optim: dict, max_steps: int):
    """LitLM's own optimizer and schedule (param groups, betas, fused on CUDA)
    for a model that is not a LitLM, so every peer steps the same optimizer."""
    from rope_lm.lit import OptimConfig, build_optimizer

    return build_optimizer(model, OptimConfig(**optim), max_steps)


def _cpu_seconds() -> float:
    """CPU time of the whole process (all threads), user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class LoopRunner:
    """A plain PyTorch training loop: what a user writes without a framework."""

    def __init__(self, peer, loss_fn, params, opt, sched, batches, device, clip):
        self.peer, self.loss_fn, self.params = peer, loss_fn, params
        self.opt, self.sched, self.batches, self.device, self.clip = opt, sched, batches, device, clip
        self._i = 0

    def _step(self):
        x, y = self.batches[self._i % len(self.batches)]
        self._i += 1
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with _autocast(self.device):
            loss = self.loss_fn(x, y)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)

    def steps(self, n) -> tuple[float, float]:
        """(wall, CPU) seconds of n steps."""
        _sync(self.device)
        t0, c0 = time.perf_counter(), _cpu_seconds()
        for _ in range(n):
            self._step()
        _sync(self.device)
        return time.perf_counter() - t0, _cpu_seconds() - c0


class _StopFit(Exception):
    pass


class LightningRunner:
    """LitLM trained by one lightning.Trainer built by the pipeline's own
    trainer_kwargs (precision, determinism, clipping, checkpoint and
    throughput callbacks), for the whole benchmark. The coordinator paces it
    from inside the fit: at the start of a step, a callback answers the last
    command and waits for the next, so a block of n steps is timed over n
    whole loop periods (data fetch, hooks, logging, step) of one long fit."""

    def __init__(self, peer, lit, trainer_options, batches, device, out_dir, max_steps):
        self.peer, self.lit, self.options = peer, lit, dict(trainer_options)
        self.batches, self.device, self.out_dir, self.max_steps = batches, device, out_dir, max_steps

    def drive(self, channel, first: dict, answer) -> None:
        """Run the fit, serving `first` and then every command read from
        `channel` until 'exit'. answer(msg, wall, cpu) -> the reply dict."""
        import lightning as L
        from torch.utils.data import DataLoader

        from rope_lm.config import trainer_config
        from rope_lm.pipeline import trainer_kwargs

        device = self.device
        pending = {"msg": first, "left": first["n"], "t0": None}

        class Pacer(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if pending["t0"] is None:  # the first step of the fit
                    pending.update(t0=time.perf_counter(), c0=_cpu_seconds())
                if pending["left"] > 0:
                    pending["left"] -= 1
                    return
                _sync(device)
                wall, cpu = time.perf_counter() - pending["t0"], _cpu_seconds() - pending["c0"]
                channel.reply(answer(pending["msg"], wall, cpu))
                msg = channel.read()
                if msg["cmd"] == "exit":
                    raise _StopFit
                if msg["cmd"] not in ("warm", "block"):
                    channel.reply({"ok": False, "error": f"command {msg['cmd']!r} during a fit"})
                    raise _StopFit
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                pending.update(msg=msg, left=msg["n"] - 1, t0=time.perf_counter(), c0=_cpu_seconds())

        kwargs = trainer_kwargs(trainer_config({**self.options, "max_steps": self.max_steps}), self.out_dir, None)
        kwargs.update(enable_model_summary=False, accelerator="gpu" if device == "cuda" else "cpu", devices=1)
        kwargs["callbacks"] = list(kwargs["callbacks"]) + [Pacer()]
        data = [self.batches[i % len(self.batches)] for i in range(self.max_steps)]
        # The progress bar keeps its real per-step cost; its text goes to the worker's stderr.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = L.Trainer(**kwargs)
                try:
                    trainer.fit(self.lit, train_dataloaders=DataLoader(data, batch_size=None))
                except _StopFit:
                    channel.reply({"ok": True})
                    return
            channel.reply({"ok": False, "error": f"the fit ended after {self.max_steps} steps before 'exit'"})
        finally:
            shutil.rmtree(self.out_dir, ignore_errors=True)


def _quiet_lightning():
    import lightning  # noqa: F401  (it sets its loggers' levels on import; override after)

    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _setup_process(spec: dict):
    """What every measuring process shares: threads, determinism, extra schemes."""
    torch.set_num_threads(spec["threads"])
    # The pipeline trains deterministically on CPU (trainer.deterministic=auto),
    # and Lightning sets the flag process-wide: every peer runs under it alike.
    torch.use_deterministic_algorithms(spec.get("deterministic", False), warn_only=True)
    for name in spec.get("imports", []):
        __import__(name)
    if spec["peer"].startswith("hf") and spec["peer"].endswith("+keepmem"):
        from rope_lm.allocator import keep_freed_memory

        keep_freed_memory()


def build_train_runner(spec: dict):
    """The runner of one training peer, built in its own process: (runner,
    parameter counts, the CompiledForward or None)."""
    from rope_lm.lit import LitLM

    _setup_process(spec)
    s = spec
    model_cfg, pos_cfg, device = s["model_cfg"], s["pos_cfg"], s["device"]
    clip = s["trainer"].get("gradient_clip_val")
    max_steps = int(s["trainer"].get("max_steps", 1200))
    batches = make_batches(s["n_batches"], s["batch"], s["seq_len"], s["vocab"], s["seed"])
    peer = s["peer"]
    compiled = peer.endswith("+compile")
    _seeded(s["seed"])
    if peer.startswith("hf"):
        hf = build_hf(model_cfg, pos_cfg, s["vocab"], s["seq_len"], s["hf_mlp"]).to(device)
        opt, sched = _optimizer_like_lit(hf, s["optim"], max_steps)
        loss = lambda x, y: F.cross_entropy(hf(x).float().flatten(0, 1), y.flatten())  # noqa: E731
        return LoopRunner(peer, loss, list(hf.parameters()), opt, sched, batches, device, clip), param_counts(hf), None
    optim = {**s["optim"], "fused": True} if "+fused" in peer else s["optim"]  # AdamW's fused kernel, CPU included
    lit = LitLM(model=model_cfg, pos=pos_cfg, scaling=None, optim=optim, vocab_size=s["vocab"],
                train_len=s["seq_len"], max_steps=max_steps, compile=compiled).to(device)
    counts = param_counts(lit.model)
    fwd = lit.compiled_forward
    if peer.startswith("plain"):
        opt, sched = lit.configure_optimizers().values()
        runner = LoopRunner(peer, lambda x, y: lit.loss((x, y)), list(lit.parameters()), opt, sched["scheduler"],
                            batches, device, clip)
    else:
        _quiet_lightning()
        runner = LightningRunner(peer, lit, s["trainer"], batches, device, tempfile.mkdtemp(prefix="rope-lm-bench-"),
                                 s["fit_steps"])
    return runner, counts, fwd


def measure_eval(spec: dict) -> dict:
    """One evaluation measurement: build, warm up, time eval_repeats forward
    passes (with the per-token loss) at one length, and the memory they took."""
    from rope_lm.evaluation import token_losses

    _setup_process(spec)
    device, L, B = spec["device"], spec["length"], spec["batch"]
    model_cfg, pos_cfg = spec["model_cfg"], spec["pos_cfg"]
    _seeded(spec["seed"])
    if spec["peer"].startswith("hf"):
        model = build_hf(model_cfg, pos_cfg, spec["vocab"], max(L, spec["seq_len"]), spec["hf_mlp"])
    else:
        model = build_ours(model_cfg, pos_cfg, spec["vocab"], spec["seq_len"])
        model.validate_length(L)
    counts = param_counts(model)
    model = model.to(device).eval()
    compiled = None
    if spec["peer"].endswith("+compile"):
        from rope_lm.compile import maybe_compile

        model = compiled = maybe_compile(model, dynamic=False)
    g = torch.Generator().manual_seed(spec["seed"])
    x = torch.randint(0, spec["vocab"], (B, L), generator=g)
    y = torch.randint(0, spec["vocab"], (B, L), generator=g)
    # A compiled model is specialised to its shape, so it warms up at L (that
    # is its compile time); an eager one at a short length, which keeps the
    # allocations of the measured pass out of the baseline.
    warm = L if compiled is not None else min(L, 256)
    t0 = time.perf_counter()
    token_losses(model, x[:, :warm], y[:, :warm], B * warm)
    _sync(device)
    warm_s = time.perf_counter() - t0
    gc.collect()
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        reset = _reset_peak_rss()
        base = (_status_kb("VmRSS") or 0) / 1024
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        losses = token_losses(model, x, y, B * L)
        _sync(device)
        times.append(time.perf_counter() - t0)
    if device == "cuda":
        peak, how = torch.cuda.max_memory_allocated() / 2**20, "cuda max_memory_allocated"
    else:
        peak = _peak_rss_kb() / 1024
        how = "peak RSS (reset before the pass)" if reset else "peak RSS of the process"
    return {"tokens_per_s": B * L / statistics.median(times), "seconds": statistics.median(times),
            "peak_mem_mb": peak, "mem_growth_mb": max(0.0, peak - base), "baseline_mem_mb": base, "memory": how,
            "warmup_s": warm_s, "loss": float(losses.mean()), **counts,
            "compiled": None if compiled is None else compiled.compiled}


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


class _Channel:
    """The worker's side: commands from stdin, answers on the original stdout;
    anything else printed (Lightning, warnings) goes to stderr."""

    def __init__(self):
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def read(self) -> dict:
        line = sys.stdin.readline()
        return json.loads(line) if line else {"cmd": "exit"}

    def reply(self, obj: dict):
        self.out.write(json.dumps(obj) + "\n")


def _exit_with_parent():
    """A worker outlives a killed coordinator only as long as it computes;
    this ends it then too."""
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(2)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker_main():
    """A measuring process: build, then warm/block commands, or one eval."""
    _exit_with_parent()
    channel = _Channel()
    state: dict = {}

    def answer(msg, wall, cpu):
        out = {"ok": True, "seconds": wall, "cpu_seconds": cpu}
        if msg["cmd"] == "warm":
            fwd = state["fwd"]
            out.update(compiled=None if fwd is None else fwd.compiled, compile_error=None if fwd is None else fwd.reason)
        elif state["spec"]["device"] == "cuda":
            out["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        else:
            out["peak_mem_mb"] = _peak_rss_kb() / 1024
        return out

    while True:
        msg = channel.read()
        cmd = msg["cmd"]
        if cmd == "exit":
            channel.reply({"ok": True})
            return
        try:
            if cmd == "eval":
                out = {"ok": True, **measure_eval(msg["spec"])}
            elif cmd == "build":
                state["spec"] = msg["spec"]
                state["runner"], counts, state["fwd"] = build_train_runner(msg["spec"])
                out = {"ok": True, **counts}
            elif cmd in ("warm", "block") and isinstance(state.get("runner"), LightningRunner):
                state["runner"].drive(channel, msg, answer)  # serves every command up to 'exit'
                return
            elif cmd in ("warm", "block"):
                if cmd == "block" and state["spec"]["device"] == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                out = answer(msg, *state["runner"].steps(msg["n"]))
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as e:
            out = {"ok": False, "error": _error_text(e)}
        channel.reply(out)


class Worker:
    """A measuring process (see _worker_main) and its command channel."""

    def __init__(self):
        self.errors = tempfile.TemporaryFile(mode="w+")
        # This file run as a script is the worker (see the end of the file).
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errors, text=True, bufsize=1)

    def call(self, cmd: str, **kwargs) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.proc.wait()
            self.errors.seek(0)
            tail = " | ".join(self.errors.read().strip().splitlines()[-3:])
            return {"ok": False, "error": f"measuring process exited with {self.proc.returncode}: {tail}"}
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.call("exit")
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.errors.close()


def _train_peers(s: BenchSettings, pos_cfg: dict) -> list[str]:
    """rope gets every peer. Other schemes get the plain loop, which gives
    scheme/rope; Lightning's per-step overhead does not depend on the scheme
    (it is measured on rope), and each peer process holds ~1 GB, so a full
    sweep of schemes x peers would not fit a small machine."""
    rope = pos_cfg.get("name") == "rope"
    peers = []
    if rope and "hf" in s.peers:
        peers += ["hf"] + (["hf+keepmem"] if s.device == "cpu" and "hf+keepmem" in s.peers else [])
    for suffix in [""] + (["+compile"] if s.compile else []):
        peers += [p + suffix for p in ("plain", "plain+fused", "lightning") if p in s.peers and (rope or p == "plain")
                  and not (suffix and p == "plain+fused")]
    if not peers and not rope and "lightning" in s.peers:
        peers = ["lightning"]
    return peers


def _spec(s: BenchSettings, model_label: str, scheme_label: str, peer: str) -> dict:
    return {"peer": peer, "model_cfg": s.models[model_label], "pos_cfg": s.schemes[scheme_label], "device": s.device,
            "threads": s.threads, "deterministic": s.deterministic, "imports": s.imports, "seed": s.seed,
            "vocab": s.vocab_size, "seq_len": s.seq_len, "batch": s.batch_size, "hf_mlp": s.hf_mlp,
            "optim": s.optim, "trainer": s.trainer, "n_batches": max(s.warmup, s.steps) + 1,
            "fit_steps": max(1, s.warmup) + s.repeats * s.steps + 2}


def run_training(s: BenchSettings, log) -> list[dict]:
    """Per model: one process per (scheme, peer), all built first, then
    repeats interleaved round-robin; only one process computes at a time."""
    rows = []
    tokens = s.batch_size * s.seq_len
    for model_label in s.models:
        entries = [{"model": model_label, "scheme": sch, "peer": peer, "spec": _spec(s, model_label, sch, peer)}
                   for sch, pos_cfg in s.schemes.items() for peer in _train_peers(s, pos_cfg)]
        for e in entries:
            e["worker"] = Worker()
        try:
            live = []
            for e in entries:
                built = e["worker"].call("build", spec=e["spec"])
                warm = e["worker"].call("warm", n=max(1, s.warmup)) if built.get("ok") else built
                if not warm.get("ok"):
                    log(f"[train] {model_label}/{e['scheme']}/{e['peer']}: skipped ({warm['error']})")
                    rows.append({"phase": "train", "model": model_label, "scheme": e["scheme"], "peer": e["peer"],
                                 "seq_len": s.seq_len, "error": warm["error"], "tokens_per_s": None})
                    continue
                if warm.get("compiled") is False:
                    log(f"[train] {model_label}/{e['scheme']}/{e['peer']}: torch.compile unavailable "
                        f"({warm['compile_error']}); this row is uncompiled")
                e.update(counts={k: built[k] for k in ("params", "params_non_embedding")}, warm=warm, times=[], mem=[],
                         cpu=[])
                live.append(e)
            for r in range(s.repeats):
                for e in live:
                    out = e["worker"].call("block", n=s.steps)
                    if not out.get("ok"):
                        raise RuntimeError(f"{e['scheme']}/{e['peer']} failed mid-benchmark: {out['error']}")
                    e["times"].append(out["seconds"])
                    e["cpu"].append(out["cpu_seconds"])
                    e["mem"].append(out["peak_mem_mb"])
                log(f"[train] {model_label} round {r + 1}/{s.repeats}: " + ", ".join(
                    f"{e['scheme']}/{e['peer']} {s.steps * tokens / e['times'][-1]:.0f}" for e in live) + " tok/s")
        finally:
            for e in entries:
                e["worker"].close()
        for e in live:
            tps = [s.steps * tokens / t for t in e["times"]]
            row = {"phase": "train", "model": model_label, "scheme": e["scheme"], "peer": e["peer"],
                   "seq_len": s.seq_len, "batch": s.batch_size, "tokens_per_s": statistics.median(tps),
                   "tokens_per_s_repeats": tps, "step_ms": 1000 * statistics.median(e["times"]) / s.steps,
                   # Tokens per CPU-second of the peer's process: barely moved by other load
                   # (time slices lost to it are not counted), so a check on the wall-clock ratios.
                   "tokens_per_cpu_s": statistics.median(s.steps * tokens / max(c, 1e-6) for c in e["cpu"]),
                   "tokens_per_cpu_s_repeats": [s.steps * tokens / max(c, 1e-6) for c in e["cpu"]],
                   **e["counts"], "compiled": e["warm"].get("compiled"), "warmup_s": e["warm"]["seconds"],
                   "peak_mem_mb": max(e["mem"]), "memory": "cuda max_memory_allocated" if s.device == "cuda"
                   else "peak RSS of the peer's process",
                   "flops_per_token": flops_per_token(e["counts"], s.models[model_label], s.vocab_size, s.seq_len,
                                                      True)}
            row["mfu"] = row["flops_per_token"] * row["tokens_per_s"] / (s.peak_tflops * 1e12) if s.peak_tflops else None
            rows.append(row)
    return rows


def run_evaluation(s: BenchSettings, log, on_row=None) -> list[dict]:
    """Each (model, scheme, length, peer) in a fresh process of its own;
    on_row(rows so far) after each."""
    rows = []
    for model_label, model_cfg in s.models.items():
        for scheme_label, pos_cfg in s.schemes.items():
            peers = ["ours"] + (["hf"] if "hf" in s.peers and pos_cfg.get("name") == "rope" else [])
            peers += ["ours+compile"] if s.compile else []
            for L in s.eval_lengths:
                for peer in peers:
                    spec = {**_spec(s, model_label, scheme_label, peer), "length": L, "batch": s.eval_batch,
                            "repeats": s.eval_repeats}
                    worker = Worker()
                    try:
                        out = worker.call("eval", spec=spec)
                    finally:
                        worker.close()
                    row = {"phase": "eval", "model": model_label, "scheme": scheme_label, "peer": peer, "seq_len": L,
                           "batch": s.eval_batch}
                    if not out.pop("ok"):
                        log(f"[eval] {model_label}/{scheme_label}/{peer} @ {L}: failed ({out['error']})")
                        rows.append({**row, "error": out["error"], "tokens_per_s": None})
                        if on_row:
                            on_row(rows)
                        continue
                    row.update(out)
                    counts = {"params": out["params"], "params_non_embedding": out["params_non_embedding"]}
                    row["flops_per_token"] = flops_per_token(counts, model_cfg, s.vocab_size, L, False)
                    row["mfu"] = (row["flops_per_token"] * row["tokens_per_s"] / (s.peak_tflops * 1e12)
                                  if s.peak_tflops else None)
                    if out.get("compiled") is False:
                        log(f"[eval] {model_label}/{scheme_label}: torch.compile unavailable; {peer} row is uncompiled")
                    log(f"[eval] {model_label}/{scheme_label}/{peer} @ {L}: {row['tokens_per_s']:.0f} tok/s, "
                        f"+{row['mem_growth_mb']:.0f} MB")
                    rows.append(row)
                    if on_row:
                        on_row(rows)
    return rows


# ----------------------------------------------------------------------------- ratios, targets, views


def _paired(a, b, key="tokens_per_s_repeats") -> float | None:
    """Median over rounds of a's throughput over b's in the same round."""
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return statistics.median(x / y for x, y in zip(a[key], b[key]))


def _find(rows, **key):
    for r in rows:
        if all(r.get(k) == v for k, v in key.items()):
            return r
    return None


def ratios_and_targets(s: BenchSettings, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    train = [r for r in rows if r["phase"] == "train"]
    ratios, targets = [], []
    rope = [lab for lab, cfg in s.schemes.items() if cfg.get("name") == "rope"]
    rope = rope[0] if rope else None

    def ratio(name, model, a, b, threshold=None, note="", show=True):
        value = _paired(a, b)
        if value is None:
            return
        cpu = _paired(a, b, "tokens_per_cpu_s_repeats")
        entry = {"name": name, "model": model, "value": value, "a": f"{a['scheme']}/{a['peer']}",
                 "b": f"{b['scheme']}/{b['peer']}", "ratio_of_medians": a["tokens_per_s"] / b["tokens_per_s"],
                 "cpu_time_ratio": cpu}
        ratios.append(entry)
        if show:
            a["ratio"], a["ratio_vs"], a["cpu_ratio"] = value, entry["b"], cpu
        if threshold is not None:
            note = "; ".join(n for n in (note, f"per CPU-second: {cpu:.3f}" if cpu else "") if n)
            targets.append({"target": f"{name} >= {threshold}", "model": model, "value": round(value, 3),
                            "holds": value >= threshold, "note": note})

    for model in s.models:
        for scheme in s.schemes:
            plain = _find(train, model=model, scheme=scheme, peer="plain")
            light = _find(train, model=model, scheme=scheme, peer="lightning")
            if scheme == rope:
                hf = _find(train, model=model, scheme=scheme, peer="hf")
                same = _paired(plain, _find(train, model=model, scheme=scheme, peer="hf+keepmem"))
                ratio("ours/HF (plain loops)", model, plain, hf, 1.1,
                      note=f"vs HF given rope-lm's allocator setting too: {same:.3f}" if same else "")
            elif rope:
                ratio(f"{scheme}/rope (plain loops)", model, plain, _find(train, model=model, scheme=rope, peer="plain"),
                      0.7)
            ratio(f"Lightning/plain ({scheme})", model, light, plain, 0.95 if scheme == rope else None)
            if scheme == rope:
                ratio("HF with rope-lm's allocator setting/HF", model,
                      _find(train, model=model, scheme=scheme, peer="hf+keepmem"),
                      _find(train, model=model, scheme=scheme, peer="hf"))
                ratio("ours/HF with the same allocator setting", model, plain,
                      _find(train, model=model, scheme=scheme, peer="hf+keepmem"), show=False)
            ratio(f"fused/foreach AdamW, plain loop ({scheme})", model,
                  _find(train, model=model, scheme=scheme, peer="plain+fused"), plain)
            for peer in ("plain", "lightning"):
                ratio(f"compiled/eager {peer} ({scheme})", model,
                      _find(train, model=model, scheme=scheme, peer=peer + "+compile"),
                      _find(train, model=model, scheme=scheme, peer=peer))
    ev = [r for r in rows if r["phase"] == "eval" and r.get("tokens_per_s")]
    for r in ev:
        base = "hf" if r["peer"] == "ours" else "ours" if r["peer"] == "ours+compile" else None
        b = _find(ev, model=r["model"], scheme=r["scheme"], seq_len=r["seq_len"], peer=base) if base else None
        if b is not None:
            r["ratio"], r["ratio_vs"] = r["tokens_per_s"] / b["tokens_per_s"], f"{b['scheme']}/{b['peer']}"
    for model in s.models:
        for scheme in s.schemes:
            pts = sorted((r["seq_len"], r["mem_growth_mb"]) for r in ev
                         if r["model"] == model and r["scheme"] == scheme and r["peer"] == "ours")
            # Below a few MB the growth is allocator noise, not the model's.
            if len(pts) >= 2 and pts[0][1] > 0 and pts[-1][1] >= 16:
                (l0, m0), (l1, m1) = pts[0], pts[-1]
                growth = m1 / m0
                # Linear memory grows like the length; a T x T tensor would
                # grow like its square. Allow 1.5x the linear factor for fixed
                # per-forward buffers that the shortest length hides.
                targets.append({"target": f"eval memory ~linear in length ({scheme})", "model": model,
                                "value": round(growth, 2), "holds": growth <= 1.5 * l1 / l0,
                                "note": f"memory grew {growth:.2f}x from {l0} to {l1} tokens ({l1 / l0:.0f}x); "
                                        f"quadratic would be {(l1 / l0) ** 2:.0f}x"})
            if any(r["model"] == model and r["scheme"] == scheme and r.get("error") for r in rows
                   if r["phase"] == "eval"):
                targets.append({"target": f"eval at every length ({scheme})", "model": model, "value": None,
                                "holds": False, "note": "a length failed; see the rows"})
    return ratios, targets


def _fmt(v, digits=0):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    mfu = any(r.get("mfu") is not None for r in rows)  # only where a device peak is known (CUDA, --peak-tflops)
    cols = ["model", "scheme", "phase", "peer", "T", "tokens/s", "ratio", "vs", "tok/CPU-s", "CPU ratio"]
    cols += (["MFU"] if mfu else []) + ["peak MB", "+MB", "params (non-emb)"]
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join("---" if c in ("model", "scheme", "phase", "peer", "vs") else "---:" for c in cols) + "|"]
    for r in rows:
        head = [r["model"], r["scheme"], r["phase"], r["peer"], str(r["seq_len"])]
        if r.get("error"):
            lines.append("| " + " | ".join(head + [f"failed: {r['error'][:60]}"] + [""] * (len(cols) - 6)) + " |")
            continue
        params = f"{r['params'] / 1e6:.2f}M ({r['params_non_embedding'] / 1e6:.2f}M)" if r.get("params") else "-"
        cells = head + [_fmt(r["tokens_per_s"]), _fmt(r.get("ratio"), 2), r.get("ratio_vs", ""),
                        _fmt(r.get("tokens_per_cpu_s")), _fmt(r.get("cpu_ratio"), 2)]
        cells += ([f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"] if mfu else [])
        cells += [_fmt(r.get("peak_mem_mb")), _fmt(r.get("mem_growth_mb")), params]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_text(targets: list[dict]) -> str:
    return "\n".join(f"- [{'x' if t['holds'] else ' '}] {t['model']}: {t['target']}: {t['value']}"
                     + (f" ({t['note']})" if t.get("note") else "") for t in targets)


def run(s: BenchSettings, out: str | None = None, log=None) -> dict:
    """The whole benchmark; returns (and writes to `out`) the results dict."""
    from rope_lm.report import write_json

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    s.validate()
    for name in s.imports:  # fail here, once, if a module is missing
        __import__(name)
    s.threads = s.threads or (usable_cpus() if s.device == "cpu" else torch.get_num_threads())
    if s.deterministic is None:
        det = s.trainer.get("deterministic", "auto")
        s.deterministic = (s.device != "cuda") if det == "auto" else bool(det)
    if s.peak_tflops is None:
        s.peak_tflops = detect_peak_tflops(s.device)
    if s.peak_tflops is None and s.device == "cpu":
        s.peak_tflops = matmul_peak_tflops(s.threads)
        log(f"measured CPU peak: {1000 * s.peak_tflops:.0f} GFLOP/s (fp32 2048^3 matmul, {s.threads} threads)")
    load_before = load_average()
    if load_before and load_before[0] > 0.5 * usable_cpus():
        log(f"note: load average {load_before} on {usable_cpus()} CPUs: other work is running and timings are noisy")
    started = time.time()

    def results_of(rows, status):
        ratios, targets = ratios_and_targets(s, rows)
        return {"status": status, **_results(s, rows, ratios, targets, load_before, started)}

    rows = run_training(s, log) if s.repeats and s.steps else []

    def partial(eval_rows):  # a long evaluation must not lose what was measured
        if out:
            write_json(out, results_of(rows + eval_rows, "partial: evaluating"))

    if s.eval_lengths:
        partial([])
        rows += run_evaluation(s, log, partial)
    results = results_of(rows, "complete")
    if out:
        write_json(out, results)
    return results


def _results(s: BenchSettings, rows, ratios, targets, load_before, started) -> dict:
    from rope_lm.report import git_commit

    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine_info(s.device, s.threads),
        "load_average": {"before": load_before, "after": load_average()},
        "wall_s": round(time.time() - started, 1),
        "settings": {k: v for k, v in asdict(s).items()},
        "rows": rows,
        "ratios": ratios,
        "targets": targets,
        "table": markdown_table(rows),
        "notes": [
            "hf: LlamaForCausalLM, SDPA attention, SwiGLU MLP ("
            + ("width 2/3*mlp_ratio*d: equal parameters" if s.hf_mlp == "matched" else "width mlp_ratio*d")
            + "), separate q/k/v projections, RMSNorm eps matched to ours, no KV cache; ours: GELU MLP, fused qkv.",
            "train tokens/s: forward + backward + grad clip + AdamW + LR schedule, median of repeats; ratios are "
            "medians of per-round ratios (peers interleaved within a round).",
            "eval: one window per forward, loss included (rope_lm.evaluation.token_losses); +MB is the memory the "
            "measured pass added over the process after warm-up.",
            "every peer runs in its own process; hf runs with default malloc as a user's process would, hf+keepmem "
            "with rope-lm's allocator setting (rope_lm.allocator.keep_freed_memory), which rope-lm processes get "
            "when they build a model.",
            "tok/CPU-s: tokens per CPU-second of the peer's process, a check on wall-clock ratios taken under "
            "other load.",
            "MFU uses 6N + 12 L T d FLOPs per training token (2N + 4 L T d for evaluation), N the non-embedding "
            "parameters plus the output projection.",
        ],
    }


if __name__ == "__main__":
    _worker_main()
