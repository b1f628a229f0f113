"""Corpus -> byte-level BPE tokenizer (or the user's own) -> packed, memory-mapped token cache.

The cache lives in ``<cache_dir>/<corpus>-<key>/`` where the key hashes the
corpus fingerprint and the tokenizer settings, so a changed source or setting
builds a new cache and an unchanged one is reused. A cache is built in a
temporary folder under a file lock and renamed into place, and its files'
sizes and checksums are verified on every load.

The build streams: the source is read one document at a time (twice: once to
plan the splits and fingerprint, once to tokenize), tokenized by
``data.num_proc`` processes and appended to the cache files, so its memory is
bounded by ``data.memory_mb`` whatever the corpus size. A run on an unchanged
source finds its cache from file sizes, mtimes and sampled bytes without
reading the text (``data.full_check=true`` reads it all).
"""

import contextlib
from dataclasses import dataclass
import hashlib
import json
import logging
import os
import tempfile

from filelock import FileLock, Timeout
import numpy as np

from rope_lm.core.errors import (
    DENIED,
    FULL,
    ConfigError,
    OutputError,
    RopeLMError,
    free_space,
    size_text,
    write_problem,
)
from rope_lm.core.files import build_folder
from rope_lm.data.corpus import SPLITS, SourceConfig, hub_failure, quick_key, routed_pieces, scan, train_texts
from rope_lm.data.encode import encode_to_files

