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
* ``pairs``: a compare.csv's series of one model against each other on the
  same windows (its ``paired_with`` column, compare/ppl_pairs.py): the first's
  PPL over the second's with the paired interval, **lower** / higher / tied;
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
  row per method and target: the test PPL of plain positions, of the model
  cut to L (the window-L control; "–" for a search from before it), of the
  method's defaults and of the searched settings, and searched / defaults and
  searched / window on the same windows with their paired intervals;
* ``findings`` and ``not_shown``: the Findings' takeaways, from a YAML file
  whose ``findings:`` names the verdicts (check_published.json) and the
  takeaways (conf/results_page.yaml): a takeaway is shown only while every
  claim it names is matched on its folder, or its comparison holds across
  seeds; ``not_shown`` lists the rest, and every registered claim whose
  verdict is not matched, with the verdict and why.

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
from rope_lm.compare.ppl_pairs import PAIRED_COLUMN, pairs_table, read_paired_cell
from rope_lm.compare.ppl_runs import csv_number, reference_row
from rope_lm.compare.published_rules import MATCHED
from rope_lm.core.errors import ConfigError
from rope_lm.core.tables import markdown_table
from rope_lm.probes.search_run import WINDOW

BLOCK = re.compile(r"^<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)^<!-- end table -->$", re.M | re.S)
KINDS = (
    "ppl",
    "rel",
    "summary",
    "window",
    "control",
    "pairs",
    "seeds",
    "accuracy",
    "effective",
    "md",
    "search",
    "lm_eval",
    "findings",
    "not_shown",
)
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
    if kind in ("findings", "not_shown"):
        return _findings(path, parts[0], root, shown=kind == "findings")
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
    if kind == "control":
        return _own_control(by, labels, lengths, L0, parts[0])
    if kind == "pairs":
        return _pairs(by, labels, lengths, L0, parts[0])
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


def _window_cells(by: dict, labels: list[str], lengths: list[int], L0: int, name: str) -> tuple[str, list, dict]:
    """(the control's label, the lengths past L0, {run: {length: against_control's cell}}): every run
    that is neither the window-L control nor a reference row (trained longer), read against the control."""
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
    runs = [label for label in labels if label != control and not reference_row(by.get((label, L0)) or {})]
    return control, past, {label: {L: cell(label, L) for L in past} for label in runs}


def _window(by: dict, labels: list[str], lengths: list[int], L0: int, name: str) -> str:
    _, past, cells = _window_cells(by, labels, lengths, L0, name)
    return markdown_table(
        ["run"] + [f"{L} ({L / L0:g}×)" for L in past],
        [[label] + [row[L] for L in past] for label, row in cells.items()],
    )


def _own_control(by: dict, labels: list[str], lengths: list[int], L0: int, name: str) -> str:
    """Each run against its own window-L control (compare.csv's control_ratio, the paired bootstrap interval
    over the windows both scored): **yes** where the interval lies below 1 (the run reads the text past L
    better than itself cut to L), no above, tied where it holds 1. Three decimals: the paired intervals are
    narrow. The controls' own rows and runs without a control are left out."""

    def differs(label, L):  # past the control's window (L, or eval.control_window's width); up to it both are one
        r = by.get((label, L)) or {}
        values = [csv_number(r.get(k)) for k in ("control_ratio", "control_ratio_lo", "control_ratio_hi")]
        return values[0] is not None and values != [1.0, 1.0, 1.0]

    past = [L for L in lengths if L > L0 and any(differs(label, L) for label in labels)] or [
        L for L in lengths if any(differs(label, L) for label in labels)
    ]
    runs = [label for label in labels if any(differs(label, L) for L in past)]
    if not runs:
        raise ConfigError(
            f"A `control` block reads each run against its own window-L control, and no run of {name} has one "
            f"(compare.csv's control_ratio): evaluate the runs with eval.controls=[window] and compare again."
        )

    def cell(label, L):
        r = by.get((label, L)) or {}
        ratio, lo, hi = (csv_number(r.get(k)) for k in ("control_ratio", "control_ratio_lo", "control_ratio_hi"))
        if ratio is None:
            return fmt(None)
        if lo is None or hi is None:
            return f"{ratio:.3f}"
        verdict = "**yes**" if hi < 1 else "no" if lo > 1 else "tied"
        return f"{verdict} ({ratio:.3f} [{lo:.3f}, {hi:.3f}])"

    return markdown_table(
        ["run"] + [f"{L} ({L / L0:g}×)" for L in past], [[label] + [cell(label, L) for L in past] for label in runs]
    )


