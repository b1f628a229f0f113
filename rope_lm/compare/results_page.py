"""The results pages' tables, generated from the committed CSVs, so that a
page and its data cannot drift. Torch-free.

A generated block in a markdown page is a marker line, the table, and an end
line:

    <!-- table: docs/results/pe_pg19_6000/compare.csv ppl -->
    | run | 64 (1×) | ... |
    <!-- end table -->

The marker names a file (relative to the repository root) and a kind:

* ``ppl``: a compare.csv's PPL per run and length, with the 95% interval;
* ``rel``: the same runs' PPL relative to their own PPL at L_train, with the
  interval of the ratio;
* ``summary``: one line per run, PPL at L_train and at the whole multiples
  2, 4, ... x L_train, then the same relative to L_train (no intervals: the
  comparison's compare.md has them);
* ``accuracy``: a compare_retrieval.csv's accuracy per run and length for
  one task (``task=``, default passkey), with the 95% interval over samples;
* ``effective``: a compare_retrieval.csv's effective length (RULER's) per run
  and task, a row per run and a column per task (``tasks=a,b`` picks them);
* ``window``: the same runs read against the window-L control (the row whose
  method is `window`) at each length past L_train: **yes** where a run's
  relative PPL is below the control's beyond both intervals, no where above,
  tied within (compare/noise.against_control);
* ``seeds``: a compare_seeds.csv's schemes run with several seeds, one line
  each: mean ± sd over seeds of the PPL at L_train and at the whole
  multiples of it, then of each seed's PPL relative to its own at L_train;
* ``md``: a markdown file as it is (e.g. check_published.md), or with
  ``table=N`` only its N-th table (e.g. the inside / past table that heads a
  compare_tasks.md);
* ``lm_eval``: a folder of lm-evaluation-harness result files (its
  ``--output_path`` JSONs), one row per file: the rope-lm model arguments
  other than the checkpoint, each task's metrics, and lm-eval's own wall time;
* ``search``: the scripts/search.py results (search.json) in a folder, one
  row per method and target: the test PPL of plain positions, the method's
  defaults and the searched settings, and searched / defaults on the same
  windows with its paired interval.

Options after the kind: ``labels=a,b`` picks and orders the runs (compare.csv
labels), ``group=<slug>`` the group of a multi-group comparison.
`scripts/results_page.py` rewrites every block of the pages; with
``check=true`` it only says which blocks are stale, and the test suite runs
that check on the committed pages.
"""

import csv
import os
import re

from rope_lm.compare.noise import WINDOW_CONTROL, against_control
from rope_lm.compare.ppl_markdown import fmt, with_ci
from rope_lm.compare.ppl_runs import csv_number, reference_row
from rope_lm.core.errors import ConfigError
from rope_lm.core.tables import markdown_table

BLOCK = re.compile(r"^<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)^<!-- end table -->$", re.M | re.S)
KINDS = ("ppl", "rel", "summary", "window", "seeds", "accuracy", "effective", "md", "search", "lm_eval")
FOLDER_KINDS = ("search", "lm_eval")


def _pick(labels: list[str], options: dict, lacking: str) -> list[str]:
    """The labels= option's runs, in its order (all of them without it)."""
    if "labels" not in options:
        return labels
    wanted = options["labels"].split(",")
    missing = [w for w in wanted if w not in labels]
    if missing:
        raise ConfigError(f"{lacking} labelled {', '.join(missing)} (it has: {', '.join(labels)}).")
    return wanted


def _runs(path: str, options: dict) -> tuple[list[str], list[int], dict]:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("group", "") == options.get("group", "")]
    if not rows:
        raise ConfigError(
            f"{path} has no rows{' in group ' + options['group'] if 'group' in options else ''}: "
            f"regenerate it with scripts/compare.py, or fix the block's group= option."
        )
    labels = _pick(list(dict.fromkeys(r["label"] for r in rows)), options, f"{path} has no run")
    lengths = sorted({int(r["length"]) for r in rows if r["label"] in labels})
    by = {(r["label"], int(r["length"])): r for r in rows}
    return labels, lengths, by