log = logging.getLogger("rope_lm.data.loaders")  # the name users filter on; the loaders live in data.py
CACHE_FORMAT = 1
EOS = "<|endoftext|>"
# A corpus below this many bytes of text is encoded by one process unless data.num_proc says otherwise.
SMALL_CORPUS = 4 << 20
BYTE_ALPHABET = 256
# End-of-document tokens looked for, in this order, when data.eos_token is unset.
EOS_CANDIDATES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>", "<|eot_id|>")


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class DataConfig:
    name: str = "stdlib"
    seq_len: int = 128
    batch_size: int = 16
    vocab_size: int = 4096
    tokenizer_train_chars: int = 4_000_000
    val_tokens: int = 65_536
    cache_dir: str = "data/cache"
    num_workers: int = 0
    verify_cache: bool = True
    tokenizer: str | None = None  # your own tokenizer: a tokenizer.json path or a Hugging Face tokenizer name
    eos_token: str | None = None  # the end-of-document token; null: the tokenizer's own (</s>, <|endoftext|>, ...)
    tokenizer_file: str | None = None  # set by the run itself to a checkpoint's tokenizer.json; wins over `tokenizer`
    num_proc: int | None = None  # tokenizing processes; null: all available cores
    memory_mb: int = 512  # bound on the memory a cache build uses for text and tokens in flight
    full_check: bool = False  # re-read the whole source to decide reuse (default: sizes, mtimes, sampled bytes)

    def validate(self):
        if self.vocab_size <= BYTE_ALPHABET:
            raise ConfigError(
                f"data.vocab_size={self.vocab_size} is too small: byte-level BPE needs the {BYTE_ALPHABET} byte symbols "
                f"plus the end-of-text token, so at least {BYTE_ALPHABET + 1} (4096 to 32000 are typical)."
            )
        for key in ("seq_len", "batch_size", "val_tokens", "tokenizer_train_chars"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive integer.")
        if self.num_proc is not None and self.num_proc < 1:
            raise ConfigError(
                f"data.num_proc={self.num_proc} must be a positive number of processes, or null for "
                f"all available cores ({available_cores()} here)."
            )
        if self.memory_mb < 16:
            raise ConfigError(
                f"data.memory_mb={self.memory_mb} is too small: a cache build needs at least 16 MB "
                f"for the text and tokens in flight (256 to 2048 are typical)."
            )

    def processes(self, text_bytes: int) -> int:
        """data.num_proc, or (null) every core for a corpus large enough to pay for starting workers:
        below SMALL_CORPUS one process encodes it in about a second."""
        if self.num_proc:
            return self.num_proc
        return 1 if text_bytes < SMALL_CORPUS else available_cores()


class TokenCache:
    """A built cache: tokenizer, one token array and document starts per split."""

    def __init__(self, directory: str):
        self.dir = directory
        with open(os.path.join(directory, "meta.json")) as f:
            self.meta = json.load(f)
        self.vocab_size = self.meta["vocab_size"]
        self.eos_id = self.meta["eos_id"]
        self.corpus = self.meta["corpus"]

    def tokens(self, split: str) -> np.ndarray:
        return np.memmap(os.path.join(self.dir, f"{split}.bin"), dtype=self.meta["dtype"], mode="r")

    def doc_starts(self, split: str) -> np.ndarray:
        return np.load(os.path.join(self.dir, f"{split}.docs.npy"))

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(os.path.join(self.dir, "tokenizer.json"))


def _sha1_file(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_problem(directory: str, checksums: bool = True) -> str | None:
    """Why a cache folder cannot be used, or None if it is intact."""
    meta_path = os.path.join(directory, "meta.json")
    if not os.path.exists(meta_path):
        return "meta.json is missing"
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return f"meta.json is unreadable ({e})"
    for name, info in meta.get("files", {}).items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            return f"{name} is missing"
        if os.path.getsize(path) != info["bytes"]:
            return f"{name} has {os.path.getsize(path)} bytes, expected {info['bytes']}"
        if checksums and _sha1_file(path) != info["sha1"]:
            return f"{name} does not match its checksum"
    return None


def train_tokenizer(docs, vocab_size: int, max_chars: int, eos_token: str = EOS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def sample():
        used = 0
        for d in docs:
            if used >= max_chars:
                return
            yield d[: max_chars - used]
            used += len(d)

    tok.train_from_iterator(sample(), trainer)
    return tok


def load_tokenizer(spec: str, setting: str):
    """A tokenizer.json file, or a tokenizer by name from the Hugging Face hub;
    and the settings that identify it in the cache key."""
    from tokenizers import Tokenizer

    if os.path.isfile(spec):
        try:
            return Tokenizer.from_file(spec), {"tokenizer_file_sha1": _sha1_file(spec)}
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise ConfigError(
                f"{setting}={spec!r} is not a readable tokenizer.json ({e}); give the tokenizer.json "
                f"of a Hugging Face tokenizer (or its name on the hub)."
            ) from None
    if setting == "data.tokenizer_file" or spec.endswith(".json") or spec.startswith((os.sep, ".", "~")):
        raise ConfigError(
            f"{setting}={spec!r} does not exist; give a tokenizer.json file (or a tokenizer's name on "
            f"the Hugging Face hub, e.g. gpt2)."
        )
    try:
        tok = Tokenizer.from_pretrained(spec)
    except Exception as e:  # the hub raises many types; all mean "could not load"
        raise hub_failure(
            f"{setting}={spec!r} is neither a tokenizer.json file nor a tokenizer the Hugging Face hub could give",
            e,
            "Offline, download its tokenizer.json and give that path.",
        ) from None
    return tok, {"tokenizer_sha1": hashlib.sha1(tok.to_str().encode()).hexdigest()}


def end_of_document(tok, wanted: str | None, where: str) -> str:
    """The end-of-document token: data.eos_token, else the first of
    EOS_CANDIDATES among the tokenizer's special tokens; refused clearly when absent."""
    specials = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special]
    shown = ", ".join(repr(t) for t in specials[:12]) or "none"
    if wanted is not None:
        if tok.token_to_id(wanted) is None:
            raise ConfigError(
                f"data.eos_token={wanted!r} is not a token of the tokenizer {where} (its special tokens: {shown}). "
                f"Set data.eos_token to a token of its vocabulary that ends a document (Llama-style tokenizers use "
                f"'</s>', GPT-2-style '<|endoftext|>'), or leave it null to use the tokenizer's own."
            )
        return wanted
    for candidate in EOS_CANDIDATES:
        if candidate in specials:
            return candidate
    raise ConfigError(
        f"The tokenizer {where} has no end-of-document token among its special tokens ({shown}); documents in the "
        f"token cache are separated by one, and none of {', '.join(EOS_CANDIDATES)} is there. Set data.eos_token to "
        f"a token of its vocabulary that ends a document."
    )


def resolve_tokenizer(data: DataConfig):
    """(tokenizer or None when one is trained, eos token, cache-key settings), before any text is read."""
    spec, setting = (
        (data.tokenizer_file, "data.tokenizer_file") if data.tokenizer_file else (data.tokenizer, "data.tokenizer")
    )
    if not spec:
        settings = {
            "tokenizer": "byte-level-bpe",
            "vocab_size": data.vocab_size,
            "tokenizer_train_chars": data.tokenizer_train_chars,
        }
        if data.eos_token is not None:
            settings["eos_token"] = data.eos_token
        return None, data.eos_token or EOS, settings
    tok, settings = load_tokenizer(spec, setting)
    eos = end_of_document(tok, data.eos_token, f"{setting}={spec!r}")
    if data.eos_token is not None:
        settings["eos_token"] = eos
    return tok, eos, settings


def _build(directory: str, source: SourceConfig, plan, data: DataConfig, tok, eos: str, settings: dict):
    # Called under the directory's lock (files.build_folder's condition).
    had, written = free_space(data.cache_dir), {}

    def build(tmp: str):
        try:
            fill(tmp)
        except Exception as e:
            if _write_failed(e, data.cache_dir):
                written["bytes"] = _folder_bytes(tmp)  # measured before build_folder removes it
            raise

    def fill(tmp: str):
        nonlocal tok
        if tok is None:
            tok = train_tokenizer(
                train_texts(source, plan, data.tokenizer_train_chars), data.vocab_size, data.tokenizer_train_chars, eos
            )
        tok.save(os.path.join(tmp, "tokenizer.json"))
        vocab = tok.get_vocab_size()
        dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
        written["itemsize"] = np.dtype(dtype).itemsize
        eos_id = tok.token_to_id(eos)
        counts = encode_to_files(
            tok.to_str(),
            routed_pieces(source, plan),
            eos_id,
            dtype,
            tmp,
            data.processes(plan.bytes),
            data.memory_mb,
            plan.bytes,
            log,
        )
        meta = {
            "format": CACHE_FORMAT,
            "settings": settings,
            "corpus": plan.corpus,
            "vocab_size": vocab,
            "eos_id": eos_id,
            "eos_token": eos,
            "dtype": np.dtype(dtype).name,
            "tokens": counts,
            "files": {},
        }
        for name in sorted(os.listdir(tmp)):
            p = os.path.join(tmp, name)
            meta["files"][name] = {"bytes": os.path.getsize(p), "sha1": _sha1_file(p)}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)

    try:
        build_folder(directory, build, "cache build")
    except Exception as e:
        if not _write_failed(e, data.cache_dir):
            raise
        raise _build_failure(e, data, plan, had, written) from None


def _write_failed(error: BaseException, cache_dir: str) -> bool:
    """A write into cache_dir refused (a full disk, a read-only or forbidden
    folder), not a source that could not be read or a user error."""
    if isinstance(error, RopeLMError) or write_problem(error) not in (FULL, DENIED):
        return False
    where = getattr(error, "filename", None)  # an OSError names its file: a source file is no cache write
    inside = os.path.abspath(cache_dir) + os.sep
    return not isinstance(where, str) or os.path.abspath(where).startswith(inside) or write_problem(error) == FULL


def _folder_bytes(folder: str) -> int:
    total = 0
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        with contextlib.suppress(OSError):
            total += os.path.getsize(os.path.join(folder, name))
    return total


def _build_failure(error: BaseException, data: DataConfig, plan, had: int | None, build: dict) -> OutputError:
    """One paragraph for a cache build that the disk refused: data.cache_dir,
    the space it had, wrote (build["bytes"]) and would need, and what to do."""
    where = f"data.cache_dir={data.cache_dir!r} ({os.path.abspath(data.cache_dir)})"
    if write_problem(error) == DENIED:
        why = os.strerror(error.errno) if getattr(error, "errno", None) else str(error).splitlines()[0]
        return OutputError(
            f"The token cache could not be built in {where}: it stopped being writable during the build ({why}). "
            f"The partial cache was removed. Point data.cache_dir at a writable folder (e.g. "
            f"data.cache_dir=/tmp/rope-lm-cache), or make that folder writable, then run the same command again."
        )
    # Every token is 2 bytes (4 past 65,536 tokens) and covers at least one byte of text; a document adds its
    # end token and one start (8 bytes).
    documents = sum(plan.corpus["documents"].values())
    need = (plan.bytes + documents) * build.get("itemsize", 2) + 8 * documents
    written = build.get("bytes")
    space = [f"{size_text(had)} were free when the build started" if had is not None else ""]
    space.append(f"it had written {size_text(written)} when the disk filled" if written else "")
    space = "; ".join(t for t in space if t)
    return OutputError(
        f"The token cache could not be built in {where}: the disk is full"
        f"{f' ({space})' if space else ''}. A cache of this corpus ({size_text(plan.bytes)} of text) "
        f"takes at most about {size_text(need)}. The partial cache was removed; nothing else in data.cache_dir was "
        f"touched. Free some space on that disk, or point data.cache_dir at a folder on a disk with more room (e.g. "
        f"data.cache_dir=/tmp/rope-lm-cache), then run the same command again."
    )


def _check_corpus(corpus: dict, expect_corpus: tuple[str, str] | None):
    if expect_corpus and expect_corpus[0] != corpus["fingerprint"]:
        raise ConfigError(
            f"The corpus has changed: {corpus['where']} now has fingerprint {corpus['fingerprint']}, but "
            f"{expect_corpus[1]} was trained on fingerprint {expect_corpus[0]}. Resuming would train and evaluate "
            f"it on other text. Restore the source files (or data.* settings) it was trained with, or start a "
            f"new run from its weights with init_from= to fine-tune on the new text."
        )


def _index_path(data: DataConfig, source_key: str, tokenizer: dict) -> str:
    """Where the cache built from this source (as quick_key sees it) and tokenizer is recorded."""
    key = hashlib.sha256(json.dumps([CACHE_FORMAT, source_key, tokenizer], sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(data.cache_dir, f"{data.name}-source-{key}.json")


def _write_index(index: str, directory: str, source_key: str) -> None:
    """Record which cache this source was built into. Only a shortcut: where
    the disk refuses it (full), the next run reads the source to find the cache."""
    tmp = f"{index}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"cache": os.path.basename(directory), "source_key": source_key}, f)
        os.replace(tmp, index)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        log.warning(
            "Could not record the token cache %s in %s (%s); the next run reads the source again to find it.",
            directory,
            index,
            os.strerror(e.errno) if e.errno else e,
        )


def _index_trained_tokenizer(cache: TokenCache, data: DataConfig, source_key: str, eos: str) -> None:
    """Record a cache built with a trained tokenizer under that tokenizer's
    file too: a resumed run or an evaluation is given the checkpoint's
    tokenizer.json (data.tokenizer_file), which is this cache's own, and
    would otherwise tokenize the same text again into a second cache."""
    tokenizer = {"tokenizer_file_sha1": cache.meta["files"]["tokenizer.json"]["sha1"]}
    if data.eos_token is not None:
        tokenizer["eos_token"] = eos
    alias = _index_path(data, source_key, tokenizer)
    if not os.path.exists(alias):
        _write_index(alias, cache.dir, source_key)


def _no_lock():
    return contextlib.nullcontext()


@contextlib.contextmanager
def _locked(path: str):
    """FileLock(path), saying so when another process holds it: a sweep's jobs
    and a distributed run's ranks wait here while the first builds the cache."""
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info(
            "Waiting for another process to finish building or checking the token cache (it holds %s); "
            "this run goes on when it is done.",
            path,
        )
        lock.acquire()
        log.info("The other process is done with %s.", path)
    try:
        yield
    finally:
        lock.release()


def _writable(cache_dir: str) -> OSError | None:
    """None when cache_dir can be created and written to, else the error."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=cache_dir, prefix=".write-test-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        return e
    return None


def _quick_reuse(index: str, data: DataConfig) -> TokenCache | None:
    """The cache an unchanged source was last built or checked into, if it is intact."""
    try:
        with open(index) as f:
            directory = os.path.join(data.cache_dir, json.load(f)["cache"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if os.path.isdir(directory) and cache_problem(directory, data.verify_cache) is None:
        return TokenCache(directory)
    return None


def _scan_with_progress(source: SourceConfig):
    from tqdm.auto import tqdm

    with tqdm(unit="B", unit_scale=True, desc="reading the source", disable=None, mininterval=1) as bar:
        return scan(source, progress=bar.update)


def prepare(data: DataConfig, source: SourceConfig, expect_corpus: tuple[str, str] | None = None) -> TokenCache:
    """Return the token cache for this corpus and tokenizer, building it if
    needed. expect_corpus=(fingerprint, whose): refuse, before tokenizing, a
    corpus whose text is not the one `whose` (a checkpoint) was trained on.

    Every rank of a distributed run may call this at once: the first builds
    under a lock, the others wait and then reuse the cache without reading
    the text."""
    data.validate()
    source.validate()
    tok, eos, tokenizer = resolve_tokenizer(data)
    source_key = quick_key(source)
    index = _index_path(data, source_key, tokenizer) if source_key else None
    unwritable = _writable(data.cache_dir)
    if unwritable is not None:
        # A cache that is complete can still be read from a read-only folder (a shared, prebuilt one):
        # caches are renamed into place whole, so no lock is needed to read one.
        cache = _quick_reuse(index, data) if index and not data.full_check else None
        if cache is not None:
            _check_corpus(cache.corpus, expect_corpus)
            log.info("Reusing token cache %s (its folder is read-only; source unchanged)", cache.dir)
            return cache
        why = os.strerror(unwritable.errno) if unwritable.errno else str(unwritable)
        raise OutputError(
            f"data.cache_dir={data.cache_dir!r} ({os.path.abspath(data.cache_dir)}) is not writable "
            f"({why}), and the token cache of this corpus must be built there. Point data.cache_dir "
            f"at a writable folder (e.g. data.cache_dir=/tmp/rope-lm-cache)."
        )
    with _locked(f"{index}.lock") if index else _no_lock():
        if index and not data.full_check:
            cache = _quick_reuse(index, data)
            if cache is not None:
                _check_corpus(cache.corpus, expect_corpus)
                if tok is None:
                    _index_trained_tokenizer(cache, data, source_key, eos)
                log.info("Reusing token cache %s (source unchanged: sizes, mtimes and sampled bytes)", cache.dir)
                return cache
        plan = _scan_with_progress(source)
        corpus = plan.corpus
        _check_corpus(corpus, expect_corpus)
        settings = {"format": CACHE_FORMAT, "corpus": corpus["fingerprint"], **tokenizer}
        key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
        directory = os.path.join(data.cache_dir, f"{data.name}-{key}")
        with _locked(f"{directory}.lock"):
            problem = cache_problem(directory, data.verify_cache) if os.path.isdir(directory) else "absent"
            if problem is None:
                log.info("Reusing token cache %s", directory)
            else:
                if problem != "absent":
                    log.warning("Token cache %s is damaged (%s); rebuilding it.", directory, problem)
                log.info("Building token cache %s (%s documents)", directory, sum(corpus["documents"].values()))
                _build(directory, source, plan, data, tok, eos, settings)
        if index:
            _write_index(index, directory, source_key)
    cache = TokenCache(directory)
    if index and tok is None:
        _index_trained_tokenizer(cache, data, source_key, eos)
    log.info(
        "Token cache ready: %s tokens (train/valid/test %s)",
        sum(cache.meta["tokens"].values()),
        "/".join(str(cache.meta["tokens"][s]) for s in SPLITS),
    )
    return cache
