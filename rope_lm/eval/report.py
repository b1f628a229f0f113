"""Views of a run's results (the data and its files: results.py): the
markdown table (results.md), the PNG plot and the wandb charts."""

import math
import os

from rope_lm.core import tables
from rope_lm.core.files import atomic_write, save_figure, written_together
from rope_lm.eval.results import RESULTS_MD, RESULTS_PNG, write_results
from rope_lm.train_positions import train_positions_label


def _fmt(v):
    if v is None:
        return "–"
    return f"{v:.3g}" if v >= 1000 else f"{v:.2f}"


def _fmt_ci(row: dict, key: str) -> str:
    """`37.51 [37.10, 37.92]`: the value and its 95% interval, where there is one."""
    v = row.get(key)
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    if v is None or lo is None or hi is None:
        return _fmt(v)
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"


PROTOCOL_TEXT = {
    "stream": "non-overlapping windows of L tokens cut from the concatenated split, each starting fresh",
    "documents": "documents of at least L+1 tokens, each truncated to its first L+1 tokens and scored as one window",
    "sliding": "windows of L every {stride} tokens, each target scored once with up to L tokens of context",
}
UNIT_TEXT = {"window": "windows", "document": "documents", "block": "blocks of L consecutive targets"}


def _protocol_lines(results: dict) -> list[str]:
    rows = results["results"]
    ev = results.get("eval", {})
    protocol = rows[0].get("protocol", ev.get("protocol", "stream"))
    corpus = (
        f"Corpus: {results['corpus'].get('source')} `{results['corpus'].get('fingerprint')}`, split "
        f"`{ev.get('split', 'test')}`."
    )
    text = PROTOCOL_TEXT[protocol].format(stride=rows[0].get("stride"))
    if rows[0].get("document_tokens"):
        text = (
            f"the first {rows[0]['document_tokens']} targets of each document, cut into non-overlapping windows of "
            f"L tokens that never cross a document's end"
        )
    out = [f"{corpus} Protocol `{protocol}`: {text}."]
    lengths = sorted({r["length"] for r in rows})
    if protocol == "documents":
        by_len = {r["length"]: r for r in rows}
        counts = {by_len[L]["documents"] for L in lengths}
        if rows[0].get("documents_shared"):
            out.append(
                f"Every length scores the same {counts.pop()} documents (those long enough for the longest length)."
            )
        else:
            out.append(
                "No document is long enough for the longest length, so each length scores the documents "
                "long enough for it: "
                + ", ".join(f"{L}: {by_len[L]['documents']} documents, {by_len[L]['tokens']} tokens" for L in lengths)
                + "."
            )
        if ev.get("skipped_lengths"):
            out.append(f"Skipped (no document long enough): {', '.join(map(str, ev['skipped_lengths']))}.")
    else:
        out.append(f"Every length scores the same {rows[0]['tokens']} target tokens.")
    if any(r.get("ppl_lo") is not None for r in rows):
        unit = rows[0].get("unit", "window")
        out.append(
            f"Brackets: 95% interval from {ev.get('bootstrap', '')} bootstrap resamples (seed "
            f"{ev.get('seed', 0)}) over {UNIT_TEXT.get(unit, unit)}."
        )
    return out


