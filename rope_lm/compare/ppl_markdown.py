"""A perplexity comparison as markdown (compare.md): per group, PPL with its
intervals, PPL relative to L_train, PPL past L_train, seed aggregates, the
rows within noise of the best, and each run against the window-L control."""

import math

from rope_lm.compare.noise import WINDOW_CONTROL, against_control
from rope_lm.compare.ppl_series import Group, relative, relative_interval
from rope_lm.compare.result_files import short_path
from rope_lm.core.tables import markdown_table


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if v >= 1e6:
        return f"{v:.3g}"
    return f"{v:.0f}" if v >= 1000 else f"{v:.2f}"


def with_ci(v, lo, hi) -> str:
    if v is None or lo is None or hi is None:
        return fmt(v)
    return f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"


def markdown(groups: list[Group], skipped: list[str], title: str) -> str:
    out = [f"# {title}", ""]
    for n, g in enumerate(groups, 1):
        lengths, L0 = g.lengths, g.key.train_len
        columns = ["run"] + [f"{L} ({L / L0:g}×)" for L in lengths]

        def table(cell):
            return markdown_table(columns, [[s.label] + [cell(s, L) for L in lengths] for s in g.series])

        # Under the documents protocol each length scores its own number of tokens; only a
        # difference between runs at the same length means they scored different amounts of text.
        per_length = {L: {s.rows[L]["tokens"] for s in g.series if L in s.rows} for L in lengths}
        tokens = sorted(set().union(*[v for v in per_length.values() if len(v) > 1]))
        prefix = f"## Group {n}: " if len(groups) > 1 else "## "
        out += [f"{prefix}{g.key.describe()}", ""]
        out += [f"{len(g.runs)} run(s): " + ", ".join(f"`{short_path(r.dir)}`" for r in g.runs), ""]
        refs = [s.label for s in g.series if s.trained_at is not None]
        if refs:
            out += [
                f"Reference rows, trained at a longer length (every length here inside it): {', '.join(refs)}. "
                f"An upper bound for a model trained at {L0}; not ranked among the runs. Relative PPL: against "
                f"its own PPL at {L0}.",
                "",
            ]
        if len(tokens) > 1:
            out += [
                f"**Note:** the runs scored different numbers of target tokens ({', '.join(map(str, tokens))}): "
                f"the same test text, but not the same amount of it.",
                "",
            ]

        def ppl_cell(s, L):
            row = s.rows.get(L) or {}
            return with_ci(s.ppl(L), row.get("ppl_lo"), row.get("ppl_hi"))

        has_ci = any(s.noise(L) for s in g.series for L in s.rows)
        out += ["### PPL", ""]
        if has_ci:
            out += ["Brackets: 95% bootstrap interval of each run's evaluation.", ""]
        out += [
            table(ppl_cell),
            "",
            f"### PPL relative to the same run's PPL at L_train = {L0}",
            "",
            "1.00 = as good as inside the training length; above 1 = worse.",
            "",
            table(lambda s, L: with_ci(relative(s, L), *relative_interval(s, L))),
            "",
            f"### PPL of tokens at positions ≥ {L0} (past the training length)",
            "",
            table(lambda s, L: fmt(s.rows[L].get("ppl_beyond") if L in s.rows else None)),
            "",
        ]
        out += _seed_section(g, lengths, columns)
        out += _noise_section(g, lengths)
        out += _window_section(g, lengths)
    if skipped:
        out += ["## Jobs not complete or not readable (shown above only where some lengths were evaluated)", ""]
        out += [f"- {s}" for s in skipped] + [""]
    return "\n".join(out)


def _seed_section(g: Group, lengths: list[int], columns: list[str]) -> list[str]:
    aggs = g.seed_aggregates()
    if not aggs:
        return []

    def cell(a, L):
        st = a.stats(L)
        return "" if st is None else f"{fmt(st['mean'])} ± {fmt(st['sd'])}"

    out = [
        "### PPL across seeds (mean ± sd)",
        "",
        "Runs that differ only in `seed`; sd across seeds (n − 1 in the denominator).",
        "",
        markdown_table(columns, [[a.label] + [cell(a, L) for L in lengths] for a in aggs]),
        "",
    ]
    for a in aggs:
        per = "; ".join(
            f"{L}: " + ", ".join(f"seed {k} {fmt(v)}" for k, v in a.values(L).items()) for L in lengths if a.values(L)
        )
        out.append(f"- {a.label} — {per}")
    return out + [""]


def _noise_section(g: Group, lengths: list[int]) -> list[str]:
    lines = []
    for L in lengths:
        judged = g.best_and_peers(L)
        if judged is None:
            continue
        best, peers = judged
        others = [r.label for r in g.noise_rows() if id(r) in peers and r is not best]
        lines.append(
            f"- {L}: best {best.label} ({fmt(best.ppl(L))}); within noise of it: "
            f"{', '.join(others) if others else 'none'}"
        )
    if not lines:
        return []
    return (
        [
            "### Within noise",
            "",
            "Rows whose noise intervals overlap the best row's (a run: its 95% bootstrap interval; "
            "a seed aggregate: mean ± 2 sd) cannot be told apart from it at that length.",
            "",
        ]
        + lines
        + [""]
    )


def _window_section(g: Group, lengths: list[int]) -> list[str]:
    """Does each series use the context past L? Its PPL relative to its own at
    L_train against the window-L control's (a model that reads nothing past
    L), at each length past L_train: below beyond both 95% intervals (yes),
    above beyond them (no), or within them (tied)."""
    L0 = g.key.train_len
    controls = [s for s in g.series if s.method == WINDOW_CONTROL and s.reference_self]
    if len(controls) != 1:
        return []
    control, past = controls[0], [L for L in lengths if L > L0]

    def cell(s, L):
        a, b = relative_interval(s, L), relative_interval(control, L)
        if None in a or None in b:
            return "–"
        return against_control(a, b, f"{fmt(relative(s, L))} vs {fmt(relative(control, L))}", higher_is_better=False)

    # Reference rows (trained longer) are read on absolute PPL above: relative to their own PPL at L_train,
    # a length they were not trained at, they say nothing about reading past it.
    rows = [[s.label] + [cell(s, L) for L in past] for s in g.series if s is not control and s.trained_at is None]
    if not past or not rows:
        return []
    return [
        f"### Against the window-L control ({control.label})",
        "",
        f"Does a run use the context past L_train = {L0}? Its PPL relative to its own at L_train against "
        f"{control.label}'s, a model whose attention is cut to the last {L0} keys and so reads nothing past "
        f"them: **yes** where it is lower beyond both 95% intervals, no where higher beyond them, tied within "
        f"them. A flat curve alone is what the control gives too.",
        "",
        markdown_table(["run"] + [f"{L} ({L / L0:g}×)" for L in past], rows),
        "",
    ]