def _pairs(by: dict, labels: list[str], lengths: list[int], L0: int, name: str) -> str:
    """One model's series against each other on the same windows (compare.csv's paired_with, ppl_pairs)."""
    pairs = {
        (label, L): {b: p for b, p in read_paired_cell(r.get(PAIRED_COLUMN)).items() if b in labels}
        for (label, L), r in by.items()
        if label in labels
    }
    table = pairs_table({k: v for k, v in pairs.items() if v}, labels, lengths, L0)
    if not table:
        raise ConfigError(
            f"{name} has no series of one model paired on the same windows (its {PAIRED_COLUMN} column is empty): "
            f"their evaluations kept no per-window losses (eval_units.npz) for the same windows, or compare.py "
            f"predates the column; regenerate it, or drop the block."
        )
    return table


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
        paired = s.get("paired") or {}

        def ratio(a, b):
            pair = paired.get(f"{a} / {b}") or {}
            if not pair:
                return "–"
            return f"{pair['ratio']:.3f}" + (
                f" [{pair['lo']:.3f}, {pair['hi']:.3f}]" if pair.get("lo") is not None else ""
            )

        rows.append(
            [
                s["method"],
                f"{s['target']} ({s['target'] / s['train_len']:g}×)",
                cell(test.get("none")),
                cell(test.get(WINDOW)),
                f"{defaults.split()[0]}: {cell(test[defaults])}",
                cell(test[searched]),
                ratio(searched, defaults),
                ratio(searched, WINDOW),
                str(s["trials"]),
            ]
        )
    header = ["method", "target", "none", "window (L)", "defaults", "searched", "searched / defaults (paired)"]
    return markdown_table(header + ["searched / window (paired)", "trials"], rows)


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


# --- Findings: takeaways bound to the registered claims' verdicts ---------------------------------

SEEDS_NEEDED = 3  # a difference between separately trained models is called only where it holds for each of 3 seeds
MAX_TAKEAWAYS = 7  # with the "also matched" line, the Findings open with at most 8 lines
TAKEAWAY_KINDS = ("claims", "seeds", "window")


def _findings_spec(path: str, name: str, root: str) -> tuple[dict, list[dict]]:
    """The `findings:` of a YAML file (conf/results_page.yaml) and the verdict rows it names."""
    import json

    import yaml

    with open(path) as f:
        spec = (yaml.safe_load(f) or {}).get("findings")
    if not isinstance(spec, dict) or not isinstance(spec.get("verdicts"), str) or not spec.get("takeaways"):
        raise ConfigError(
            f"{name} has no `findings:` with `verdicts:` (the check_published.json the takeaways are bound to) "
            f"and a list of `takeaways:`; see the one in conf/results_page.yaml."
        )
    takeaways = spec["takeaways"]
    if not isinstance(takeaways, list) or len(takeaways) > MAX_TAKEAWAYS:
        raise ConfigError(
            f"{name}'s findings.takeaways is {'not a list' if not isinstance(takeaways, list) else len(takeaways)}: "
            f"give a list of at most {MAX_TAKEAWAYS} (the Findings open with at most {MAX_TAKEAWAYS + 1} lines, "
            f"one of them the claims matched that no takeaway names); merge takeaways, or leave some to the sections."
        )
    for t in takeaways:
        kinds = [k for k in TAKEAWAY_KINDS if isinstance(t, dict) and k in t]
        if not isinstance(t, dict) or not t.get("title") or len(kinds) != 1:
            raise ConfigError(
                f"A takeaway of {name} is {t!r}: each needs a `title` and exactly one of {', '.join(TAKEAWAY_KINDS)} "
                f"(claims: registered claim ids, with `results:` their folder; seeds: a compare.csv with `multiplier` "
                f"and `order`; window: a compare.csv holding a window-L control)."
            )
    verdicts = os.path.join(root, spec["verdicts"])
    if not os.path.isfile(verdicts):
        raise ConfigError(
            f"{spec['verdicts']} (the verdicts named by {name}'s findings) does not exist under "
            f"{os.path.abspath(root)}: python scripts/check_published.py out={os.path.dirname(spec['verdicts'])}"
        )
    with open(verdicts) as f:
        rows = json.load(f)
    return spec, rows


