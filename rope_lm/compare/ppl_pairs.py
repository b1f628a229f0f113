"""Methods on one model, compared on the same windows.

Two series evaluated with the same weights (results.json's config.model_identity for an evaluation of a
checkpoint or an imported model, its model_identity for a training run's own evaluation) and scored on the very same
windows differ in the method alone, so the difficulty of the text is no noise in their ratio. Its interval is a
paired bootstrap over those windows (or documents), eval/bootstrap.paired_ratio, from the per-window losses each
evaluation kept beside its results (eval_units.npz): two folders that evaluated one model, e.g. Gemma 3 with a
method on its global layers and on every layer, are read as one experiment. Overlapping the two PPL intervals
instead would count the books' difficulty twice, as if the two had read different text.

Series of different models (seeds, schemes) are never paired here: their differences include training noise,
read across seeds (ppl_series.seed_pairs). A run's own control is paired by the evaluation itself (the
`controls` of its rows) and is not repeated."""

import json
import os

import numpy as np

from rope_lm.compare.ppl_series import Group, Series
from rope_lm.core.tables import markdown_table
from rope_lm.eval import bootstrap
from rope_lm.eval.units_file import UNITS_NPZ, load_units

PAIRED_COLUMN = "paired_with"  # compare.csv: JSON, the other series' label -> {ratio, lo, hi, units, unit}


def _same_windows(a: bootstrap.Units, b: bootstrap.Units) -> bool:
    # Equal keys and token counts: the same documents or windows, cut the same way (two folders may have been
    # evaluated with other document budgets, and then a document's key alone does not name the same text).
    return (
        a.kind == b.kind
        and np.array_equal(a.keys, b.keys)
        and np.array_equal(a.count, b.count)
        and (a.ends is None) == (b.ends is None)
        and (a.ends is None or np.array_equal(a.ends, b.ends))
    )


def window_pairs(g: Group) -> dict[tuple[str, int], dict[str, dict]]:
    """(label, length) -> {other label: {ratio, lo, hi, units}}: each series' PPL over every other series' of
    the same model at that length, paired over the windows both were scored on; computed once per group."""
    if g.window_pairs is not None:
        return g.window_pairs
    units_of: dict[str, dict] = {}

    def units(s: Series, length: int):
        if s.run_dir not in units_of:
            units_of[s.run_dir] = load_units(os.path.join(s.run_dir, UNITS_NPZ)) if s.model else {}
        return units_of[s.run_dir].get(s.method, {}).get(length)

    out: dict[tuple[str, int], dict[str, dict]] = {}
    for s in g.series:  # a committed compare.csv's rows keep the pairs it was written with
        for length, row in s.rows.items():
            if row.get(PAIRED_COLUMN):
                out.setdefault((s.label, length), {}).update(row[PAIRED_COLUMN])
    series = [s for s in g.series if s.model and s.trained_at is None]
    for i, a in enumerate(series):
        for b in series[i + 1 :]:
            if a.model != b.model or (a.run_dir == b.run_dir and (a.is_control or b.is_control)):
                continue
            for length in sorted(set(a.rows) & set(b.rows)):
                ua, ub = units(a, length), units(b, length)
                pa, pb = a.ppl(length), b.ppl(length)
                if ua is None or ub is None or pa is None or pb is None or not _same_windows(ua, ub):
                    continue
                resamples, seed = min(a.resampling[0], b.resampling[0]), a.resampling[1]
                r = bootstrap.paired_ratio(ua, ub, pa, pb, resamples, seed, length)
                if r.get("lo") is None:
                    continue
                common = {"units": r["units"], "unit": ua.kind}  # how many, and what: window, document, block
                out.setdefault((a.label, length), {})[b.label] = {
                    "ratio": r["ratio"],
                    "lo": r["lo"],
                    "hi": r["hi"],
                    **common,
                }
                out.setdefault((b.label, length), {})[a.label] = inverted(out[(a.label, length)][b.label])
    g.window_pairs = out
    return out


def inverted(pair: dict) -> dict:
    """The same pair read the other way round: the second's PPL over the first's, its interval flipped."""
    return {**pair, "ratio": 1 / pair["ratio"], "lo": 1 / pair["hi"], "hi": 1 / pair["lo"]}


def paired_cell(g: Group, s: Series, length: int) -> str | None:
    """compare.csv's PAIRED_COLUMN cell of a series at a length: JSON, or None where it has no pair."""
    pairs = window_pairs(g).get((s.label, length))
    return json.dumps(pairs, sort_keys=True) if pairs else None


def read_paired_cell(value) -> dict:
    """A PAIRED_COLUMN cell read back: {other label: {ratio, lo, hi, units}}, {} where empty."""
    if value in (None, ""):
        return {}
    return json.loads(value) if isinstance(value, str) else dict(value)


def pairs_table(pairs: dict[tuple[str, int], dict[str, dict]], order: list[str], lengths: list[int], L0: int) -> str:
    """The pairs as a markdown table, a row "first / second" per two series (in `order`, the table's rows;
    a label only a committed CSV names goes last) and a column per length that has a pair: the ratio with its
    interval, **lower** where it lies below 1, higher where above, tied where it holds 1; "" where none; ""
    for no table at all."""
    # Two series with the very same rows there (a method that changes nothing at that length, whose rows are the
    # plain model's) say nothing: 1.000 [1.000, 1.000] is left out.
    pairs = {
        k: {b: p for b, p in others.items() if not p["ratio"] == p["lo"] == p["hi"] == 1.0}
        for k, others in pairs.items()
    }
    rank = {label: i for i, label in enumerate(order)}

    def first(label):
        return rank.get(label, len(rank)), label

    names = sorted(
        {tuple(sorted((a, b), key=first)) for (a, _), others in pairs.items() for b in others},
        key=lambda ab: (first(ab[0]), first(ab[1])),
    )
    shown = [L for L in lengths if any(b in pairs.get((a, L), {}) for a, b in names)]
    if not names or not shown:
        return ""

    def cell(a, b, L):
        p = pairs.get((a, L), {}).get(b)
        if p is None:
            return ""
        text = f"{p['ratio']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]"
        return f"**lower** ({text})" if p["hi"] < 1 else f"higher ({text})" if p["lo"] > 1 else f"tied ({text})"

    return markdown_table(
        ["first / second"] + [f"{L} ({L / L0:g}×)" for L in shown],
        [[f"{a} / {b}"] + [cell(a, b, L) for L in shown] for a, b in names],
    )