def render(spec: str, root: str = ".") -> str:
    """The table (or file) a block's marker asks for, without trailing newline."""
    parts = spec.split()
    if len(parts) < 2 or parts[1] not in KINDS:
        raise ConfigError(
            f"A results-page block says `<!-- table: {spec} -->`; write `<!-- table: <file> <kind> "
            f"[labels=a,b] [group=g] -->` with kind one of {', '.join(KINDS)}."
        )
    path, kind = os.path.join(root, parts[0]), parts[1]
    options = dict(p.split("=", 1) for p in parts[2:])
    if not (os.path.isdir if kind in FOLDER_KINDS else os.path.isfile)(path):
        raise ConfigError(
            f"{parts[0]} (named by a results-page block) does not exist under {os.path.abspath(root)}"
            f"{' as a folder' if kind in FOLDER_KINDS else ''}."
        )
    if kind == "search":
        return _search(path, parts[0])
    if kind == "lm_eval":
        return _lm_eval(path, parts[0])
    if kind == "md":
        with open(path) as f:
            text = f.read().rstrip("\n")
        return _nth_table(text, options["table"], parts[0]) if "table" in options else text
    if kind == "accuracy":
        return _accuracy(path, parts[0], options)
    if kind == "effective":
        return _effective(path, parts[0], options)
    labels, lengths, by = _runs(path, options)
    if kind == "seeds" and "rel_mean" not in next(iter(by.values())):
        raise ConfigError(
            f"{parts[0]} is no compare_seeds.csv with relative PPL (rel_mean): point the block at the "
            f"compare_seeds.csv of a comparison, regenerated with today's scripts/compare.py."
        )
    train_len = {int(float(by[k]["train_len"])) for k in by if k[0] in labels}
    if len(train_len) != 1:
        raise ConfigError(
            f"The runs {', '.join(labels)} of {parts[0]} have different training lengths "
            f"({sorted(train_len)}); pick one group with labels= or group=."
        )
    L0 = train_len.pop()
    if kind in ("summary", "seeds"):
        return _summary(by, labels, lengths, L0, seeds=kind == "seeds")
    if kind == "window":
        return _window(by, labels, lengths, L0, parts[0])
    key = ("ppl", "ppl_lo", "ppl_hi") if kind == "ppl" else ("ppl_rel", "ppl_rel_lo", "ppl_rel_hi")

    def cell(label, L):
        r = by.get((label, L))
        return with_ci(*(csv_number(r.get(k)) for k in key)) if r else fmt(None)

    return markdown_table(
        ["run"] + [f"{L} ({L / L0:g}×)" for L in lengths],
        [[label] + [cell(label, L) for L in lengths] for label in labels],
    )


def _summary(by: dict, labels: list[str], lengths: list[int], L0: int, seeds: bool) -> str:
    """PPL at L0 and its whole multiples, then relative to L0: a compare.csv's
    value per run, or a compare_seeds.csv's mean ± sd per scheme."""
    far = [L for L in lengths if L > L0 and L % L0 == 0]

    def value(label, L, k):
        r = by.get((label, L)) or {}
        if not seeds:
            return fmt(csv_number(r.get(k)))
        mean, sd = csv_number(r.get(f"{k}_mean")), csv_number(r.get(f"{k}_sd"))
        return "–" if mean is None or sd is None else f"{fmt(mean)} ± {fmt(sd)}"

    absolute, relative = ("ppl", "rel") if seeds else ("ppl", "ppl_rel")
    return markdown_table(
        ["scheme (seeds)" if seeds else "run", f"{L0} (1×)"]
        + [f"{L // L0}×" for L in far]
        + [f"relative at {far[0] // L0}×"]
        + [f"{L // L0}×" for L in far[1:]],
        [
            [label, value(label, L0, absolute)]
            + [value(label, L, absolute) for L in far]
            + [value(label, L, relative) for L in far]
            for label in labels
        ],
    )


