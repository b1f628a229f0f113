"""Compare long-range probe runs (scripts/long_range_probes.py, rope_lm.probes.long_range_run): the
repeated span's drop per distance, and key-token PPL beside PPL per length, one row per model with
its seeds together (mean ± sd over seeds, and a t-interval over them: noise.seed_interval). Torch-free:
it reads long_range.json files only. Models are named as the other comparisons name their rows
(rope_lm.compare.labels)."""

import json
import math
import os
import re

import numpy as np

from rope_lm.compare.labels import NOT_A_SETTING, distinct_labels, flat_settings, run_name
from rope_lm.compare.noise import seed_interval
from rope_lm.compare.result_files import files_given_or_below, read_runs, short_path, write_comparison
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import from_here
from rope_lm.core.tables import markdown_table
from rope_lm.eval import bootstrap
from rope_lm.runs.run_settings import settings_key

# rope_lm.probes.long_range_run.RESULTS, named here: that module needs torch, a comparison does not.
LONG_RANGE_JSON = "long_range.json"
COLUMNS = [
    "label",
    "scheme",
    "method",
    "train_len",
    "probe",
    "quantity",
    "at",
    "ratio",
    "n",
    "seeds",
    "values",
    "mean",
    "sd",
    "lo",
    "hi",
    "interval",
    "run_dirs",
]
# (probe, the row's length key, the CSV's quantity, the part of the row holding it, its name there):
# the value is part[name], its one-run bootstrap interval part[name_lo], part[name_hi].
QUANTITIES = (
    ("repeated_span", "distance", "drop", "drop", "loss"),
    ("repeated_span", "distance", "loss_with_copy", "copy", "loss"),
    ("repeated_span", "distance", "loss_without_copy", "nocopy", "loss"),
    ("key_tokens", "length", "key_ppl", None, "key_ppl"),
    ("key_tokens", "length", "ppl", None, "ppl"),
)
READ_IT = (
    "How to read it: a model that reads context past its training length L shows a drop clearly above 0 at "
    "d > L (its interval above 0); a drop about 0 there means the first copy lay beyond what it uses."
)


def find_long_range_results(paths: list[str]) -> list[str]:
    """long_range.json files named directly or found (recursively) under directories."""
    return files_given_or_below(paths, LONG_RANGE_JSON)


def _rows(r: dict, probe: str) -> list[dict]:
    section = r.get(probe)
    return (section.get("rows") or []) if isinstance(section, dict) else []


def load_long_range_runs(paths: list[str]) -> tuple[list[dict], list[str]]:
    """The runs with at least one scored distance or length, and a note on every other long_range.json."""

    def problem(r, p):
        if not isinstance(r, dict) or "scheme" not in r or not isinstance(r.get("text"), dict):
            return f"UNREADABLE: `{short_path(os.path.dirname(p))}`: {p} is not a long-range probe run's results."
        if not (_rows(r, "repeated_span") or _rows(r, "key_tokens")):
            return (
                f"NOTHING SCORED: `{short_path(os.path.dirname(p))}`: {p} holds no scored distance or length yet; "
                f"finish that run (existing=continue)."
            )

    return read_runs(find_long_range_results(paths), "run scripts/long_range_probes.py into a new out=.", problem)


def _seed(r: dict):
    return (r.get("config") or {}).get("seed")


def _setting(r: dict) -> str:
    """Equal for seed replicas: the same model settings but the seed, scored with the same method."""
    scaling = ((r.get("settings") or {}).get("common") or {}).get("scaling")
    parts = [r["scheme"], r.get("method", "none"), r.get("train_pos", "none"), scaling]
    return json.dumps(parts + [settings_key(r.get("config") or {}, NOT_A_SETTING)], sort_keys=True, default=str)


