"""Corpus -> byte-level BPE tokenizer -> packed, memory-mapped token cache -> loaders.

The cache lives in ``<cache_dir>/<corpus>-<key>/`` where the key hashes the
corpus fingerprint and the tokenizer settings, so a changed source or setting
builds a new cache and an unchanged one is reused. A cache is built in a
temporary folder under a file lock and renamed into place, and its files'
sizes and checksums are verified on every load.
"""

from dataclasses import dataclass
import fcntl
import hashlib
import json
import logging
import os
import shutil

import lightning as L
import numpy as np
import torch

from rope_lm.corpus import SPLITS, SourceConfig, fingerprint, load_documents
from rope_lm.errors import ConfigError

log = logging.getLogger("rope_lm.data")
CACHE_FORMAT = 1
EOS = "<|endoftext|>"
BYTE_ALPHABET = 256


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
    tokenizer_file: str | None = None  # use this tokenizer.json instead of training one (evaluating a checkpoint)

    def validate(self):
        if self.vocab_size <= BYTE_ALPHABET:
            raise ConfigError(
                f"data.vocab_size={self.vocab_size} is too small: byte-level BPE needs the {BYTE_ALPHABET} byte symbols "
                f"plus the end-of-text token, so at least {BYTE_ALPHABET + 1} (4096 to 32000 are typical)."
            )
        for key in ("seq_len", "batch_size", "val_tokens", "tokenizer_train_chars"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}={getattr(self, key)} must be a positive integer.")


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


