"""What the benchmark's rows say: FLOPs per token, paired ratios between
peers (read by benchmarks/paired.py's rule), the targets they are held to,
and the table and list they print as."""

import statistics

import paired

from rope_lm.core.tables import markdown_table as table


def flops_per_token(counts: dict, model_cfg: dict, vocab: int, seq_len: int, training: bool) -> float:
    """6N + 12 S d for a training token (2N + 4 S d for a forward-only one),
    N the non-embedding parameters plus the output projection, whose matmul
    is real work even when it is tied to the embedding, and S the keys a query
    reads summed over layers: T for a full layer, min(W, T) for a layer of
    model.layout with a sliding window of W (counting T there would credit a
    windowed model with work it never does: MFU above 100%)."""
    from rope_lm.model.layout import layer_specs

    n = counts["params_non_embedding"] + vocab * model_cfg["d_model"]
    if not model_cfg.get("tie_embeddings", True):
        n = counts["params_non_embedding"]
    specs = layer_specs(model_cfg.get("layout"), {"name": "rope"}, model_cfg["n_layer"])
    spans = [
        seq_len if spec is None or spec.window is None else min(spec.window, seq_len)
        for spec in (specs or [None] * model_cfg["n_layer"])
    ]
    attn = sum(spans) * model_cfg["d_model"]
    return 6 * n + 12 * attn if training else 2 * n + 4 * attn


def plain_rope(pos_cfg: dict) -> bool:
    """Whether a row is plain RoPE: the baseline the other schemes are read against, and the only one
    Llama's rotary reproduces (hf_config carries its base and nothing else). A `pos.name: rope` row with
    any other RoPE knob off its default (p-RoPE's `p_rope`, a partial `rotary_fraction`, interleaved
    pairs) or with a layout is a scheme of its own, timed against it like any other."""
    import inspect

    from rope_lm.positional.rope import RoPE

    if pos_cfg.get("name") != "rope" or "layout" in pos_cfg:
        return False
    knobs = inspect.signature(RoPE.__init__).parameters
    return all(
        value == knobs[key].default
        for key, value in pos_cfg.items()
        if key != "base" and key in knobs and knobs[key].default is not inspect.Parameter.empty
    )


def _paired(a, b, key="tokens_per_s_repeats") -> float | None:
    """Median over rounds of a's throughput over b's in the same round."""
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return statistics.median(x / y for x, y in zip(a[key], b[key]))


def _label(r) -> str:
    return f"{r['scheme']}/{r['peer']}"


def _compare(name, model, a, b, limit) -> paired.Comparison:
    """a's median tokens/s over b's, both over their rounds, read by the rule."""
    return paired.compare(
        f"{model}: {name}" + (f" at {a['seq_len']}" if a["phase"] == "eval" else ""),
        _label(a),
        a["tokens_per_s_repeats"],
        _label(b),
        b["tokens_per_s_repeats"],
        limit,
        "tok/s",
    )


def _entry(name, model, a, b, c: paired.Comparison) -> dict:
    return {
        "name": name,
        "model": model,
        "phase": a["phase"],
        "value": c.ratio,
        "a": _label(a),
        "b": _label(b),
        "ratio_of_medians": c.ratio,
        "median_of_round_ratios": _paired(a, b),
        "readable": c.readable,
        "verdict": c.record()["verdict"],
        "line": c.line(3),
    }


def _holds(value, readable, threshold) -> bool | None:
    """A target holds (True), fails (False), or cannot be read (None: the spread was too wide)."""
    return (value >= threshold) if readable else None


def _find(rows, **key):
    for r in rows:
        if all(r.get(k) == v for k, v in key.items()):
            return r
    return None


