"""A perplexity comparison as CSV rows: compare.csv (one row per series and
length, CSV_COLUMNS), compare_seeds.csv (one per seed aggregate and length,
SEED_COLUMNS) and compare_seed_pairs.csv (one per two seed aggregates and
length, PAIR_COLUMNS); ppl_runs.load_csv_runs reads compare.csv back."""

import math

from rope_lm.compare.noise import HOLDS, WINDOW_CONTROL
from rope_lm.compare.ppl_pairs import PAIRED_COLUMN, paired_cell
from rope_lm.compare.ppl_series import (
    Group,
    control_verdict,
    noise_flag,
    pair_verdict,
    relative,
    relative_interval,
    seed_pair,
    seed_pairs,
)
from rope_lm.core.files import from_here

# A series' PPL over its own run's control's on the same windows (results.json rows' `controls`), with the
# evaluation's paired bootstrap interval: compare.csv's columns, read back by ppl_runs.csv_control.
CONTROL_COLUMNS = ["control", "control_ratio", "control_ratio_lo", "control_ratio_hi", "control_paired"]

CSV_COLUMNS = [
    "group",
    "label",
    "scheme",
    "method",
    "seed",
    "train_len",
    "length",
    "ratio",
    "ppl",
    "ppl_lo",
    "ppl_hi",
    "ppl_rel",
    "ppl_rel_lo",
    "ppl_rel_hi",
    "ppl_within",
    "ppl_beyond",
    "loss",
    "tokens",
    "documents",
    "protocol",
    "within_noise_of_best",
    "corpus",
    "split",
    "tokenizer",
    "run_dir",
    "train_pos",
    "trained_at",
    *CONTROL_COLUMNS,
    PAIRED_COLUMN,  # against the other series of the same model, paired on the same windows (ppl_pairs)
]
SEED_COLUMNS = [
    "group",
    "label",
    "scheme",
    "method",
    "train_len",
    "length",
    "n_seeds",
    "seeds",
    "ppl_mean",
    "ppl_sd",
    "ppl_min",
    "ppl_max",
    "noise_lo",
    "noise_hi",
    "rel_mean",
    "rel_sd",
    "per_seed",
    "within_noise_of_best",
    "run_dirs",
    # Against each seed's own window-L control on the same windows: d_s = ln(PPL_s / PPL_s(control)); mean and
    # sd over seeds, the 95% t-interval mean ± t_{0.975,n-1} sd / sqrt(n) (control_log_ratio_lo/hi) and as a
    # ratio (exp of those: control_ratio, _lo, _hi); control_holds_across_seeds: the interval excludes 0;
    # control_verdict: "below the control" / "above the control" (holds) or "within training noise".
    "control",
    "control_n_seeds",
    "control_log_ratio_mean",
    "control_log_ratio_sd",
    "control_log_ratio_lo",
    "control_log_ratio_hi",
    "control_ratio",
    "control_ratio_lo",
    "control_ratio_hi",
    "control_per_seed",
    "control_holds_across_seeds",
    "control_verdict",
]
# Two seed aggregates at a length, paired by seed: d_s = ln(PPL_a,s / PPL_b,s), the same statistics.
PAIR_COLUMNS = [
    "group",
    "a",
    "b",
    "train_len",
    "length",
    "n_seeds",
    "seeds",
    "log_ratio_mean",
    "log_ratio_sd",
    "log_ratio_lo",
    "log_ratio_hi",
    "ratio",
    "ratio_lo",
    "ratio_hi",
    "per_seed",
    "holds_across_seeds",
    "verdict",
]


def _ratio_columns(st: dict | None, prefix: str) -> dict:
    """The statistics of per-seed log ratios (noise.seed_interval + verdict) as CSV cells."""
    if st is None:
        return {}
    return {
        f"{prefix}log_ratio_mean": st["mean"],
        f"{prefix}log_ratio_sd": st["sd"],
        f"{prefix}log_ratio_lo": st["lo"],
        f"{prefix}log_ratio_hi": st["hi"],
        f"{prefix}ratio": math.exp(st["mean"]),
        f"{prefix}ratio_lo": math.exp(st["lo"]),
        f"{prefix}ratio_hi": math.exp(st["hi"]),
        f"{prefix}per_seed": ";".join(f"{k}={math.exp(v)!r}" for k, v in st["values"].items()),
    }


