"""Text sources -> a stream of documents, split into train / valid / test.

Sources: the Python standard library's own source code (the zero-download
default), local text / JSONL / parquet files, and any Hugging Face dataset.
Every source is *iterated*, one document (one file, one record, one Arrow
batch) at a time, so that a corpus far larger than memory can be read:

* ``scan`` reads the source once and keeps ~40 bytes per document (a hash of
  its id, a SHA-1 of its text, its length), from which the split of every
  document and the corpus ``fingerprint`` follow;
* ``routed_pieces`` reads it again and hands out ``(split mask, text, end)``
  pieces in source order, which is what the token cache is written from;
* ``quick_key`` identifies the source from file sizes, mtimes and sampled
  bytes, without reading all the text (fast reuse of a token cache).

A document is a string, or a ``TextFile`` (a whole .txt file, read in chunks
so that one huge file never has to be held in memory).
"""

from array import array
from dataclasses import dataclass, field
import glob
import hashlib
import json
import logging
import os
import re
import stat
import sys
import sysconfig

import numpy as np

from rope_lm.core.errors import ConfigError
from rope_lm.data import retrieval_mix
from rope_lm.tasks import passkey_text

log = logging.getLogger("rope_lm.data.corpus")

SPLITS = ("train", "valid", "test")
SPLIT_BITS = {"train": 1, "valid": 2, "test": 4}
SPLIT_ALIASES = {
    "train": "train",
    "valid": "valid",
    "validation": "valid",
    "val": "valid",
    "dev": "valid",
    "test": "test",
}
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
READ_CHARS = 1 << 20  # a .txt document is read in chunks of this many characters
SAMPLE_BYTES = 4096  # quick_key hashes this many bytes at a few places of every file


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

    @property
    def where(self) -> str:
        return self.path or self.hf_name or stdlib_dir()

    def validate(self):
        if self.kind not in READERS:
            raise ConfigError(f"data.source={self.source!r} is not a source; use one of {', '.join(READERS)}.")
        for key in ("valid_fraction", "test_fraction"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a fraction within [0, 1).")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ConfigError(
                f"data.valid_fraction + data.test_fraction = {self.valid_fraction + self.test_fraction:g} "
                f"leaves nothing to train on; keep the sum below 1 (0.05 + 0.05 is typical)."
            )
        if self.max_docs is not None and self.max_docs <= 0:
            raise ConfigError(f"data.max_docs={self.max_docs} must be a positive integer (or null for all).")
        if self.doc_start:
            try:
                re.compile(self.doc_start)
            except re.error as e:
                raise ConfigError(
                    f"data.doc_start={self.doc_start!r} is not a valid regular expression ({e}); "
                    f"give a pattern that matches the first line of a document, or null."
                ) from None


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def _stable_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")


