"""Published findings against ours, computed: each claim (conf/published.yaml:
its source, the published figure and a rule with its thresholds) is checked
against a study's results by the rule's pure function, which says what ours
is and whether it matched.

A verdict is "matched", "not matched", or "not comparable" (the study was not
run, or lacks a length or scheme the rule reads). Perplexity rules read the
rows compare.py writes (compare.csv, or the same rows computed from run
folders); task rules read exact match past the training sizes from
compare_tasks.csv or task_results.json files.
"""

from dataclasses import dataclass
import csv
import json
import logging
import os

from rope_lm.errors import ConfigError
from rope_lm.tables import markdown_table

log = logging.getLogger("rope_lm")

MATCHED, NOT_MATCHED, NOT_COMPARABLE = "matched", "not matched", "not comparable"


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
        return [{k: _number(v) if k not in ("scheme", "method", "label", "task", "sizes", "group", "corpus", "split",
                                           "tokenizer", "run_dir", "protocol", "inside") else v
                 for k, v in row.items()} for row in csv.DictReader(f)]


def ppl_rows(paths: list[str]) -> list[dict]:
    """PPL rows (scheme, method, train_len, length, ratio, ppl, ppl_rel) of a
    study: its compare.csv files, or computed from its run folders."""
    from rope_lm.compare import csv_rows, files_named, group_runs, load_runs

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
            raise ConfigError(f"{p} does not exist (resolved from {os.getcwd()}); give a study's compare.csv, the "
                              f"folder compare.py wrote, or its run folders.")
    return rows


def task_rows(paths: list[str]) -> list[dict]:
    """(task, scheme, method, seed, accuracy past the training sizes) per run."""
    from rope_lm.compare import files_named
    from rope_lm.task_compare import load_task_runs

    out = []
    for p in paths:
        found = [p] if os.path.isfile(p) and p.endswith(".csv") else \
            files_named(p, "compare_tasks.csv") if os.path.isdir(p) else []
        if found:
            runs = {}
            for f in found:
                for r in _read_csv(f):
                    if str(r["inside"]) == "False" and r.get("n"):
                        key = (r["task"], r["scheme"], r["method"], r.get("seed"), r["run_dir"])
                        hit, n = runs.get(key, (0.0, 0.0))
                        runs[key] = (hit + r["accuracy"] * r["n"], n + r["n"])
            out += [{"task": k[0], "scheme": k[1], "method": k[2], "seed": k[3], "accuracy": hit / n}
                    for k, (hit, n) in runs.items()]
        elif os.path.exists(p):
            runs, unreadable = load_task_runs([p])
            for note in unreadable:  # the rules say which claims lack their runs
                log.warning("%s: %s", p, note)
            out += [{"task": r["task"], "scheme": r["scheme"], "method": r["method"], "seed": r.get("seed"),
                     "accuracy": (r.get("beyond") or {}).get("accuracy")} for r in runs]
        else:
            raise ConfigError(f"{p} does not exist (resolved from {os.getcwd()}); give compare_tasks.csv, the folder "
                              f"compare.py wrote, or a scripts/task.py sweep folder.")
    return [r for r in out if r["accuracy"] is not None]


def _series(rows: list[dict], name: str, train_len: str = "min") -> dict[float, dict]:
    """multiplier -> {ppl, ppl_rel} of one series ('scheme' or 'scheme+method',
    e.g. rope+yarn), averaged over seeds; the group trained at the shortest
    (min) or longest (max: a fine-tune) length."""
    scheme, _, method = name.partition("+")
    mine = [r for r in rows if r["scheme"] == scheme and r["method"] == (method or "none")]
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
    return {k: {c: sum(r[c] for r in v) / len(v) for c in ("ppl", "ppl_rel") if all(r.get(c) is not None for r in v)}
            for k, v in by.items()}


class Ambiguous(Exception):
    """A series names several runs that differ in more than their seed."""


# --- rules: (claim, evidence) -> Verdict ----------------------------------------------

def ratio_between(claim: dict, rows: list[dict]) -> Verdict:
    s, k = _series(rows, claim["series"]), float(claim["multiplier"])
    v = (s.get(k) or {}).get("ppl_rel")
    if v is None:
        return Verdict(f"no {claim['series']} result at {k:g} x L", NOT_COMPARABLE)
    lo, hi = claim.get("min", float("-inf")), claim.get("max", float("inf"))
    return Verdict(f"{v:.2f} at {k:g} x L", MATCHED if lo <= v <= hi else NOT_MATCHED)


def ratio_at_most(claim: dict, rows: list[dict]) -> Verdict:
    s = _series(rows, claim["series"])
    past = {k: v["ppl_rel"] for k, v in s.items() if k >= float(claim["from_multiplier"]) and "ppl_rel" in v}
    if not past:
        return Verdict(f"no {claim['series']} result at {claim['from_multiplier']} x L or beyond", NOT_COMPARABLE)
    worst = max(past, key=past.get)
    return Verdict(f"{min(past.values()):.2f}-{past[worst]:.2f} over {min(past):g}-{max(past):g} x L (highest at "
                   f"{worst:g} x L)", MATCHED if past[worst] <= claim["max"] else NOT_MATCHED)


def ppl_order(claim: dict, rows: list[dict]) -> Verdict:
    """The series in claim['order'] (best first) have increasing `metric`
    (ppl or ppl_rel) at the multiplier, in the group trained at `train_len`."""
    k, metric = float(claim["multiplier"]), claim.get("metric", "ppl")
    values = {}
    for name in claim["order"]:
        v = (_series(rows, name, claim.get("train_len", "min")).get(k) or {}).get(metric)
        if v is None:
            return Verdict(f"no {name} result at {k:g} x L", NOT_COMPARABLE)
        values[name] = v
    ours = sorted(values, key=values.get)
    shown = " < ".join(f"{n} {values[n]:.{3 if metric == 'ppl_rel' else 1}f}" for n in ours)
    return Verdict(f"{shown} ({metric} at {k:g} x L)", MATCHED if ours == list(claim["order"]) else NOT_MATCHED)


