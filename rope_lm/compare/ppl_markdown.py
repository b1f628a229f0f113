"""A perplexity comparison as markdown (compare.md): per group, PPL with its
intervals, PPL relative to L_train, PPL past L_train, seed aggregates (against
their own window-L controls and against each other, over seeds), the rows
within noise of the best, and each run against the window-L control."""

import math

from rope_lm.compare.noise import HOLDS, WINDOW_CONTROL, against_control
from rope_lm.compare.ppl_pairs import pairs_table, window_pairs
from rope_lm.compare.ppl_series import (
    Group,
    control_verdict,
    pair_verdict,
    relative,
    relative_interval,
    seed_pair,
    seed_pairs,
)
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
        out += _seed_control_section(g, lengths)
        out += _seed_pair_section(g, lengths)
        out += _noise_section(g, lengths)
        out += _window_section(g, lengths)
        out += _same_model_section(g, lengths)
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


T_FORMULA = (
    "Per seed s, d_s = ln(PPL_s / {other}) on the same windows; d = mean ± sd over the n seeds; 95% interval "
    "mean ± t_{{0.975, n−1}} · sd / √n (t = 4.303 for 3 seeds). Cells: exp(mean) [exp(interval)], a ratio, then "
    "d. The interval includes training noise (one value per trained model), which no run's bootstrap interval "
    "does. **holds**: it excludes a ratio of 1; otherwise the difference is within training noise."
)


def _ratio_cell(st: dict | None, verdict: str | None) -> str:
    if st is None:
        return ""
    shown = (
        f"{fmt(math.exp(st['mean']))} [{fmt(math.exp(st['lo']))}, {fmt(math.exp(st['hi']))}], "
        f"d {st['mean']:+.3f} ± {st['sd']:.3f}"
    )
    return f"{shown} **holds**" if st["verdict"] == HOLDS else f"{shown} {verdict}"


def _noise_list(rows: list, lengths: list[int], stats) -> list[str]:
    """One line per length naming the rows whose difference is within training noise there."""
    lines = []
    for L in lengths:
        names = [name for name, row in rows if (st := stats(row, L)) is not None and st["verdict"] != HOLDS]
        if names:
            lines.append(f"- {L}: within training noise: {', '.join(names)}")
    return lines


def _seed_control_section(g: Group, lengths: list[int]) -> list[str]:
    """Each seed aggregate against its own window-L control (each seed's run's own, on the same windows), at
    the lengths past L_train, over seeds."""
    past = [L for L in lengths if L > g.key.train_len]
    aggs = [a for a in g.seed_aggregates() if a.method != WINDOW_CONTROL]
    aggs = [a for a in aggs if any(a.control_stats(L) for L in past)]
    if not aggs:
        return []
    L0 = g.key.train_len
    rows = [[a.label] + [_ratio_cell(st := a.control_stats(L), control_verdict(st)) for L in past] for a in aggs]
    return (
        [
            f"### Against its own window-L control, across seeds (PPL / PPL of the same model cut to {L0})",
            "",
            "Below 1: the model reads the context past L_train better than itself with attention cut to the last "
            f"{L0} keys; above 1: the context past L_train costs it. "
            + T_FORMULA.format(other=f"PPL_s with attention cut to {L0}"),
            "",
            markdown_table(["run"] + [f"{L} ({L / L0:g}×)" for L in past], rows),
            "",
        ]
        + _noise_list([(a.label, a) for a in aggs], past, lambda a, L: a.control_stats(L))
        + [""]
    )


