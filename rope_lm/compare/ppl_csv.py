"""A perplexity comparison as CSV rows: compare.csv (one row per series and
length, CSV_COLUMNS) and compare_seeds.csv (one per seed aggregate and length,
SEED_COLUMNS); ppl_runs.load_csv_runs reads compare.csv back."""

from rope_lm.compare.ppl_series import Group, noise_flag, relative, relative_interval
from rope_lm.core.files import from_here

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
]


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
                    }
                )
    return rows


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
                    }
                )
    return rows
