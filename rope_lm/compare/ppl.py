"""Compare runs: ppl@L tables (markdown, CSV) and plots across results.json files.

A comparison only means something when every run scored the same text with the
same tokenizer and was trained at the same length, so runs are keyed by
(corpus fingerprint + evaluation split, tokenizer, training length). Runs with
different keys are refused, or, with ``group=True``, compared within each key
separately: never mixed in one table or plot.

Each (run, extrapolation method) pair is one *series*: one table row and one
line. Its relative PPL is ppl@L divided by the same series' ppl at L_train
(falling back to the run's direct-extrapolation series, then to any series of
the run, where the series itself was not evaluated at L_train).

Series whose runs differ only in `seed` are also aggregated: mean ± sd across
seeds per length, the per-seed values kept (compare_seeds.csv and a markdown
table). Rows are "within noise" of each other when their noise intervals
overlap: a single run's 95% bootstrap interval, or an aggregate's seed spread
mean ± 2 sd (docs/studies.md).
"""

import csv
from dataclasses import dataclass, field, replace
import io
import json
import logging
import math
import os
import re

from rope_lm.compare.labels import NOT_A_SETTING, distinct_labels, flat_settings, run_name
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import atomic_write, from_here, save_figure
from rope_lm.core.tables import markdown_table
from rope_lm.eval.report import RESULTS_JSON, log_binned
from rope_lm.runs.run_settings import settings_key
from rope_lm.runs.sweep import job_dirs, sweep_jobs
from rope_lm.train_positions import train_positions_label

log = logging.getLogger("rope_lm")

SKIP_DIRS = {"checkpoints", "wandb", "csv", "lightning_logs", ".hydra", "__pycache__"}
CSV_COLUMNS = [
    "group",
    "label",
    "scheme",
    "method",
    "seed",
    "train_len",
    "length",
    "ratio",
    "ppl",
    "ppl_lo",
    "ppl_hi",
    "ppl_rel",
    "ppl_rel_lo",
    "ppl_rel_hi",
    "ppl_within",
    "ppl_beyond",
    "loss",
    "tokens",
    "documents",
    "protocol",
    "within_noise_of_best",
    "corpus",
    "split",
    "tokenizer",
    "run_dir",
    "train_pos",
    "trained_at",
]
SEED_COLUMNS = [
    "group",
    "label",
    "scheme",
    "method",
    "train_len",
    "length",
    "n_seeds",
    "seeds",
    "ppl_mean",
    "ppl_sd",
    "ppl_min",
    "ppl_max",
    "noise_lo",
    "noise_hi",
    "rel_mean",
    "rel_sd",
    "per_seed",
    "within_noise_of_best",
    "run_dirs",
]


@dataclass(frozen=True)
class GroupKey:
    fingerprint: str
    split: str
    tokenizer: str
    train_len: int
    protocol: str = "stream"

    def describe(self) -> str:
        proto = "" if self.protocol == "stream" else f", protocol {self.protocol}"
        return (
            f"corpus {self.fingerprint} ({self.split} split), tokenizer {self.tokenizer}, trained at "
            f"L={self.train_len}{proto}"
        )

    def slug(self) -> str:
        proto = "" if self.protocol == "stream" else f"_{self.protocol}"
        return re.sub(
            r"[^A-Za-z0-9_.-]+", "-", f"L{self.train_len}_{self.tokenizer}_{self.fingerprint[:8]}_{self.split}{proto}"
        )


@dataclass
class Series:
    run_dir: str
    scheme: str
    method: str
    train_len: int
    rows: dict  # length -> result row
    label: str = ""
    reference_ppl: float | None = None  # ppl at L_train used for the relative column
    reference_self: bool = False  # the reference is this series' own ppl at L_train
    seed: int | None = None
    setting: str = ""  # the run's config without NOT_A_SETTING, and the method: equal for seed replicas
    train_pos: str = "none"  # how training drew its position ids (rope_lm/train_positions/), e.g. pose-x16
    flat_config: dict = field(default_factory=dict)  # the run's config as dotted keys (labels.flat_settings)
    given_label: str = ""  # a committed compare.csv's label, kept as it is
    trained_at: int | None = None  # a reference row's own training length (train_len is its table's)

    def ppl(self, length):
        row = self.rows.get(length)
        return None if row is None else row.get("ppl")

    def noise(self, length) -> tuple[float, float] | None:
        row = self.rows.get(length) or {}
        if row.get("ppl_lo") is None or row.get("ppl_hi") is None:
            return None
        return row["ppl_lo"], row["ppl_hi"]


