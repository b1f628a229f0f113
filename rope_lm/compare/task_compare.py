"""Compare synthetic-task runs (rope_lm.probes.task_run, scripts/task.py): exact
match inside / past the training sizes per task and scheme, and accuracy per
size bucket across runs. Rows are named as the perplexity comparison names
its rows (rope_lm.compare.labels)."""

import os
import re

from rope_lm.compare.labels import distinct_labels, flat_settings
from rope_lm.compare.result_files import files_given_or_below, read_runs, short_path, to_csv
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import atomic_write, from_here, written_together
from rope_lm.core.tables import markdown_table

TASK_COLUMNS = [
    "task",
    "label",
    "scheme",
    "method",
    "seed",
    "train_max",
    "sizes",
    "inside",
    "max_tokens",
    "n",
    "accuracy",
    "accuracy_lo",
    "accuracy_hi",
    "token_accuracy",
    "run_dir",
]


def find_task_results(paths: list[str]) -> list[str]:
    """task_results.json files named directly or found (recursively) under directories."""
    from rope_lm.probes.task_run import TASK_JSON  # torch: only where task runs are looked for

    return files_given_or_below(paths, TASK_JSON)


def load_task_runs(paths: list[str]) -> tuple[list[dict], list[str]]:
    """The task runs, and a note on every task_results.json that cannot be
    read (half-written by a killed process, or not a task run's): one bad file
    never hides the others."""

    def problem(r, p):
        if not isinstance(r, dict) or r.get("kind") != "task" or "buckets" not in r:
            return (
                f"UNREADABLE: `{short_path(os.path.dirname(p))}`: {p} is not a rope-lm task results file (no kind: "
                f"task / buckets)."
            )

    runs, unreadable = read_runs(find_task_results(paths), "rerun that task.", problem)
    return [split for r in runs for split in with_splits(r)], unreadable


def with_splits(run: dict) -> list[dict]:
    """The run, then each of its test splits (eval.splits) as a run of the task `<task>@<split>`,
    so every table, plot and claim reads a split as a task of its own."""
    out = [run]
    for name, split in (run.get("splits") or {}).items():
        out.append(
            {
                **{k: v for k, v in run.items() if k != "splits"},
                "task": f"{run['task']}@{name}",
                "task_options": {**(run.get("task_options") or {}), **split["task_options"]},
                **{k: split.get(k) for k in ("buckets", "inside", "beyond")},
            }
        )
    return out


def task_labels(runs: list[dict]) -> dict[str, str]:
    """run_dir -> scheme (+ method, + seed when several); runs of one task
    that would share a name are told apart by rope_lm.compare.labels."""
    seeds = len({r.get("seed") for r in runs}) > 1
    entries = [
        (
            r["task"],
            r["scheme"]
            + ("" if r["method"] == "none" else f" + {r['method']}")
            + (f" (seed {r['seed']})" if seeds else ""),
            flat_settings(r.get("config")),
            r["run_dir"],
            r.get("seed"),
        )
        for r in runs
    ]
    return dict(zip((r["run_dir"] for r in runs), distinct_labels(entries)))