def _seed_pair_section(g: Group, lengths: list[int]) -> list[str]:
    """Every two seed aggregates (no controls) at each length, paired by seed."""
    pairs = [(a, b) for a, b in seed_pairs(g) if any(seed_pair(a, b, L) for L in lengths)]
    if not pairs:
        return []
    L0 = g.key.train_len
    rows = [
        [f"{a.label} vs {b.label}"] + [_ratio_cell(st := seed_pair(a, b, L), pair_verdict(st)) for L in lengths]
        for a, b in pairs
    ]
    named = [(f"{a.label} vs {b.label}", (a, b)) for a, b in pairs]
    return (
        [
            "### Run against run, across seeds (PPL of the first over the second's, paired by seed)",
            "",
            T_FORMULA.format(other="PPL_s of the second"),
            "",
            markdown_table(["pair"] + [f"{L} ({L / L0:g}×)" for L in lengths], rows),
            "",
        ]
        + _noise_list(named, lengths, lambda ab, L: seed_pair(ab[0], ab[1], L))
        + [""]
    )


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
    if any(s.control(L) for s in g.series for L in s.rows):
        return _own_control_section(g, lengths)
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


def _differs(pair: dict | None) -> bool:
    return pair is not None and not (pair.get("ratio") == pair.get("lo") == pair.get("hi") == 1.0)


def _own_control_section(g: Group, lengths: list[int]) -> list[str]:
    """Each series against its own run's window-L control on the same windows, as the evaluation recorded it:
    PPL over the control's with the paired bootstrap interval, **yes** where below 1 beyond it (the model reads
    the context past L), no where above, tied where the interval holds 1."""
    L0 = g.key.train_len
    # Past L; where the control is narrower than L (eval.control_window, e.g. 64 tokens for a model fine-tuned
    # at 1,024), the lengths past its window, where the two differ (up to it they are one evaluation).
    past = [L for L in lengths if L > L0] or [L for L in lengths if any(_differs(s.control(L)) for s in g.series)]

    def cell(s, L):
        pair = s.control(L)
        if pair is None:
            return ""
        # Three decimals: paired intervals are narrow, and 0.996 [0.995, 0.997] must not read as 1.00 [1.00, 1.00].
        shown = f"{pair['ratio']:.3f}"
        if pair.get("lo") is None or pair.get("hi") is None:
            return shown
        shown = f"{shown} [{pair['lo']:.3f}, {pair['hi']:.3f}]" + ("" if pair.get("paired", True) else " unpaired")
        return against_control((pair["lo"], pair["hi"]), (1.0, 1.0), shown, higher_is_better=False)

    rows = [[s.label] + [cell(s, L) for L in past] for s in g.series if any(s.control(L) for L in past)]
    if not past or not rows:
        return []
    return [
        "### Against its own window-L control (paired, on the same windows)",
        "",
        f"Does a run use the context past its window-L control? Its PPL over its own model's with attention cut to "
        f"the last L keys (L_train = {L0}, or eval.control_window; evaluated on the run's own weights), with the 95% "
        f"paired bootstrap "
        f"interval over the windows both scored: **yes** where the interval lies below 1, no where above, tied "
        f"where it holds 1. The interval is the text's noise for this one trained model; across seeds see above.",
        "",
        markdown_table(["run"] + [f"{L} ({L / L0:g}×)" for L in past], rows),
        "",
    ]


def _same_model_section(g: Group, lengths: list[int]) -> list[str]:
    """Every two series of one model scored on the same windows (ppl_pairs), the first's PPL over the second's
    with the paired interval."""
    pairs = window_pairs(g)
    table = pairs_table(pairs, [s.label for s in g.series], lengths, g.key.train_len)
    if not table:
        return []
    units = sorted({p["units"] for others in pairs.values() for p in others.values() if p.get("units")})
    kinds = sorted({p["unit"] for others in pairs.values() for p in others.values() if p.get("unit")})
    return [
        "### Methods on one model, paired on the same windows",
        "",
        f"Series evaluated with the same weights (one checkpoint or imported model, in one folder or several) and "
        f"scored on the same windows: the first's PPL over the second's, with the 95% paired bootstrap interval "
        f"over the {', '.join(map(str, units))} {' or '.join(k + 's' for k in kinds) or 'windows'} both read; "
        f"**lower** where the interval lies "
        f"below 1, higher where above, tied where it holds 1. The text's difficulty cancels in the ratio, so this "
        f"reads a method's effect more sharply than two overlapping PPL intervals.",
        "",
        table,
        "",
    ]