def _natural(text: str) -> list:
    """Sort key that puts train.steps=4000 before train.steps=10000."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def long_range_groups(runs: list[dict]) -> list[tuple[str, list[dict]]]:
    """(label, runs by seed) per model: runs of one setting and distinct seeds are one model's seeds;
    the same seed twice (or none) is one model probed twice, so each of those stands alone and is told
    apart by its folder."""
    by_setting: dict[str, list[dict]] = {}
    for r in runs:
        by_setting.setdefault(_setting(r), []).append(r)
    groups = []
    for members in by_setting.values():
        seeds = [_seed(r) for r in members]
        if None in seeds or len({str(s) for s in seeds}) < len(members):
            groups += [[r] for r in members]
        else:
            groups.append(sorted(members, key=_seed))
    entries = [
        (
            0,
            run_name(g[0]["scheme"], g[0].get("method", "none"), g[0].get("train_pos", "none")),
            flat_settings(g[0].get("config")),
            g[0]["run_dir"],
            _seed(g[0]) if len(g) == 1 else None,
        )
        for g in groups
    ]
    return sorted(zip(distinct_labels(entries), groups), key=lambda x: _natural(x[0]))


def _by_owner(runs: list[dict], key) -> dict:
    out: dict = {}
    for r in runs:
        out.setdefault(key(r), []).append(short_path(r["run_dir"]))
    return out


def _listed(owners: dict, describe) -> str:
    return " ".join(f"[{describe(k)}: {', '.join(v[:4])}{' ...' if len(v) > 4 else ''}]" for k, v in owners.items())


def check_comparable(runs: list[dict]) -> None:
    """Every run read the same tokens; the spans are of one length; at each key-token length every run
    was scored on the same key tokens. Else one paragraph naming the folders of each side."""
    texts = _by_owner(runs, lambda r: (r["text"].get("split"), r["text"].get("digest")))
    if len(texts) > 1:
        where = {(r["text"].get("split"), r["text"].get("digest")): r["text"].get("where") for r in runs}
        raise ConfigError(
            f"These long-range probe runs read different text, so their losses are not comparable in one table: "
            f"{_listed(texts, lambda k: f'the {k[0]} split of {where[k]}, tokens {k[1]}')}. The tokens differ where "
            f"the corpus, the split or the tokenizer does (each model reads the text with its own tokenizer): "
            f"compare runs trained on one corpus with one tokenizer and probed on one split, a set at a time."
        )
    spans = _by_owner(
        [r for r in runs if _rows(r, "repeated_span")], lambda r: _rows(r, "repeated_span")[0].get("span")
    )
    if len(spans) > 1:
        raise ConfigError(
            f"These long-range probe runs copied spans of different lengths, so their drops are not comparable "
            f"in one table: {_listed(spans, lambda k: f'{k} tokens')}. Probe every model with one "
            f"repeated_span.span=, or compare the runs of each span apart."
        )
    lengths = sorted({row["length"] for r in runs for row in _rows(r, "key_tokens")})
    for T in lengths:
        chosen = {r["run_dir"]: row["selection"] for r in runs for row in _rows(r, "key_tokens") if row["length"] == T}
        owners = _by_owner([r for r in runs if r["run_dir"] in chosen], lambda r: chosen[r["run_dir"]])
        if len(owners) > 1:
            raise ConfigError(
                f"At the key-token length {T}, these long-range probe runs were scored on different key tokens, so "
                f"their key-token PPLs are not comparable: {_listed(owners, lambda k: f'selection {k}')}. The "
                f"key tokens are chosen by the evaluator, its thresholds and the text: probe every model with "
                f"the same key_tokens.evaluator=, alpha, beta, short, stride and token_budget, or compare the "
                f"runs of each evaluator apart."
            )


def _stats(values: list[float], one: tuple) -> dict:
    """mean, sd and 95% interval over seeds (the t-interval, noise.seed_interval); a lone seed keeps its
    own run's bootstrap interval (`one`: (lo, hi)), the only interval it has."""
    st = seed_interval(values)
    if st is not None:
        return {**st, "interval": "t"}
    lo, hi = one
    return {"n": 1, "mean": values[0], "sd": None, "lo": lo, "hi": hi, "interval": "" if lo is None else "bootstrap"}


def csv_rows(groups: list[tuple[str, list[dict]]]) -> list[dict]:
    """One row per model, quantity and distance or length, its seeds' values summarised."""
    rows = []
    for label, members in groups:
        for probe, at_key, quantity, part, name in QUANTITIES:
            by_at: dict = {}
            for r in members:
                for row in _rows(r, probe):
                    d = (row.get(part) or {}) if part else row
                    if d.get(name) is not None:  # a length with no key token has no key-token PPL
                        by_at.setdefault(row[at_key], []).append((r, row["ratio"], d))
            for at in sorted(by_at):
                got = by_at[at]
                values = [float(d[name]) for _, _, d in got]
                st = _stats(values, (got[0][2].get(f"{name}_lo"), got[0][2].get(f"{name}_hi")))
                rows.append(_csv_row(label, probe, quantity, at, got[0][1], [r for r, _, _ in got], values, st))
    return rows