def _natural(text: str) -> list:
    """Sort key that puts train.steps=4000 before train.steps=10000."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _by_task(runs: list[dict], labels: dict[str, str]) -> dict[str, list[dict]]:
    out = {}
    for r in sorted(runs, key=lambda r: (r["task"], r["scheme"], r["method"], _natural(labels[r["run_dir"]]))):
        out.setdefault(r["task"], []).append(r)
    return out


def task_table(runs: list[dict]) -> str:
    """One row per task, one column per scheme (+ method): exact match inside
    the training sizes / past them, each with its 95% interval below."""
    from rope_lm.probes.task_run import fmt_acc  # torch: only when there is a table to write

    names = task_labels(runs)
    ordered = sorted(runs, key=lambda r: (r["scheme"], r["method"], _natural(names[r["run_dir"]])))
    labels = list(dict.fromkeys(names[r["run_dir"]] for r in ordered))
    rows = []
    for task, rs in _by_task(runs, names).items():
        cells = {names[r["run_dir"]]: r for r in rs}
        first = rs[0]
        head = f"{task} ({first['train_sizes'][0]}-{first['train_sizes'][1]} → {first['test_max']})"
        rows.append(
            [head]
            + [
                f"{fmt_acc(cells[l].get('inside'))} / {fmt_acc(cells[l].get('beyond'))}" if l in cells else "—"
                for l in labels
            ]
        )
    return markdown_table(["task (train sizes → tested)"] + labels, rows)


def _notes(unreadable: list[str]) -> list[str]:
    return ["## Runs not read", ""] + [f"- {u}" for u in unreadable] + [""] if unreadable else []


def task_summary(root: str) -> str | None:
    """The inside / beyond table of every task run under root, written to
    <root>/tasks.md; None when there is none."""
    runs, unreadable = load_task_runs([root])
    if not runs:
        return None
    text = (
        "Exact match inside the training sizes / past them (95% bootstrap interval over instances), "
        f"{len(runs)} runs under {short_path(root)}:\n\n" + task_table(runs) + "\n"
    )
    if unreadable:
        text += "\n" + "\n".join(_notes(unreadable))
    atomic_write(os.path.join(root, "tasks.md"), text)
    return text


def compare_tasks(paths: list[str], out_dir: str, title: str | None = None) -> dict:
    """compare_tasks.md (summary table, then accuracy per size bucket across
    runs for each task), compare_tasks.csv and accuracy_vs_length_<task>.png,
    written as one set: a full disk part-way leaves out= as it was (or not made)."""
    with written_together(out_dir, "out=", "comparison"):
        return _compare_tasks(paths, out_dir, title)


def _compare_tasks(paths: list[str], out_dir: str, title: str | None) -> dict:
    from rope_lm.probes.task_run import fmt_acc, plot_accuracy

    runs, unreadable = load_task_runs(paths)
    if not runs:
        raise ConfigError(
            f"No readable task_results.json under {', '.join(paths)}"
            f"{' (' + '; '.join(unreadable[:3]) + ')' if unreadable else ''}: point compare at "
            f"scripts/task.py runs."
        )
    os.makedirs(out_dir, exist_ok=True)
    title = title or "Length generalization on synthetic tasks"
    names = task_labels(runs)
    md = [f"# {title}", "", "Exact match inside / past the training sizes:", "", task_table(runs), ""]
    rows, plots = [], []
    for task, rs in _by_task(runs, names).items():
        train_max = {r["train_sizes"][1] for r in rs}
        if len(train_max) > 1:
            md += [
                f"**{task}**: runs trained on different sizes ({sorted(train_max)}) are tabulated but not "
                f"plotted together.",
                "",
            ]
        bucket_labels = list(dict.fromkeys(b["label"] for r in rs for b in r["buckets"]))
        table = []
        for r in rs:
            by = {b["label"]: b for b in r["buckets"]}
            table.append([names[r["run_dir"]]] + [fmt_acc(by.get(l)) for l in bucket_labels])
            rows += [
                {
                    "task": task,
                    "label": names[r["run_dir"]],
                    "scheme": r["scheme"],
                    "method": r["method"],
                    "seed": r.get("seed"),
                    "train_max": r["train_sizes"][1],
                    "sizes": b["label"],
                    "run_dir": from_here(r["run_dir"]),
                    **{c: b.get(c) for c in TASK_COLUMNS if c in b and c not in ("sizes", "label")},
                }
                for b in r["buckets"]
            ]
        md += [f"## {task}", "", markdown_table(["run"] + bucket_labels, table), ""]
        if len(train_max) == 1:
            png = os.path.join(out_dir, f"accuracy_vs_length_{task}.png")
            plot_accuracy([dict(r, label=names[r["run_dir"]]) for r in rs], png, f"{title}: {task}")
            plots.append(png)
    md += _notes(unreadable)
    files = {
        "markdown": os.path.join(out_dir, "compare_tasks.md"),
        "csv": os.path.join(out_dir, "compare_tasks.csv"),
        "plots": plots,
    }
    atomic_write(files["markdown"], "\n".join(md))
    atomic_write(files["csv"], to_csv(rows, TASK_COLUMNS))
    return {"out_dir": out_dir, "files": files, "runs": runs, "rows": rows, "unreadable": unreadable}
