"""Published findings against ours, computed: each claim (conf/published.yaml:
its source, the published figure and a rule with its thresholds) is checked
against a study's results by the rule's pure function, which says what ours
is and whether it matched.

A verdict is "matched", "not matched", "tied" (the order holds or fails only
within the intervals: noise decides it, so it is not a match), or "not
comparable" (the study was not run, or lacks a length, scheme or control the
rule reads). A claim is checked on every folder of its study and counted once:
matched where it matched on at least one folder, the rows saying on how many.
Perplexity rules read the rows compare.py writes (compare.csv, or the same
rows computed from run folders); task rules read exact match past the
training sizes from compare_tasks.csv or task_results.json files and rank
the schemes per task; retrieval rules read accuracy by length, with its
interval, from compare_retrieval.csv or retrieval.json files; search rules
read the test rows of scripts/search.py's search.json files.
"""

from collections.abc import Callable
import csv
from dataclasses import dataclass
import json
import logging
import os

from rope_lm.core.errors import ConfigError
from rope_lm.core.tables import markdown_table

log = logging.getLogger("rope_lm")

MATCHED, NOT_MATCHED, TIED, NOT_COMPARABLE = "matched", "not matched", "tied", "not comparable"
VERDICTS = (MATCHED, NOT_MATCHED, TIED, NOT_COMPARABLE)


@dataclass
class Verdict:
    ours: str
    verdict: str


# --- evidence: rows of one study --------------------------------------------------


def _number(v):
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return v


def _read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return [
            {
                k: _number(v)
                if k
                not in (
                    "scheme",
                    "method",
                    "label",
                    "task",
                    "sizes",
                    "group",
                    "corpus",
                    "split",
                    "tokenizer",
                    "run_dir",
                    "protocol",
                    "inside",
                )
                else v
                for k, v in row.items()
            }
            for row in csv.DictReader(f)
        ]


def ppl_rows(paths: list[str]) -> list[dict]:
    """PPL rows (scheme, method, train_len, length, ratio, ppl, ppl_rel) of a
    study: its compare.csv files, or computed from its run folders. Reference
    rows (runs trained longer, compare.py references=) are no arm of the
    study and are left out."""
    from rope_lm.compare.ppl_csv import csv_rows
    from rope_lm.compare.ppl_groups import group_runs
    from rope_lm.compare.ppl_runs import load_runs, reference_row
    from rope_lm.compare.result_files import files_named

    rows = []
    for p in paths:
        found = [p] if os.path.isfile(p) else files_named(p, "compare.csv") if os.path.isdir(p) else []
        if found:
            for f in found:
                rows += _read_csv(f)
        elif os.path.isdir(p):
            try:
                runs, _ = load_runs([p])
            except ConfigError as e:  # no evaluated length there yet: the rules say what is missing
                log.warning("%s: %s", p, e)
                continue
            rows += csv_rows(group_runs(runs, group=True))
        else:
            raise ConfigError(
                f"{p} does not exist (resolved from {os.getcwd()}); give a study's compare.csv, the "
                f"folder compare.py wrote, or its run folders."
            )
    return [r for r in rows if not reference_row(r)]


def task_rows(paths: list[str]) -> list[dict]:
    """(task, scheme, method, seed, accuracy past the training sizes) per run."""
    from rope_lm.compare.result_files import files_named
    from rope_lm.compare.task_compare import load_task_runs

    out = []
    for p in paths:
        found = (
            [p]
            if os.path.isfile(p) and p.endswith(".csv")
            else files_named(p, "compare_tasks.csv")
            if os.path.isdir(p)
            else []
        )
        if found:
            runs = {}
            for f in found:
                for r in _read_csv(f):
                    if str(r["inside"]) == "False" and r.get("n"):
                        key = (r["task"], r["scheme"], r["method"], r.get("seed"), r["run_dir"])
                        hit, n = runs.get(key, (0.0, 0.0))
                        runs[key] = (hit + r["accuracy"] * r["n"], n + r["n"])
            out += [
                {"task": k[0], "scheme": k[1], "method": k[2], "seed": k[3], "accuracy": hit / n}
                for k, (hit, n) in runs.items()
            ]
        elif os.path.exists(p):
            runs, unreadable = load_task_runs([p])
            for note in unreadable:  # the rules say which claims lack their runs
                log.warning("%s: %s", p, note)
            out += [
                {
                    "task": r["task"],
                    "scheme": r["scheme"],
                    "method": r["method"],
                    "seed": r.get("seed"),
                    "accuracy": (r.get("beyond") or {}).get("accuracy"),
                }
                for r in runs
            ]
        else:
            raise ConfigError(
                f"{p} does not exist (resolved from {os.getcwd()}); give compare_tasks.csv, the folder "
                f"compare.py wrote, or a scripts/task.py sweep folder."
            )
    return [r for r in out if r["accuracy"] is not None]