def _window(by: dict, labels: list[str], lengths: list[int], L0: int, name: str) -> str:
    controls = [label for label in labels if (by.get((label, L0)) or {}).get("method") == WINDOW_CONTROL]
    if len(controls) != 1:
        raise ConfigError(
            f"A `window` block needs exactly one window-L control (method {WINDOW_CONTROL}) among the runs "
            f"of {name}; it has {len(controls)}: add the control's evaluation to the comparison, or pick "
            f"the runs with labels=."
        )
    control, past = controls[0], [L for L in lengths if L > L0]

    def cell(label, L):
        a, b = by.get((label, L)), by.get((control, L))
        ci = lambda r: tuple(csv_number(r.get(k)) for k in ("ppl_rel_lo", "ppl_rel_hi")) if r else (None, None)
        if None in ci(a) or None in ci(b):
            return "–"
        return against_control(
            ci(a), ci(b), f"{fmt(csv_number(a['ppl_rel']))} vs {fmt(csv_number(b['ppl_rel']))}", higher_is_better=False
        )

    # A reference row (trained longer) is read on absolute PPL in the other blocks: its PPL relative to its
    # own at L0, a length it was not trained at, says nothing about reading past L0.
    return markdown_table(
        ["run"] + [f"{L} ({L / L0:g}×)" for L in past],
        [
            [label] + [cell(label, L) for L in past]
            for label in labels
            if label != control and not reference_row(by.get((label, L0)) or {})
        ],
    )


def _accuracy(path: str, name: str, options: dict) -> str:
    """One retrieval task's accuracy by length, a row per run (compare_retrieval.csv
    keeps each run's lengths and accuracies as space-separated lists)."""
    task = options.get("task", "passkey")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == task]
    if not rows:
        raise ConfigError(
            f"{name} has no {task} rows: name the task with task= (the file's tasks are in its "
            f"`task` column), or regenerate it with scripts/compare.py."
        )
    by_label = {r["label"]: r for r in rows}
    rows = [by_label[w] for w in _pick(list(by_label), options, f"{name} has no {task} run")]

    def by_length(r):
        lengths = [int(v) for v in r["lengths"].split()]
        column = lambda k: [csv_number(v) for v in r[k].split()] if r.get(k) else [None] * len(lengths)
        return dict(zip(lengths, zip(column("accuracy"), column("accuracy_lo"), column("accuracy_hi"))))

    tables = {r["label"]: by_length(r) for r in rows}
    train_len = {int(float(r["train_len"])) for r in rows}
    if len(train_len) != 1:
        raise ConfigError(
            f"The {task} runs of {name} have different training lengths ({sorted(train_len)}); pick runs with labels=."
        )
    L0, lengths = train_len.pop(), sorted({L for t in tables.values() for L in t})
    pct = lambda v: "–" if v is None else f"{v:.0%}"

    def cell(t, L):
        if L not in t:
            return "–"
        a, lo, hi = t[L]
        return pct(a) + (f" [{pct(lo)}, {pct(hi)}]" if lo is not None and hi is not None else "")

    return markdown_table(
        ["run"] + [f"{L} ({L / L0:g}×)" for L in lengths],
        [[label] + [cell(t, L) for L in lengths] for label, t in tables.items()],
    )


