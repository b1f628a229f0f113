"""Throughput and memory of rope-lm against the peers a user would pick.

Training (forward + backward + clip + optimizer step, tokens/s) for each model
size and positional scheme, on the same machine, dimensions and batches:

* ``hf``: Hugging Face ``LlamaForCausalLM`` with SDPA attention, sized to
  match (see ``hf_config``), driven by a plain PyTorch loop, in a process set
  up as a user's would be;
* ``hf+keepmem`` (CPU): the same with rope-lm's allocator setting
  (rope_lm.train.allocator.keep_freed_memory), which separates what the model does
  from what the process setting does;
* ``plain``: our model, the same plain loop (bounds framework overhead);
* ``plain+fused``: the same with AdamW's fused kernel (``optim.fused=true``; on
  CPU the default is the foreach kernel);
* ``lightning``: our model through ``LitLM`` and ``lightning.Trainer`` built
  by the pipeline's own trainer_kwargs, steps timed by a callback;
* ``plain+compile`` / ``lightning+compile`` with ``compile=True``.

Every peer runs in a process of its own (so allocator state, process-wide
flags and peak RSS are its own) and only one computes at a time; repeats are
alternated round-robin (A, B, C, A, B, C, ...; benchmarks/paired.py) so that
background load falls on every peer alike. A ratio is the ratio of the two
peers' median tokens/s, read only where both peers' spread over rounds is
within ``spread_limit`` ("spread too wide to read a ratio" otherwise).

Evaluation (forward + per-token loss, the code path of rope_lm.eval.evaluation) at
long lengths, one window per forward, with peak memory: every measurement in
a fresh process, reading its peak RSS (reset after warm-up) on CPU, or
``max_memory_allocated`` after a reset on CUDA; at each length the (scheme,
peer) processes alternate for ``eval_rounds`` rounds, read by the same rule.

benchmarks/bench.py is the command line; this module reads no config file and
uses rope_lm's public API only.

The jobs live in their own files: bench_machine.py (machine probes),
bench_peers.py (the measured peers), bench_worker.py (the measuring process
and its protocol), bench_analysis.py (ratios, targets, table); this file
holds the settings and the coordinator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import datetime
import os
import statistics
import sys
import time

from bench_analysis import flops_per_token, markdown_table, plain_rope, ratios_and_targets
from bench_machine import detect_peak_tflops, load_average, machine_info, matmul_peak_tflops, usable_cpus
from bench_worker import Worker
import paired
import torch

PEERS = ("hf", "hf+keepmem", "plain", "plain+fused", "lightning")


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
    eval_repeats: int = 2  # timed passes per evaluation process (their median is that process's figure)
    eval_rounds: int = paired.ROUNDS  # alternated rounds of evaluation processes per length (median over them)
    spread_limit: float = paired.LIMIT  # a ratio is read only where each side's (max - min) / median is at most this
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
        from rope_lm.core.errors import ConfigError

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
        paired.check(self.eval_rounds, self.spread_limit, "eval_rounds")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for, but torch sees no CUDA device.")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: use cpu or cuda.")


def _train_peers(s: BenchSettings, pos_cfg: dict) -> list[str]:
    """rope gets every peer. Other schemes get the plain loop, which gives
    scheme/rope; Lightning's per-step overhead does not depend on the scheme
    (it is measured on rope), and each peer process holds ~1 GB, so a full
    sweep of schemes x peers would not fit a small machine."""
    rope = plain_rope(pos_cfg)
    peers = []
    if rope and "hf" in s.peers:
        peers += ["hf"] + (["hf+keepmem"] if s.device == "cpu" and "hf+keepmem" in s.peers else [])
    for suffix in [""] + (["+compile"] if s.compile else []):
        peers += [
            p + suffix
            for p in ("plain", "plain+fused", "lightning")
            if p in s.peers and (rope or p == "plain") and not (suffix and p == "plain+fused")
        ]
    if not peers and not rope and "lightning" in s.peers:
        peers = ["lightning"]
    return peers


def _spec(s: BenchSettings, model_label: str, scheme_label: str, peer: str) -> dict:
    # A layout row (bench.py's `layouts`) carries its model.layout beside the scheme's settings.
    pos_cfg = dict(s.schemes[scheme_label])
    layout = pos_cfg.pop("layout", None)
    model_cfg = {**s.models[model_label], "layout": layout} if layout else s.models[model_label]
    return {
        "peer": peer,
        "model_cfg": model_cfg,
        "pos_cfg": pos_cfg,
        "device": s.device,
        "threads": s.threads,
        "deterministic": s.deterministic,
        "imports": s.imports,
        "seed": s.seed,
        "vocab": s.vocab_size,
        "seq_len": s.seq_len,
        "batch": s.batch_size,
        "hf_mlp": s.hf_mlp,
        "optim": s.optim,
        "trainer": s.trainer,
        "n_batches": max(s.warmup, s.steps) + 1,
        "fit_steps": max(1, s.warmup) + s.repeats * s.steps + 2,
    }


def run_training(s: BenchSettings, log) -> list[dict]:
    """Per model: one process per (scheme, peer), all built first, then
    repeats interleaved round-robin; only one process computes at a time."""
    rows = []
    tokens = s.batch_size * s.seq_len
    for model_label in s.models:
        entries = [
            {"model": model_label, "scheme": sch, "peer": peer, "spec": _spec(s, model_label, sch, peer)}
            for sch, pos_cfg in s.schemes.items()
            for peer in _train_peers(s, pos_cfg)
        ]
        for e in entries:
            e["worker"] = Worker()
        try:
            live = []
            for e in entries:
                built = e["worker"].call("build", spec=e["spec"])
                warm = e["worker"].call("warm", n=max(1, s.warmup)) if built.get("ok") else built
                if not warm.get("ok"):
                    log(f"[train] {model_label}/{e['scheme']}/{e['peer']}: skipped ({warm['error']})")
                    rows.append(
                        {
                            "phase": "train",
                            "model": model_label,
                            "scheme": e["scheme"],
                            "peer": e["peer"],
                            "seq_len": s.seq_len,
                            "error": warm["error"],
                            "tokens_per_s": None,
                        }
                    )
                    continue
                if warm.get("compiled") is False:
                    log(
                        f"[train] {model_label}/{e['scheme']}/{e['peer']}: torch.compile unavailable "
                        f"({warm['compile_error']}); this row is uncompiled"
                    )
                e.update(
                    counts={k: built[k] for k in ("params", "params_non_embedding")},
                    warm=warm,
                    times=[],
                    mem=[],
                    cpu=[],
                )
                live.append(e)

            def block(e):
                def call():
                    out = e["worker"].call("block", n=s.steps)
                    if not out.get("ok"):
                        raise RuntimeError(f"{e['scheme']}/{e['peer']} failed mid-benchmark: {out['error']}")
                    e["times"].append(out["seconds"])
                    e["cpu"].append(out["cpu_seconds"])
                    e["mem"].append(out["peak_mem_mb"])
                    return out

                return call

            def each_round(r, _, live=live, model_label=model_label):
                log(
                    f"[train] {model_label} round {r + 1}/{s.repeats}: "
                    + ", ".join(f"{e['scheme']}/{e['peer']} {s.steps * tokens / e['times'][-1]:.0f}" for e in live)
                    + " tok/s"
                )

            # Alternated (benchmarks/paired.py): one block of each peer per round, round after round.
            paired.alternate([(f"{e['scheme']}/{e['peer']}", block(e)) for e in live], s.repeats, on_round=each_round)
        finally:
            for e in entries:
                e["worker"].close()
        for e in live:
            tps = [s.steps * tokens / t for t in e["times"]]
            row = {
                "phase": "train",
                "model": model_label,
                "scheme": e["scheme"],
                "peer": e["peer"],
                "seq_len": s.seq_len,
                "batch": s.batch_size,
                "tokens_per_s": statistics.median(tps),
                "tokens_per_s_repeats": tps,
                "step_ms": 1000 * statistics.median(e["times"]) / s.steps,
                # Tokens per CPU-second of the peer's process: barely moved by other load
                # (time slices lost to it are not counted), so a check on the wall-clock ratios.
                "tokens_per_cpu_s": statistics.median(s.steps * tokens / max(c, 1e-6) for c in e["cpu"]),
                "tokens_per_cpu_s_repeats": [s.steps * tokens / max(c, 1e-6) for c in e["cpu"]],
                **e["counts"],
                "compiled": e["warm"].get("compiled"),
                "warmup_s": e["warm"]["seconds"],
                "peak_mem_mb": max(e["mem"]),
                "memory": "cuda max_memory_allocated" if s.device == "cuda" else "peak RSS of the peer's process",
                "flops_per_token": flops_per_token(e["counts"], e["spec"]["model_cfg"], s.vocab_size, s.seq_len, True),
            }
            row["mfu"] = (
                row["flops_per_token"] * row["tokens_per_s"] / (s.peak_tflops * 1e12) if s.peak_tflops else None
            )
            rows.append(row)
    return rows


def _eval_peers(s: BenchSettings, pos_cfg: dict) -> list[str]:
    hf = ["hf"] if "hf" in s.peers and plain_rope(pos_cfg) else []
    return ["ours"] + hf + (["ours+compile"] if s.compile else [])


def _eval_row(outs: list[dict]) -> dict:
    """One evaluation row from its rounds (each a fresh process): medians over rounds, the largest memory."""
    tps = [o["tokens_per_s"] for o in outs]
    first = outs[0]
    return {
        **first,
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_repeats": tps,
        "seconds": statistics.median(o["seconds"] for o in outs),
        "peak_mem_mb": max(o["peak_mem_mb"] for o in outs),
        "mem_growth_mb": max(o["mem_growth_mb"] for o in outs),
        "baseline_mem_mb": statistics.median(o["baseline_mem_mb"] for o in outs),
        "warmup_s": statistics.median(o["warmup_s"] for o in outs),
        "rounds": len(outs),
    }


def run_evaluation(s: BenchSettings, log, on_row=None) -> list[dict]:
    """Per (model, length): every (scheme, peer) measured in a fresh process of its own, alternated for
    eval_rounds rounds (A, B, A, B, ...; benchmarks/paired.py), so a change of load falls on all of them;
    on_row(rows so far) after each length."""
    rows = []
    for model_label in s.models:
        entries = [(sch, peer) for sch, pos_cfg in s.schemes.items() for peer in _eval_peers(s, pos_cfg)]
        for L in s.eval_lengths:
            failed: dict[str, dict] = {}

            def measure(sch, peer, L=L, failed=failed):
                def call():
                    label = f"{sch}/{peer}"
                    if label in failed:  # a peer that failed once is not started again
                        return failed[label]
                    spec = {
                        **_spec(s, model_label, sch, peer),
                        "length": L,
                        "batch": s.eval_batch,
                        "repeats": s.eval_repeats,
                    }
                    worker = Worker()
                    try:
                        out = worker.call("eval", spec=spec)
                    finally:
                        worker.close()
                    if not out.get("ok"):
                        failed[label] = out
                    return out

                return call

            def each_round(r, done, L=L):
                log(
                    f"[eval] {model_label} @ {L} round {r + 1}/{s.eval_rounds}: "
                    + ", ".join(
                        f"{label} {out[-1]['tokens_per_s']:.0f} tok/s" if out[-1].get("ok") else f"{label} failed"
                        for label, out in done.results.items()
                    )
                )

            timed = paired.alternate(
                [(f"{sch}/{peer}", measure(sch, peer)) for sch, peer in entries], s.eval_rounds, on_round=each_round
            )
            for sch, peer in entries:
                outs = timed.results[f"{sch}/{peer}"]
                row = {
                    "phase": "eval",
                    "model": model_label,
                    "scheme": sch,
                    "peer": peer,
                    "seq_len": L,
                    "batch": s.eval_batch,
                }
                bad = next((o for o in outs if not o.get("ok")), None)
                if bad is not None:
                    log(f"[eval] {model_label}/{sch}/{peer} @ {L}: failed ({bad['error']})")
                    rows.append({**row, "error": bad["error"], "tokens_per_s": None})
                    continue
                row.update(_eval_row([{k: v for k, v in o.items() if k != "ok"} for o in outs]))
                counts = {"params": row["params"], "params_non_embedding": row["params_non_embedding"]}
                row["flops_per_token"] = flops_per_token(
                    counts, _spec(s, model_label, sch, peer)["model_cfg"], s.vocab_size, L, False
                )
                row["mfu"] = (
                    row["flops_per_token"] * row["tokens_per_s"] / (s.peak_tflops * 1e12) if s.peak_tflops else None
                )
                if row.get("compiled") is False:
                    log(f"[eval] {model_label}/{sch}: torch.compile unavailable; {peer} row is uncompiled")
                log(
                    f"[eval] {model_label}/{sch}/{peer} @ {L}: {row['tokens_per_s']:.0f} tok/s "
                    f"(median of {len(outs)}), +{row['mem_growth_mb']:.0f} MB"
                )
                rows.append(row)
            if on_row:
                on_row(rows)
    order = {key: i for i, key in enumerate((m, sch, L) for m in s.models for sch in s.schemes for L in s.eval_lengths)}
    return sorted(rows, key=lambda r: order[(r["model"], r["scheme"], r["seq_len"])])  # stable: peers stay in order


def run(s: BenchSettings, out: str | None = None, log=None) -> dict:
    """The whole benchmark; returns (and writes to `out`) the results dict."""
    from rope_lm.core.files import write_json

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    s.validate()
    if out:  # a place the results cannot go is told before minutes of timing, not after
        from rope_lm.core.files import check_room
        from rope_lm.runs.run_folder import check_writable

        folder = os.path.dirname(os.path.abspath(out))
        check_writable(folder, "out=")
        check_room(folder, "out=")
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
    from rope_lm.eval.results import git_commit

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
            "train tokens/s: forward + backward + grad clip + AdamW + LR schedule, median of repeats (peers "
            "alternated within a round); eval tokens/s: median of eval_rounds alternated fresh processes.",
            f"ratios: the ratio of two peers' median tokens/s over their rounds (median_of_round_ratios beside "
            f"it), read only where each peer's spread (max - min) / median is at most {100 * s.spread_limit:.0f}%; "
            f"otherwise: {paired.TOO_WIDE}.",
            "eval: one window per forward, loss included (rope_lm.eval.evaluation.token_losses); +MB is the memory the "
            "measured pass added over the process after warm-up.",
            "every peer runs in its own process; hf runs with default malloc as a user's process would, hf+keepmem "
            "with rope-lm's allocator setting (rope_lm.train.allocator.keep_freed_memory), which rope-lm processes get "
            "when they build a model.",
            "tok/CPU-s: tokens per CPU-second of the peer's process, a check on wall-clock ratios taken under "
            "other load.",
            "MFU uses 6N + 12 L T d FLOPs per training token (2N + 4 L T d for evaluation), N the non-embedding "
            "parameters plus the output projection.",
        ],
    }