def retrieval_rows(paths: list[str]) -> list[dict]:
    """(task, scheme, method, train_len, length, accuracy, accuracy_lo, accuracy_hi)
    per run, task and length: from compare_retrieval.csv files, or computed
    from scripts/retrieval.py folders (retrieval.json)."""
    from rope_lm.compare.result_files import files_named
    from rope_lm.compare.retrieval_compare import MEAN, csv_rows, load_retrieval_runs

    table = []
    for p in paths:
        found = (
            [p]
            if os.path.isfile(p) and p.endswith(".csv")
            else files_named(p, "compare_retrieval.csv")
            if os.path.isdir(p)
            else []
        )
        if found:
            for f in found:
                with open(f, newline="") as fh:
                    table += list(csv.DictReader(fh))
        elif os.path.exists(p):
            runs, unreadable = load_retrieval_runs([p])
            for note in unreadable:
                log.warning("%s: %s", p, note)
            table += csv_rows(runs) if runs else []
        else:
            raise ConfigError(
                f"{p} does not exist (resolved from {os.getcwd()}); give compare_retrieval.csv, the "
                f"folder compare.py wrote, or scripts/retrieval.py output folders."
            )
    out = []
    for r in table:
        if r["task"] == MEAN:
            continue
        cols = [str(r.get(c) or "").split() for c in ("lengths", "accuracy", "accuracy_lo", "accuracy_hi")]
        for j, length in enumerate(cols[0]):
            out.append(
                {
                    "task": r["task"],
                    "scheme": r["scheme"],
                    "method": r["method"],
                    "label": r.get("label"),
                    "train_len": int(float(r["train_len"])),
                    "length": int(length),
                    **{
                        c: float(v[j]) if j < len(v) else None
                        for c, v in zip(("accuracy", "accuracy_lo", "accuracy_hi"), cols[1:])
                    },
                }
            )
    return out


def search_rows(paths: list[str]) -> list[dict]:
    """(method, target, train_len, label, ppl, ppl_lo, ppl_hi, paired) of
    every test row of the scripts/search.py results (search.json) named or
    found below; paired: the search's "<a> / <b>" test PPL ratios with their
    paired intervals."""
    from rope_lm.compare.result_files import files_given_or_below, read_json_or_note

    out = []
    for p in files_given_or_below(paths, "search.json"):
        r, note = read_json_or_note(p, "rerun scripts/search.py.")
        if note:
            log.warning("%s", note)
            continue
        for label, row in (r.get("test") or {}).items():
            out.append(
                {
                    "method": r["method"],
                    "target": r["target"],
                    "train_len": r["train_len"],
                    "label": label,
                    **{k: row.get(k) for k in ("ppl", "ppl_lo", "ppl_hi")},
                    "paired": r.get("paired") or {},
                }
            )
    return out


def _series_rows(rows: list[dict], name: str) -> list[dict]:
    if "(" in name:  # a comparison's row label, e.g. "rope (pos.base=500.0)": runs told apart by a setting
        return [r for r in rows if r.get("label") == name]

    # A scheme's own name may hold a "+" (a layout or softmax option: rope+nope_every_4), so each row's
    # series name is built and compared whole rather than the name split.
    def series(r):
        positions = r.get("train_pos") or "none"
        return (
            r["scheme"]
            + ("" if r["method"] == "none" else f"+{r['method']}")
            + ("" if positions == "none" else f"@{positions}")
        )

    return [r for r in rows if series(r) == name]


def _series(rows: list[dict], name: str, train_len: str = "min") -> dict[float, dict]:
    """multiplier -> {ppl, ppl_rel} of one series ('scheme' or 'scheme+method',
    e.g. rope+yarn, with '@<training positions>' for runs trained on other
    position ids, e.g. rope@pose-x16, or a row label with the setting that
    tells it apart, e.g. 'rope (pos.base=500.0)'), averaged over seeds; the
    group trained at the shortest (min) or longest (max: a fine-tune) length."""
    mine = _series_rows(rows, name)
    if not mine:
        return {}
    pick = (min if train_len == "min" else max)(r["train_len"] for r in mine)
    seeds = {}
    for r in mine:
        if r["train_len"] == pick:
            seeds.setdefault(r.get("label") or r.get("run_dir"), r.get("seed"))
    if len(set(seeds.values())) < len(seeds):  # not seed replicas: runs of other settings (a budget sweep)
        raise Ambiguous(f"{len(seeds)} {name} runs that are not seed replicas ({', '.join(map(str, seeds))})")
    by = {}
    for r in mine:
        if r["train_len"] == pick and r.get("ppl") is not None:
            by.setdefault(round(r["ratio"], 6), []).append(r)
    out = {}
    for k, v in by.items():
        out[k] = {c: sum(r[c] for r in v) / len(v) for c in ("ppl", "ppl_rel") if all(r.get(c) is not None for r in v)}
        for c in ("ppl", "ppl_rel"):
            # The noise band: each run's interval where the study has one, and across seeds
            # their spread too (the lowest low to the highest high).
            lows = [r.get(f"{c}_lo") for r in v]
            highs = [r.get(f"{c}_hi") for r in v]
            if c in out[k] and (len(v) > 1 or all(isinstance(x, float) for x in lows + highs)):
                out[k][f"{c}_band"] = (
                    min(x if isinstance(x, float) else r[c] for x, r in zip(lows, v)),
                    max(x if isinstance(x, float) else r[c] for x, r in zip(highs, v)),
                )
    return out


