"""Published findings against ours, computed: each claim (conf/published.yaml:
its source, the published figure and a rule with its thresholds) is checked
against a study's results by its rule (compare/published_rules.py, a pure
function each), which says what ours is and gives the verdict: matched, not
matched, not robust, tied or not comparable (published_rules.VERDICTS says
what each means). A claim is checked on every folder of its study and
counted once: matched where it matched on at least one folder, the rows
saying on how many. This module reads the rows the rules read and writes the
table: perplexity rules read the rows compare.py writes (compare.csv, or the
same rows computed from run folders); task rules read exact match past the
training sizes, per run and per size bucket with its count, from
compare_tasks.csv or task_results.json files; retrieval rules read accuracy
by length, with its interval, from compare_retrieval.csv or retrieval.json
files; search rules read the test rows of scripts/search.py's search.json
files.
"""

import csv
import json
import logging
import os

from rope_lm.compare.published_rules import (
    MATCHED,
    NOT_COMPARABLE,
    RULES,
    VERDICTS,
    Ambiguous,
    Verdict,
)
from rope_lm.core.errors import ConfigError
from rope_lm.core.tables import markdown_table

log = logging.getLogger("rope_lm")


# --- evidence: rows of one study --------------------------------------------------


def _number(v):
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return v


def _read_csv(path: str) -> list[dict]:
    from rope_lm.compare.ppl_pairs import PAIRED_COLUMN, read_paired_cell

    with open(path, newline="") as f:
        rows = [
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
    for row in rows:
        if PAIRED_COLUMN in row:
            row[PAIRED_COLUMN] = read_paired_cell(row[PAIRED_COLUMN])
    return rows


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
        # A comparison's own folder is read alone: a compare.csv below it is another comparison's (an
        # archived first run kept beside it), whose rows would otherwise be averaged in as seeds.
        top = os.path.join(p, "compare.csv")
        if os.path.isfile(p):
            found = [p]
        elif os.path.isfile(top):
            found = [top]
        else:
            found = files_named(p, "compare.csv") if os.path.isdir(p) else []
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


def _size_bucket(label, n, accuracy) -> dict:
    """One size bucket past the training sizes: its label ("7-8", or "7"),
    its sizes (lo, hi), the instances scored and the exact match."""
    lo, _, hi = str(label).partition("-")
    return {"label": str(label), "sizes": (int(lo), int(hi or lo)), "n": n, "accuracy": accuracy}


def _pooled(buckets: list[dict]) -> dict:
    """{accuracy, n} over size buckets, weighted by their instances (None where none)."""
    n = sum(b["n"] for b in buckets)
    return {"accuracy": sum(b["accuracy"] * b["n"] for b in buckets) / n if n else None, "n": n or None}


def task_rows(paths: list[str]) -> list[dict]:
    """(task, scheme, method, seed, accuracy, n, buckets, inside) per run: the
    exact match past the training sizes pooled over its size buckets, the
    number of instances it counts, the buckets past the training sizes on their
    own (label, sizes, n, accuracy), which the task rules make intervals and
    rankings per bucket from, and `inside`: the same pooled over the training
    sizes ({accuracy, n}; a test split's in-distribution sizes at its other
    settings are what CoPE's dense and sparse splits test)."""
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
            runs, inside = {}, {}
            for f in found:
                for r in _read_csv(f):
                    if not r.get("n"):
                        continue
                    key = (r["task"], r["scheme"], r["method"], r.get("seed"), r["run_dir"])
                    if str(r["inside"]) == "False":
                        runs.setdefault(key, []).append(_size_bucket(r["sizes"], r["n"], r["accuracy"]))
                    else:
                        inside.setdefault(key, []).append(_size_bucket(r["sizes"], r["n"], r["accuracy"]))
            for key, buckets in runs.items():
                task, scheme, method, seed, _ = key
                out.append(
                    {
                        "task": task,
                        "scheme": scheme,
                        "method": method,
                        "seed": seed,
                        **_pooled(buckets),
                        "buckets": buckets,
                        "inside": _pooled(inside.get(key, [])),
                    }
                )
        elif os.path.exists(p):
            runs, unreadable = load_task_runs([p])
            for note in unreadable:  # the rules say which claims lack their runs
                log.warning("%s: %s", p, note)
            for r in runs:
                beyond = r.get("beyond") or {}
                buckets = [_size_bucket(b["label"], b.get("n"), b["accuracy"]) for b in r["buckets"] if not b["inside"]]
                out.append(
                    {
                        "task": r["task"],
                        "scheme": r["scheme"],
                        "method": r["method"],
                        "seed": r.get("seed"),
                        "accuracy": beyond.get("accuracy"),
                        "n": beyond.get("n") or sum(b["n"] or 0 for b in buckets) or None,
                        "buckets": buckets,
                        "inside": {k: (r.get("inside") or {}).get(k) for k in ("accuracy", "n")},
                    }
                )
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
                    **({"sensitivity": result.detail} if result.detail else {}),
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
    where a folder contradicts it, not robust where a folder's reading decides
    it, tied where noise decided every comparable folder, not comparable where
    none could be read (the order of VERDICTS)."""
    out = {}
    for r in rows:
        c = out.setdefault(
            r["id"], {"id": r["id"], "claim": r["claim"], "rule": r["rule"], "folders": 0, **{v: 0 for v in VERDICTS}}
        )
        c["folders"] += 1
        c[r["verdict"]] += 1
    for c in out.values():
        c["verdict"] = next(v for v in VERDICTS if c[v])
    return list(out.values())


def summary_line(claims: list[dict]) -> str:
    """ "claims matched: K of N (not matched ..., not robust ..., ...)": every verdict counted."""
    others = ", ".join(f"{v} {n}" for v in VERDICTS[1:] if (n := sum(c["verdict"] == v for c in claims)))
    return f"claims matched: {sum(c['verdict'] == MATCHED for c in claims)} of {len(claims)}" + (
        f" ({others})" if others else ""
    )


def _sensitivity(rows: list[dict], names: dict[str, str]) -> list[str]:
    """The task rankings under every reading of the results (task_mrr): a table per claim and folder."""
    from rope_lm.compare.published_rules import LEARNED_MARGIN

    ranked = [r for r in rows if r.get("sensitivity")]
    if not ranked:
        return []
    lines = [
        "",
        "Task rankings under every reading (`task_mrr`). Kazemnejad et al. (2023) aggregate by mean reciprocal "
        "rank (section 4, after Liang et al., 2022; Figure 1, over their 10 tasks); their code "
        "(McGill-NLP/length-generalization, notebooks/plot_aggregate_final.ipynb, get_mrr_df and "
        "compute_mean_reciprocal_rank) ranks the encodings per dataset, length split and seed by test exact match, "
        'breaking equal accuracies by row order (pandas `rank(method="first")`), and averages 1 / rank. Here a '
        "unit is a task, scored by its seeds' mean exact match past the training sizes, and the claim is read under "
        "each way of settling what row order settles there: ties shared or averaged, tasks or size buckets as units, every "
        "task or the learned ones, ties by accuracy or by 95% interval overlap (Wilson, widened by the seed "
        "spread). A task is learned where at least one run's interval lies above the task's chance rate (its most "
        f"frequent answer's rate) by {LEARNED_MARGIN * 100:g} points. Matched under every reading: matched; under "
        "some: **not robust**.",
    ]
    for r in ranked:
        where = " + ".join(names[p] for p in r["results"].split(", "))
        schemes = list(r["sensitivity"][0]["mrr"])
        table = [
            [s["reading"], str(s["units"]), *(f"{s['mrr'][n]:.2f}" for n in schemes), "yes" if s["holds"] else "no"]
            for s in r["sensitivity"]
        ]
        lines += [
            "",
            f"**{r['id']}** ({where}): mean reciprocal rank, verdict **{r['verdict']}**",
            "",
            markdown_table(["reading", "units", *schemes, "claim holds"], table),
        ]
    return lines


def markdown(rows: list[dict]) -> str:
    claims = per_claim(rows)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    names = short_names(p for r in rows if r["results"] for p in r["results"].split(", "))
    per = [
        [
            f"**{c['id']}**: {c['claim']}",
            c["rule"],
            f"{c[MATCHED]} of {c['folders']}" + "".join(f", {v} on {c[v]}" for v in VERDICTS[1:] if c[v]),
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
        *_sensitivity(rows, names),
    ]
    lines += ["", "Sources:", ""]
    for source in dict.fromkeys(r["source"] for r in rows):
        lines.append(f"* {source}")
    return "\n".join(lines + ["", summary_line(claims)]) + "\n"


def to_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)


def check_and_write(claims: list, studies: dict, out: str | None) -> list:
    """scripts/check_published.py's work: every claim checked, the table printed (its last line
    the count, "claims matched: K of N (not matched ..., not robust ..., ...)"), and with `out`
    written as markdown and JSON."""
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
