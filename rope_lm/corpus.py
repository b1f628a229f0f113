"""Text sources -> documents, split into train / valid / test.

Sources: the Python standard library's own source code (the zero-download
default), local text / JSONL / parquet files, and any Hugging Face dataset.
Each yields documents as strings; ``fingerprint`` identifies the exact text.
"""

from dataclasses import dataclass, field
import glob
import hashlib
import json
import logging
import os
import re
import sys
import sysconfig

from rope_lm.errors import ConfigError

log = logging.getLogger("rope_lm.corpus")

SPLITS = ("train", "valid", "test")
SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "val": "valid", "dev": "valid", "test": "test"}
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class SourceConfig:
    source: str = "stdlib"  # stdlib | files | hub
    path: str | None = None  # files: a file, a directory or a glob; also overrides a hub source
    hf_name: str | None = None
    hf_config: str | None = None
    text_field: str = "text"
    doc_start: str | None = None  # regex: a line matching it starts a new document
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    max_docs: int | None = None  # per split, for quick runs on big corpora
    skip_bad_records: bool = False  # a JSONL/parquet record without usable text: refuse (false) or skip and count
    extra: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "files" if self.path else self.source

    def validate(self):
        if self.kind not in READERS:
            raise ConfigError(f"data.source={self.source!r} is not a source; use one of {', '.join(READERS)}.")
        for key in ("valid_fraction", "test_fraction"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a fraction within [0, 1).")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ConfigError(f"data.valid_fraction + data.test_fraction = {self.valid_fraction + self.test_fraction:g} "
                              f"leaves nothing to train on; keep the sum below 1 (0.05 + 0.05 is typical).")
        if self.max_docs is not None and self.max_docs <= 0:
            raise ConfigError(f"data.max_docs={self.max_docs} must be a positive integer (or null for all).")


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def _stable_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")