def _csv_row(label: str, probe: str, quantity: str, at: int, ratio, runs: list[dict], values: list, st: dict) -> dict:
    """One CSV row: a model's quantity at a distance or length over its seeds' runs, summarised in `st`."""
    first = runs[0]
    return {
        "label": label,
        "scheme": first["scheme"],
        "method": first.get("method", "none"),
        "train_len": first.get("train_len"),
        "probe": probe,
        "quantity": quantity,
        "at": at,
        "ratio": ratio,
        "n": st["n"],
        "seeds": " ".join(str(_seed(r)) for r in runs),
        "values": " ".join(f"{v:.6g}" for v in values),
        **{k: st[k] for k in ("mean", "sd", "lo", "hi", "interval")},
        "run_dirs": " ".join(from_here(r["run_dir"]) for r in runs),
    }


def _mean_sd(st: dict | None, fmt: str) -> str:
    if st is None:
        return "—"
    return fmt.format(st["mean"]) + ("" if st["sd"] is None else " ± " + fmt.format(st["sd"]))


def _interval(st: dict | None, fmt: str) -> str:
    if st is None or st["lo"] is None or st["hi"] is None:
        return "—"
    shown = f"[{fmt.format(st['lo'])}, {fmt.format(st['hi'])}]"
    return shown + (" (bootstrap)" if st["interval"] == "bootstrap" else "")


def _at(rows: list[dict], probe: str, labels: list[str]) -> list[tuple]:
    """(distance or length, ratio, label) in table order: by length, then model."""
    seen = {(r["at"], r["label"]): r["ratio"] for r in rows if r["probe"] == probe}
    order = {label: i for i, label in enumerate(labels)}
    return sorted(((at, ratio, label) for (at, label), ratio in seen.items()), key=lambda x: (x[0], order[x[2]]))


def span_table(rows: list[dict], labels: list[str]) -> str:
    cell = {(r["at"], r["label"]): r for r in rows if r["quantity"] == "drop"}
    table = []
    for d, ratio, label in _at(rows, "repeated_span", labels):
        st = cell.get((d, label))
        table.append(
            [f"{d:,}", f"{ratio:g}", label, st["n"] if st else 0, _mean_sd(st, "{:.3f}"), _interval(st, "{:.3f}")]
        )
    return markdown_table(["d", "d/L", "model", "seeds", "drop, nats (mean ± sd)", "95% interval"], table, "rrlrrr")


def key_table(rows: list[dict], labels: list[str]) -> str:
    cells = {(r["at"], r["label"], r["quantity"]): r for r in rows if r["probe"] == "key_tokens"}

    def shown(st):
        if st is None or st["sd"] is not None:
            return _mean_sd(st, "{:.2f}")
        return _mean_sd(st, "{:.2f}") + ("" if st["lo"] is None else " " + _interval(st, "{:.2f}"))

    table = []
    for T, ratio, label in _at(rows, "key_tokens", labels):
        key, plain = cells.get((T, label, "key_ppl")), cells.get((T, label, "ppl"))
        n = max(st["n"] for st in (key, plain) if st)
        table.append([f"{T:,}", f"{ratio:g}", label, n, shown(key), shown(plain)])
    return markdown_table(["T", "T/L", "model", "seeds", "key-token PPL", "PPL"], table, "rrlrrr")


def _key_tokens_note(runs: list[dict]) -> str:
    first = next(r for r in runs if _rows(r, "key_tokens"))
    ev = first["key_tokens"].get("evaluator") or {}
    rows = {row["length"]: row for r in runs for row in _rows(r, "key_tokens")}
    counts = "; ".join(
        f"T = {T:,}: {row['key_tokens']:,} of {row['tokens']:,} targets (selection {row['selection']})"
        for T, row in sorted(rows.items())
    )
    return (
        f"Key tokens chosen by the evaluator {ev.get('source')} (weights {(ev.get('identity') or {}).get('weights')}; "
        f"K = {ev.get('short')}, S = {ev.get('stride')}, alpha = {ev.get('alpha')}, beta = {ev.get('beta')}), the "
        f"same for every model: {counts}. Mean ± sd over seeds; a lone seed shows its own bootstrap interval over "
        f"windows."
    )


