"""Results as data first (JSON), then views: markdown table, PNG plot, wandb."""

import datetime
import json
import math
import os
import subprocess
import tempfile

from rope_lm.errors import write_failure

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "ppl_vs_length.png"


def atomic_write(path: str, data: str | bytes):
    """Write via a temporary file and a rename, so a kill mid-write leaves the
    previous version intact, never a truncated file."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-" + os.path.basename(path))
        # mkstemp makes the file private (0600); results should be as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        kept = f"The previous {os.path.basename(path)} is untouched. " if os.path.exists(path) else ""
        raise write_failure(path, e, kept) from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: str, obj):
    atomic_write(path, json.dumps(obj, indent=1, default=str))


def git_commit() -> str | None:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def new_results(config: dict, corpus: dict, train_len: int, scheme: str, **extra) -> dict:
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "scheme": scheme,
        "train_len": train_len,
        "corpus": corpus,
        "config": config,
        **extra,
        "methods": {},
        "results": [],
    }


def _fmt(v):
    if v is None:
        return "–"
    return f"{v:.3g}" if v >= 1000 else f"{v:.2f}"


def markdown_table(results: dict) -> str:
    rows = results["results"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    train_len = results["train_len"]
    by = {(r["method"], r["length"]): r for r in rows}
    head = "| method | " + " | ".join(f"{L} ({L / train_len:g}×)" for L in lengths) + " |"
    sep = "|---" * (len(lengths) + 1) + "|"

    def value(row, key):
        return (row.get("sliding") or {}).get("ppl") if key == "sliding_ppl" else row.get(key)

    def table(key):
        lines = [head, sep]
        for m in methods:
            lines.append(f"| {m} | " + " | ".join(_fmt(value(by[(m, L)], key)) if (m, L) in by else "" for L in lengths) + " |")
        return "\n".join(lines)

    scored = rows[0]["tokens"] if rows else 0
    out = [
        f"# Perplexity vs evaluation length — {results['scheme']}, trained at L={train_len}",
        "",
        f"Corpus: {results['corpus'].get('source')} `{results['corpus'].get('fingerprint')}`, split "
        f"`{results.get('eval', {}).get('split', 'test')}`; every length scores the same {scored} target tokens.",
        "",
        "## PPL over all tokens",
        "",
        table("ppl"),
        "",
        f"## PPL of tokens at positions ≥ {train_len} (past the training length)",
        "",
        table("ppl_beyond"),
    ]
    if any("sliding" in r for r in rows):
        out += ["", f"## Sliding-window PPL (stride {rows[0]['sliding']['stride']})", "", table("sliding_ppl")]
    return "\n".join(out) + "\n"


def log_binned(per_position: dict, length: int, per_octave: int = 4) -> tuple[list[float], list[float]]:
    """The per-position curve merged into bins of equal width on a log-2 axis
    (per_octave bins per doubling of the position): the long tail past L_train
    holds most positions but few windows, and plotted bucket by bucket it is
    mostly noise. Returns (bin centres, token-weighted mean loss)."""
    starts, width, losses = per_position["start"], per_position["width"], per_position["loss"]
    bins: dict[int, list] = {}
    for start, loss in zip(starts, losses):
        size = min(width, length - start)
        key = math.floor(per_octave * math.log2(start + size / 2 + 0.5))
        b = bins.setdefault(key, [start, start + size, 0.0, 0])
        b[1], b[2], b[3] = start + size, b[2] + loss * size, b[3] + size
    return [(lo + hi) / 2 for lo, hi, _, _ in bins.values()], [total / n for _, _, total, n in bins.values()]


def plot(results: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["results"]
    train_len = results["train_len"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in methods:
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["length"])
        ax.plot([r["length"] for r in rs], [r["ppl"] for r in rs], marker="o", label=m)
        longest = rs[-1]
        pp = longest["per_position"]
        ax2.plot(*log_binned(pp, longest["length"]), marker=".", label=f"{m} (L={longest['length']})")
    for a in (ax, ax2):
        a.axvline(train_len, color="grey", linestyle="--", linewidth=1)
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"{results['scheme']}: PPL vs length (trained at {train_len}, dashed)")
    ax2.set_xlabel("position in window (tokens; 4 bins per doubling)")
    ax2.set_ylabel("mean token loss (nats)")
    ax2.set_title("per-position loss, longest window")
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def write_views(results: dict, out_dir: str, draw: bool = True):
    """(Re)write results.json, results.md and (with draw) the plot; safe to
    call after every length. Drawing costs ~0.6 s, so callers draw less often."""
    write_json(os.path.join(out_dir, RESULTS_JSON), results)
    if results["results"]:
        atomic_write(os.path.join(out_dir, RESULTS_MD), markdown_table(results))
        if draw:
            plot(results, os.path.join(out_dir, RESULTS_PNG))


def log_to_wandb(run, results: dict, out_dir: str):
    """PPL-vs-length table and charts, per-position loss (table and chart) and
    the PNG plot on a wandb run; ppl@L per method in the run summary, so the
    runs of a group can be compared column by column in the dashboard."""
    import wandb

    rows = results["results"]
    if not rows:
        return
    train_len = results["train_len"]
    cols = ["method", "length", "ratio", "ppl", "ppl_within", "ppl_beyond", "tokens"]
    table = wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])
    methods = list(dict.fromkeys(r["method"] for r in rows))
    # Each method gets its own x values: a method interrupted part-way has fewer lengths.
    series = {m: sorted((r for r in rows if r["method"] == m), key=lambda r: r["length"]) for m in methods}
    chart = wandb.plot.line_series(
        xs=[[r["length"] for r in series[m]] for m in methods], ys=[[r["ppl"] for r in series[m]] for m in methods],
        keys=methods, title=f"PPL vs evaluation length ({results['scheme']}, L_train={train_len})", xname="length",
    )
    payload = {"extrapolation/table": table, "extrapolation/ppl_vs_length": chart}
    png = os.path.join(out_dir, RESULTS_PNG)
    if os.path.exists(png):
        payload["extrapolation/plot"] = wandb.Image(png)
    pos_rows = []
    for r in rows:
        pp = r["per_position"]
        pos_rows += [[r["method"], r["length"], s, v] for s, v in zip(pp["start"], pp["loss"])]
    payload["extrapolation/per_position"] = wandb.Table(columns=["method", "length", "position", "loss"], data=pos_rows)
    longest = [series[m][-1] for m in methods]
    payload["extrapolation/per_position_chart"] = wandb.plot.line_series(
        xs=[r["per_position"]["start"] for r in longest], ys=[r["per_position"]["loss"] for r in longest],
        keys=[f"{r['method']} (L={r['length']})" for r in longest],
        title=f"per-position loss at the longest length (L_train={train_len})", xname="position",
    )
    run.log(payload)
    run.summary["scheme"] = results["scheme"]
    run.summary["train_len"] = train_len
    for r in rows:
        run.summary[f"ppl@{r['length']}/{r['method']}"] = r["ppl"]
        # ppl@(k x L_train), comparable across runs trained at different lengths
        run.summary[f"ppl@{r['ratio']:g}x/{r['method']}"] = r["ppl"]