def _clauses(text: str) -> list[str]:
    """A verdict's `ours` cut at its top-level "; " (not inside parentheses)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith("; ", i):
            out.append(text[start:i])
            start = i + 2
    return out + [text[start:]]


def _why(ours: str) -> str:
    """Why a verdict is what it is, in a few words: the trailing clauses of `ours` that carry no
    interval (the rules write the figures first, then what decided: "within the intervals: ...",
    "control missing: ...", "the claim holds under 1 of 6 readings ...")."""
    clauses = _clauses(ours)
    tail = []
    for c in reversed(clauses[1:]):
        if "[" in c:
            break
        tail.insert(0, c)
    return "; ".join(tail) or ours


def _seed_note(root: str, results: str) -> str:
    """ ", 3 seeds" / ", one seed" / ", 1-2 seeds" from the compare.csv of a verdict's (first) folder:
    the seeds of each scheme's runs without a method."""
    path = os.path.join(root, results.split(", ")[0], "compare.csv")
    if not os.path.isfile(path):
        return ""
    seeds: dict = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("method", "none") == "none" and not reference_row(r):
                seeds.setdefault(r.get("scheme", r["label"]), set()).add(r.get("seed", ""))
    if not seeds:
        return ""
    counts = sorted(len(v) for v in seeds.values())
    lo, hi = counts[0], counts[-1]
    return ", one seed" if hi == 1 else f", {hi} seeds" if lo == hi else f", {lo}-{hi} seeds"


def _claim_takeaway(t: dict, rows: list[dict], names: dict, root: str, name: str) -> tuple[bool, str, str, set]:
    """(shown, its line, its not-shown line, the claim ids it names) for a takeaway of registered claims:
    shown only while every claim is matched on the takeaway's folder."""
    ids = [t["claims"]] if isinstance(t["claims"], str) else list(t["claims"])
    picked = []
    for cid in ids:
        mine = [r for r in rows if r["id"] == cid]
        if not mine:
            raise ConfigError(
                f"The takeaway {t['title']!r} of {name} names claim {cid!r}, which the verdicts do not hold "
                f"(their claims: {', '.join(dict.fromkeys(r['id'] for r in rows))}): register it in "
                f"conf/published.yaml and run scripts/check_published.py, or fix the id."
            )
        checked = [r["results"] for r in mine]
        if "results" in t:
            mine = [r for r in mine if r["results"] == t["results"]]
        if len(mine) != 1:
            raise ConfigError(
                f"The takeaway {t['title']!r} of {name} reads claim {cid!r} "
                f"{'on ' + repr(t['results']) if 'results' in t else 'without results:'}; it was checked on "
                f"{'; '.join(map(str, checked))}: give the one folder the takeaway stands on as `results:`."
            )
        picked.append(mine[0])
    where = " + ".join(names[p] for p in picked[0]["results"].split(", ")) if picked[0]["results"] else "–"
    note = _seed_note(root, picked[0]["results"] or "")
    line = f"* **{t['title']}** (matched on `{where}`{note}): " + "; ".join(f"`{r['id']}` {r['ours']}" for r in picked)
    failed = [r for r in picked if r["verdict"] != MATCHED]
    missing = f"* **{t['title']}** (on `{where}`{note}): " + "; ".join(
        f"`{r['id']}` **{r['verdict']}**, {_why(r['ours'])}" for r in failed
    )
    return not failed, line, missing, set(ids)


