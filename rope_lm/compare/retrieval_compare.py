"""Compare retrieval-battery runs (scripts/retrieval.py): each task's
effective length per checkpoint and method, side by side. Torch-free: it
reads retrieval.json files only. Rows are named as the other comparisons
name theirs (rope_lm.compare.labels)."""

import os

from rope_lm.compare.labels import distinct_labels, flat_settings, run_name
from rope_lm.compare.noise import WINDOW_CONTROL, against_control
from rope_lm.compare.result_files import files_given_or_below, read_runs, short_path, write_comparison
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import from_here
from rope_lm.core.tables import markdown_table
from rope_lm.probes.effective_length import effective_label

RETRIEVAL_JSON = "retrieval.json"
COLUMNS = [
    "label",
    "scheme",
    "method",
    "train_len",
    "scoring",
    "threshold",
    "relative",
    "task",
    "effective_length",
    "at_least",
    "effective",
    "lengths",
    "accuracy",
    "accuracy_lo",
    "accuracy_hi",
    "run_dir",
]
MEAN = "mean of tasks"


def find_retrieval_results(paths: list[str]) -> list[str]:
    """retrieval.json files named directly or found (recursively) under directories."""
    return files_given_or_below(paths, RETRIEVAL_JSON)


def load_retrieval_runs(paths: list[str]) -> tuple[list[dict], list[str]]:
    """The runs that report effective lengths, and a note on every other
    retrieval.json (unreadable, or written before effective lengths existed:
    rerun scripts/retrieval.py on it)."""

    def problem(r, p):
        if not isinstance(r, dict) or not isinstance(r.get("tasks"), dict) or "effective" not in r:
            return (
                f"NO EFFECTIVE LENGTHS: `{short_path(os.path.dirname(p))}`: {p} has no effective lengths (written by "
                f"an older scripts/retrieval.py); rerun it."
            )

    return read_runs(find_retrieval_results(paths), "rerun it.", problem)


def _threshold(r: dict) -> str:
    e = r["effective"]
    return f"{e['threshold']:g} × own@L" if e["relative"] else f"{e['threshold']:.0%}"


def retrieval_labels(runs: list[dict]) -> dict[str, str]:
    """run_dir -> scheme ([train: its training-time position method]) (+ method), as compare.py names
    the same runs; told apart by the training settings they differ in (pos.base=10.0), then by seed
    (seed=1), else (older files, without the checkpoint's settings) by their folders."""
    entries = [
        (
            0,
            run_name(r["scheme"], r["method"], r.get("train_pos", "none")),
            flat_settings(r.get("config")),
            r["run_dir"],
            (r.get("config") or {}).get("seed"),
        )
        for r in runs
    ]
    return dict(zip((r["run_dir"] for r in runs), distinct_labels(entries)))


def retrieval_table(runs: list[dict]) -> str:
    """One row per run (checkpoint x method), one column per task and the
    mean of its tasks: the effective length (× the training length)."""
    names = retrieval_labels(runs)
    tasks = list(dict.fromkeys(t for r in runs for t in r["tasks"]))
    rows = []
    for r in sorted(runs, key=lambda r: (r["scheme"], r["method"], names[r["run_dir"]])):
        cells = [
            effective_label(r["tasks"][t]["effective"], r.get("train_len")) if t in r["tasks"] else "—" for t in tasks
        ]
        rows.append(
            [
                names[r["run_dir"]],
                r.get("train_len", "?"),
                r.get("scoring", "?"),
                _threshold(r),
                *cells,
                effective_label(r["effective"]["mean"], r.get("train_len")),
            ]
        )
    return markdown_table(["run", "L", "scoring", "threshold", *tasks, MEAN], rows)