def _split_sizes(n: int, valid_fraction: float, test_fraction: float) -> tuple[int, int]:
    n_test = min(n, -(-int(round(test_fraction * n * 1e6)) // 1_000_000)) if test_fraction > 0 else 0
    n_valid = min(n - n_test, -(-int(round(valid_fraction * n * 1e6)) // 1_000_000)) if valid_fraction > 0 else 0
    return n_valid, n_test


def split_by_hash(hashes: np.ndarray, valid_fraction: float, test_fraction: float) -> np.ndarray:
    """Split masks for items given the stable hashes of their ids: rank by hash,
    the first ceil(test_fraction * n) go to test, the next to valid. Ranking
    (rather than thresholds) keeps small corpora from ending up with an empty
    split; it needs only the 8-byte hashes in memory, not the ids."""
    n_valid, n_test = _split_sizes(len(hashes), valid_fraction, test_fraction)
    order = np.argsort(hashes, kind="stable")
    masks = np.full(len(hashes), SPLIT_BITS["train"], dtype=np.uint8)
    masks[order[:n_test]] = SPLIT_BITS["test"]
    masks[order[n_test : n_test + n_valid]] = SPLIT_BITS["valid"]
    return masks


def _doc_start_re(doc_start: str):
    return re.compile(f"(?m)^(?:{doc_start})")


def _split_lines(lines, doc_start: str):
    """Documents from an iterable of lines: a line matching doc_start starts a
    new one (the pattern is matched line by line, so it must not span lines)."""
    start, doc = _doc_start_re(doc_start), []
    for line in lines:
        if doc and start.match(line):
            text = "".join(doc)
            if text.strip():
                yield text
            doc = []
        doc.append(line)
    text = "".join(doc)
    if text.strip():
        yield text


def _keep_lines(text: str) -> list[str]:
    """Lines with their "\n" (only "\n" ends a line, as in the text files)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _utf8_error(path: str, e: UnicodeDecodeError) -> ConfigError:
    return ConfigError(
        f"The data file {path} is not valid UTF-8 ({e.reason} at byte {e.start}). "
        f"Convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or remove it from `data.path`."
    )


class TextFile:
    """A whole .txt file as one document, read in chunks on every iteration."""

    def __init__(self, path: str, errors: str = "strict"):
        self.path, self.errors = path, errors

    def __iter__(self):
        try:
            with open(self.path, encoding="utf-8", errors=self.errors) as f:
                for chunk in iter(lambda: f.read(READ_CHARS), ""):
                    yield chunk
        except UnicodeDecodeError as e:
            raise _utf8_error(self.path, e) from None


def _lines(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e) from None


def pieces_of(doc) -> list | TextFile:
    return [doc] if isinstance(doc, str) else doc


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
        _bad_record(
            path,
            where,
            f"the record has no field {text_field!r} (its fields: {', '.join(row) or 'none'})",
            text_field,
            skip,
            skipped,
        )
        return None
    value = row[text_field]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        _bad_record(path, where, f"the field {text_field!r} is {kind}, not a string", text_field, skip, skipped)
        return None
    return value


def _units_of_file(path: str, text_field: str, skip_bad: bool = False):
    """The texts a file holds, one at a time: the whole file (chunked), or one
    per JSONL line / parquet row, each record checked as it is read."""
    if path.endswith(".txt"):
        yield TextFile(path)
        return
    skipped = []
    if path.endswith(".jsonl"):
        for n, line in enumerate(_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                _bad_record(path, f"line {n}", f"the line is not valid JSON ({e.msg})", text_field, skip_bad, skipped)
                continue
            text = _record_text(row, path, f"line {n}", text_field, skip_bad, skipped)
            if text is not None:
                yield text
    else:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise ConfigError(
                f"{path} has no column {text_field!r} (setting `data.text_field`); its columns are {', '.join(pf.schema_arrow.names)}."
            )
        n = 0
        for batch in pf.iter_batches(batch_size=1024, columns=[text_field]):
            for value in batch.column(0).to_pylist():
                text = _record_text({text_field: value}, path, f"row {n}", text_field, skip_bad, skipped)
                n += 1
                if text is not None:
                    yield text
    if skipped:
        log.warning(
            "Skipped %d bad record(s) of %s (data.skip_bad_records=true): %s%s",
            len(skipped),
            path,
            ", ".join(skipped[:5]),
            " ..." if len(skipped) > 5 else "",
        )


def _not_regular(path: str) -> str | None:
    """What a path is when it is not a regular file (or a link to one), else
    None: reading a FIFO blocks until a writer comes, a device never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken link" if os.path.islink(path) else "unreadable"
    if stat.S_ISREG(mode):
        return None
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


_reported_skips: set[str] = set()


def _expand_path(path: str) -> list[str]:
    path = os.path.expanduser(path)
    if any(c in path for c in "*?["):
        files = sorted(glob.glob(path, recursive=True))
    elif os.path.isdir(path):
        files = sorted(os.path.join(root, f) for root, _, fs in os.walk(path) for f in fs)
    elif os.path.lexists(path):
        what = _not_regular(path)
        if what:
            raise ConfigError(
                f"data.path={path!r} is {what}, not a text file: give a regular file, a directory or "
                f"a glob of {', '.join(TEXT_SUFFIXES)} files."
            )
        files = [path]
    else:
        raise ConfigError(
            f"data.path={path!r} does not exist (resolved from {os.getcwd()}). Give a file, a directory or a glob "
            f"of {', '.join(TEXT_SUFFIXES)} files."
        )
    files = [f for f in files if f.endswith(TEXT_SUFFIXES)]
    skipped = [(f, what) for f in files if (what := _not_regular(f))]
    if skipped:
        files = [f for f in files if f not in dict(skipped)]
        news = [f"{f} ({what})" for f, what in skipped if f not in _reported_skips]
        _reported_skips.update(f for f, _ in skipped)
        if news:  # the listing runs more than once a run: say it once
            log.warning(
                "data.path=%s: skipping %d entr%s that %s not regular files: %s",
                path,
                len(news),
                "y" if len(news) == 1 else "ies",
                "is" if len(news) == 1 else "are",
                ", ".join(news),
            )
    if not files:
        raise ConfigError(f"data.path={path!r} holds no {', '.join(TEXT_SUFFIXES)} files; point it at text data.")
    return files


def _split_of_file(path: str) -> str | None:
    stem = os.path.basename(path).split(".")[0].lower()
    for part in re.split(r"[-_]", stem):
        if part in SPLIT_ALIASES:
            return SPLIT_ALIASES[part]
    return None


def _stdlib_files() -> list[str]:
    root, out = stdlib_dir(), []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS)
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return out


# A reader yields (key, splits, document): key identifies the document for the
# hash split (None when its split is given), splits is a mask of SPLIT_BITS or 0.


def stdlib_stream(cfg: SourceConfig):
    root = stdlib_dir()
    for full in _stdlib_files():
        yield os.path.relpath(full, root).replace(os.sep, "/"), 0, TextFile(full, errors="replace")


def file_stream(cfg: SourceConfig):
    files = _expand_path(cfg.path)
    named = {f: _split_of_file(f) for f in files}
    by_name = all(named.values())  # files named train/valid/test keep their split
    for f in files:
        rel = os.path.relpath(f, cfg.path) if os.path.isdir(cfg.path) else os.path.basename(f)
        for n, unit in enumerate(_units_of_file(f, cfg.text_field, cfg.skip_bad_records)):
            if cfg.doc_start:
                docs = _split_lines(_lines(f) if isinstance(unit, TextFile) else _keep_lines(unit), cfg.doc_start)
            else:
                docs = [unit]
            for m, doc in enumerate(docs):
                yield (None, SPLIT_BITS[named[f]], doc) if by_name else (f"{rel}#{n}#{m}", 0, doc)


def _load_hub(cfg: SourceConfig):
    import datasets

    if not cfg.hf_name:
        raise ConfigError(
            "data.source=hub needs data.hf_name, the dataset's name on the Hugging Face hub (or a local dataset script / directory)."
        )
    try:
        return datasets.load_dataset(cfg.hf_name, cfg.hf_config, **cfg.extra)
    except Exception as e:  # the hub raises many types; all mean "could not load"
        raise hub_failure(
            f"Could not load the Hugging Face dataset {cfg.hf_name!r} (config {cfg.hf_config!r})",
            e,
            "Without network access, set data.path to a local copy (text / JSONL / parquet files).",
        )


def hub_failure(what: str, e: Exception, remedy: str) -> ConfigError:
    """One paragraph for anything the Hugging Face hub raised."""
    first = str(e).splitlines()[0].rstrip(".") if str(e) else ""
    return ConfigError(f"{what}: {type(e).__name__}: {first}. {remedy}")


def _hub_rows(cfg: SourceConfig, split, name: str):
    """The texts of one split, an Arrow batch (or a streamed batch) at a time."""
    for batch in split.iter(batch_size=1000):
        if cfg.text_field not in batch:
            raise ConfigError(
                f"Dataset {cfg.hf_name!r} has no column {cfg.text_field!r} (setting `data.text_field`); "
                f"its columns are {', '.join(batch)}."
            )
        yield from batch[cfg.text_field]


def hub_stream(cfg: SourceConfig):
    """A Hugging Face dataset by name (and config) with datasets.load_dataset;
    data.extra is passed on, so data.extra.streaming=true streams it.

    Named splits are used as they are (validation -> valid); a dataset with only
    a train split is split by a stable hash of the document index; a dataset
    with one held-out split shares it between valid and test. With doc_start,
    the rows of a split are joined and re-split into documents (WikiText stores
    one line per row)."""
    ds = _load_hub(cfg)
    named = {SPLIT_ALIASES.get(name): name for name in ds}
    held = [s for s in ("valid", "test") if s in named]
    for split in SPLITS:
        if split not in named:
            continue
        mask = SPLIT_BITS[split] | (
            SPLIT_BITS["valid"] | SPLIT_BITS["test"] if len(held) == 1 and split != "train" else 0
        )
        rows = _hub_rows(cfg, ds[named[split]], named[split])
        if cfg.doc_start:
            rows = _split_lines((r if r.endswith("\n") else r + "\n" for r in rows), cfg.doc_start)
        for i, doc in enumerate(rows):
            yield (str(i), 0, doc) if not held else (None, mask, doc)


def passkey_stream(cfg: SourceConfig):
    """Passkey-retrieval examples mixed into a base corpus (settings in data.extra; see rope_lm/tasks/passkey_text.py)."""
    for split, docs in passkey_documents(cfg).items():
        for doc in docs:
            yield None, SPLIT_BITS[split], doc


def passkey_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    """The base corpus's splits (data.extra.base: stdlib, none, or a path of
    text files) with passkey examples added; deterministic in data.extra.seed."""
    o = passkey_text.corpus_options(cfg.extra or {})
    return passkey_text.mix_examples(_base_documents(cfg, o["base"]), o, cfg.valid_fraction, cfg.test_fraction)


def retrieval_mix_stream(cfg: SourceConfig):
    """The retrieval battery's tasks as training examples mixed into a base
    corpus (settings in data.extra; see rope_lm/data/retrieval_mix.py)."""
    for split, docs in retrieval_mix_documents(cfg).items():
        for doc in docs:
            yield None, SPLIT_BITS[split], doc


def retrieval_mix_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    o = retrieval_mix.corpus_options(cfg.extra or {})
    return retrieval_mix.mix_examples(_base_documents(cfg, o["base"]), o, cfg.valid_fraction, cfg.test_fraction)


def _base_documents(cfg: SourceConfig, base) -> dict[str, list[str]]:
    """The corpus a generated source mixes its examples into: stdlib, none, or a path of text files."""
    base = str(base)
    common = dict(
        valid_fraction=cfg.valid_fraction,
        test_fraction=cfg.test_fraction,
        text_field=cfg.text_field,
        doc_start=cfg.doc_start,
    )
    if base == "none":
        return {"train": [], "valid": [], "test": []}
    if base == "stdlib":
        return stdlib_documents(SourceConfig(source="stdlib", **common))
    return file_documents(SourceConfig(source="files", path=base, **common))


READERS = {
    "stdlib": stdlib_stream,
    "files": file_stream,
    "hub": hub_stream,
    "passkey": passkey_stream,
    "retrieval_mix": retrieval_mix_stream,
}


def iter_documents(cfg: SourceConfig):
    if cfg.kind not in READERS:
        raise ConfigError(f"data.source={cfg.source!r} is not a source; use one of {', '.join(READERS)}.")
    return READERS[cfg.kind](cfg)


EVAL_SPLITS = ("valid", "test")  # the splits whose files a files corpus names (Plan.corpus["files"])


@dataclass
class Plan:
    """The outcome of one full read: which splits every document goes to."""

    masks: np.ndarray  # uint8 per document in source order (0: dropped)
    corpus: dict  # fingerprint info (see fingerprint)
    by_position: bool = False  # one document, cut into train / valid / test by position
    cuts: tuple = ()  # by_position: the characters where valid and test start (before line alignment)
    bytes: int = 0  # UTF-8 bytes of the documents kept


def scan(cfg: SourceConfig, progress=None) -> Plan:
    """Read every document once, keeping per document only a hash of its id,
    a SHA-1 of its text and its length; return the split plan and fingerprint."""
    hashes, given, digests, chars, empty = array("Q"), array("B"), bytearray(), array("q"), array("B")
    nbytes = array("q")
    names = []  # the file each document came from (files source): which texts the evaluation splits hold
    for key, mask, doc in iter_documents(cfg):
        if cfg.kind == "files":
            names.append(key.split("#", 1)[0] if key is not None else None)
        h, n, size, blank = hashlib.sha1(), 0, 0, True
        for piece in pieces_of(doc):
            raw = piece.encode("utf-8", "surrogatepass")
            h.update(raw)
            n, size = n + len(piece), size + len(raw)
            blank = blank and not piece.strip()
            if progress:
                progress(len(raw))
        hashes.append(_stable_hash(key) if key is not None else 0)
        given.append(mask)
        digests += h.digest()
        chars.append(n)
        nbytes.append(size)
        empty.append(blank)
    given, empty, chars = (
        np.frombuffer(given, np.uint8),
        np.frombuffer(empty, np.uint8) > 0,
        np.frombuffer(chars, np.int64),
    )
    digests = np.frombuffer(bytes(digests), np.uint8).reshape(-1, 20)
    masks = given.copy()
    free = given == 0
    live = free & ~empty
    by_position = int(live.sum()) == 1 and len(given) == int(free.sum()) and (cfg.valid_fraction or cfg.test_fraction)
    if by_position:
        masks[live] = SPLIT_BITS["train"] | SPLIT_BITS["valid"] | SPLIT_BITS["test"]
    elif free.any():
        masks[free] = split_by_hash(np.frombuffer(hashes, np.uint64)[free], cfg.valid_fraction, cfg.test_fraction)
    if cfg.max_docs:
        for s in SPLITS:
            inside = np.flatnonzero(masks & SPLIT_BITS[s])
            masks[inside[cfg.max_docs :]] &= ~np.uint8(SPLIT_BITS[s])
    masks[empty] = 0
    counts = {s: int(np.count_nonzero(masks & SPLIT_BITS[s])) for s in SPLITS}
    for s in SPLITS:
        if not counts[s]:
            raise ConfigError(
                f"The {s} split of the corpus ({cfg.kind}: {cfg.where}) is empty: {int((~empty).sum())} non-empty "
                f"document(s) in all. Give more text, or change data.valid_fraction / data.test_fraction "
                f"(or name files train/valid/test)."
            )
    h = hashlib.sha256()
    if by_position:
        h.update(f"<by-position:{cfg.valid_fraction!r}:{cfg.test_fraction!r}>".encode())
    for s in SPLITS:
        inside = np.flatnonzero(masks & SPLIT_BITS[s])
        if not by_position:
            h.update(f"<{s}:{len(inside)}>".encode())
        for i in inside:
            h.update(digests[i].tobytes())
            if by_position:
                break
    info = {
        "source": cfg.kind,
        "where": cfg.where,
        "fingerprint": h.hexdigest()[:16],
        "documents": counts,
        "characters": {s: int(chars[masks & SPLIT_BITS[s] > 0].sum()) for s in SPLITS},
    }
    if names and any(n is not None for n in names):
        info["files"] = {
            s: sorted({names[i] for i in np.flatnonzero(masks & SPLIT_BITS[s])} - {None}) for s in EVAL_SPLITS
        }
    cuts = ()
    if by_position:
        # Where valid and test start; routed_pieces moves each to the next line start.
        total = int(chars[live].sum())
        cuts = (round((1 - cfg.valid_fraction - cfg.test_fraction) * total), round((1 - cfg.test_fraction) * total))
        info["split_by_position"] = True
        info["characters"] = dict(zip(SPLITS, (cuts[0], cuts[1] - cuts[0], total - cuts[1])))
    if cfg.kind == "stdlib":
        info["python_version"] = sys.version.split()[0]
    if cfg.kind == "hub":
        info["hf_config"] = cfg.hf_config
    return Plan(masks, info, bool(by_position), cuts, int(np.frombuffer(nbytes, np.int64)[masks > 0].sum()))


def routed_pieces(cfg: SourceConfig, plan: Plan):
    """(split mask, text, end of document) in source order, as the plan says.
    A document split by position is cut at the first line break at or after
    each cut point, and each part is a document of its split."""
    docs = iter_documents(cfg)
    for i, (_, _, doc) in enumerate(docs):
        mask = int(plan.masks[i])
        if not mask:
            continue
        if not plan.by_position:
            for piece in pieces_of(doc):
                yield mask, piece, False
            yield mask, "", True
            continue
        cuts, pos, part = list(plan.cuts), 0, 0
        for piece in pieces_of(doc):
            while piece:
                if part < len(cuts) and pos + len(piece) > cuts[part]:
                    nl = piece.find("\n", max(0, cuts[part] - pos))
                    if nl < 0:
                        yield SPLIT_BITS[SPLITS[part]], piece, False
                        pos += len(piece)
                        break
                    head, piece = piece[: nl + 1], piece[nl + 1 :]
                    yield SPLIT_BITS[SPLITS[part]], head, False
                    yield SPLIT_BITS[SPLITS[part]], "", True
                    pos += len(head)
                    part += 1
                    if part < len(cuts):
                        cuts[part] = max(cuts[part], pos)
                else:
                    yield SPLIT_BITS[SPLITS[part]], piece, False
                    pos += len(piece)
                    break
        if part < len(cuts):
            raise ConfigError(
                f"The corpus ({cfg.kind}: {cfg.where}) is one document, split by position, but it has no line break "
                f"after {cuts[part]} of its {pos} characters, so the {SPLITS[part + 1]} split would be empty. "
                f"Give text with line breaks, several files, or set data.doc_start to split it into documents."
            )
        yield SPLIT_BITS[SPLITS[part]], "", True


def train_texts(cfg: SourceConfig, plan: Plan, max_chars: int):
    """Training-split documents, whole, until max_chars characters (the last one cut)."""
    used, doc, size = 0, [], 0
    for mask, piece, end in routed_pieces(cfg, plan):
        if not mask & SPLIT_BITS["train"]:
            continue
        doc.append(piece)
        size += len(piece)
        if end or size >= max_chars - used:
            text = "".join(doc)
            doc, size = [], 0
            yield text[: max_chars - used]
            used += len(text)
            if used >= max_chars:
                return


def load_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    """The whole corpus in memory, split (for small corpora and tests)."""
    plan = scan(cfg)
    out, doc = {s: [] for s in SPLITS}, []
    for mask, piece, end in routed_pieces(cfg, plan):
        doc.append(piece)
        if end:
            text = "".join(doc)
            for s in SPLITS:
                if mask & SPLIT_BITS[s]:
                    out[s].append(text)
            doc = []
    return out


def stdlib_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    return load_documents(SourceConfig(**{**cfg.__dict__, "source": "stdlib", "path": None}))


def file_documents(cfg: SourceConfig) -> dict[str, list[str]]:
    return load_documents(SourceConfig(**{**cfg.__dict__, "source": "files"}))


def _file_sample(path: str) -> str:
    """SHA-1 of a few blocks of a file (start, quarters, end) and its size and mtime."""
    st = os.stat(path)
    h = hashlib.sha1(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        for at in sorted({0, st.st_size // 4, st.st_size // 2, 3 * st.st_size // 4, max(0, st.st_size - SAMPLE_BYTES)}):
            f.seek(at)
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def quick_key(cfg: SourceConfig) -> str | None:
    """An identity of the source read from file sizes, mtimes and sampled bytes
    (not all the text): unchanged files give the same key. None for sources it
    cannot vouch for (generated corpora), which are always read in full."""
    if cfg.kind == "stdlib":
        files = _stdlib_files()
    elif cfg.kind == "files":
        files = _expand_path(cfg.path)
    elif cfg.kind == "hub" and cfg.hf_name and os.path.isdir(cfg.hf_name):
        files = sorted(os.path.join(r, f) for r, _, fs in os.walk(cfg.hf_name) for f in fs)
    elif cfg.kind == "hub":
        files = []  # a remote dataset is known by its name, config and data.extra (pin extra.revision)
    else:
        return None
    h = hashlib.sha256(json.dumps({k: v for k, v in cfg.__dict__.items()}, sort_keys=True, default=str).encode())
    h.update(sys.version.split()[0].encode() if cfg.kind == "stdlib" else b"")
    for f in files:
        h.update(f"{f}\0{_file_sample(f)}\0".encode())
    return h.hexdigest()[:16]