@dataclass
class SeedAggregate:
    """Series that differ only in seed: per length, the per-seed PPLs."""

    label: str
    members: list  # Series, ordered by seed

    @property
    def scheme(self):
        return self.members[0].scheme

    @property
    def method(self):
        return self.members[0].method

    def values(self, length, relative_to=None) -> dict:
        """PPL per seed; with `relative_to` (L_train), each seed's PPL over its
        own at that length."""
        v = {s.seed: s.ppl(length) for s in self.members if s.ppl(length) is not None}
        if relative_to is None:
            return v
        base = self.values(relative_to)
        return {k: x / base[k] for k, x in v.items() if k in base}

    def stats(self, length, relative_to=None) -> dict | None:
        """mean, sd (n - 1 in the denominator), min, max over seeds (of PPL,
        or relative to `relative_to`); None unless at least two seeds reached
        this length."""
        v = list(self.values(length, relative_to).values())
        if len(v) < 2:
            return None
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
        return {"n": len(v), "mean": mean, "sd": sd, "min": min(v), "max": max(v)}

    def ppl(self, length):
        st = self.stats(length)
        return None if st is None else st["mean"]

    def noise(self, length) -> tuple[float, float] | None:
        st = self.stats(length)
        return None if st is None else (st["mean"] - 2 * st["sd"], st["mean"] + 2 * st["sd"])