def _weights(r: dict) -> tuple:
    model = r.get("model") if isinstance(r.get("model"), dict) else {}
    return (model.get("weights"), model.get("step"))


def own_windows(runs: list[dict]) -> dict:
    """run_dir -> the probe run of the same weights cut to a window (method window): each model's own
    window control, where exactly one was probed."""
    by_weights: dict = {}
    for r in runs:
        weights = _weights(r)
        if weights[0] is not None:
            by_weights.setdefault(weights, []).append(r)
    out = {}
    for members in by_weights.values():
        controls = [r for r in members if r.get("method") == "window"]
        if len(controls) == 1:
            out.update({r["run_dir"]: controls[0] for r in members if r.get("method") != "window"})
    return out


def _window_units(row: dict, name: str) -> bootstrap.Units | None:
    """A key-token row's per-window sums as bootstrap units (`name`: loss or key_loss), or None for a row
    scored before they were kept."""
    per = row.get("per_window")
    if not per:
        return None
    loss = np.asarray(per[name], np.float64)
    count = np.asarray(per["key_count"] if name == "key_loss" else [row["length"]] * len(loss), np.float64)
    keys = np.arange(len(loss))
    # As "document" units, two rows pair where their keys are equal: the same windows, in the same order.
    return bootstrap.Units("document", keys, loss, count, np.zeros_like(loss), np.zeros_like(count))


# (the CSV's quantity, the row's PPL, the per-window sums behind it)
OVER_WINDOW = (("key_ppl_over_window", "key_ppl", "key_loss"), ("ppl_over_window", "ppl", "loss"))


def _ratio_interval(ratios: list[float]) -> dict | None:
    """Per-seed ratios summarised as the rules read them (noise.py): the t-interval of their logs, shown as
    the geometric mean and the interval's ends back on the ratio scale, so an interval never crosses 0 and
    a ratio and its inverse get mirrored intervals; `sd` is the sd of the logs (a factor exp(sd) each
    way). None for a lone seed."""
    st = seed_interval(math.log(v) for v in ratios)
    if st is None:
        return None
    return {
        **st,
        "mean": math.exp(st["mean"]),
        "lo": math.exp(st["lo"]),
        "hi": math.exp(st["hi"]),
        "interval": "t, log",
    }


def window_rows(groups: list[tuple[str, list[dict]]], controls: dict, resamples: int = 1000) -> list[dict]:
    """Each model's key-token PPL and PPL over its own window control's at each length, per seed; over seeds
    the geometric mean and t-interval of the per-seed ratios (_ratio_interval: training noise), and for a
    lone seed the paired bootstrap over the windows both were scored on (the same windows and key tokens)."""
    rows = []
    for label, members in groups:
        paired = [(r, controls[r["run_dir"]]) for r in members if r["run_dir"] in controls]
        if not paired:
            continue
        for quantity, name, sums in OVER_WINDOW:
            by_T: dict = {}
            for r, c in paired:
                ctrl = {row["length"]: row for row in _rows(c, "key_tokens")}
                for row in _rows(r, "key_tokens"):
                    other = ctrl.get(row["length"])
                    if other is not None and row.get(name) and other.get(name):
                        by_T.setdefault(row["length"], []).append((r, row, other))
            for T in sorted(by_T):
                got = by_T[T]
                values = [row[name] / other[name] for _, row, other in got]
                st = _ratio_interval(values)
                if st is None:
                    _, row, other = got[0]
                    a, b = _window_units(row, sums), _window_units(other, sums)
                    ci = (
                        bootstrap.paired_ratio(a, b, row[name], other[name], resamples, 0, T)
                        if a is not None and b is not None
                        else {}
                    )
                    lo, hi = ci.get("lo"), ci.get("hi")
                    st = {"n": 1, "mean": values[0], "sd": None, "lo": lo, "hi": hi}
                    st["interval"] = "" if lo is None else "paired bootstrap"
                runs = [r for r, _, _ in got]
                rows.append(_csv_row(label, "key_tokens", quantity, T, got[0][1]["ratio"], runs, values, st))
    return rows