def ratios_and_targets(s, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Paired ratios between peers and the targets they are held to, for the
    rows of a run with settings `s` (throughput.BenchSettings)."""
    train = [r for r in rows if r["phase"] == "train"]
    ratios, targets = [], []
    rope = [lab for lab, cfg in s.schemes.items() if plain_rope(cfg)]
    rope = rope[0] if rope else None

    limit = getattr(s, "spread_limit", paired.LIMIT)

    def ratio(name, model, a, b, threshold=None, note="", show=True):
        if _paired(a, b) is None:
            return
        c = _compare(name, model, a, b, limit)
        cpu = _paired(a, b, "tokens_per_cpu_s_repeats")
        entry = {**_entry(name, model, a, b, c), "cpu_time_ratio": cpu}
        ratios.append(entry)
        if show:
            a["ratio"], a["ratio_vs"], a["cpu_ratio"], a["ratio_readable"] = c.ratio, entry["b"], cpu, c.readable
        if threshold is not None:
            note = "; ".join(n for n in (note, f"per CPU-second: {cpu:.3f}" if cpu else "") if n)
            targets.append(
                {
                    "target": f"{name} >= {threshold}",
                    "model": model,
                    "value": round(c.ratio, 3),
                    "holds": _holds(c.ratio, c.readable, threshold),
                    "why": c.why,
                    "note": note,
                }
            )

    for model in s.models:
        for scheme in s.schemes:
            plain = _find(train, model=model, scheme=scheme, peer="plain")
            light = _find(train, model=model, scheme=scheme, peer="lightning")
            if scheme == rope:
                hf = _find(train, model=model, scheme=scheme, peer="hf")
                same = _paired(plain, _find(train, model=model, scheme=scheme, peer="hf+keepmem"))
                ratio(
                    "ours/HF (plain loops)",
                    model,
                    plain,
                    hf,
                    1.1,
                    note=f"vs HF given rope-lm's allocator setting too: {same:.3f}" if same else "",
                )
            elif rope:
                ratio(
                    f"{scheme}/rope (plain loops)",
                    model,
                    plain,
                    _find(train, model=model, scheme=rope, peer="plain"),
                    0.7,
                )
            ratio(f"Lightning/plain ({scheme})", model, light, plain, 0.95 if scheme == rope else None)
            if scheme == rope:
                ratio(
                    "HF with rope-lm's allocator setting/HF",
                    model,
                    _find(train, model=model, scheme=scheme, peer="hf+keepmem"),
                    _find(train, model=model, scheme=scheme, peer="hf"),
                )
                ratio(
                    "ours/HF with the same allocator setting",
                    model,
                    plain,
                    _find(train, model=model, scheme=scheme, peer="hf+keepmem"),
                    show=False,
                )
            ratio(
                f"fused/foreach AdamW, plain loop ({scheme})",
                model,
                _find(train, model=model, scheme=scheme, peer="plain+fused"),
                plain,
            )
            for peer in ("plain", "lightning"):
                ratio(
                    f"compiled/eager {peer} ({scheme})",
                    model,
                    _find(train, model=model, scheme=scheme, peer=peer + "+compile"),
                    _find(train, model=model, scheme=scheme, peer=peer),
                )
    ev = [r for r in rows if r["phase"] == "eval" and r.get("tokens_per_s")]

    def eval_ratio(r, b):
        c = _compare(f"eval {_label(r)} over {_label(b)}", r["model"], r, b, limit)
        ratios.append(_entry(f"eval {_label(r)} over {_label(b)}", r["model"], r, b, c))
        r["ratio"], r["ratio_vs"], r["ratio_readable"], r["ratio_why"] = c.ratio, _label(b), c.readable, c.why

    for r in ev:
        base = "hf" if r["peer"] == "ours" else "ours" if r["peer"] == "ours+compile" else None
        b = _find(ev, model=r["model"], scheme=r["scheme"], seq_len=r["seq_len"], peer=base) if base else None
        if b is not None:
            eval_ratio(r, b)
    # Evaluation against RoPE at the same length: a layout should cost little over the
    # plain model (>= 0.8), a bias scheme at most half of it (>= 0.5), at the longest length.
    for r in ev:
        if rope and r["peer"] == "ours" and r["scheme"] != rope:
            b = _find(ev, model=r["model"], scheme=rope, seq_len=r["seq_len"], peer="ours")
            if b is not None:
                eval_ratio(r, b)
    longest = max((r["seq_len"] for r in ev), default=None)
    for r in ev:
        if r.get("ratio_vs") == f"{rope}/ours" and r["seq_len"] == longest:
            threshold = 0.8 if "layout" in s.schemes[r["scheme"]] else 0.5
            rounds = len(r["tokens_per_s_repeats"])
            note = f"median of {rounds} alternated round(s), same run"
            targets.append(
                {
                    "target": f"eval {r['scheme']}/{rope} at {longest} >= {threshold}",
                    "model": r["model"],
                    "value": round(r["ratio"], 3),
                    "holds": _holds(r["ratio"], r["ratio_readable"], threshold),
                    "why": r["ratio_why"],
                    "note": note,
                }
            )
    for model in s.models:
        for scheme in s.schemes:
            pts = sorted(
                (r["seq_len"], r["mem_growth_mb"])
                for r in ev
                if r["model"] == model and r["scheme"] == scheme and r["peer"] == "ours"
            )
            # Below a few MB the growth is allocator noise, not the model's.
            if len(pts) >= 2 and pts[0][1] > 0 and pts[-1][1] >= 16:
                (l0, m0), (l1, m1) = pts[0], pts[-1]
                growth = m1 / m0
                # Linear memory grows like the length; a T x T tensor would
                # grow like its square. Allow 1.5x the linear factor for fixed
                # per-forward buffers that the shortest length hides.
                targets.append(
                    {
                        "target": f"eval memory ~linear in length ({scheme})",
                        "model": model,
                        "value": round(growth, 2),
                        "holds": growth <= 1.5 * l1 / l0,
                        "note": f"memory grew {growth:.2f}x from {l0} to {l1} tokens ({l1 / l0:.0f}x); "
                        f"quadratic would be {(l1 / l0) ** 2:.0f}x",
                    }
                )
            if any(
                r["model"] == model and r["scheme"] == scheme and r.get("error") for r in rows if r["phase"] == "eval"
            ):
                targets.append(
                    {
                        "target": f"eval at every length ({scheme})",
                        "model": model,
                        "value": None,
                        "holds": False,
                        "note": "a length failed; see the rows",
                    }
                )
    return ratios, targets


def _fmt(v, digits=0):
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    mfu = any(r.get("mfu") is not None for r in rows)  # only where a device peak is known (CUDA, --peak-tflops)
    cols = ["model", "scheme", "phase", "peer", "T", "tokens/s (min-max)", "ratio", "vs", "tok/CPU-s", "CPU ratio"]
    cols += (["MFU"] if mfu else []) + ["peak MB", "+MB", "params (non-emb)"]
    align = "".join("l" if c in ("model", "scheme", "phase", "peer", "vs") else "r" for c in cols)
    lines = []
    for r in rows:
        head = [r["model"], r["scheme"], r["phase"], r["peer"], str(r["seq_len"])]
        if r.get("error"):
            lines.append(head + [f"failed: {r['error'][:60]}"] + [""] * (len(cols) - 6))
            continue
        params = f"{r['params'] / 1e6:.2f}M ({r['params_non_embedding'] / 1e6:.2f}M)" if r.get("params") else "-"
        repeats = r.get("tokens_per_s_repeats") or [r["tokens_per_s"]]
        ratio = _fmt(r.get("ratio"), 2) if r.get("ratio_readable", True) else paired.TOO_WIDE
        cells = head + [
            paired.Spread.of(repeats).cell(),
            ratio,
            r.get("ratio_vs", ""),
            _fmt(r.get("tokens_per_cpu_s")),
            _fmt(r.get("cpu_ratio"), 2),
        ]
        cells += [f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"] if mfu else []
        cells += [_fmt(r.get("peak_mem_mb")), _fmt(r.get("mem_growth_mb")), params]
        lines.append(cells)
    return table(cols, lines, align)


def targets_text(targets: list[dict]) -> str:
    """One line a target: [x] holds, [ ] fails, [?] cannot be read: the spread was too wide, so the line
    says so in place of the ratio (the results JSON keeps the ratio of medians as `value`)."""

    def line(t):
        mark = "?" if t["holds"] is None else "x" if t["holds"] else " "
        value = f"{paired.TOO_WIDE} ({t.get('why')})" if t["holds"] is None else t["value"]
        return f"- [{mark}] {t['model']}: {t['target']}: {value}" + (f" ({t['note']})" if t.get("note") else "")

    return "\n".join(line(t) for t in targets)