def csv_rows(groups: list[Group]) -> list[dict]:
    rows = []
    multi = len(groups) > 1
    for g in groups:
        for s in g.series:
            for L in sorted(s.rows):
                r = s.rows[L]
                rel_lo, rel_hi = relative_interval(s, L)
                rows.append(
                    {
                        "group": g.key.slug() if multi else "",
                        "label": s.label,
                        "scheme": s.scheme,
                        "method": s.method,
                        "seed": s.seed,
                        "train_len": s.train_len,
                        "length": L,
                        "ratio": L / s.train_len,
                        "ppl": r.get("ppl"),
                        "ppl_lo": r.get("ppl_lo"),
                        "ppl_hi": r.get("ppl_hi"),
                        "ppl_rel": relative(s, L),
                        "ppl_rel_lo": rel_lo,
                        "ppl_rel_hi": rel_hi,
                        "ppl_within": r.get("ppl_within"),
                        "ppl_beyond": r.get("ppl_beyond"),
                        "loss": r.get("loss"),
                        "tokens": r.get("tokens"),
                        "documents": r.get("documents"),
                        "protocol": r.get("protocol", "stream"),
                        "within_noise_of_best": noise_flag(g, s, L),
                        "corpus": g.key.fingerprint,
                        "split": g.key.split,
                        "tokenizer": g.key.tokenizer,
                        "run_dir": from_here(s.run_dir),
                        "train_pos": s.train_pos,
                        "trained_at": s.trained_at or s.train_len,
                        **_control_cells(s.control(L)),
                        PAIRED_COLUMN: paired_cell(g, s, L),
                    }
                )
    return rows


def _control_cells(pair: dict | None) -> dict:
    if pair is None:
        return dict.fromkeys(CONTROL_COLUMNS)
    return {
        "control": WINDOW_CONTROL,
        "control_ratio": pair["ratio"],
        "control_ratio_lo": pair.get("lo"),
        "control_ratio_hi": pair.get("hi"),
        "control_paired": pair.get("paired"),
    }


def seed_rows(groups: list[Group]) -> list[dict]:
    rows = []
    multi = len(groups) > 1
    for g in groups:
        for a in g.seed_aggregates():
            for L in g.lengths:
                st = a.stats(L)
                if st is None:
                    continue
                lo, hi = a.noise(L)
                values, rel = a.values(L), a.stats(L, relative_to=g.key.train_len)
                rows.append(
                    {
                        "group": g.key.slug() if multi else "",
                        "label": a.label,
                        "scheme": a.scheme,
                        "method": a.method,
                        "train_len": g.key.train_len,
                        "length": L,
                        "n_seeds": st["n"],
                        "seeds": ";".join(str(k) for k in values),
                        "ppl_mean": st["mean"],
                        "ppl_sd": st["sd"],
                        "ppl_min": st["min"],
                        "ppl_max": st["max"],
                        "noise_lo": lo,
                        "noise_hi": hi,
                        "rel_mean": rel and rel["mean"],
                        "rel_sd": rel and rel["sd"],
                        "per_seed": ";".join(f"{k}={v!r}" for k, v in values.items()),
                        "within_noise_of_best": noise_flag(g, a, L),
                        "run_dirs": ";".join(from_here(s.run_dir) for s in a.members),
                        **_seed_control_cells(a.control_stats(L)),
                    }
                )
    return rows


def _seed_control_cells(st: dict | None) -> dict:
    if st is None:
        return {}
    return {
        "control": WINDOW_CONTROL,
        "control_n_seeds": st["n"],
        **_ratio_columns(st, "control_"),
        "control_holds_across_seeds": st["verdict"] == HOLDS,
        "control_verdict": control_verdict(st),
    }


def pair_rows(groups: list[Group]) -> list[dict]:
    """compare_seed_pairs.csv: every two seed aggregates of a group (no controls) at every length."""
    rows = []
    multi = len(groups) > 1
    for g in groups:
        for a, b in seed_pairs(g):
            for L in g.lengths:
                st = seed_pair(a, b, L)
                if st is None:
                    continue
                rows.append(
                    {
                        "group": g.key.slug() if multi else "",
                        "a": a.label,
                        "b": b.label,
                        "train_len": g.key.train_len,
                        "length": L,
                        "n_seeds": st["n"],
                        "seeds": ";".join(str(k) for k in st["values"]),
                        **_ratio_columns(st, ""),
                        "holds_across_seeds": st["verdict"] == HOLDS,
                        "verdict": pair_verdict(st),
                    }
                )
    return rows