def window_table(rows: list[dict], labels: list[str]) -> str:
    cells = {(r["at"], r["label"], r["quantity"]): r for r in rows if r["quantity"].endswith("_over_window")}
    order = {label: i for i, label in enumerate(labels)}
    keys = sorted({(at, label) for at, label, _ in cells}, key=lambda k: (k[0], order[k[1]]))

    def shown(st):
        if st is None:
            return "—"
        if st["interval"] == "t, log":
            return f"{st['mean']:.3f} ×/÷ {math.exp(st['sd']):.3f} " + _interval(st, "{:.3f}")
        text = _mean_sd(st, "{:.3f}") + " " + _interval(st, "{:.3f}").replace(" (bootstrap)", "")
        return text + (" (paired)" if st["interval"] == "paired bootstrap" else "")

    table = []
    for T, label in keys:
        key, plain = cells.get((T, label, "key_ppl_over_window")), cells.get((T, label, "ppl_over_window"))
        ratio = (key or plain)["ratio"]
        table.append([f"{T:,}", f"{ratio:g}", label, (key or plain)["n"], shown(key), shown(plain)])
    return markdown_table(
        ["T", "T/L", "model", "seeds", "key-token PPL / own window's", "PPL / own window's"], table, "rrlrrr"
    )


WINDOW_NOTE = (
    "Each model against itself cut to a window (its own window control, probed with scaling=window on the same "
    "weights): the ratio of its key-token PPL, and of its PPL, to the control's on the same windows and key "
    "tokens. Below 1: it reads those tokens better with the whole window than cut to the control's width. "
    "Over seeds: the geometric mean of the per-seed ratios ×/÷ the geometric sd, and the 95% t-interval of their "
    "logs taken back to ratios (training noise included; the rules' reading, noise.py); a lone seed: its paired "
    "bootstrap interval over the windows (text noise only)."
)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def compare_long_range(paths: list[str], out: str, title: str | None = None, required: bool = True) -> dict | None:
    """compare_long_range.md (the repeated span's drop per distance, key-token PPL and PPL per length,
    per model over its seeds) and compare_long_range.csv (one row per model, quantity and distance or
    length), written as one set. Without a readable run: a ConfigError if required, else None."""
    runs, skipped = load_long_range_runs(paths)
    if not runs and not required:
        return None
    if not runs:
        raise ConfigError(
            f"No long-range probe results under {', '.join(paths)}"
            f"{' (' + '; '.join(skipped[:3]) + ')' if skipped else ''}: point compare at "
            f"scripts/long_range_probes.py outputs."
        )
    check_comparable(runs)
    groups = long_range_groups(runs)
    labels = [label for label, _ in groups]
    rows = csv_rows(groups)
    over_window = window_rows(groups, own_windows(runs))
    rows += over_window
    text = runs[0]["text"]
    md = [
        f"# {title or 'Long-range probes'}",
        "",
        f"{_count(len(runs), 'run')} of {_count(len(groups), 'model')}, every one scored on the same tokens: the "
        f"{text.get('split')} "
        f"split of {text.get('where')} ({text.get('tokens', 0):,} tokens, checksum {text.get('digest')}).",
        "",
    ]
    partial = [short_path(r["run_dir"]) for r in runs if r.get("status") != "complete"]
    if partial:
        md += [f"Not finished (the rows they scored are used): {', '.join(partial)}.", ""]
    if any(r["probe"] == "repeated_span" for r in rows):
        span = next(_rows(r, "repeated_span")[0]["span"] for r in runs if _rows(r, "repeated_span"))
        md += [
            "## Repeated span",
            "",
            READ_IT,
            "",
            f"Drop: the loss of a span's second copy (mean NLL per token over its {span} tokens) without its first "
            f"copy d tokens earlier minus with it. Mean ± sd over seeds; 95% interval of the mean over seeds, "
            f"mean ± t(0.975, n-1) sd/√n; a lone seed shows its own bootstrap interval over samples.",
            "",
            span_table(rows, labels),
            "",
        ]
    if any(r["probe"] == "key_tokens" for r in rows):
        md += ["## Key-token perplexity (LongPPL)", "", _key_tokens_note(runs), "", key_table(rows, labels), ""]
    if over_window:
        md += ["## Against its own window", "", WINDOW_NOTE, "", window_table(over_window, labels), ""]
    files = write_comparison(out, "long_range", md, skipped, rows, COLUMNS)
    return {"out_dir": out, "files": files, "runs": runs, "groups": groups, "rows": rows, "skipped": skipped}
