"""Text pieces -> token ids, in parallel processes, appended to split files in order.

The writer sees results in the order the pieces came, whatever the number of
processes, so the files are byte-identical for any ``num_proc``. Memory is
bounded: at most ``2 * num_proc`` batches of ``batch_chars`` characters are in
flight, and a long document is encoded a piece at a time.

Long documents are cut only between a non-space character and a single
"\\n" or " " followed by a non-space: the byte-level BPE's pre-tokenizer
(the GPT-2 pattern) splits there anyway, so the ids are those of the whole
document. Tokenizers with a normalizer or a prefix space (e.g. SentencePiece
"▁") may differ at those cuts; documents shorter than a batch are never cut.
"""

from collections import deque
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from rope_lm.data.corpus import SPLIT_BITS, SPLITS

# Resident bytes per character of a batch while it is encoded (the Encoding
# objects of `tokenizers` dominate: measured ~48 B/byte; rounded up).
BYTES_PER_CHAR = 64
_worker = {}


def batch_chars_for(memory_mb: int, num_proc: int) -> int:
    """Characters per batch such that the batches in flight fit memory_mb."""
    return int(min(8 << 20, max(4096, memory_mb * (1 << 20) // (BYTES_PER_CHAR * 2 * num_proc))))


def _cut_point(text: str, start: int, limit: int) -> int:
    """The last safe cut in text[start + 1 : limit] (see the module doc), else limit."""
    for sep in ("\n", " "):
        i = text.rfind(sep, start + 1, limit)
        while i > start:
            if i + 1 < len(text) and not text[i - 1].isspace() and not text[i + 1].isspace():
                return i
            i = text.rfind(sep, start + 1, i)
    return limit


def cut_pieces(pieces, limit: int):
    """(mask, text, end) pieces -> (mask, text, first, end) pieces of at most
    ~limit characters each, cut only at safe places."""
    buf, first = "", True
    for mask, piece, end in pieces:
        buf = buf + piece if buf else piece
        start = 0
        while len(buf) - start > limit:
            at = _cut_point(buf, start, start + limit)
            yield mask, buf[start:at], first, False
            start, first = at, False
        buf = buf[start:] if start else buf
        if end:
            yield mask, buf, first, True
            buf, first = "", True


def _init_worker(tokenizer_json: str, dtype: str):
    # One thread per process: the processes are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _worker["tok"] = Tokenizer.from_str(tokenizer_json)
    _worker["dtype"] = np.dtype(dtype)


def _encode(texts: list[str], firsts: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """ids of the texts, concatenated, and their lengths. The first piece of a
    document gets the tokenizer's special tokens (a BOS, if it adds one)."""
    tok, dtype = _worker["tok"], _worker["dtype"]
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    out = [None] * len(texts)
    for special in (True, False):
        idx = [i for i, f in enumerate(firsts) if f == special and texts[i]]
        for i, enc in zip(idx, encode([texts[i] for i in idx], add_special_tokens=special)):
            out[i] = enc.ids
    lengths = np.array([len(o) if o else 0 for o in out], dtype=np.int64)
    ids = np.fromiter((t for o in out if o for t in o), dtype=dtype, count=int(lengths.sum()))
    return ids, lengths


def _batches(pieces, batch_chars: int):
    items, size = [], 0
    for item in pieces:
        items.append(item)
        size += len(item[1])
        if size >= batch_chars:
            yield items
            items, size = [], 0
    if items:
        yield items


class SplitWriter:
    """Appends ids to <split>.bin and document starts to <split>.docs.npy."""

    def __init__(self, directory: str, eos_id: int, dtype):
        self.dir, self.eos = directory, np.array([eos_id], dtype=dtype)
        self.bins = {s: open(os.path.join(directory, f"{s}.bin"), "wb") for s in SPLITS}
        self.starts = {s: open(os.path.join(directory, f"{s}.docs.raw"), "wb") for s in SPLITS}
        self.count = {s: 0 for s in SPLITS}

    def write(self, items, ids: np.ndarray, lengths: np.ndarray):
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for (mask, _, first, end), a, b in zip(items, offsets[:-1], offsets[1:]):
            for s in SPLITS:
                if mask & SPLIT_BITS[s]:
                    if first:
                        self.starts[s].write(np.int64(self.count[s]).tobytes())
                    self.bins[s].write(ids[a:b].tobytes())
                    self.count[s] += int(b - a)
                    if end:
                        self.bins[s].write(self.eos.tobytes())
                        self.count[s] += 1

    def close(self) -> dict:
        for s in SPLITS:
            self.bins[s].close()
            self.starts[s].close()
            raw = os.path.join(self.dir, f"{s}.docs.raw")
            starts = np.memmap(raw, dtype=np.int64, mode="r") if os.path.getsize(raw) else np.zeros(0, np.int64)
            out = np.lib.format.open_memmap(
                os.path.join(self.dir, f"{s}.docs.npy"), mode="w+", dtype=np.int64, shape=(len(starts),)
            )
            for i in range(0, len(starts), 1 << 20):
                out[i : i + (1 << 20)] = starts[i : i + (1 << 20)]
            out.flush()
            del out, starts
            os.remove(raw)
        return dict(self.count)


def encode_to_files(
    tokenizer_json: str,
    pieces,
    eos_id: int,
    dtype,
    directory: str,
    num_proc: int,
    memory_mb: int,
    total_bytes: int,
    log,
) -> dict:
    """Encode (mask, text, end) pieces into <directory>/<split>.bin and
    <split>.docs.npy; return the token count of each split."""
    from tqdm.auto import tqdm

    dtype = np.dtype(dtype)
    limit = batch_chars_for(memory_mb, num_proc)
    writer = SplitWriter(directory, eos_id, dtype)
    bar = tqdm(
        total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=None, mininterval=1, dynamic_ncols=True
    )
    started, tokens = time.perf_counter(), 0
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # set before forking; restored below
    pool = None
    try:
        if num_proc > 1:
            # Not fork: this process has threads by now (the tokenizer just trained on its thread pool,
            # torch's), and a child forked while one of them held a lock (the allocator's) hangs for good.
            # A fork server is forked from a fresh process instead, once per build.
            ctx = mp.get_context("forkserver" if sys.platform.startswith("linux") else "spawn")
            pool = ctx.Pool(num_proc, initializer=_init_worker, initargs=(tokenizer_json, dtype.name))
        else:
            _init_worker(tokenizer_json, dtype.name)
        pending = deque()

        def drain(n: int):
            nonlocal tokens
            while len(pending) > n:
                items, result = pending.popleft()
                ids, lengths = result.get() if pool else result
                writer.write(items, ids, lengths)
                tokens += len(ids)
                bar.update(sum(len(it[1].encode("utf-8", "surrogatepass")) for it in items))
                bar.set_postfix_str(f"{tokens / max(time.perf_counter() - started, 1e-9):,.0f} tokens/s", refresh=False)

        for items in _batches(cut_pieces(pieces, limit), limit):
            args = ([it[1] for it in items], [it[2] for it in items])
            pending.append((items, pool.apply_async(_encode, args) if pool else _encode(*args)))
            drain(2 * num_proc - 1)
        drain(0)
    finally:
        if pool:
            pool.terminate()
            pool.join()
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
        bar.close()
    counts = writer.close()
    seconds = time.perf_counter() - started
    log.info(
        "Tokenized %.1f MB in %.1f s with %d process(es): %.2f MB/s, %s tokens/s",
        total_bytes / 1e6,
        seconds,
        num_proc,
        total_bytes / 1e6 / max(seconds, 1e-9),
        f"{sum(counts.values()) / max(seconds, 1e-9):,.0f}",
    )
    return counts