def train_tokenizer(docs: list[str], vocab_size: int, max_chars: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
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


def _encode_split(tok, docs: list[str], eos_id: int, dtype, path: str) -> np.ndarray:
    starts, offset = [], 0
    with open(path, "wb") as f:
        for i in range(0, len(docs), 256):
            for enc in tok.encode_batch(docs[i : i + 256]):
                ids = np.asarray(enc.ids + [eos_id], dtype=dtype)
                starts.append(offset)
                offset += len(ids)
                f.write(ids.tobytes())
    return np.asarray(starts, dtype=np.int64)


def _build(directory: str, docs: dict, corpus: dict, cfg: DataConfig, settings: dict):
    tmp = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if cfg.tokenizer_file:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(cfg.tokenizer_file)
    else:
        tok = train_tokenizer(docs["train"], cfg.vocab_size, cfg.tokenizer_train_chars)
    tok.save(os.path.join(tmp, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    eos_id = tok.token_to_id(EOS)
    meta = {"format": CACHE_FORMAT, "settings": settings, "corpus": corpus, "vocab_size": vocab,
            "eos_id": eos_id, "dtype": np.dtype(dtype).name, "tokens": {}, "files": {}}
    for s in SPLITS:
        starts = _encode_split(tok, docs[s], eos_id, dtype, os.path.join(tmp, f"{s}.bin"))
        np.save(os.path.join(tmp, f"{s}.docs.npy"), starts)
        meta["tokens"][s] = os.path.getsize(os.path.join(tmp, f"{s}.bin")) // np.dtype(dtype).itemsize
    for name in sorted(os.listdir(tmp)):
        p = os.path.join(tmp, name)
        meta["files"][name] = {"bytes": os.path.getsize(p), "sha1": _sha1_file(p)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.rename(tmp, directory)


def prepare(data: DataConfig, source: SourceConfig, expect_corpus: tuple[str, str] | None = None) -> TokenCache:
    """Return the token cache for this corpus and tokenizer, building it if
    needed. expect_corpus=(fingerprint, whose): refuse, before tokenizing, a
    corpus whose text is not the one `whose` (a checkpoint) was trained on."""
    data.validate()
    docs = load_documents(source)
    corpus = fingerprint(docs, source)
    if expect_corpus and expect_corpus[0] != corpus["fingerprint"]:
        raise ConfigError(
            f"The corpus has changed: {corpus['where']} now has fingerprint {corpus['fingerprint']}, but "
            f"{expect_corpus[1]} was trained on fingerprint {expect_corpus[0]}. Resuming would train and evaluate "
            f"it on other text. Restore the source files (or data.* settings) it was trained with, or start a "
            f"new run from its weights with init_from= to fine-tune on the new text."
        )
    if data.tokenizer_file:
        if not os.path.isfile(data.tokenizer_file):
            raise ConfigError(f"data.tokenizer_file={data.tokenizer_file!r} does not exist; give a tokenizer.json file.")
        tokenizer = {"tokenizer_file_sha1": _sha1_file(data.tokenizer_file)}
    else:
        tokenizer = {"tokenizer": "byte-level-bpe", "vocab_size": data.vocab_size,
                     "tokenizer_train_chars": data.tokenizer_train_chars}
    settings = {"format": CACHE_FORMAT, "corpus": corpus["fingerprint"], **tokenizer}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    directory = os.path.join(data.cache_dir, f"{data.name}-{key}")
    os.makedirs(data.cache_dir, exist_ok=True)
    with open(f"{directory}.lock", "w") as lock:
        # Parallel sweep jobs wait here while the first builds the cache.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(directory):
            problem = cache_problem(directory, data.verify_cache)
            if problem is None:
                log.info("Reusing token cache %s", directory)
                return TokenCache(directory)
            log.warning("Token cache %s is damaged (%s); rebuilding it.", directory, problem)
        log.info("Building token cache %s (%s documents)", directory, sum(len(d) for d in docs.values()))
        _build(directory, docs, corpus, data, settings)
    cache = TokenCache(directory)
    log.info("Token cache ready: %s tokens (train/valid/test %s)", sum(cache.meta["tokens"].values()),
             "/".join(str(cache.meta["tokens"][s]) for s in SPLITS))
    return cache


class TokenWindows(torch.utils.data.Dataset):
    """Non-overlapping (input, target) windows of seq_len tokens from a token array."""

    def __init__(self, tokens: np.ndarray, seq_len: int, max_tokens: int | None = None):
        self.tokens = tokens
        self.seq_len = seq_len
        usable = len(tokens) - 1 if max_tokens is None else min(len(tokens) - 1, max_tokens)
        self.n = max(0, usable // seq_len)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = i * self.seq_len
        chunk = torch.from_numpy(np.asarray(self.tokens[s : s + self.seq_len + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]


class StepSampler(torch.utils.data.Sampler):
    """Sample order fixed by (seed, global sample index): epoch e is permutation
    seed + e of the windows. Starting at ``start`` samples resumes the exact
    order of an uninterrupted run; ranks take interleaved samples.

    Endless unless ``total`` is given: training stops at trainer.max_steps, so
    Lightning's own epoch bookkeeping (which a resume would restore mid-epoch)
    never decides which data comes next."""

    def __init__(self, n: int, seed: int, total: int | None = None, start: int = 0, rank: int = 0, world: int = 1):
        self.n, self.seed, self.total, self.start, self.rank, self.world = n, seed, total, start, rank, world

    def _perm(self, epoch):
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self):
        epoch, perm = None, None
        g = self.start + self.rank
        while self.total is None or g < self.total:
            if g // self.n != epoch:
                epoch = g // self.n
                perm = self._perm(epoch)
            yield int(perm[g % self.n])
            g += self.world


class LMDataModule(L.LightningDataModule):
    """Train/validation loaders over a TokenCache.

    The training sample order depends only on (seed, global sample index), and
    the loader starts at the trainer's restored global step, so a resumed run
    continues exactly where the interrupted one stopped (see StepSampler)."""

    def __init__(self, cache: TokenCache, cfg: DataConfig, seed: int, accumulate: int = 1):
        super().__init__()
        self.cache, self.cfg, self.seed = cache, cfg, seed
        self.accumulate = accumulate
        self.train = TokenWindows(cache.tokens("train"), cfg.seq_len)
        self.val = TokenWindows(cache.tokens("valid"), cfg.seq_len, cfg.val_tokens)
        if len(self.train) < cfg.batch_size:
            raise ConfigError(
                f"data.batch_size={cfg.batch_size} is larger than the training split, which holds only "
                f"{len(self.train)} windows of data.seq_len={cfg.seq_len} tokens ({len(cache.tokens('train'))} tokens). "
                f"Lower the batch size or the sequence length, or use more text."
            )
        if len(self.val) == 0:
            raise ConfigError(
                f"The validation split has {len(cache.tokens('valid'))} tokens, fewer than one window of "
                f"data.seq_len={cfg.seq_len}; lower data.seq_len or raise data.valid_fraction."
            )

    def train_dataloader(self):
        t = self.trainer
        per_step = self.cfg.batch_size * self.accumulate * t.world_size
        sampler = StepSampler(len(self.train), self.seed, None, t.global_step * per_step, t.global_rank, t.world_size)
        return torch.utils.data.DataLoader(self.train, batch_size=self.cfg.batch_size, sampler=sampler,
                                           num_workers=self.cfg.num_workers, drop_last=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val, batch_size=self.cfg.batch_size, shuffle=False,
                                           num_workers=self.cfg.num_workers)
