"""Results files for every comparison (perplexity, task, retrieval, search):
found at or below the folders given, read one by one so that one bad file
never hides the others, and rows written back as CSV."""

import csv
import io
import json
import os

SKIP_DIRS = {"checkpoints", "wandb", "csv", "lightning_logs", ".hydra", "__pycache__"}


def short_path(path: str) -> str:
    """A folder as its last two parts, e.g. `sweep/rope_0`: how a comparison names a run."""
    parts = os.path.normpath(path).split(os.sep)
    return os.sep.join(parts[-2:])


def files_named(directory: str, name: str) -> list[str]:
    """Absolute paths of the files called `name` at or below `directory`, in
    sorted walk order, skipping SKIP_DIRS and hidden folders."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        if name in files:
            found.append(os.path.abspath(os.path.join(root, name)))
    return found


def files_given_or_below(paths: list[str], name: str) -> list[str]:
    """The files called `name` among `paths` (files) or at or below them
    (directories), absolute and each once, in the order given."""
    found = []
    for p in paths:
        if os.path.isfile(p) and os.path.basename(p) == name:
            found.append(os.path.abspath(p))
        elif os.path.isdir(p):
            found += files_named(p, name)
    return list(dict.fromkeys(found))


def read_json_or_note(path: str, rerun: str) -> tuple[object, str | None]:
    """A results file's JSON, or None and the UNREADABLE line a comparison
    lists it under (half-written by a killed process): one bad file never
    hides the others."""
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"UNREADABLE: `{short_path(os.path.dirname(path))}`: {path} is not valid JSON ({e}); {rerun}"


def read_runs(files: list[str], rerun: str, problem) -> tuple[list[dict], list[str]]:
    """The results files that read as JSON and in which `problem(r)` finds
    nothing (it returns the line to list a bad file under, or None), each with
    its run_dir; and that line for every other file: one bad file never hides
    the others."""
    runs, notes = [], []
    for p in files:
        r, note = read_json_or_note(p, rerun)
        note = note or problem(r, p)
        if note:
            notes.append(note)
            continue
        r["run_dir"] = os.path.dirname(p)
        runs.append(r)
    return runs, notes


def to_csv(rows: list[dict], columns: list[str]) -> str:
    """Rows as CSV text, a header of `columns` first."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_comparison(out: str, stem: str, md: list[str], skipped: list[str], rows: list[dict], columns: list[str]):
    """compare_<stem>.md (the runs not read listed at its end) and compare_<stem>.csv in `out`, written as one
    set: both or neither, and a folder made for them goes on failure. Returns {"markdown", "csv"}: their paths."""
    from rope_lm.core.files import atomic_write, written_together

    if skipped:
        md = md + ["## Runs not read", ""] + [f"- {s}" for s in skipped] + [""]
    files = {"markdown": os.path.join(out, f"compare_{stem}.md"), "csv": os.path.join(out, f"compare_{stem}.csv")}
    with written_together(out, "out=", "comparison"):
        atomic_write(files["markdown"], "\n".join(md))
        atomic_write(files["csv"], to_csv(rows, columns))
    return files