def within_noise(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Two rows are within noise of each other when their noise intervals
    overlap; None (not judged) when either has no interval."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


@dataclass
class Run:
    path: str  # the results.json
    results: dict
    key: GroupKey
    series: list[Series] = field(default_factory=list)

    @property
    def dir(self) -> str:
        return os.path.dirname(self.path)


@dataclass
class Group:
    key: GroupKey
    runs: list[Run]

    @property
    def series(self) -> list[Series]:
        return [s for r in self.runs for s in r.series]

    @property
    def lengths(self) -> list[int]:
        return sorted({L for s in self.series for L in s.rows})

    def seed_aggregates(self) -> list[SeedAggregate]:
        """Series of the same setting and method run with two or more seeds."""
        by_setting: dict[str, list[Series]] = {}
        for s in self.series:
            if s.seed is not None and s.trained_at is None:
                by_setting.setdefault(s.setting, []).append(s)
        out, names = [], {}
        for members in by_setting.values():
            if len({s.seed for s in members}) < 2 or len({s.seed for s in members}) != len(members):
                continue  # one seed, or a seed run twice: nothing to aggregate, or not a seed replica
            members = sorted(members, key=lambda s: s.seed)
            base = members[0].scheme if members[0].method == "none" else f"{members[0].scheme} + {members[0].method}"
            names[base] = names.get(base, 0) + 1
            label = base if names[base] == 1 else f"{base} #{names[base]}"
            out.append(SeedAggregate(f"{label} ({len(members)} seeds)", members))
        return out

    def noise_rows(self) -> list:
        """The rows judged for noise: each seed aggregate, and every series
        that is not part of one; reference rows (another training length, an
        upper bound) are no contenders."""
        aggs = self.seed_aggregates()
        inside = {id(s) for a in aggs for s in a.members}
        return aggs + [s for s in self.series if id(s) not in inside and s.trained_at is None]

    def best_and_peers(self, length) -> tuple[object, set] | None:
        """The row with the lowest PPL at a length, and the ids of the rows
        within noise of it (the best included); None without any interval."""
        rows = [r for r in self.noise_rows() if r.ppl(length) is not None]
        if not rows:
            return None
        best = min(rows, key=lambda r: r.ppl(length))
        if best.noise(length) is None:
            return None
        return best, {id(r) for r in rows if within_noise(best.noise(length), r.noise(length))}


# --- reading ------------------------------------------------------------------


def files_named(directory: str, name: str) -> list[str]:
    """Absolute paths of the files called `name` at or below `directory`, in
    sorted walk order, skipping SKIP_DIRS and hidden folders."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        if name in files:
            found.append(os.path.abspath(os.path.join(root, name)))
    return found


def read_json_or_note(path: str, rerun: str) -> tuple[object, str | None]:
    """A results file's JSON, or None and the UNREADABLE line a comparison
    lists it under (half-written by a killed process): one bad file never
    hides the others."""
    try:
        with open(path) as f:
            return json.load(f), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"UNREADABLE: `{_short(os.path.dirname(path))}`: {path} is not valid JSON ({e}); {rerun}"


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


def find_results(paths: list[str]) -> list[str]:
    """results.json files named directly or found (recursively) under directories."""
    if not paths:
        raise ConfigError("Give at least one run directory, sweep directory or results.json file to compare.")
    found = []
    for p in paths:
        if os.path.isfile(p):
            if os.path.basename(p) != RESULTS_JSON:
                raise ConfigError(
                    f"{p} is not a {RESULTS_JSON} file; give run directories, a sweep directory or {RESULTS_JSON} files."
                )
            found.append(os.path.abspath(p))
            continue
        if not os.path.isdir(p):
            raise ConfigError(
                f"{p} does not exist (resolved from {os.getcwd()}); give run directories, a sweep directory or {RESULTS_JSON} files."
            )
        here = files_named(p, RESULTS_JSON)
        if not here and not job_dirs(p):
            raise ConfigError(
                f"No {RESULTS_JSON} under {p}: point compare at finished runs (train.py or scripts/eval_extrapolation.py write one per run)."
            )
        found += here
    return list(dict.fromkeys(found))


def tokenizer_id(config: dict) -> str:
    """The tokenizer a run used: an imported model's own (named by the model),
    a tokenizer the data settings name, or the BPE trained on the corpus, named
    by its vocabulary size and the amount of text it was trained on (both
    change the token units), and, for a checkpoint evaluated on a split it
    was not trained on, by the corpus fingerprint it was trained on (its
    merges differ from those trained on this split)."""
    data = config.get("data") or {}
    source = str(config.get("ckpt_path") or "")
    if source.startswith("hf:"):
        return source
    if data.get("tokenizer"):
        return str(data["tokenizer"])
    vocab = data.get("vocab_size")
    if vocab is None:
        return "unknown"
    chars = data.get("tokenizer_train_chars")
    trained_on = config.get("tokenizer_trained_on")
    return f"bpe{vocab}" + (f"@{chars}" if chars is not None else "") + (f" of {trained_on}" if trained_on else "")


def load_run(path: str) -> Run:
    try:
        with open(path) as f:
            results = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON ({e}); the run may have been killed while writing, rerun its evaluation."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} cannot be read ({e}).") from None
    missing = (
        [k for k in ("train_len", "corpus", "results", "scheme") if k not in results]
        if isinstance(results, dict)
        else ["train_len", "corpus", "results", "scheme"]
    )
    if missing or not isinstance(results.get("corpus"), dict) or "fingerprint" not in results["corpus"]:
        raise ConfigError(
            f"{path} is not a rope-lm results file (it lacks {', '.join(missing) or 'corpus.fingerprint'})."
        )
    key = GroupKey(
        fingerprint=str(results["corpus"]["fingerprint"]),
        split=str((results.get("eval") or {}).get("split", "test")),
        tokenizer=tokenizer_id(results.get("config") or {}),
        train_len=int(results["train_len"]),
        protocol=_protocol(results),
    )
    run = Run(path=path, results=results, key=key)
    by_method = {}
    for row in results["results"]:
        by_method.setdefault(row["method"], {})[int(row["length"])] = row
    config = results.get("config") or {}
    seed = config.get("seed")
    setting = settings_key(config, NOT_A_SETTING)
    run.series = [
        Series(
            run_dir=run.dir,
            scheme=results["scheme"],
            method=m,
            train_len=key.train_len,
            rows=rows,
            seed=seed,
            setting=f"{results['scheme']}|{m}|{setting}",
            flat_config=flat_settings(config),
            train_pos=train_positions_label(config.get("train_pos")),
        )
        for m, rows in by_method.items()
    ]
    for s in run.series:
        s.reference_ppl = _reference(s, run.series)
        s.reference_self = s.ppl(s.train_len) is not None
    return run


def _protocol(results: dict) -> str:
    """The evaluation protocol, with the sliding stride (different strides
    are different measurements)."""
    ev = results.get("eval") or {}
    protocol = str(ev.get("protocol", "stream"))
    return f"sliding{ev.get('sliding_stride')}" if protocol == "sliding" else protocol


def _reference(s: Series, siblings: list[Series]) -> float | None:
    for cand in [s] + [x for x in siblings if x.method == "none"] + siblings:
        if cand.ppl(s.train_len) is not None:
            return cand.ppl(s.train_len)
    return None


def _number(v: str | None) -> float | None:
    """A CSV cell as a float, None where it is empty."""
    return float(v) if v not in ("", None) else None


def reference_row(row: dict) -> bool:
    """A row of compare.csv (cells as written or as numbers) that a reference
    run, trained longer than its table (references=), wrote: trained_at is its
    own training length, train_len the table's."""
    trained_at = _number(row.get("trained_at"))
    return trained_at is not None and trained_at != _number(row.get("train_len"))


CSV_NAME = "compare.csv"
CSV_FLOATS = ("ppl", "ppl_lo", "ppl_hi", "ppl_rel_lo", "ppl_rel_hi", "ppl_within", "ppl_beyond", "loss")


def csv_spec(path: str) -> tuple[str, list[str] | None] | None:
    """A committed comparison named as an input, `<dir>/compare.csv` or
    `<dir>/compare.csv:label,label` (only those rows): (file, labels), or None
    for any other path."""
    file, sep, labels = path.partition(f"{CSV_NAME}:")
    if sep:
        return file + CSV_NAME, [x for x in labels.split(",") if x]
    return (path, None) if os.path.basename(path) == CSV_NAME else None


def load_csv_runs(path: str, labels: list[str] | None = None) -> list[Run]:
    """A committed compare.csv's rows as runs, one per run folder (which may be
    gone: the CSV is what is left of it). Their labels are kept as written; the
    relative-PPL intervals are the CSV's, each against the series' own PPL at
    L_train. Lets a new run join a table whose runs were deleted. The CSV has
    no settings, so its seed replicas are rows of their own, not aggregated
    again, and no per-position curves are drawn for them."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"{path} does not exist (resolved from {os.getcwd()}); name a compare.csv written by scripts/compare.py."
        )
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    lacking = [
        c
        for c in ("label", "scheme", "method", "train_len", "length", "ppl", "corpus", "split", "tokenizer", "run_dir")
        if rows and c not in rows[0]
    ]
    if not rows or lacking:
        raise ConfigError(
            f"{path} is not a compare.csv with rows ({'no rows' if not rows else 'it lacks ' + ', '.join(lacking)}); "
            f"regenerate it with scripts/compare.py."
        )
    if labels:
        missing = [x for x in labels if x not in {r["label"] for r in rows}]
        if missing:
            raise ConfigError(
                f"{path} has no row labelled {', '.join(missing)} (it has: "
                f"{', '.join(dict.fromkeys(r['label'] for r in rows))})."
            )
        rows = [r for r in rows if r["label"] in labels]
    runs: dict[tuple, Run] = {}
    for r in rows:
        r["run_dir"] = os.path.abspath(r["run_dir"])  # written relative to the working directory (files.from_here)
        key = GroupKey(
            fingerprint=r["corpus"],
            split=r["split"],
            tokenizer=r["tokenizer"],
            train_len=int(float(r["train_len"])),
            protocol=r.get("protocol") or "stream",
        )
        run = runs.setdefault(
            (r["run_dir"], key),
            Run(path=os.path.join(r["run_dir"], RESULTS_JSON), results={"committed": path}, key=key),
        )
        series = next((s for s in run.series if s.given_label == r["label"]), None)
        if series is None:
            seed = r.get("seed")
            series = Series(
                run_dir=r["run_dir"],
                scheme=r["scheme"],
                method=r["method"],
                train_len=key.train_len,
                rows={},
                given_label=r["label"],
                seed=int(seed) if seed not in ("", None) else None,
                setting=f"{path}|{r['label']}",
                train_pos=r.get("train_pos") or "none",
            )
            run.series.append(series)
        row = {k: _number(r.get(k)) for k in CSV_FLOATS}
        row.update(
            tokens=int(float(r["tokens"])) if r.get("tokens") else None,
            documents=int(float(r["documents"])) if r.get("documents") else None,
            protocol=r.get("protocol") or "stream",
            length=int(r["length"]),
        )
        series.rows[int(r["length"])] = row
    for run in runs.values():
        for s in run.series:
            s.reference_ppl = _reference(s, run.series)
            s.reference_self = s.ppl(s.train_len) is not None
    return list(runs.values())


def load_runs(paths: list[str]) -> tuple[list[Run], list[str]]:
    """The runs with at least one evaluated length, and a note on every job
    that is not complete: failed (and why), interrupted, half-evaluated,
    stopped before writing results, or with a results.json that cannot be
    read (half-written by a killed process, or not rope-lm's). None is
    dropped silently, and one bad file never hides the others. A committed
    compare.csv among the paths gives its rows (load_csv_runs)."""
    committed = [load_csv_runs(*csv_spec(p)) for p in paths if csv_spec(p)]
    paths = [p for p in paths if not csv_spec(p)]
    if not paths:
        return [r for runs in committed for r in runs], []
    runs, notes = [r for runs in committed for r in runs], {}
    states = {j["dir"]: j for j in sweep_jobs(paths)}
    for d, job in states.items():
        if job["state"] != "complete":
            notes[d] = f"{job['state'].upper()}: `{_short(d)}`: {job['detail']}"
    for p in find_results(paths):
        d = os.path.dirname(p)
        job = states.get(d)
        if job is not None and job["state"] == "failed":
            continue  # listed with its error above
        try:
            run = load_run(p)
        except ConfigError as e:
            notes[d] = f"UNREADABLE: `{_short(d)}`: {e}"
            continue
        if run.series:
            runs.append(run)
        elif job is None:
            status = run.results.get("status", "no status")
            notes[d] = f"{d}: no evaluated lengths ({status})"
    skipped = list(notes.values())
    if not runs:
        raise ConfigError(
            f"None of the {len(skipped)} results file(s) is readable and holds an evaluated length yet "
            f"({'; '.join(skipped[:3])}{' ...' if len(skipped) > 3 else ''}); wait for the runs to "
            f"finish or rerun their evaluation."
        )
    return runs, skipped


def add_references(groups: list[Group], references: list[Run]):
    """Each reference run (trained at another, longer length: the train-long
    upper bound) joins every group of its corpus, split, tokenizer and
    protocol trained shorter, as rows at the group's lengths: PPL as
    evaluated, relative to its own PPL at the group's L_train. A reference
    that joins no group is refused."""
    for ref in references:
        joined = False
        for g in groups:
            k, lengths = g.key, set(g.lengths)
            if (ref.key.fingerprint, ref.key.split, ref.key.tokenizer, ref.key.protocol) != (
                k.fingerprint,
                k.split,
                k.tokenizer,
                k.protocol,
            ) or ref.key.train_len <= k.train_len:
                continue
            copies = [
                replace(
                    s,
                    train_len=k.train_len,
                    trained_at=s.train_len,
                    reference_self=False,
                    reference_ppl=s.ppl(k.train_len),
                    rows={L: r for L, r in s.rows.items() if L in lengths},
                )
                for s in ref.series
                if s.ppl(k.train_len) is not None
            ]
            if copies:
                g.runs.append(Run(path=ref.path, results=ref.results, key=k, series=copies))
                joined = True
        if not joined:
            same_text = [
                g
                for g in groups
                if (ref.key.fingerprint, ref.key.split, ref.key.protocol)
                == (g.key.fingerprint, g.key.split, g.key.protocol)
            ]
            why = (
                f" Its tokenizer ({ref.key.tokenizer}) is not the table's ({same_text[0].key.tokenizer}), so it "
                f"cuts this text into other tokens than the table's models (a BPE trained on another split: 'of' "
                f"names it): train the reference on the table's own split and tokenizer."
                if same_text and same_text[0].key.tokenizer != ref.key.tokenizer
                else ""
            )
            raise ConfigError(
                f"The reference run {_short(ref.dir)} ({ref.key.describe()}) joins none of the compared tables: a "
                f"reference must share a table's corpus, split, tokenizer and protocol, be trained longer than it, "
                f"and be evaluated at its L_train. The tables: {'; '.join(g.key.describe() for g in groups)}.{why}"
            )


def group_runs(runs: list[Run], group: bool, references: list[Run] = ()) -> list[Group]:
    keys = list(dict.fromkeys(r.key for r in runs))
    if len(keys) > 1 and not group:
        parts = []
        for k in keys:
            members = [_short(r.dir) for r in runs if r.key == k]
            parts.append(f"[{k.describe()}: {', '.join(members[:4])}{' ...' if len(members) > 4 else ''}]")
        diff = [
            name
            for name, vals in (
                ("corpus/split", {(k.fingerprint, k.split) for k in keys}),
                ("tokenizer", {k.tokenizer for k in keys}),
                ("training length", {k.train_len for k in keys}),
                ("evaluation protocol", {k.protocol for k in keys}),
            )
            if len(vals) > 1
        ]
        raise ConfigError(
            f"These runs differ in {' and '.join(diff)}, so their perplexities are not comparable in one table: "
            f"{' '.join(parts)}. Compare runs of one setting, or pass group=true for one table and plot per setting."
        )
    groups = [Group(k, [r for r in runs if r.key == k]) for k in keys]
    add_references(groups, list(references))
    for g in groups:
        _label(g)
    return groups


def _short(path: str) -> str:
    parts = os.path.normpath(path).split(os.sep)
    return os.sep.join(parts[-2:])


def _label(g: Group):
    """scheme ([train: its training-time position method]) (+ method unless
    direct); where two series would share a name, the settings their runs
    differ in, else their folders (rope_lm.compare.labels). A committed row keeps its
    label; a reference row says the length it was trained at."""
    for part in (
        [s for s in g.series if not s.given_label and s.trained_at is None],
        [s for s in g.series if not s.given_label and s.trained_at is not None],
    ):
        entries = [(0, run_name(s.scheme, s.method, s.train_pos), s.flat_config, s.run_dir, s.seed) for s in part]
        for s, label in zip(part, distinct_labels(entries)):
            s.label = label + ("" if s.trained_at is None else f" (trained at {s.trained_at})")
    given = {s.given_label for s in g.series if s.given_label}
    for s in g.series:
        if s.given_label:
            s.label = s.given_label
        elif s.label in given:  # a new run beside a committed row of its name (a re-run): its folder tells them apart
            s.label += f" ({_short(s.run_dir)})"


# --- views ----------------------------------------------------------------------


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if v >= 1e6:
        return f"{v:.3g}"
    return f"{v:.0f}" if v >= 1000 else f"{v:.2f}"


def _rel(s: Series, L: int):
    p = s.ppl(L)
    return None if p is None or not s.reference_ppl else p / s.reference_ppl


def _rel_ci(s: Series, L: int) -> tuple:
    """The evaluation's own interval of the relative PPL, valid only where the
    reference is the series' own PPL at L_train (as the evaluation computed it)."""
    row = s.rows.get(L) or {}
    if not s.reference_self:
        return None, None
    return row.get("ppl_rel_lo"), row.get("ppl_rel_hi")


def _with_ci(v, lo, hi) -> str:
    if v is None or lo is None or hi is None:
        return _fmt(v)
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"


def _noise_flag(g: Group, row, L):
    judged = g.best_and_peers(L)
    if judged is None or row.ppl(L) is None or row.noise(L) is None or getattr(row, "trained_at", None) is not None:
        return None  # not judged (a reference row is no contender)
    return id(row) in judged[1]


def markdown(groups: list[Group], skipped: list[str], title: str) -> str:
    out = [f"# {title}", ""]
    for n, g in enumerate(groups, 1):
        lengths, L0 = g.lengths, g.key.train_len
        columns = ["run"] + [f"{L} ({L / L0:g}×)" for L in lengths]

        def table(cell):
            return markdown_table(columns, [[s.label] + [cell(s, L) for L in lengths] for s in g.series])

        # Under the documents protocol each length scores its own number of tokens; only a
        # difference between runs at the same length means they scored different amounts of text.
        per_length = {L: {s.rows[L]["tokens"] for s in g.series if L in s.rows} for L in lengths}
        tokens = sorted(set().union(*[v for v in per_length.values() if len(v) > 1]))
        prefix = f"## Group {n}: " if len(groups) > 1 else "## "
        out += [f"{prefix}{g.key.describe()}", ""]
        out += [f"{len(g.runs)} run(s): " + ", ".join(f"`{_short(r.dir)}`" for r in g.runs), ""]
        refs = [s.label for s in g.series if s.trained_at is not None]
        if refs:
            out += [
                f"Reference rows, trained at a longer length (every length here inside it): {', '.join(refs)}. "
                f"An upper bound for a model trained at {L0}; not ranked among the runs. Relative PPL: against "
                f"its own PPL at {L0}.",
                "",
            ]
        if len(tokens) > 1:
            out += [
                f"**Note:** the runs scored different numbers of target tokens ({', '.join(map(str, tokens))}): "
                f"the same test text, but not the same amount of it.",
                "",
            ]

        def ppl_cell(s, L):
            row = s.rows.get(L) or {}
            return _with_ci(s.ppl(L), row.get("ppl_lo"), row.get("ppl_hi"))

        has_ci = any(s.noise(L) for s in g.series for L in s.rows)
        out += ["### PPL", ""]
        if has_ci:
            out += ["Brackets: 95% bootstrap interval of each run's evaluation.", ""]
        out += [
            table(ppl_cell),
            "",
            f"### PPL relative to the same run's PPL at L_train = {L0}",
            "",
            "1.00 = as good as inside the training length; above 1 = worse.",
            "",
            table(lambda s, L: _with_ci(_rel(s, L), *_rel_ci(s, L))),
            "",
            f"### PPL of tokens at positions ≥ {L0} (past the training length)",
            "",
            table(lambda s, L: _fmt(s.rows[L].get("ppl_beyond") if L in s.rows else None)),
            "",
        ]
        out += _seed_section(g, lengths, columns)
        out += _noise_section(g, lengths)
        out += _window_section(g, lengths)
    if skipped:
        out += ["## Jobs not complete or not readable (shown above only where some lengths were evaluated)", ""]
        out += [f"- {s}" for s in skipped] + [""]
    return "\n".join(out)


def _seed_section(g: Group, lengths: list[int], columns: list[str]) -> list[str]:
    aggs = g.seed_aggregates()
    if not aggs:
        return []

    def cell(a, L):
        st = a.stats(L)
        return "" if st is None else f"{_fmt(st['mean'])} ± {_fmt(st['sd'])}"

    out = [
        "### PPL across seeds (mean ± sd)",
        "",
        "Runs that differ only in `seed`; sd across seeds (n − 1 in the denominator).",
        "",
        markdown_table(columns, [[a.label] + [cell(a, L) for L in lengths] for a in aggs]),
        "",
    ]
    for a in aggs:
        per = "; ".join(
            f"{L}: " + ", ".join(f"seed {k} {_fmt(v)}" for k, v in a.values(L).items()) for L in lengths if a.values(L)
        )
        out.append(f"- {a.label} — {per}")
    return out + [""]


def _noise_section(g: Group, lengths: list[int]) -> list[str]:
    lines = []
    for L in lengths:
        judged = g.best_and_peers(L)
        if judged is None:
            continue
        best, peers = judged
        others = [r.label for r in g.noise_rows() if id(r) in peers and r is not best]
        lines.append(
            f"- {L}: best {best.label} ({_fmt(best.ppl(L))}); within noise of it: "
            f"{', '.join(others) if others else 'none'}"
        )
    if not lines:
        return []
    return (
        [
            "### Within noise",
            "",
            "Rows whose noise intervals overlap the best row's (a run: its 95% bootstrap interval; "
            "a seed aggregate: mean ± 2 sd) cannot be told apart from it at that length.",
            "",
        ]
        + lines
        + [""]
    )


WINDOW_CONTROL = "window"  # the method whose series is the window-L control (attention cut to the last L keys)


def against_control(mine: tuple, control: tuple, shown: str, higher_is_better: bool) -> str:
    """A window-control verdict from two (lo, hi) intervals: **yes** where this run is better beyond
    both, no where worse beyond both, tied where they overlap."""
    above, below = mine[0] > control[1], mine[1] < control[0]
    better, worse = (above, below) if higher_is_better else (below, above)
    return f"**yes** ({shown})" if better else f"no ({shown})" if worse else f"tied ({shown})"


def _window_section(g: Group, lengths: list[int]) -> list[str]:
    """Does each series use the context past L? Its PPL relative to its own at
    L_train against the window-L control's (a model that reads nothing past
    L), at each length past L_train: below beyond both 95% intervals (yes),
    above beyond them (no), or within them (tied)."""
    L0 = g.key.train_len
    controls = [s for s in g.series if s.method == WINDOW_CONTROL and s.reference_self]
    if len(controls) != 1:
        return []
    control, past = controls[0], [L for L in lengths if L > L0]

    def cell(s, L):
        a, b = _rel_ci(s, L), _rel_ci(control, L)
        if None in a or None in b:
            return "–"
        return against_control(a, b, f"{_fmt(_rel(s, L))} vs {_fmt(_rel(control, L))}", higher_is_better=False)

    # Reference rows (trained longer) are read on absolute PPL above: relative to their own PPL at L_train,
    # a length they were not trained at, they say nothing about reading past it.
    rows = [[s.label] + [cell(s, L) for L in past] for s in g.series if s is not control and s.trained_at is None]
    if not past or not rows:
        return []
    return [
        f"### Against the window-L control ({control.label})",
        "",
        f"Does a run use the context past L_train = {L0}? Its PPL relative to its own at L_train against "
        f"{control.label}'s, a model whose attention is cut to the last {L0} keys and so reads nothing past "
        f"them: **yes** where it is lower beyond both 95% intervals, no where higher beyond them, tied within "
        f"them. A flat curve alone is what the control gives too.",
        "",
        markdown_table(["run"] + [f"{L} ({L / L0:g}×)" for L in past], rows),
        "",
    ]


def csv_rows(groups: list[Group]) -> list[dict]:
    rows = []
    multi = len(groups) > 1
    for g in groups:
        for s in g.series:
            for L in sorted(s.rows):
                r = s.rows[L]
                rel_lo, rel_hi = _rel_ci(s, L)
                rows.append(
                    {
                        "group": g.key.slug() if multi else "",
                        "label": s.label,
                        "scheme": s.scheme,
                        "method": s.method,
                        "seed": s.seed,
                        "train_len": s.train_len,
                        "length": L,
                        "ratio": L / s.train_len,
                        "ppl": r.get("ppl"),
                        "ppl_lo": r.get("ppl_lo"),
                        "ppl_hi": r.get("ppl_hi"),
                        "ppl_rel": _rel(s, L),
                        "ppl_rel_lo": rel_lo,
                        "ppl_rel_hi": rel_hi,
                        "ppl_within": r.get("ppl_within"),
                        "ppl_beyond": r.get("ppl_beyond"),
                        "loss": r.get("loss"),
                        "tokens": r.get("tokens"),
                        "documents": r.get("documents"),
                        "protocol": r.get("protocol", "stream"),
                        "within_noise_of_best": _noise_flag(g, s, L),
                        "corpus": g.key.fingerprint,
                        "split": g.key.split,
                        "tokenizer": g.key.tokenizer,
                        "run_dir": from_here(s.run_dir),
                        "train_pos": s.train_pos,
                        "trained_at": s.trained_at or s.train_len,
                    }
                )
    return rows


def seed_rows(groups: list[Group]) -> list[dict]:
    rows = []
    multi = len(groups) > 1
    for g in groups:
        for a in g.seed_aggregates():
            for L in g.lengths:
                st = a.stats(L)
                if st is None:
                    continue
                lo, hi = a.noise(L)
                values, rel = a.values(L), a.stats(L, relative_to=g.key.train_len)
                rows.append(
                    {
                        "group": g.key.slug() if multi else "",
                        "label": a.label,
                        "scheme": a.scheme,
                        "method": a.method,
                        "train_len": g.key.train_len,
                        "length": L,
                        "n_seeds": st["n"],
                        "seeds": ";".join(str(k) for k in values),
                        "ppl_mean": st["mean"],
                        "ppl_sd": st["sd"],
                        "ppl_min": st["min"],
                        "ppl_max": st["max"],
                        "noise_lo": lo,
                        "noise_hi": hi,
                        "rel_mean": rel and rel["mean"],
                        "rel_sd": rel and rel["sd"],
                        "per_seed": ";".join(f"{k}={v!r}" for k, v in values.items()),
                        "within_noise_of_best": _noise_flag(g, a, L),
                        "run_dirs": ";".join(from_here(s.run_dir) for s in a.members),
                    }
                )
    return rows


def to_csv(rows: list[dict], columns: list[str] = CSV_COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _styles(series: list[Series]):
    """A colour per series, except that a method's variants (`ntk` and
    `ntk+logn`) share one and differ in dash, so they read as a pair, and
    seed replicas (the same setting, another seed) share one and differ in
    dash, so a scheme's seeds read as one colour. Past ten colours, a new dash
    pattern keeps colours apart."""
    dashes = ["-", "--", ":", "-."]
    colours, variants, replicas, out = {}, {}, {}, []
    for s in series:
        modifiers = s.method.partition("+")[2]
        base = s.label[: -len(modifiers) - 1] if modifiers and s.label.endswith("+" + modifiers) else s.label
        key = ("seeds", s.setting) if s.seed is not None and s.setting and s.trained_at is None else base
        replica = replicas[key] = replicas.get(key, -1) + 1  # 0 for a key's first series
        c = colours.setdefault(key, len(colours))
        v = variants.setdefault(modifiers, len(variants))
        out.append((f"C{c % 10}", dashes[(c // 10 + v + replica) % len(dashes)]))
    return out


def _group_plot(g: Group, path: str, heading: str, xlabel: str, ylabel: str, draw, ylog: bool = False):
    """One figure for a group: draw(ax, series, colour, dash) per series, then
    the L_train line, log-2 x axis, labels, legend outside, and the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 5))
    try:
        for s, (color, dash) in zip(g.series, _styles(g.series)):
            draw(ax, s, color, dash)
        ax.axvline(g.key.train_len, color="grey", linestyle="--", linewidth=1, label=f"L_train = {g.key.train_len}")
        ax.set_xscale("log", base=2)
        if ylog:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{heading} — {g.key.describe()}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        save_figure(fig, path, palette=True)
    finally:
        plt.close(fig)


def plot_ppl(g: Group, path: str, title: str):
    def draw(ax, s, color, dash):
        Ls = sorted(L for L in s.rows if s.ppl(L) is not None)
        ax.plot(Ls, [s.ppl(L) for L in Ls], marker="o", markersize=4, color=color, linestyle=dash, label=s.label)
        band = [L for L in Ls if s.noise(L)]
        if band:
            ax.fill_between(
                band, [s.noise(L)[0] for L in band], [s.noise(L)[1] for L in band], color=color, alpha=0.15, linewidth=0
            )

    _group_plot(
        g,
        path,
        f"{title}\nPPL vs evaluation length (bands: 95% interval)",
        "evaluation length (tokens, log scale)",
        "perplexity (log scale)",
        draw,
        ylog=True,
    )


def plot_per_position(g: Group, path: str, title: str):
    """Mean token loss by position in the window, at each series' longest
    evaluated length: where (not only how much) a model breaks."""

    def draw(ax, s, color, dash):
        L = max(s.rows)
        pp = s.rows[L].get("per_position")
        if pp:
            ax.plot(*log_binned(pp, L), marker=".", color=color, linestyle=dash, label=f"{s.label} (L={L})")

    _group_plot(
        g,
        path,
        f"{title}\nper-position loss at the longest length",
        "position in the evaluation window (tokens, log scale; 4 bins per doubling)",
        "mean token loss (nats)",
        draw,
    )


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
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"Cannot create the output directory {out_dir} ({e.strerror}); pass out= a writable place."
        ) from None
    title = title or f"Comparison: {study_name(paths, runs)}"
    rows = csv_rows(groups)
    files = {"markdown": os.path.join(out_dir, "compare.md"), "csv": os.path.join(out_dir, "compare.csv"), "plots": []}
    atomic_write(files["markdown"], markdown(groups, skipped, title))
    atomic_write(files["csv"], to_csv(rows))
    seeds = seed_rows(groups)
    if seeds:
        files["seeds_csv"] = os.path.join(out_dir, "compare_seeds.csv")
        atomic_write(files["seeds_csv"], to_csv(seeds, SEED_COLUMNS))
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
        "runs": runs,
        "skipped": skipped,
        "title": title,
        "study": study_name(paths, runs),
    }


# --- wandb ------------------------------------------------------------------------


def log_to_wandb(summary: dict, project: str | None = None, group: str | None = None, mode: str = "auto") -> str | None:
    """One summary run (job_type 'compare') in the study's wandb group: the
    comparison table, a PPL-vs-length chart per group and the PNG plots.
    Returns the local run directory when the run was offline (to sync later)."""
    import wandb

    from rope_lm.train.loggers import wandb_mode

    runs = summary["runs"]
    projects = {((r.results.get("config") or {}).get("logger") or {}).get("project") for r in runs} - {None}
    project = project or (projects.pop() if len(projects) == 1 else "rope-lm")
    group = group or summary["study"]
    mode = wandb_mode(mode)
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(
        project=project,
        group=group,
        job_type="compare",
        name=f"compare: {group}",
        dir=summary["out_dir"],
        mode=mode,
        reinit="finish_previous",
        tags=["compare"] + sorted({f"L{r.key.train_len}" for r in runs}),
        config={"runs": [r.dir for r in runs], "groups": [g.key.describe() for g in summary["groups"]]},
    )
    try:
        table = wandb.Table(columns=CSV_COLUMNS, data=[[row[c] for c in CSV_COLUMNS] for row in summary["rows"]])
        payload = {"compare/table": table}
        for g, plots in zip(summary["groups"], summary["files"]["plots"]):
            prefix = f"compare/{g.key.slug()}" if len(summary["groups"]) > 1 else "compare"
            series = [s for s in g.series if s.rows]
            payload[f"{prefix}/ppl_vs_length_chart"] = wandb.plot.line_series(
                xs=[sorted(s.rows) for s in series],
                ys=[[s.ppl(L) for L in sorted(s.rows)] for s in series],
                keys=[s.label for s in series],
                title=f"PPL vs evaluation length ({g.key.describe()})",
                xname="length",
            )
            payload[f"{prefix}/ppl_vs_length"] = wandb.Image(plots["ppl_vs_length"])
            payload[f"{prefix}/per_position"] = wandb.Image(plots["per_position"])
        run.log(payload)
        offline_dir = os.path.dirname(run.dir) if mode == "offline" and getattr(run, "dir", None) else None
    finally:
        run.finish()
    return offline_dir


def has_results(paths: list[str]) -> bool:
    """Whether any results.json (a perplexity run) or committed compare.csv is named or lies under paths."""
    return any(
        csv_spec(p)
        or (
            os.path.basename(p) == RESULTS_JSON
            if os.path.isfile(p)
            else os.path.isdir(p) and files_named(p, RESULTS_JSON)
        )
        for p in paths
    )
