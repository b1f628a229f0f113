"""Perplexity runs read for a comparison: results.json files (a run folder's,
a sweep's, or named) and committed compare.csv files, each into a Run of
Series keyed by what makes runs comparable (ppl_series.GroupKey). Every job
that is not complete is listed with why, never dropped silently."""

import csv
import json
import os

from rope_lm.compare.labels import NOT_A_SETTING, flat_settings
from rope_lm.compare.ppl_pairs import PAIRED_COLUMN, read_paired_cell
from rope_lm.compare.ppl_series import GroupKey, Run, Series
from rope_lm.compare.result_files import files_named, short_path
from rope_lm.core.errors import ConfigError
from rope_lm.eval.results import CONTROLS_SETTING, RESULTS_JSON
from rope_lm.runs.run_settings import settings_key, without
from rope_lm.runs.sweep import job_dirs, sweep_jobs
from rope_lm.train_positions import train_positions_label


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
    # Controls add rows on the same weights: runs that differ in them are the same experiment (seed replicas).
    config = without(results.get("config") or {}, [CONTROLS_SETTING])
    if config.get("eval") == {}:  # held the controls alone
        del config["eval"]
    seed = config.get("seed")
    setting = settings_key(config, NOT_A_SETTING)
    # An evaluation of a checkpoint records the weights in its config; a training run beside its results.
    identity = config.get("model_identity") or results.get("model_identity")
    model = json.dumps(identity, sort_keys=True) if identity else os.path.realpath(run.dir)
    ev = results.get("eval") or {}
    resampling = (int(ev.get("bootstrap") or 0), int(ev.get("seed") or 0))
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
            model=model,
            is_control=bool((results.get("methods") or {}).get(m, {}).get("control")),
            control_width=_control_width((results.get("methods") or {}).get(m, {}), key.train_len),
            resampling=resampling,
        )
        for m, rows in by_method.items()
    ]
    for s in run.series:
        s.reference_ppl = _reference(s, run.series)
        s.reference_self = s.ppl(s.train_len) is not None
    return run


def _control_width(method: dict, train_len: int) -> int | None:
    """The width of a window control cut narrower than the table's L (a model fine-tuned at 1,024 read against
    itself cut to its base's 64 keys), so its row says so; None for any other series."""
    width = method.get("window")
    return width if method.get("control") and isinstance(width, int) and width != train_len else None


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


def csv_number(v: str | None) -> float | None:
    """A CSV cell as a float, None where it is empty."""
    return float(v) if v not in ("", None) else None


def reference_row(row: dict) -> bool:
    """A row of compare.csv (cells as written or as numbers) that a reference
    run, trained longer than its table (references=), wrote: trained_at is its
    own training length, train_len the table's."""
    trained_at = csv_number(row.get("trained_at"))
    return trained_at is not None and trained_at != csv_number(row.get("train_len"))


CSV_NAME = "compare.csv"
CSV_FLOATS = ("ppl", "ppl_lo", "ppl_hi", "ppl_rel_lo", "ppl_rel_hi", "ppl_within", "ppl_beyond", "loss")


def csv_control(r: dict) -> dict:
    """A compare.csv row's control columns (ppl_csv.CONTROL_COLUMNS) as the `controls` entry of a result
    row, or {} where it has none."""
    name, ratio = r.get("control") or "", csv_number(r.get("control_ratio"))
    if not name or ratio is None:
        return {}
    paired = r.get("control_paired")
    return {
        "controls": {
            name: {
                "ratio": ratio,
                "lo": csv_number(r.get("control_ratio_lo")),
                "hi": csv_number(r.get("control_ratio_hi")),
                "paired": None if paired in ("", None) else paired == "True",
            }
        }
    }


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
        row = {k: csv_number(r.get(k)) for k in CSV_FLOATS}
        row.update(
            tokens=int(float(r["tokens"])) if r.get("tokens") else None,
            documents=int(float(r["documents"])) if r.get("documents") else None,
            protocol=r.get("protocol") or "stream",
            length=int(r["length"]),
            **csv_control(r),
        )
        if r.get(PAIRED_COLUMN):  # computed from units this CSV's folders kept, which may be gone: kept as written
            row[PAIRED_COLUMN] = read_paired_cell(r[PAIRED_COLUMN])
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
            notes[d] = f"{job['state'].upper()}: `{short_path(d)}`: {job['detail']}"
    for p in find_results(paths):
        d = os.path.dirname(p)
        job = states.get(d)
        if job is not None and job["state"] == "failed":
            continue  # listed with its error above
        try:
            run = load_run(p)
        except ConfigError as e:
            notes[d] = f"UNREADABLE: `{short_path(d)}`: {e}"
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
