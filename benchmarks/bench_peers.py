"""The peers the benchmark measures, each built and run inside its own
measuring process (benchmarks/bench_worker.py): our model and Hugging Face's
Llama, the plain PyTorch loop, LitLM in lightning.Trainer, and one
evaluation measurement."""

from contextlib import nullcontext
import gc
import logging
import shutil
import statistics
import tempfile
import time
import warnings

from bench_machine import _cpu_seconds, _peak_rss_kb, _status_kb, _sync
import torch
import torch.nn.functional as F

from rope_lm.eval.cost import reset_cpu_peak as _reset_peak_rss


def _seeded(seed: int):
    torch.manual_seed(seed)


def build_ours(model_cfg: dict, pos_cfg: dict, vocab: int, train_len: int):
    from rope_lm.model.transformer import build_model

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
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=inter,
        num_hidden_layers=model_cfg["n_layer"],
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=d // heads,
        max_position_embeddings=max_len,
        rope_parameters={"rope_type": "default", "rope_theta": float(pos_cfg.get("base", 10000.0))},
        tie_word_embeddings=model_cfg.get("tie_embeddings", True),
        attention_bias=model_cfg.get("bias", False),
        mlp_bias=model_cfg.get("bias", False),
        rms_norm_eps=torch.finfo(torch.float32).eps,
        attention_dropout=model_cfg.get("dropout", 0.0),
        use_cache=False,
        attn_implementation="sdpa",
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


def make_batches(n: int, batch: int, seq_len: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, vocab, (batch, seq_len), generator=g), torch.randint(0, vocab, (batch, seq_len), generator=g))
        for _ in range(n)
    ]


def _optimizer_like_lit(model, optim: dict, max_steps: int):
    """LitLM's own optimizer and schedule (param groups, betas, fused on CUDA)
    for a model that is not a LitLM, so every peer steps the same optimizer."""
    from rope_lm.train.lit import OptimConfig, build_optimizer

    return build_optimizer(model, OptimConfig(**optim), max_steps)


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()


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

        from rope_lm.train.trainer import trainer_config, trainer_kwargs

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
        from rope_lm.train.allocator import keep_freed_memory

        keep_freed_memory()


def build_train_runner(spec: dict):
    """The runner of one training peer, built in its own process: (runner,
    parameter counts, the CompiledForward or None)."""
    from rope_lm.train.lit import LitLM

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
    lit = LitLM(
        model=model_cfg,
        pos=pos_cfg,
        scaling=None,
        optim=optim,
        vocab_size=s["vocab"],
        train_len=s["seq_len"],
        max_steps=max_steps,
        compile=compiled,
    ).to(device)
    counts = param_counts(lit.model)
    fwd = lit.compiled_forward
    if peer.startswith("plain"):
        opt, sched = lit.configure_optimizers().values()
        runner = LoopRunner(
            peer, lambda x, y: lit.loss((x, y)), list(lit.parameters()), opt, sched["scheduler"], batches, device, clip
        )
    else:
        _quiet_lightning()
        runner = LightningRunner(
            peer, lit, s["trainer"], batches, device, tempfile.mkdtemp(prefix="rope-lm-bench-"), s["fit_steps"]
        )
    return runner, counts, fwd


def measure_eval(spec: dict) -> dict:
    """One evaluation measurement: build, warm up, time eval_repeats forward
    passes (with the per-token loss) at one length, and the memory they took."""
    from rope_lm.eval.evaluation import token_losses

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
        from rope_lm.train.compile import maybe_compile

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
    return {
        "tokens_per_s": B * L / statistics.median(times),
        "seconds": statistics.median(times),
        "peak_mem_mb": peak,
        "mem_growth_mb": max(0.0, peak - base),
        "baseline_mem_mb": base,
        "memory": how,
        "warmup_s": warm_s,
        "loss": float(losses.mean()),
        **counts,
        "compiled": None if compiled is None else compiled.compiled,
    }