def window_section(runs: list[dict], names: dict[str, str]) -> list[str]:
    """Does each run find what lies past L? Per task, its accuracy at each
    length past L against the window-L control's (a model trained at the same
    L whose attention is cut to the last L keys, so it can only answer from
    them): **yes** where higher beyond both 95% intervals, no where lower
    beyond them, tied within them. Only where one such control was run."""
    pct = lambda v: f"{v:.0%}"
    out = []
    for L0 in sorted({r["train_len"] for r in runs if r.get("train_len")}):
        at = [r for r in runs if r.get("train_len") == L0]
        controls = [r for r in at if r["method"] == WINDOW_CONTROL]
        if len(controls) != 1 or len(at) < 2:
            continue
        control, tables = controls[0], []
        for task, c in control["tasks"].items():
            theirs = dict(zip(c["lengths"], c["by_length"]))
            past = [L for L in c["lengths"] if L > L0]

            def cell(mine, L):
                a, b = mine.get(L), theirs[L]
                if a is None or None in (
                    a.get("accuracy_lo"),
                    a.get("accuracy_hi"),
                    b.get("accuracy_lo"),
                    b.get("accuracy_hi"),
                ):
                    return "–"
                return against_control(
                    (a["accuracy_lo"], a["accuracy_hi"]),
                    (b["accuracy_lo"], b["accuracy_hi"]),
                    f"{pct(a['accuracy'])} vs {pct(b['accuracy'])}",
                    higher_is_better=True,
                )

            rows = [
                [names[r["run_dir"]]]
                + [cell(dict(zip(r["tasks"][task]["lengths"], r["tasks"][task]["by_length"])), L) for L in past]
                for r in at
                if r is not control and task in r["tasks"]
            ]
            if past and rows:
                tables += [f"### {task}", "", markdown_table(["run"] + [f"{L} ({L / L0:g}×)" for L in past], rows), ""]
        if tables:
            name = names[control["run_dir"]]
            out += [
                f"## Against the window-L control ({name}, L = {L0})",
                "",
                f"Does a run find what lies past L_train = {L0}? Each task's accuracy against {name}'s, whose "
                f"attention is cut to the last {L0} keys, so that it answers only from them (and by guessing): "
                f"**yes** where higher beyond both 95% intervals, no where lower beyond them, tied within them.",
                "",
            ] + tables
    return out


def _numbers(values) -> str:
    """Space-separated, empty where a value is missing (an interval without bootstrap)."""
    return " ".join("" if v is None else f"{v:.4g}" for v in values) if all(v is not None for v in values) else ""


def csv_rows(runs: list[dict], names: dict[str, str] | None = None) -> list[dict]:
    """One row per run and task (and the mean of its tasks): effective length,
    and the accuracy with its 95% interval at each length (space-separated)."""
    names = names or retrieval_labels(runs)
    rows = []
    for r in runs:
        entries = [(t, v["effective"], v["lengths"], v["by_length"]) for t, v in r["tasks"].items()]
        mean = r["effective"]["mean"]
        entries.append(
            (MEAN, mean, next(iter(r["tasks"].values()))["lengths"], [{"accuracy": a} for a in mean["accuracy"]])
        )
        for task, e, lengths, by_length in entries:
            rows.append(
                {
                    "label": names[r["run_dir"]],
                    "scheme": r["scheme"],
                    "method": r["method"],
                    "train_len": r.get("train_len"),
                    "scoring": r.get("scoring"),
                    "threshold": r["effective"]["threshold"],
                    "relative": r["effective"]["relative"],
                    "task": task,
                    "effective_length": e["length"],
                    "at_least": e["at_least"],
                    "effective": effective_label(e, r.get("train_len")),
                    "lengths": " ".join(map(str, lengths)),
                    "accuracy": _numbers([b["accuracy"] for b in by_length]),
                    "accuracy_lo": _numbers([b.get("accuracy_lo") for b in by_length]),
                    "accuracy_hi": _numbers([b.get("accuracy_hi") for b in by_length]),
                    "run_dir": from_here(r["run_dir"]),
                }
            )
    return rows


def compare_retrieval(paths: list[str], out_dir: str, title: str | None = None, required: bool = True) -> dict | None:
    """compare_retrieval.md (the effective-length table) and compare_retrieval.csv
    (one row per run and task, with its accuracy by length). Without a
    readable run: a ConfigError if required, else None."""
    runs, skipped = load_retrieval_runs(paths)
    if not runs and not required:
        return None
    if not runs:
        raise ConfigError(
            f"No retrieval.json with effective lengths under {', '.join(paths)}"
            f"{' (' + '; '.join(skipped[:3]) + ')' if skipped else ''}: point compare at "
            f"scripts/retrieval.py outputs."
        )
    names = retrieval_labels(runs)
    md = [
        f"# {title or 'Retrieval battery: effective length'}",
        "",
        "The longest length up to which each task's accuracy stays above the threshold (RULER's effective "
        "length; a dip ends it even where a longer length recovers); ≥: above at every length tested, <: not "
        "above at the shortest.",
        "",
        retrieval_table(runs),
        "",
    ] + window_section(runs, names)
    rows = csv_rows(runs, names)
    files = write_comparison(out_dir, "retrieval", md, skipped, rows, COLUMNS)
    return {"out_dir": out_dir, "files": files, "runs": runs, "rows": rows, "skipped": skipped}