def _series_at(path: str, name: str, multiplier: float, value: str) -> tuple[dict, int]:
    """{scheme: [(seed, value, lo, hi)]} of a compare.csv's runs without a method at multiplier x L,
    and L. Reference rows (trained longer) and controls are no scheme's runs."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("method", "none") == "none" and not reference_row(r)]
    train_len = {int(float(r["train_len"])) for r in rows}
    if len(train_len) != 1:
        raise ConfigError(
            f"{name} holds runs trained at {sorted(train_len)}: a seeds takeaway reads one training length."
        )
    L0 = train_len.pop()
    key = {"rel": ("ppl_rel", "ppl_rel_lo", "ppl_rel_hi"), "ppl": ("ppl", "ppl_lo", "ppl_hi")}[value]
    out: dict = {}
    for r in rows:
        if int(r["length"]) == round(multiplier * L0):
            out.setdefault(r["scheme"], []).append((r.get("seed", ""), *(csv_number(r.get(k)) for k in key)))
    return out, L0


def _seeds_takeaway(t: dict, root: str) -> tuple[bool, str, str, set]:
    """(shown, line, not-shown line, no claim ids) for an order of schemes over seeds: shown only where
    each scheme has SEEDS_NEEDED seeds and every seed's interval of one group lies below every seed's
    interval of the next (the bootstrap interval covers the scored text; the seeds, training noise)."""
    import statistics

    name = t["seeds"]
    path = os.path.join(root, name)
    value, multiplier = t.get("value", "rel"), t.get("multiplier")
    if not os.path.isfile(path) or value not in ("rel", "ppl") or not isinstance(multiplier, (int, float)):
        raise ConfigError(
            f"The takeaway {t['title']!r} reads seeds: {name} (a file: {os.path.isfile(path)}), value: {value!r}, "
            f"multiplier: {multiplier!r}: give a committed compare.csv, value rel (PPL relative to L) or ppl, "
            f"and the multiple of L to read."
        )
    groups = [[g] if isinstance(g, str) else list(g) for g in t.get("order") or []]
    series, _ = _series_at(path, name, multiplier, value)
    lacking = [s for g in groups for s in g if s not in series]
    if len(groups) < 2 or lacking:
        raise ConfigError(
            f"The takeaway {t['title']!r} orders {groups} on {name}, which has at {multiplier:g} x L the schemes "
            f"{', '.join(series) or 'none'}: give `order:` two or more groups of its schemes"
            f"{' (missing: ' + ', '.join(lacking) + ')' if lacking else ''}."
        )

    def shown(s):
        values = [v for _, v, _, _ in series[s]]
        if len(values) < 2:
            return f"{s} {fmt(values[0])}"
        return f"{s} {fmt(statistics.mean(values))} ± {fmt(statistics.stdev(values))}"

    seeds = {s: len(series[s]) for g in groups for s in g}
    what = "relative PPL" if value == "rel" else "PPL"
    body = " < ".join(" ~ ".join(shown(s) for s in g) for g in groups)
    counts = sorted(set(seeds.values()))
    head = (
        f"* **{t['title']}** (comparison `{os.path.basename(os.path.dirname(path)) or name}`, "
        f"{' or '.join(map(str, counts))} seed{'s' if counts != [1] else ''} each, {what} at {multiplier:g} × L"
        f"{', mean ± sd over seeds' if counts[-1] > 1 else ''}): {body}"
    )
    few = [s for s, n in seeds.items() if n < SEEDS_NEEDED]
    if few:
        return False, head, f"{head}: **not comparable**, {', '.join(few)} with fewer than {SEEDS_NEEDED} seeds", set()
    if any(lo is None or hi is None for g in groups for s in g for _, _, lo, hi in series[s]):
        return False, head, f"{head}: **not comparable**, runs without intervals", set()
    reversed_, within = [], []
    for a, b in zip(groups, groups[1:]):
        a_runs = [x for s in a for x in series[s]]
        b_runs = [x for s in b for x in series[s]]
        if max(hi for *_, hi in a_runs) < min(lo for _, _, lo, _ in b_runs):
            continue
        pair = f"{'/'.join(a)} ~ {'/'.join(b)}"
        (reversed_ if min(lo for _, _, lo, _ in a_runs) > max(hi for *_, hi in b_runs) else within).append(pair)
    if reversed_:
        return False, head, f"{head}: **not matched**, reversed for every seed: {', '.join(reversed_)}", set()
    if within:
        return False, head, f"{head}: **tied**, within the seeds' intervals: {', '.join(within)}", set()
    return True, f"{head}; at each < every seed's 95% interval lies below every seed's of the next", "", set()


def _window_takeaway(t: dict, root: str) -> tuple[bool, str, str, set]:
    """(shown, line, not-shown line, no claim ids): no run is below the window-L control at any length
    past L (the control reads nothing past L). Shown while that holds, with how the runs stand
    against the control; a run below it moves the takeaway to not shown, naming where."""
    name = t["window"]
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        raise ConfigError(f"The takeaway {t['title']!r} reads window: {name}, which does not exist under {root}.")
    labels, lengths, by = _runs(path, {})
    L0 = {int(float(by[k]["train_len"])) for k in by}.pop()
    control, past, cells = _window_cells(by, labels, lengths, L0, name)
    verdicts = {label: {L: c.split(" ")[0].strip("*") for L, c in row.items()} for label, row in cells.items()}
    judged = [(label, L, v) for label, row in verdicts.items() for L, v in row.items() if v in ("yes", "no", "tied")]
    below = [f"{label} at {L / L0:g} × L" for label, L, v in judged if v == "yes"]
    tied: dict = {}
    for label, _, v in judged:
        scheme = by[(label, L0)].get("scheme") or label
        tied.setdefault(scheme, [0, 0])[1] += 1
        tied[scheme][0] += v == "tied"
    ties = ", ".join(f"{s} {n} of {m}" for s, (n, m) in tied.items() if n)
    counts = f"{len(below)} of {len(judged)} run × length cells below it, {sum(v == 'tied' for *_, v in judged)} tied"
    head = f"* **{t['title']}** (comparison `{os.path.basename(os.path.dirname(path))}` against `{control}`): "
    line = head + counts + (f" ({ties})" if ties else "") + f", {sum(v == 'no' for *_, v in judged)} above"
    if below:
        return False, line, f"{line}: **no longer holds**, below the control: {', '.join(below)}", set()
    return True, line, "", set()


def _findings(path: str, name: str, root: str, shown: bool) -> str:
    """The Findings' takeaways (shown) or what they cannot show (not_shown), from the registered claims'
    verdicts and the committed comparisons a YAML file's `findings:` names."""
    from rope_lm.compare.published import per_claim, short_names
    from rope_lm.compare.published_rules import VERDICTS

    spec, rows = _findings_spec(path, name, root)
    names = short_names(p for r in rows if r.get("results") for p in r["results"].split(", "))
    done = []
    for t in spec["takeaways"]:
        if "claims" in t:
            done.append(_claim_takeaway(t, rows, names, root, name))
        elif "seeds" in t:
            done.append(_seeds_takeaway(t, root))
        else:
            done.append(_window_takeaway(t, root))
    named = set().union(*(ids for ok, *_, ids in done if ok))
    claims = per_claim(rows)
    if shown:
        lines = [line for ok, line, _, _ in done if ok]
        also = [c for c in claims if c["verdict"] == MATCHED and c["id"] not in named]
        if also:
            lines.append("* Also matched: " + ", ".join(f"`{c['id']}` ({c['claim']})" for c in also))
        return "\n".join(lines) or "* (no takeaway holds: each is under Not shown)"
    lines = [missing for ok, _, missing, _ in done if not ok]
    failed = set().union(*(ids for ok, *_, ids in done if not ok))
    rank = {v: i for i, v in enumerate(VERDICTS)}
    for c in sorted(
        (c for c in claims if c["verdict"] != MATCHED and c["id"] not in failed), key=lambda c: rank[c["verdict"]]
    ):
        mine = [r for r in rows if r["id"] == c["id"] and r["verdict"] == c["verdict"]]
        last = mine[-1]
        where = " + ".join(names[p] for p in last["results"].split(", ")) if last["results"] else "–"
        more = f" and {len(mine) - 1} more folder{'s' if len(mine) > 2 else ''}" if len(mine) > 1 else ""
        lines.append(f"* `{c['id']}` ({c['claim']}): **{c['verdict']}** on `{where}`{more}, {_why(last['ours'])}")
    return "\n".join(lines) or "* (none: every registered claim is matched)"


