"""Compare perplexity runs: compare.md, compare.csv (and compare_seeds.csv,
compare_seed_pairs.csv where seeds were replicated) and a pair of plots per group, across
results.json files and committed compare.csv files (scripts/compare.py).

A comparison only means something when every run scored the same text with
the same tokenizer and was trained at the same length: runs with different
keys (ppl_series.GroupKey) are refused, or, with ``group=True``, compared
within each key separately, never mixed in one table or plot.

The parts: runs read (ppl_runs), what a comparison is made of and its
statistics (ppl_series), runs grouped and named (ppl_groups), the views
(ppl_markdown, ppl_csv, ppl_plots) and the wandb summary run (ppl_wandb).
"""

import os

from rope_lm.compare.ppl_csv import CSV_COLUMNS, PAIR_COLUMNS, SEED_COLUMNS, csv_rows, pair_rows, seed_rows
from rope_lm.compare.ppl_groups import group_runs
from rope_lm.compare.ppl_markdown import markdown
from rope_lm.compare.ppl_plots import plot_per_position, plot_ppl
from rope_lm.compare.ppl_runs import load_runs
from rope_lm.compare.ppl_series import Run
from rope_lm.compare.result_files import to_csv
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import atomic_write, written_together


def default_out(paths: list[str]) -> str:
    if len(paths) == 1 and os.path.isdir(paths[0]):
        return os.path.join(paths[0], "compare")
    import datetime

    return os.path.join("outputs", "compare", datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S"))


def study_name(paths: list[str], runs: list[Run]) -> str:
    """The runs' shared wandb group if they have one, else the (sweep) directory name."""
    groups = {((r.results.get("config") or {}).get("logger") or {}).get("group") for r in runs}
    if len(groups) == 1 and None not in groups:
        return str(groups.pop())
    if len(paths) == 1:
        return os.path.basename(os.path.normpath(os.path.abspath(paths[0])))
    return os.path.basename(os.path.commonpath([r.dir for r in runs])) or "compare"


def compare(
    paths: list[str],
    out_dir: str | None = None,
    group: bool = False,
    title: str | None = None,
    references: list[str] = (),
) -> dict:
    """Write compare.md, compare.csv and one pair of PNGs per group; returns
    what was written (and the groups, for logging elsewhere). `references`:
    runs trained longer, shown in each table of their corpus as upper-bound
    rows (add_references)."""
    runs, skipped = load_runs(paths)
    ref_runs, ref_skipped = load_runs(list(references)) if references else ([], [])
    skipped += ref_skipped
    groups = group_runs(runs, group, ref_runs)
    out_dir = out_dir or default_out(paths)
    # Written as one set: a full disk part-way leaves the folder as it was (or not made).
    with written_together(out_dir, "out=", "comparison"):
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"Cannot create the output directory {out_dir} ({e.strerror}); pass out= a writable place."
            ) from None
        title = title or f"Comparison: {study_name(paths, runs)}"
        rows = csv_rows(groups)
        files = {
            "markdown": os.path.join(out_dir, "compare.md"),
            "csv": os.path.join(out_dir, "compare.csv"),
            "plots": [],
        }
        atomic_write(files["markdown"], markdown(groups, skipped, title))
        atomic_write(files["csv"], to_csv(rows, CSV_COLUMNS))
        seeds = seed_rows(groups)
        if seeds:
            files["seeds_csv"] = os.path.join(out_dir, "compare_seeds.csv")
            atomic_write(files["seeds_csv"], to_csv(seeds, SEED_COLUMNS))
        pairs = pair_rows(groups)
        if pairs:
            files["seed_pairs_csv"] = os.path.join(out_dir, "compare_seed_pairs.csv")
            atomic_write(files["seed_pairs_csv"], to_csv(pairs, PAIR_COLUMNS))
        for g in groups:
            suffix = f"_{g.key.slug()}" if len(groups) > 1 else ""
            ppl_png = os.path.join(out_dir, f"ppl_vs_length{suffix}.png")
            pos_png = os.path.join(out_dir, f"per_position{suffix}.png")
            plot_ppl(g, ppl_png, title)
            plot_per_position(g, pos_png, title)
            files["plots"].append({"group": g.key.slug(), "ppl_vs_length": ppl_png, "per_position": pos_png})
    return {
        "out_dir": out_dir,
        "files": files,
        "groups": groups,
        "rows": rows,
        "seed_rows": seeds,
        "pair_rows": pairs,
        "runs": runs,
        "skipped": skipped,
        "title": title,
        "study": study_name(paths, runs),
    }