def assign_splits(keys: list[str], valid_fraction: float, test_fraction: float) -> dict[str, list[int]]:
    """Split items by a stable hash of their key: rank by hash, the first
    ceil(test_fraction * n) go to test, the next to valid. Ranking (rather than
    thresholds) keeps small corpora from ending up with an empty split."""
    n = len(keys)
    order = sorted(range(n), key=lambda i: (_stable_hash(keys[i]), keys[i]))
    n_test = min(n, -(-int(round(test_fraction * n * 1e6)) // 1_000_000)) if test_fraction > 0 else 0
    n_valid = min(n - n_test, -(-int(round(valid_fraction * n * 1e6)) // 1_000_000)) if valid_fraction > 0 else 0
    out = {"test": order[:n_test], "valid": order[n_test : n_test + n_valid], "train": order[n_test + n_valid :]}
    return {k: sorted(v) for k, v in out.items()}


def _split_docs(text: str, doc_start: str | None) -> list[str]:
    if not doc_start:
        return [text]
    parts = re.split(f"(?m)^(?={doc_start})", text)
    return [p for p in parts if p.strip()]


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"The data file {path} is not valid UTF-8 ({e.reason} at byte {e.start}). "
            f"Convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or remove it from `data.path`."
        ) from None


def _bad_record(path: str, where: str, problem: str, text_field: str, skip: bool, skipped: list) -> None:
    if not skip:
        raise ConfigError(
            f"{path}, {where}: {problem}. Every record needs a string in its {text_field!r} field (setting "
            f"`data.text_field`). Fix or remove the record, or set data.skip_bad_records=true to skip such records "
            f"(the log says how many)."
        )
    skipped.append(where)


def _record_text(row, path: str, where: str, text_field: str, skip: bool, skipped: list) -> str | None:
    """The text of one record, or None when it is skipped; never str(None)."""
    if not isinstance(row, dict):
        _bad_record(path, where, f"the record is a JSON {type(row).__name__}, not an object", text_field, skip, skipped)
        return None
    if text_field not in row:
        _bad_record(path, where, f"the record has no field {text_field!r} (its fields: {', '.join(row) or 'none'})",
                    text_field, skip, skipped)
        return None
    value = row[text_field]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        _bad_record(path, where, f"the field {text_field!r} is {kind}, not a string", text_field, skip, skipped)
        return None
    return value


def _units_of_file(path: str, text_field: str, skip_bad: bool = False) -> list[str]:
    """The texts a file holds: the whole file, or one per JSONL line / parquet
    row, each record checked as it is read."""
    if path.endswith(".txt"):
        return [_read_text(path)]
    out, skipped = [], []
    if path.endswith(".jsonl"):
        for n, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                _bad_record(path, f"line {n}", f"the line is not valid JSON ({e.msg})", text_field, skip_bad, skipped)
                continue
            text = _record_text(row, path, f"line {n}", text_field, skip_bad, skipped)
            if text is not None:
                out.append(text)
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if text_field not in table.column_names:
            raise ConfigError(f"{path} has no column {text_field!r} (setting `data.text_field`); its columns are {', '.join(table.column_names)}.")
        for n, value in enumerate(table.column(text_field).to_pylist()):
            text = _record_text({text_field: value}, path, f"row {n}", text_field, skip_bad, skipped)
            if text is not None:
                out.append(text)
    if skipped:
        log.warning("Skipped %d bad record(s) of %s (data.skip_bad_records=true): %s%s", len(skipped), path,
                    ", ".join(skipped[:5]), " ..." if len(skipped) > 5 else "")
    return out


def _expand_path(path: str) -> list[str]:
    path = os.path.expanduser(path)
    if any(c in path for c in "*?["):
        files = sorted(glob.glob(path, recursive=True))
    elif os.path.isdir(path):
        files = sorted(
            os.path.join(root, f) for root, _, fs in os.walk(path) for f in fs
        )
    elif os.path.isfile(path):
        files = [path]
    else:
        raise ConfigError(
            f"data.path={path!r} does not exist (resolved from {os.getcwd()}). Give a file, a directory or a glob "
            f"of {', '.join(TEXT_SUFFIXES)} files."
        )
    files = [f for f in files if f.endswith(TEXT_SUFFIXES)]
    if not files:
        raise ConfigError(f"data.path={path!r} holds no {', '.join(TEXT_SUFFIXES)} files; point it at text data.")
    return files


def _split_of_file(path: str) -> str | None:
    stem = os.path.basename(path).split(".")[0].lower()
    for part in re.split(r"[-_]", stem):
        if part in SPLIT_ALIASES:
            return SPLIT_ALIASES[part]
    return None


def _hash_split(items: list[tuple[str, str]], cfg: SourceConfig) -> dict[str, list[str]]:
    parts = assign_splits([k for k, _ in items], cfg.valid_fraction, cfg.test_fraction)
    return {s: [items[i][1] for i in idx] for s, idx in parts.items()}


def stdlib_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    root = stdlib_dir()
    items = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS)
        for f in sorted(filenames):
            if f.endswith(".py"):
                full = os.path.join(dirpath, f)
                with open(full, encoding="utf-8", errors="replace") as fh:
                    items.append((os.path.relpath(full, root).replace(os.sep, "/"), fh.read()))
    return _hash_split(items, cfg)


def file_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    files = _expand_path(cfg.path)
    by_split = {f: _split_of_file(f) for f in files}
    if all(by_split.values()):
        # The files name their splits (train.txt, valid.txt, ...): keep them.
        docs = {s: [] for s in SPLITS}
        for f in files:
            for unit in _units_of_file(f, cfg.text_field, cfg.skip_bad_records):
                docs[by_split[f]].extend(_split_docs(unit, cfg.doc_start))
        return docs
    items = []
    for f in files:
        for n, unit in enumerate(_units_of_file(f, cfg.text_field, cfg.skip_bad_records)):
            for m, doc in enumerate(_split_docs(unit, cfg.doc_start)):
                items.append((f"{os.path.relpath(f, cfg.path) if os.path.isdir(cfg.path) else os.path.basename(f)}#{n}#{m}", doc))
    return _hash_split(items, cfg)


def hub_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    """Load a Hugging Face dataset by name (and config) with datasets.load_dataset.

    Named splits are used as they are (validation -> valid); a dataset with only
    a train split is split by a stable hash of the row index. With doc_start,
    the rows of a split are joined and re-split into documents (WikiText stores
    one line per row)."""
    import datasets

    if not cfg.hf_name:
        raise ConfigError("data.source=hub needs data.hf_name, the dataset's name on the Hugging Face hub (or a local dataset script / directory).")
    try:
        ds = datasets.load_dataset(cfg.hf_name, cfg.hf_config, **cfg.extra)
    except Exception as e:  # the hub raises many types; all mean "could not load"
        raise ConfigError(
            f"Could not load the Hugging Face dataset {cfg.hf_name!r} (config {cfg.hf_config!r}): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Without network access, set data.path to a local copy "
            f"(text / JSONL / parquet files)."
        ) from None
    docs = {s: [] for s in SPLITS}
    named = {SPLIT_ALIASES.get(name): name for name in ds}
    for split, name in named.items():
        if split is None:
            continue
        column = ds[name]
        if cfg.text_field not in column.column_names:
            raise ConfigError(f"Dataset {cfg.hf_name!r} has no column {cfg.text_field!r} (setting `data.text_field`); its columns are {', '.join(column.column_names)}.")
        rows = column[cfg.text_field]
        docs[split] = _split_docs("".join(r if r.endswith("\n") else r + "\n" for r in rows), cfg.doc_start) if cfg.doc_start else list(rows)
    if not docs["valid"] and not docs["test"]:
        docs = _hash_split([(str(i), d) for i, d in enumerate(docs["train"])], cfg)
    elif not docs["valid"] or not docs["test"]:
        # One held-out split exists: share it rather than invent one from train.
        held = docs["valid"] or docs["test"]
        docs["valid"], docs["test"] = held, held
    return docs


def passkey_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    """Passkey-retrieval examples mixed into a base corpus (settings in data.extra; see rope_lm/passkey.py)."""
    from rope_lm.passkey import passkey_documents as read

    return read(cfg)


READERS = {"stdlib": stdlib_documents, "files": file_documents, "hub": hub_documents, "passkey": passkey_documents}


def load_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    if cfg.kind not in READERS:
        raise ConfigError(f"data.source={cfg.source!r} is not a source; use one of {', '.join(READERS)}.")
    docs = READERS[cfg.kind](cfg)
    if cfg.max_docs:
        docs = {s: d[: cfg.max_docs] for s, d in docs.items()}
    docs = {s: [d for d in docs.get(s, []) if d.strip()] for s in SPLITS}
    where = cfg.path or cfg.hf_name or stdlib_dir()
    for s in SPLITS:
        if not docs[s]:
            total = sum(len(v) for v in docs.values())
            raise ConfigError(
                f"The {s} split of the corpus ({cfg.kind}: {where}) is empty: {total} non-empty document(s) in all. "
                f"Give more text, or change data.valid_fraction / data.test_fraction "
                f"(or name files train/valid/test)."
            )
    return docs


def fingerprint(docs: dict[str, list[str]], cfg: SourceConfig) -> dict:
    h = hashlib.sha256()
    for s in SPLITS:
        h.update(f"<{s}:{len(docs[s])}>".encode())
        for d in docs[s]:
            h.update(hashlib.sha1(d.encode("utf-8", "surrogatepass")).digest())
    info = {
        "source": cfg.kind,
        "where": cfg.path or cfg.hf_name or stdlib_dir(),
        "fingerprint": h.hexdigest()[:16],
        "documents": {s: len(docs[s]) for s in SPLITS},
        "characters": {s: sum(len(d) for d in docs[s]) for s in SPLITS},
    }
    if cfg.kind == "stdlib":
        info["python_version"] = sys.version.split()[0]
    if cfg.kind == "hub":
        info["hf_config"] = cfg.hf_config
    return info