MENTION = re.compile(
    r"`(?P<id>\w+)`(?P<between>[^`]{0,60}?)\b(?P<verdict>not matched|not robust|not comparable|matched|tied)\b"
)


def stated_verdicts(text: str, rows: list[dict]) -> list[str]:
    """The hand-written text's (outside the generated blocks) mentions of a registered claim with a
    verdict it has on none of its folders: "`small_base_ppl_without_retrieval` ... matched" where every
    folder says not comparable. Prose may name a folder's verdict; it may not name one no folder gave."""
    have: dict = {}
    for r in rows:
        have.setdefault(r["id"], set()).add(r["verdict"])
    prose = re.sub(r"\s+", " ", BLOCK.sub("", text))
    return [
        f"`{m['id']}`{m['between']}{m['verdict']} (its verdicts: {', '.join(sorted(have[m['id']]))})"
        for m in MENTION.finditer(prose)
        if m["id"] in have and m["verdict"] not in have[m["id"]]
    ]


def contradictions(text: str, root: str = ".") -> list[str]:
    """stated_verdicts for a page with a findings block, against the verdicts its findings name."""
    out = []
    for spec in dict.fromkeys(m.group("spec") for m in BLOCK.finditer(text)):
        parts = spec.split()
        if len(parts) >= 2 and parts[1] in ("findings", "not_shown"):
            _, rows = _findings_spec(os.path.join(root, parts[0]), parts[0], root)
            out += [f"prose contradicts a verdict: {c}" for c in stated_verdicts(text, rows)]
    return list(dict.fromkeys(out))


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
    (or, with `check`, only named); returns {page: the stale blocks, and any hand-written mention
    of a claim with a verdict its verdicts do not hold (contradictions)}. The caller exits 1 on
    either under `check`."""
    from rope_lm.core.files import atomic_write

    stale = {}
    for page in pages:
        with open(page) as f:
            text = f.read()
        new, changed = regenerate(text, root)
        if changed and not check:
            atomic_write(page, new)
        # A hand-written verdict no folder gave cannot be regenerated: it is reported, and fails a check.
        changed = changed + contradictions(new, root)
        if changed:
            stale[page] = changed
    for page, changed in stale.items():
        verb = "stale" if check else "regenerated"
        blocks = [c for c in changed if not c.startswith("prose ")]
        if blocks:
            print(f"{page}: {len(blocks)} block(s) {verb}: " + "; ".join(blocks))
        for c in changed[len(blocks) :]:
            print(f"{page}: {c}")
    if not stale:
        print("Every generated block is current: " + ", ".join(pages))
    return stale