def markdown_table(results: dict) -> str:
    rows = results["results"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lengths = sorted({r["length"] for r in rows})
    train_len = results["train_len"]
    by = {(r["method"], r["length"]): r for r in rows}
    columns = ["method"] + [f"{L} ({L / train_len:g}×)" for L in lengths]

    def table(key, cell=_fmt_ci):
        return tables.markdown_table(
            columns, [[m] + [cell(by[(m, L)], key) if (m, L) in by else "" for L in lengths] for m in methods]
        )

    drawn = train_positions_label((results.get("config") or {}).get("train_pos"))
    ids = "" if drawn == "none" else f" with {drawn} position ids"
    out = [
        f"# Perplexity vs evaluation length — {results['scheme']}, trained at L={train_len}{ids}",
        "",
        " ".join(_protocol_lines(results)) if rows else "",
        "",
        "## PPL over all tokens",
        "",
        table("ppl"),
        "",
        f"## PPL of tokens at positions ≥ {train_len} (past the training length)",
        "",
        table("ppl_beyond"),
    ]
    if any(r.get("ppl_rel") is not None for r in rows):
        out += ["", f"## PPL relative to the same method's PPL at L_train = {train_len}", "", table("ppl_rel")]
    out += _control_sections(results, methods, lengths, columns, by)
    if any("sliding" in r for r in rows):
        out += [
            "",
            f"## Sliding-window PPL (stride {rows[0]['sliding']['stride']})",
            "",
            table("sliding", lambda r, k: _fmt_ci(r[k], "ppl") if k in r else ""),
        ]
    if any("seconds" in r for r in rows):
        out += ["", "## Wall time and peak memory per length", "", _cost_note(rows), "", table("seconds", _fmt_cost)]
    out += [
        "",
        "## Documents and tokens scored",
        "",
        table(
            "tokens",
            lambda r, k: (
                (f"{r['documents']} docs, " if "documents" in r else "")
                + f"{r['tokens']} tokens, {r.get('windows', '')} windows"
            ),
        ),
    ]
    return "\n".join(out) + "\n"


def _fmt_cost(row: dict, key: str) -> str:
    if row.get("same_as"):  # the method changes nothing at this length: the plain method's row, not scored again
        return f"not scored (same as {row['same_as']})"
    if key not in row:
        return "not recorded"
    memory = row.get("peak_memory_mb")
    return f"{row[key]:.1f} s, " + (f"{memory:,.0f} MB" if memory is not None else "memory not measured")


def _cost_note(rows: list) -> str:
    kinds = sorted({r["peak_memory"] for r in rows if r.get("peak_memory")})
    return (
        "Seconds to score the length (forward passes and its intervals) and the peak memory meanwhile: "
        + "; ".join(kinds)
        + ". On a shared machine the seconds carry its load; read them beside each other within one run."
    )


def _control_sections(results: dict, methods: list, lengths: list, columns: list, by: dict) -> list[str]:
    """Per control: each method's PPL over the control's at every length, with its paired interval; a control
    that does not apply to this model says why."""
    out = []
    for name, control in (results.get("controls") or {}).items():
        if not control.get("applies"):
            out += ["", f"Control `{name}` not evaluated: {control.get('reason')}."]
            continue
        shown = [m for m in methods if m != control["label"]]

        def cell(m, L, name=name):
            pair = ((by.get((m, L)) or {}).get("controls") or {}).get(name)
            if pair is None:
                return ""
            v = _fmt_ci({"r": pair["ratio"], "r_lo": pair.get("lo"), "r_hi": pair.get("hi")}, "r")
            return v if pair.get("paired", True) else f"{v} (unpaired)"

        if not shown or not any(cell(m, L) for m in shown for L in lengths):
            continue
        out += [
            "",
            f"## PPL over the {name} control's on the same windows (`{control['label']}`)",
            "",
            f"The control is {control.get('about', name)}, evaluated on this model. Below 1: the method reads the "
            f"text better than the model cut to L; brackets: 95% paired bootstrap interval over the windows both "
            f"were scored on.",
            "",
            tables.markdown_table(columns, [[m] + [cell(m, L) for L in lengths] for m in shown]),
        ]
    return out


def positive(v) -> bool:
    """A value a log axis can show: a finite number above 0 (None, NaN and inf are missing points)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def log_binned(per_position: dict, length: int, per_octave: int = 4) -> tuple[list[float], list[float]]:
    """The per-position curve merged into bins of equal width on a log-2 axis
    (per_octave bins per doubling of the position): the long tail past L_train
    holds most positions but few windows, and plotted bucket by bucket it is
    mostly noise. Returns (bin centres, token-weighted mean loss)."""
    starts, width, losses = per_position["start"], per_position["width"], per_position["loss"]
    bins: dict[int, list] = {}
    for start, loss in zip(starts, losses):
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            continue  # a missing point, not a NaN that spreads over its whole bin
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
    drawn = False
    for m in methods:
        every = sorted((r for r in rows if r["method"] == m), key=lambda r: r["length"])
        # A diverged model's NaN or infinite perplexity is a missing point, never a reason to lose the plot.
        rs = [r for r in every if positive(r.get("ppl"))]
        if not rs:
            continue
        drawn = True
        (line,) = ax.plot([r["length"] for r in rs], [r["ppl"] for r in rs], marker="o", label=m)
        band = [r for r in rs if positive(r.get("ppl_lo")) and positive(r.get("ppl_hi"))]
        if band:
            ax.fill_between(
                [r["length"] for r in band],
                [r["ppl_lo"] for r in band],
                [r["ppl_hi"] for r in band],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
        longest = rs[-1]
        pp = longest.get("per_position")
        if pp:
            ax2.plot(*log_binned(pp, longest["length"]), marker=".", label=f"{m} (L={longest['length']})")
    for a in (ax, ax2):
        a.axvline(train_len, color="grey", linestyle="--", linewidth=1)
        a.set_xscale("log", base=2)
        a.grid(True, alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=8)
    if drawn:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no finite perplexity", transform=ax.transAxes, ha="center")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"{results['scheme']}: PPL vs length (trained at {train_len}, dashed; bands: 95% interval)")
    ax2.set_xlabel("position in window (tokens; 4 bins per doubling)")
    ax2.set_ylabel("mean token loss (nats)")
    ax2.set_title("per-position loss, longest window")
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)


def write_views(results: dict, out_dir: str, draw: bool = True):
    """(Re)write results.json, results.md and (with draw) the plot; safe to
    call after every length. Drawing costs ~0.6 s, so callers draw less often.
    The files are replaced together: a full disk part-way leaves all of them
    as they were, never a results.md behind its results.json."""
    with written_together(out_dir, what="update of the results"):
        write_results(results, out_dir)
        if results["results"]:
            atomic_write(os.path.join(out_dir, RESULTS_MD), markdown_table(results))
            if draw:
                plot(results, os.path.join(out_dir, RESULTS_PNG))


LOG2_COLUMNS = ["run", "method", "series", "length", "log2_length", "ppl", "lo", "hi"]


def log2_rows(results: dict, run_name: str | None = None) -> list[list]:
    """One row per (method, length) for the log-2 chart; `series` (scheme +
    method) keys the lines, so runs logged to one project line up."""
    scheme = results["scheme"]
    out = []
    for r in sorted(results["results"], key=lambda r: (r["method"], r["length"])):
        series = scheme if r["method"] == "none" else f"{scheme} + {r['method']}"
        out.append(
            [
                run_name or scheme,
                r["method"],
                series,
                r["length"],
                math.log2(r["length"]),
                r["ppl"],
                r.get("ppl_lo"),
                r.get("ppl_hi"),
            ]
        )
    return out


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
        xs=[[r["length"] for r in series[m]] for m in methods],
        ys=[[r["ppl"] for r in series[m]] for m in methods],
        keys=methods,
        title=f"PPL vs evaluation length ({results['scheme']}, L_train={train_len})",
        xname="length",
    )
    payload = {"extrapolation/table": table, "extrapolation/ppl_vs_length": chart}
    # wandb's line charts have no log axis: a table with log2(L) as a column,
    # drawn over it, one line per run and method, with the interval alongside.
    log2_table = wandb.Table(columns=LOG2_COLUMNS, data=log2_rows(results, getattr(run, "name", None)))
    payload["extrapolation/ppl_vs_log2_length_table"] = log2_table
    payload["extrapolation/ppl_vs_log2_length"] = wandb.plot.line(
        log2_table,
        "log2_length",
        "ppl",
        stroke="series",
        title=f"PPL vs log2(evaluation length) ({results['scheme']}, L_train={train_len}; lo/hi: 95% interval)",
    )
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
        xs=[r["per_position"]["start"] for r in longest],
        ys=[r["per_position"]["loss"] for r in longest],
        keys=[f"{r['method']} (L={r['length']})" for r in longest],
        title=f"per-position loss at the longest length (L_train={train_len})",
        xname="position",
    )
    run.log(payload)
    run.summary["scheme"] = results["scheme"]
    run.summary["train_len"] = train_len
    for r in rows:
        for key in (
            f"ppl@{r['length']}/{r['method']}",
            # ppl@(k x L_train), comparable across runs trained at different lengths
            f"ppl@{r['ratio']:g}x/{r['method']}",
        ):
            run.summary[key] = r["ppl"]
            if r.get("ppl_lo") is not None:
                run.summary[f"{key}/lo"] = r["ppl_lo"]
                run.summary[f"{key}/hi"] = r["ppl_hi"]