class Ambiguous(Exception):
    """A series names several runs that differ in more than their seed."""


# --- rules: (claim, evidence) -> Verdict ----------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rule: its check, the claim fields it needs, the rows it reads
    (READERS) and the rule in words, made from the claim's own fields so that
    text and check never drift."""

    check: Callable[[dict, object], Verdict]
    parameters: tuple[str, ...]
    says: Callable[[dict], str]
    rows: str = "ppl"

    def __call__(self, claim: dict, rows) -> Verdict:
        return self.check(claim, rows)


RULES: dict[str, Rule] = {}


def rule(parameters: tuple[str, ...], says: Callable[[dict], str], rows: str = "ppl"):
    """Registers the decorated check under its function name."""

    def register(check):
        RULES[check.__name__] = Rule(check, parameters, says, rows)
        return check

    return register


def _bounds(c: dict) -> str:
    lo, hi = c.get("min"), c.get("max")
    return f"in [{lo}, {hi}]" if lo is not None and hi is not None else f">= {lo}" if lo is not None else f"<= {hi}"


@rule(("series", "multiplier"), lambda c: f"{c['series']}: PPL({c['multiplier']} x L) / PPL(L) {_bounds(c)}")
def ratio_between(claim: dict, rows: list[dict]) -> Verdict:
    s, k = _series(rows, claim["series"]), float(claim["multiplier"])
    v = (s.get(k) or {}).get("ppl_rel")
    if v is None:
        return Verdict(f"no {claim['series']} result at {k:g} x L", NOT_COMPARABLE)
    lo, hi = claim.get("min", float("-inf")), claim.get("max", float("inf"))
    return Verdict(f"{v:.2f} at {k:g} x L", MATCHED if lo <= v <= hi else NOT_MATCHED)


@rule(
    ("series", "from_multiplier", "max"),
    lambda c: f"{c['series']}: PPL(k x L) / PPL(L) <= {c['max']} for every k >= {c['from_multiplier']}",
)
def ratio_at_most(claim: dict, rows: list[dict]) -> Verdict:
    s = _series(rows, claim["series"])
    past = {k: v["ppl_rel"] for k, v in s.items() if k >= float(claim["from_multiplier"]) and "ppl_rel" in v}
    if not past:
        return Verdict(f"no {claim['series']} result at {claim['from_multiplier']} x L or beyond", NOT_COMPARABLE)
    worst = max(past, key=past.get)
    return Verdict(
        f"{min(past.values()):.2f}-{past[worst]:.2f} over {min(past):g}-{max(past):g} x L (highest at {worst:g} x L)",
        MATCHED if past[worst] <= claim["max"] else NOT_MATCHED,
    )


def _fmt(v: float, metric: str) -> str:
    return f"{v:.{3 if metric == 'ppl_rel' else 1}f}"


def _shown(name: str, point: dict, metric: str) -> str:
    band = point.get(f"{metric}_band")
    return f"{name} {_fmt(point[metric], metric)}" + (
        f" [{_fmt(band[0], metric)}, {_fmt(band[1], metric)}]" if band else ""
    )


def _separated(better: dict, worse: dict, metric: str) -> bool | None:
    """True: `better` is lower beyond both bands; False: higher beyond them;
    None: the bands overlap (noise decides)."""
    b, w = better[f"{metric}_band"], worse[f"{metric}_band"]
    if b[1] >= w[0] and w[1] >= b[0]:
        return None
    return better[metric] < worse[metric]


def _ordered(points: dict[str, dict], order: list[str], metric: str) -> tuple[str, str]:
    """(verdict, what decided it) for the claim that `order` runs from the lowest
    `metric` up: every neighbour pair must be separated beyond its bands."""
    tied, reversed_ = [], []
    for a, b in zip(order, order[1:]):
        sep = _separated(points[a], points[b], metric)
        if sep is None:
            tied.append(f"{a} ~ {b}")
        elif not sep:
            reversed_.append(f"{b} < {a}")
    why = "; ".join(
        ([f"reversed beyond the intervals: {', '.join(reversed_)}"] if reversed_ else [])
        + ([f"within the intervals: {', '.join(tied)}"] if tied else [])
    )
    return (NOT_MATCHED if reversed_ else TIED if tied else MATCHED), why


@rule(
    ("multiplier", "order"),
    lambda c: (
        f"{c.get('metric', 'ppl')} at {c['multiplier']} x L"
        f"{', in the fine-tuned runs' if c.get('train_len') == 'max' else ''}: "
        f"{' < '.join(c['order'])}, each pair apart beyond the intervals"
    ),
)
def ppl_order(claim: dict, rows: list[dict]) -> Verdict:
    """The series in claim['order'] (best first) have increasing `metric`
    (ppl or ppl_rel) at the multiplier, in the group trained at `train_len`;
    each neighbour pair apart by more than its intervals (or seed spread)."""
    k, metric = float(claim["multiplier"]), claim.get("metric", "ppl")
    points = {}
    for name in claim["order"]:
        p = _series(rows, name, claim.get("train_len", "min")).get(k) or {}
        if p.get(metric) is None:
            return Verdict(f"no {name} result at {k:g} x L", NOT_COMPARABLE)
        points[name] = p
    ours = sorted(points, key=lambda n: points[n][metric])
    shown = " < ".join(_shown(n, points[n], metric) for n in ours)
    if not all(f"{metric}_band" in p for p in points.values()):
        # One seed and no intervals: nothing tells the order from noise.
        return Verdict(
            f"{shown} ({metric} at {k:g} x L); no intervals or seeds in this study to tell the order from noise",
            NOT_COMPARABLE,
        )
    verdict, why = _ordered(points, list(claim["order"]), metric)
    return Verdict(f"{shown} ({metric} at {k:g} x L)" + (f"; {why}" if why else ""), verdict)


@rule(
    ("series", "from_multiplier", "max", "control"),
    lambda c: (
        f"{c['series']}: PPL(k x L) / PPL(L) <= {c['max']} for every k >= {c['from_multiplier']}, and "
        f"below {c['control']}'s (attention limited to L) beyond the intervals"
    ),
)
def flat_beyond_window(claim: dict, rows: list[dict]) -> Verdict:
    """The series at k x L (every k >= from_multiplier) is at most `max` times
    its PPL at L, and below the window-L control (`control`, a model that reads
    nothing past L) by more than their intervals, relative to each one's PPL at
    L: flat alone is what a model that ignores far context gives too."""
    flat = ratio_at_most(claim, rows)
    if flat.verdict != MATCHED:  # not flat: no control can make it so
        return flat
    control = claim["control"]
    s, w = _series(rows, claim["series"]), _series(rows, control)
    ks = sorted(k for k in s if k >= float(claim["from_multiplier"]) and "ppl_rel" in s[k])
    if not w:
        return Verdict(f"{flat.ours}; control missing: no {control} (window-L) run in this study", NOT_COMPARABLE)
    missing = [k for k in ks if "ppl_rel" not in w.get(k, {})]
    if missing:
        return Verdict(
            f"{flat.ours}; control missing: no {control} result at {', '.join(f'{k:g}' for k in missing)} x L",
            NOT_COMPARABLE,
        )
    if not all("ppl_rel_band" in s[k] and "ppl_rel_band" in w[k] for k in ks):
        return Verdict(
            f"{flat.ours}; no intervals or seeds in this study to tell it from the {control} control", NOT_COMPARABLE
        )
    sep = {k: _separated(s[k], w[k], "ppl_rel") for k in ks}
    far = ks[-1]
    shown = (
        f"{flat.ours}; at {far:g} x L {_shown(claim['series'], s[far], 'ppl_rel')} vs "
        f"{_shown(control, w[far], 'ppl_rel')}"
    )
    if any(v is False for v in sep.values()):
        worse = [f"{k:g}" for k, v in sep.items() if v is False]
        return Verdict(f"{shown}; above the control beyond the intervals at {', '.join(worse)} x L", NOT_MATCHED)
    if any(v is None for v in sep.values()):
        return Verdict(
            shown
            + "; within the intervals of the control at "
            + ", ".join(f"{k:g}" for k, v in sep.items() if v is None)
            + " x L",
            TIED,
        )
    return Verdict(shown, MATCHED)


@rule(
    ("above", "below"),
    lambda c: (
        f"mean reciprocal rank over tasks, exact match past the training sizes: each of "
        f"{', '.join(c['above'])} > each of {', '.join(c['below'])}"
        + (f" ({', '.join(c['extra'])} ranked too, not in the claim)" if c.get("extra") else "")
    ),
    rows="task",
)
def task_mrr(claim: dict, rows: list[dict]) -> Verdict:
    """Mean reciprocal rank over tasks (Kazemnejad et al.): per task the schemes
    are ranked by exact match past the training sizes (mean over seeds; equal
    accuracies share the better rank), and each scheme's 1/rank is averaged over
    the tasks every ranked scheme was run on. Every scheme in `above` must have
    a higher MRR than every scheme in `below`; `extra` schemes are ranked and
    shown but not part of the claim."""
    names = list(claim["above"]) + list(claim["below"])
    ranked = names + [n for n in claim.get("extra", []) if n not in names]
    run = lambda n: {r["task"] for r in rows if r["scheme"] == n and r["method"] == "none"}
    absent = [n for n in names if not run(n)]
    if not rows or len(absent) == len(names):
        return Verdict("no task sweep with any of " + ", ".join(names), NOT_COMPARABLE)
    present = [n for n in ranked if run(n)]
    tasks = set.intersection(*[run(n) for n in present])
    if not tasks:
        return Verdict("no task that every one of " + ", ".join(present) + " was run on", NOT_COMPARABLE)
    acc = {}
    for r in rows:
        if r["method"] == "none" and r["scheme"] in present and r["task"] in tasks:
            acc.setdefault((r["task"], r["scheme"]), []).append(r["accuracy"])
    acc = {key: sum(v) / len(v) for key, v in acc.items()}
    mrr = {n: sum(1 / (1 + sum(acc[t, o] > acc[t, n] for o in present)) for t in tasks) / len(tasks) for n in present}
    ours = sorted(present, key=mrr.get, reverse=True)
    shown = " > ".join(f"{n} {mrr[n]:.2f}" for n in ours) + f" (mean reciprocal rank over {len(tasks)} tasks)"
    if absent:
        return Verdict(f"not comparable: no {', '.join(absent)} run; {shown}", NOT_COMPARABLE)
    ok = min(mrr[n] for n in claim["above"]) > max(mrr[n] for n in claim["below"])
    return Verdict(shown, MATCHED if ok else NOT_MATCHED)


@rule(
    ("series", "reference"),
    lambda c: f"PPL of {c['series']} above {c['reference']}'s at every evaluated length, beyond the intervals",
)
def worse_everywhere(claim: dict, rows: list[dict]) -> Verdict:
    """The series has a higher PPL than the reference at every length both were
    evaluated at, each beyond the intervals."""
    s, ref = _series(rows, claim["series"]), _series(rows, claim["reference"])
    ks = sorted(k for k in s if k in ref and "ppl" in s[k] and "ppl" in ref[k])
    if not ks:
        return Verdict(f"no length with both {claim['series']} and {claim['reference']}", NOT_COMPARABLE)
    shown = "; ".join(
        f"{k:g} x L: {_shown(claim['series'], s[k], 'ppl')} vs {_shown(claim['reference'], ref[k], 'ppl')}" for k in ks
    )
    if not all("ppl_band" in s[k] and "ppl_band" in ref[k] for k in ks):
        return Verdict(f"{shown}; no intervals or seeds in this study to tell them from noise", NOT_COMPARABLE)
    sep = {k: _separated(ref[k], s[k], "ppl") for k in ks}
    better = [f"{k:g}" for k, v in sep.items() if v is False]
    tied = [f"{k:g}" for k, v in sep.items() if v is None]
    if better:
        return Verdict(
            f"{shown}; lower than {claim['reference']} beyond the intervals at {', '.join(better)} x L", NOT_MATCHED
        )
    if tied:
        return Verdict(f"{shown}; within the intervals at {', '.join(tied)} x L", TIED)
    return Verdict(shown, MATCHED)


def _at_length(rows: list[dict], name: str, length: int) -> dict:
    """A series' point at an absolute length (runs fine-tuned at different
    lengths record different training lengths, so multipliers do not line up)."""
    lens = [r["train_len"] for r in _series_rows(rows, name) if r.get("length") == length]
    if not lens:
        return {}
    return _series(rows, name).get(round(length / min(lens), 6)) or {}


@rule(
    ("series", "references", "length", "max_ratio"),
    lambda c: (
        f"PPL of {c['series']} at {c['length']} tokens at most {c['max_ratio']} x the best of "
        f"{', '.join(c['references'])}'s (above it within the intervals: tied)"
    ),
)
def close_to(claim: dict, rows: list[dict]) -> Verdict:
    """The series' PPL at `length` tokens is at most max_ratio times the best
    of the references' (the lowest PPL there). Above that ratio the claim
    fails only beyond both intervals; where they overlap, noise decides
    (tied): wide intervals are no evidence of closeness."""
    length = int(claim["length"])
    s = _at_length(rows, claim["series"], length)
    refs = {n: _at_length(rows, n, length) for n in claim["references"]}
    missing = [n for n, p in [(claim["series"], s), *refs.items()] if p.get("ppl") is None]
    if missing:
        return Verdict(f"no {', '.join(missing)} result at {length} tokens", NOT_COMPARABLE)
    best = min(refs, key=lambda n: refs[n]["ppl"])
    ratio = s["ppl"] / refs[best]["ppl"]
    shown = f"{_shown(claim['series'], s, 'ppl')} vs {_shown(best, refs[best], 'ppl')} (ratio {ratio:.2f}) at {length} tokens"
    if ratio <= claim["max_ratio"]:
        return Verdict(shown, MATCHED)
    overlap = "ppl_band" in s and "ppl_band" in refs[best] and _separated(s, refs[best], "ppl") is None
    if overlap:
        return Verdict(f"{shown}; above {claim['max_ratio']} x it, but within the intervals", TIED)
    return Verdict(shown, NOT_MATCHED)


@rule(
    ("method", "better", "worse"),
    lambda c: (
        f"test PPL of {c['better']} below {c['worse']}'s at every target of the {c['method']} search, "
        f"beyond the paired interval of their ratio (else both intervals)"
    ),
    rows="search",
)
def search_beats(claim: dict, rows: list[dict]) -> Verdict:
    """In every search of `method`, the test PPL of the row `better` (e.g.
    "longrope searched") is below that of `worse` (e.g. "yarn defaults")
    beyond the noise, at every target searched: the paired interval of their
    ratio (same windows) below 1 where the search reports it, else both
    intervals apart."""
    mine = [r for r in rows if r["method"] == claim["method"]]
    targets = sorted({r["target"] for r in mine})
    if not targets:
        return Verdict(f"no {claim['method']} search", NOT_COMPARABLE)
    parts, verdicts = [], []
    for t in targets:
        at = {r["label"]: r for r in mine if r["target"] == t}
        b, w = at.get(claim["better"]), at.get(claim["worse"])
        if not b or not w or b.get("ppl") is None or w.get("ppl") is None:
            return Verdict(
                f"the {claim['method']} search at {t} lacks {claim['better']} or {claim['worse']}", NOT_COMPARABLE
            )
        pts = {
            n: {"ppl": r["ppl"], **({"ppl_band": (r["ppl_lo"], r["ppl_hi"])} if r.get("ppl_lo") is not None else {})}
            for n, r in ((claim["better"], b), (claim["worse"], w))
        }
        parts.append(f"{t} ({t / b['train_len']:g} x L): " + " vs ".join(_shown(n, p, "ppl") for n, p in pts.items()))
        pair = b.get("paired", {}).get(f"{claim['better']} / {claim['worse']}") or {}
        if pair.get("lo") is not None and pair.get("hi") is not None:
            parts[-1] += f", ratio {pair['ratio']:.3f} [{pair['lo']:.3f}, {pair['hi']:.3f}] paired"
            verdicts.append(MATCHED if pair["hi"] < 1 else NOT_MATCHED if pair["lo"] > 1 else TIED)
            continue
        if not all("ppl_band" in p for p in pts.values()):
            verdicts.append(NOT_COMPARABLE)
            continue
        sep = _separated(pts[claim["better"]], pts[claim["worse"]], "ppl")
        verdicts.append(TIED if sep is None else MATCHED if sep else NOT_MATCHED)
    verdict = next(v for v in (NOT_MATCHED, NOT_COMPARABLE, TIED, MATCHED) if v in verdicts)
    return Verdict("; ".join(parts), verdict)


def _accuracy_series(rows: list[dict], name: str, task: str) -> dict[int, dict]:
    return {r["length"]: r for r in _series_rows(rows, name) if r["task"] == task}


@rule(
    ("better", "worse", "multiplier"),
    lambda c: (
        f"{c.get('metric', 'ppl')} at {c['multiplier']} x L: each of {', '.join(c['better'])} below "
        f"{c['worse']}, beyond the intervals"
    ),
)
def each_below(claim: dict, rows: list[dict]) -> Verdict:
    """Every series in `better` has a lower `metric` (ppl or ppl_rel) at the
    multiplier than `worse`, beyond the intervals."""
    k, metric = float(claim["multiplier"]), claim.get("metric", "ppl")
    points = {n: _series(rows, n).get(k) or {} for n in [*claim["better"], claim["worse"]]}
    missing = [n for n, p in points.items() if p.get(metric) is None]
    if missing:
        return Verdict(f"no {', '.join(missing)} result at {k:g} x L", NOT_COMPARABLE)
    worse = points[claim["worse"]]
    shown = (
        ", ".join(_shown(n, points[n], metric) for n in claim["better"])
        + f" vs {_shown(claim['worse'], worse, metric)} ({metric} at {k:g} x L)"
    )
    if not all(f"{metric}_band" in p for p in points.values()):
        return Verdict(f"{shown}; no intervals or seeds to tell them from noise", NOT_COMPARABLE)
    sep = {n: _separated(points[n], worse, metric) for n in claim["better"]}
    if any(v is False for v in sep.values()):
        return Verdict(
            shown + "; above it beyond the intervals: " + ", ".join(n for n, v in sep.items() if v is False),
            NOT_MATCHED,
        )
    if any(v is None for v in sep.values()):
        return Verdict(shown + "; within the intervals: " + ", ".join(n for n, v in sep.items() if v is None), TIED)
    return Verdict(shown, MATCHED)


@rule(
    ("series", "task", "multiplier", "max_ppl_rel", "min_at_l", "max_accuracy"),
    lambda c: (
        f"{c['series']}: PPL({c['multiplier']} x L) / PPL(L) <= {c['max_ppl_rel']} while its {c['task']} "
        f"accuracy, >= {c['min_at_l']:.0%} at L, is <= {c['max_accuracy']:.0%} at {c['multiplier']} x L"
    ),
    rows="ppl+retrieval",
)
def ppl_kept_retrieval_lost(claim: dict, rows: dict) -> Verdict:
    """The series keeps its PPL at k x L within `max_ppl_rel` of its PPL at L
    while the task's accuracy, at least `min_at_l` at L, is at most
    `max_accuracy` at k x L: low perplexity that is no evidence of reading the
    context."""
    k = float(claim["multiplier"])
    p = _series(rows["ppl"], claim["series"]).get(k) or {}
    acc = _accuracy_series(rows["retrieval"], claim["series"], claim["task"])
    if p.get("ppl_rel") is None or not acc:
        return Verdict(
            f"no {claim['series']} {'PPL' if p.get('ppl_rel') is None else claim['task']} result at {k:g} x L",
            NOT_COMPARABLE,
        )
    L0 = next(iter(acc.values()))["train_len"]
    at_l, far = acc.get(L0), acc.get(int(round(k * L0)))
    if at_l is None or far is None:
        return Verdict(f"no {claim['task']} accuracy of {claim['series']} at L and at {k:g} x L", NOT_COMPARABLE)
    shown = (
        f"PPL {p['ppl_rel']:.2f} x its PPL at L at {k:g} x L; {claim['task']} {at_l['accuracy']:.0%} at L, "
        f"{far['accuracy']:.0%} at {k:g} x L"
    )
    if at_l["accuracy"] < claim["min_at_l"]:
        return Verdict(f"{shown}; it does not retrieve at L ({claim['min_at_l']:.0%} needed)", NOT_COMPARABLE)
    ok = p["ppl_rel"] <= claim["max_ppl_rel"] and far["accuracy"] <= claim["max_accuracy"]
    return Verdict(shown, MATCHED if ok else NOT_MATCHED)


@rule(
    ("series", "task", "min", "control"),
    lambda c: (
        f"{c['task']} accuracy of {c['series']} >= {c['min']:.0%} at every length past L, and above "
        f"{c['control']}'s beyond the intervals at one of them"
    ),
    rows="retrieval",
)
def retrieval_kept(claim: dict, rows: list[dict]) -> Verdict:
    """The series' accuracy on the task is at least `min` at every length past
    the training length, and above the control's (the plain model) beyond
    the intervals at one such length at least: where the plain model retrieves
    as well, the task at these lengths says nothing about the method."""
    s, c = (
        _accuracy_series(rows, claim["series"], claim["task"]),
        _accuracy_series(rows, claim["control"], claim["task"]),
    )
    past = sorted(L for L, r in s.items() if L > r["train_len"])
    if not past:
        return Verdict(f"no {claim['series']} {claim['task']} result past the training length", NOT_COMPARABLE)
    pct = lambda r: (
        f"{r['accuracy']:.0%}"
        + (f" [{r['accuracy_lo']:.0%}, {r['accuracy_hi']:.0%}]" if r.get("accuracy_lo") is not None else "")
    )
    shown = "; ".join(f"{L}: {pct(s[L])}" + (f" vs {claim['control']} {pct(c[L])}" if L in c else "") for L in past)
    low = [str(L) for L in past if s[L]["accuracy"] < claim["min"]]
    if low:
        return Verdict(f"{shown}; below {claim['min']:.0%} at {', '.join(low)}", NOT_MATCHED)
    both = [L for L in past if L in c]
    if not both:
        return Verdict(f"{shown}; control missing: no {claim['control']} {claim['task']} run", NOT_COMPARABLE)
    if any(s[L].get("accuracy_lo") is None or c[L].get("accuracy_hi") is None for L in both):
        return Verdict(f"{shown}; no intervals to tell it from the {claim['control']} control", NOT_COMPARABLE)
    if not any(s[L]["accuracy_lo"] > c[L]["accuracy_hi"] for L in both):
        return Verdict(f"{shown}; {claim['control']} retrieves within the intervals at every length", TIED)
    return Verdict(shown, MATCHED)


# The rows a rule reads (Rule.rows); "ppl+retrieval" gives {"ppl": ..., "retrieval": ...}.
READERS = {
    "task": task_rows,
    "retrieval": retrieval_rows,
    "search": search_rows,
    "ppl": ppl_rows,
    "ppl+retrieval": lambda paths: {"ppl": ppl_rows(paths), "retrieval": retrieval_rows(paths)},
}


def rule_text(claim: dict) -> str:
    """The rule in words, and the training budget it needs where the claim names one."""
    budget = f" (needs a model trained on {claim['budget']})" if claim.get("budget") else ""
    return RULES[claim["rule"]].says(claim) + budget


def check_claims(claims: list[dict], studies: dict[str, list[str]]) -> list[dict]:
    """One verdict row per claim and study folder it applies to."""
    for c in claims:
        missing = [k for k in ("id", "study", "source", "published", "rule") if k not in c]
        if missing or c["rule"] not in RULES:
            raise ConfigError(
                f"Claim {c.get('id', '?')!r} needs id, study, source, published and a rule among "
                f"{', '.join(RULES)} (missing: {', '.join(missing) or 'a known rule'})."
            )
        lacking = [k for k in RULES[c["rule"]].parameters if k not in c]
        if lacking:
            raise ConfigError(
                f"Claim {c['id']!r} (rule {c['rule']}) needs {', '.join(RULES[c['rule']].parameters)} "
                f"(missing: {', '.join(lacking)}); see conf/published.yaml."
            )
    out, tables_read = [], {}  # (folders, rows kind) -> the rows read, each read once
    for c in claims:
        entries = studies.get(c["study"]) or []
        for entry in entries or [None]:
            # An entry is one folder, or a list of folders read together as one set of results.
            group = [entry] if isinstance(entry, str) else list(entry or [])
            path = ", ".join(group) if group else None
            missing = [p for p in group if not os.path.exists(p)]
            if not group or missing:
                result = Verdict(
                    f"not run ({', '.join(missing) or 'no folder given for ' + c['study']})", NOT_COMPARABLE
                )
            else:
                key = (path, RULES[c["rule"]].rows)
                if key not in tables_read:
                    tables_read[key] = READERS[key[1]](group)
                try:
                    result = RULES[c["rule"]](c, tables_read[key])
                except Ambiguous as e:
                    result = Verdict(f"{e}: give one folder per setting", NOT_COMPARABLE)
            out.append(
                {
                    "id": c["id"],
                    "claim": c.get("claim", ""),
                    "source": c["source"],
                    "published": c["published"],
                    "rule": rule_text(c),
                    "study": c["study"],
                    "results": path,
                    "ours": result.ours,
                    "verdict": result.verdict,
                }
            )
    return out


def short_names(paths) -> dict[str, str]:
    """Each folder by its last path components, as few as tell it from every
    other folder given (budget_pg19/2_rope_none_L64 vs budget_stdlib/2_rope_none_L64)."""
    parts = {p: os.path.normpath(p).split(os.sep) for p in dict.fromkeys(paths)}
    out = {}
    for p, mine in parts.items():
        n = 1
        while n < len(mine) and any(q != p and other[-n:] == mine[-n:] for q, other in parts.items()):
            n += 1
        out[p] = "/".join(mine[-n:])
    return out


def per_claim(rows: list[dict]) -> list[dict]:
    """One row per claim: on how many of its folders it matched. A claim counts
    once: matched where it matched on at least one folder; else not matched
    where a folder contradicts it, tied where noise decided every comparable
    folder, not comparable where none could be read."""
    out = {}
    for r in rows:
        c = out.setdefault(
            r["id"], {"id": r["id"], "claim": r["claim"], "rule": r["rule"], "folders": 0, **{v: 0 for v in VERDICTS}}
        )
        c["folders"] += 1
        c[r["verdict"]] += 1
    for c in out.values():
        c["verdict"] = next(v for v in (MATCHED, NOT_MATCHED, TIED, NOT_COMPARABLE) if c[v])
    return list(out.values())


def summary_line(claims: list[dict]) -> str:
    return f"claims matched: {sum(c['verdict'] == MATCHED for c in claims)} of {len(claims)}"


def markdown(rows: list[dict]) -> str:
    claims = per_claim(rows)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    names = short_names(p for r in rows if r["results"] for p in r["results"].split(", "))
    per = [
        [
            f"**{c['id']}**: {c['claim']}",
            c["rule"],
            f"{c[MATCHED]} of {c['folders']}"
            + "".join(f", {v} on {c[v]}" for v in (NOT_MATCHED, TIED, NOT_COMPARABLE) if c[v]),
            f"**{c['verdict']}**",
        ]
        for c in claims
    ]
    table = []
    for r in rows:
        where = f" ({' + '.join(names[p] for p in r['results'].split(', '))})" if r["results"] else ""
        table.append(
            [f"**{r['id']}**{where}: {r['claim']}", r["published"], r["ours"], r["rule"], f"**{r['verdict']}**"]
        )
    lines = [
        "Per claim (a claim is matched where it matched on at least one of its study's folders):",
        "",
        markdown_table(["claim", "rule", "matched on", "verdict"], per),
        "",
        "Per folder: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".",
        "",
        markdown_table(["claim", "published", "ours", "rule", "verdict"], table),
    ]
    lines += ["", "Sources:", ""]
    for source in dict.fromkeys(r["source"] for r in rows):
        lines.append(f"* {source}")
    return "\n".join(lines + ["", summary_line(claims)]) + "\n"


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)


def check_and_write(claims: list, studies: dict, out: str | None) -> list:
    """scripts/check_published.py's work: every claim checked, the table printed (its last line
    the count, "claims matched: K of N"), and with `out` written as markdown and JSON."""
    from rope_lm.core.files import atomic_write

    rows = check_claims(claims, studies)
    md = markdown(rows)
    if out:
        os.makedirs(out, exist_ok=True)
        atomic_write(os.path.join(out, "check_published.md"), md)
        atomic_write(os.path.join(out, "check_published.json"), to_json(rows))
        print(f"Written: {out}/check_published.md, check_published.json\n")
    print(md, end="")
    return rows