def _effective(path: str, name: str, options: dict) -> str:
    """Each run's effective length per task, as compare_retrieval.csv's `effective`
    column writes it (e.g. "256 (2×)", "<128", "≥2048")."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if "tasks" in options:
        missing = [t for t in options["tasks"].split(",") if t not in tasks]
        if missing:
            raise ConfigError(f"{name} has no {', '.join(missing)} rows (its tasks: {', '.join(tasks)}).")
        tasks = options["tasks"].split(",")
    by = {(r["label"], r["task"]): r["effective"] for r in rows}
    labels = _pick(list(dict.fromkeys(r["label"] for r in rows)), options, f"{name} has no run")
    return markdown_table(["run"] + tasks, [[label] + [by.get((label, t), "–") for t in tasks] for label in labels])


def _search(path: str, name: str) -> str:
    import json

    from rope_lm.compare.result_files import files_given_or_below

    found = []
    for p in files_given_or_below([path], "search.json"):
        with open(p) as f:
            found.append(json.load(f))
    if not found:
        raise ConfigError(f"{name} holds no search.json: copy scripts/search.py's output folders there.")

    def cell(r):
        return with_ci(*(r.get(k) for k in ("ppl", "ppl_lo", "ppl_hi"))) if r else fmt(None)

    rows = []
    for s in sorted(found, key=lambda s: (s["method"], s["target"])):
        test = s["test"]
        searched = next(k for k in test if k.endswith(" searched"))
        defaults = next(k for k in test if k.endswith(" defaults"))
        pair = (s.get("paired") or {}).get(f"{searched} / {defaults}") or {}
        ratio = (
            "–"
            if not pair
            else f"{pair['ratio']:.3f}"
            + (f" [{pair['lo']:.3f}, {pair['hi']:.3f}]" if pair.get("lo") is not None else "")
        )
        rows.append(
            [
                s["method"],
                f"{s['target']} ({s['target'] / s['train_len']:g}×)",
                cell(test.get("none")),
                f"{defaults.split()[0]}: {cell(test[defaults])}",
                cell(test[searched]),
                ratio,
                str(s["trials"]),
            ]
        )
    return markdown_table(
        ["method", "target", "none", "defaults", "searched", "searched / defaults (paired)", "trials"], rows
    )


def _nth_table(text: str, n: str, name: str) -> str:
    """The n-th (1-based) markdown table of a file: its consecutive `|` lines."""
    tables = re.findall(r"(?:^\|.*\|$\n?)+", text, re.M)
    if not n.isdigit() or not 1 <= int(n) <= len(tables):
        raise ConfigError(
            f"A results-page block asks for table={n} of {name}, which has {len(tables)} table(s): "
            f"give table= a number from 1 to {len(tables)}."
        )
    return tables[int(n) - 1].rstrip("\n")


def _lm_eval(path: str, name: str) -> str:
    """lm-eval's result JSONs in a folder, a row per file: the model arguments
    that are not the checkpoint, then every task's metrics (stderr left out: lm-eval
    gives none for perplexity tasks) and lm-eval's evaluation time."""
    import json

    found = []
    for file in sorted(f for f in os.listdir(path) if f.endswith(".json")):
        with open(os.path.join(path, file)) as f:
            r = json.load(f)
        if not isinstance(r, dict) or "results" not in r:
            raise ConfigError(
                f"{name}/{file} is not an lm-evaluation-harness result file (no `results`): keep only "
                f"lm_eval's --output_path JSONs in the folder."
            )
        found.append(r)
    if not found:
        raise ConfigError(f"{name} holds no lm-eval result JSON: copy the files lm_eval wrote under --output_path.")
    metrics = list(
        dict.fromkeys(
            (task, k)
            for r in found
            for task, m in r["results"].items()
            for k in m
            if isinstance(m[k], (int, float)) and "stderr" not in k and k != "sample_len"
        )
    )

    def arguments(r):
        args = (r.get("config") or {}).get("model_args") or {}
        if isinstance(args, str):
            args = dict(a.split("=", 1) for a in args.split(",") if "=" in a)
        return ", ".join(f"{k}={v}" for k, v in args.items() if k != "ckpt") or "–"

    def number(v):
        return "–" if v is None else f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.3f}"

    def seconds(r):
        t = csv_number(r.get("total_evaluation_time_seconds"))
        return "–" if t is None else f"{t:.0f} s"

    several = len({task for task, _ in metrics}) > 1
    return markdown_table(
        ["model arguments"]
        + [(f"{task} " if several else "") + k.split(",")[0] for task, k in metrics]
        + ["evaluation time"],
        [
            [arguments(r)] + [number(r["results"].get(task, {}).get(k)) for task, k in metrics] + [seconds(r)]
            for r in found
        ],
    )


def regenerate(text: str, root: str = ".") -> tuple[str, list[str]]:
    """(the page with every block regenerated, the specs of the blocks that changed)."""
    stale = []

    def one(m):
        body = render(m.group("spec"), root) + "\n"
        if body != m.group("body"):
            stale.append(m.group("spec"))
        return f"<!-- table: {m.group('spec')} -->\n{body}<!-- end table -->"

    return BLOCK.sub(one, text), stale


def regenerate_pages(pages: list[str], root: str, check: bool) -> dict:
    """scripts/results_page.py's work: every stale block of `pages` rewritten from its files
    (or, with `check`, only named); returns {page: the stale blocks}. The caller exits 1 on a
    stale block under `check`."""
    from rope_lm.core.files import atomic_write

    stale = {}
    for page in pages:
        with open(page) as f:
            text = f.read()
        new, changed = regenerate(text, root)
        if changed:
            stale[page] = changed
            if not check:
                atomic_write(page, new)
    for page, changed in stale.items():
        verb = "stale" if check else "regenerated"
        print(f"{page}: {len(changed)} block(s) {verb}: " + "; ".join(changed))
    if not stale:
        print("Every generated block is current: " + ", ".join(pages))
    return stale