def task_ranking(claim: dict, rows: list[dict]) -> Verdict:
    """Every scheme in `above` has a higher mean exact match past the training
    sizes (over the tasks every listed scheme was run on) than every scheme in
    `below`."""
    names = list(claim["above"]) + list(claim["below"])
    tasks = set.intersection(*[{r["task"] for r in rows if r["scheme"] == n and r["method"] == "none"} or set()
                               for n in names]) if rows else set()
    if not tasks:
        return Verdict("no task sweep with all of " + ", ".join(names), NOT_COMPARABLE)
    mean = {}
    for n in names:
        per_task = {}
        for r in rows:
            if r["scheme"] == n and r["method"] == "none" and r["task"] in tasks:
                per_task.setdefault(r["task"], []).append(r["accuracy"])
        mean[n] = sum(sum(v) / len(v) for v in per_task.values()) / len(per_task)
    ours = sorted(names, key=mean.get, reverse=True)
    shown = " > ".join(f"{n} {100 * mean[n]:.0f}%" for n in ours)
    ok = min(mean[n] for n in claim["above"]) > max(mean[n] for n in claim["below"])
    return Verdict(f"{shown} (mean exact match past the training sizes, {len(tasks)} tasks)",
                   MATCHED if ok else NOT_MATCHED)


RULES = {"ratio_between": ratio_between, "ratio_at_most": ratio_at_most, "ppl_order": ppl_order,
         "task_ranking": task_ranking}
TASK_RULES = {"task_ranking"}


def rule_text(claim: dict) -> str:
    """The rule in words, from its own parameters (so text and check never drift)."""
    r = claim["rule"]
    if r == "ratio_between":
        lo, hi = claim.get("min"), claim.get("max")
        bounds = f"in [{lo}, {hi}]" if lo is not None and hi is not None else f">= {lo}" if lo is not None else f"<= {hi}"
        return f"{claim['series']}: PPL({claim['multiplier']} x L) / PPL(L) {bounds}"
    if r == "ratio_at_most":
        return f"{claim['series']}: PPL(k x L) / PPL(L) <= {claim['max']} for every k >= {claim['from_multiplier']}"
    if r == "ppl_order":
        where = ", in the fine-tuned runs" if claim.get("train_len") == "max" else ""
        return f"{claim.get('metric', 'ppl')} at {claim['multiplier']} x L{where}: " + " < ".join(claim["order"])
    if r == "task_ranking":
        return f"mean exact match past the training sizes: each of {', '.join(claim['above'])} > each of " \
               f"{', '.join(claim['below'])}"
    raise ConfigError(f"Unknown rule {r!r}; valid rules are {', '.join(RULES)}.")


def check_claims(claims: list[dict], studies: dict[str, list[str]]) -> list[dict]:
    """One verdict row per claim and study folder it applies to."""
    for c in claims:
        missing = [k for k in ("id", "study", "source", "published", "rule") if k not in c]
        if missing or c["rule"] not in RULES:
            raise ConfigError(f"Claim {c.get('id', '?')!r} needs id, study, source, published and a rule among "
                              f"{', '.join(RULES)} (missing: {', '.join(missing) or 'a known rule'}).")
    out, cache = [], {}
    for c in claims:
        entries = studies.get(c["study"]) or []
        for entry in entries or [None]:
            # An entry is one folder, or a list of folders read together as one set of results.
            group = [entry] if isinstance(entry, str) else list(entry or [])
            path = ", ".join(group) if group else None
            missing = [p for p in group if not os.path.exists(p)]
            if not group or missing:
                result = Verdict(f"not run ({', '.join(missing) or 'no folder given for ' + c['study']})",
                                 NOT_COMPARABLE)
            else:
                key = (path, c["rule"] in TASK_RULES)
                if key not in cache:
                    cache[key] = task_rows(group) if key[1] else ppl_rows(group)
                try:
                    result = RULES[c["rule"]](c, cache[key])
                except Ambiguous as e:
                    result = Verdict(f"{e}: give one folder per setting", NOT_COMPARABLE)
            out.append({"id": c["id"], "claim": c.get("claim", ""), "source": c["source"], "published": c["published"],
                        "rule": rule_text(c), "study": c["study"], "results": path, "ours": result.ours,
                        "verdict": result.verdict})
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


def markdown(rows: list[dict]) -> str:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in (MATCHED, NOT_MATCHED, NOT_COMPARABLE)}
    names = short_names(p for r in rows if r["results"] for p in r["results"].split(", "))
    table = []
    for r in rows:
        where = f" ({' + '.join(names[p] for p in r['results'].split(', '))})" if r["results"] else ""
        table.append([f"**{r['id']}**{where}: {r['claim']}", r["published"], r["ours"], r["rule"], f"**{r['verdict']}**"])
    lines = [f"{counts[MATCHED]} matched, {counts[NOT_MATCHED]} not matched, {counts[NOT_COMPARABLE]} not comparable.",
             "", markdown_table(["claim", "published", "ours", "rule", "verdict"], table)]
    lines += ["", "Sources:", ""]
    for source in dict.fromkeys(r["source"] for r in rows):
        lines.append(f"* {source}")
    return "\n".join(lines) + "\n"


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)
