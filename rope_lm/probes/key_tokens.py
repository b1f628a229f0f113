"""Key-token perplexity (LongPPL; Fang et al. 2024, "What is Wrong with Perplexity for Long-context
Language Modeling?", ICLR 2025): perplexity on the tokens that need long context, beside perplexity on
all tokens.

A fixed evaluator model reads the text twice. Long: each window of T tokens from its start, so the
target at window index j (the token after input j) is predicted from j + 1 tokens. Short: windows of
K tokens, one every S tokens, each scoring its last S targets, so a target is predicted from between
K - S + 1 and K tokens (exactly K with S = 1, the paper's definition; the official code shares one
short context among blocks of S = K / 4 tokens too, with contexts of K to K + S - 1 tokens: here the
short windows never read past K, which by default is the evaluator's own training length, so a short
loss is never an extrapolation failure). Only targets with more context than K are candidates (j >= K).
With the loss under long and short context,

    LSD = loss_short - loss_long        (long-short difference: how much the long context helped)
    LCL = -loss_long                    (long-context log-likelihood: the evaluator predicts it)

a candidate is a key token when LSD > alpha and LCL > beta (the paper's alpha = 2, beta = -2). The
model under test then reads the same windows from their start, and its key-token PPL is
exp(mean NLL over the key tokens); its plain PPL is exp(mean NLL over every target).

Key tokens are positions in a token sequence, so the evaluator must cut the text into the same tokens
as the model under test (the same tokenizer, checked by `same_tokenizer`); the official code maps the
evaluator's key tokens onto another tokenizer's by character offsets, which this does not. Two models'
key-token PPLs are comparable when they were scored on the same selection: the same evaluator (by its
weights), method, K, S, thresholds and text, which `selection_id` names.
"""

from dataclasses import dataclass
import hashlib
import json
import logging
import os

import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import replaced_atomically
from rope_lm.eval import bootstrap
from rope_lm.eval.evaluation import sliding_windows, token_losses

log = logging.getLogger("rope_lm")
ALPHA, BETA = 2.0, -2.0


def window_count(n_tokens: int, length: int, budget: int) -> int:
    """Windows of `length` the first `budget` targets hold (at least one), as many as the text holds."""
    return min(max(1, budget // length), (n_tokens - 1) // length)


def windows(stream, length: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), (count, length) each: the first count * length targets of the stream in
    non-overlapping windows of `length`, each read from its start (the stream protocol's windows)."""
    tokens = np.asarray(stream[: count * length + 1], dtype=np.int64)
    x = torch.from_numpy(tokens[:-1].reshape(count, length).copy())
    y = torch.from_numpy(tokens[1:].reshape(count, length).copy())
    return x, y


def text_digest(x: torch.Tensor, y: torch.Tensor) -> str:
    """The scored text by content: its windows' tokens."""
    h = hashlib.sha256()
    h.update(np.asarray(x.shape, dtype=np.int64).tobytes())
    h.update(x.numpy().tobytes())
    h.update(y[:, -1].numpy().tobytes())
    return h.hexdigest()[:16]


def short_losses(model, x: torch.Tensor, y: torch.Tensor, short: int, stride: int, batch_tokens: int) -> torch.Tensor:
    """Each target's loss with a short context (between short - stride + 1 and short tokens), (count,
    length) float32; NaN at j < short, where the short context is the whole context."""
    count, length = x.shape
    starts, score_from = sliding_windows(length, short, stride)
    starts, score_from = starts[1:], score_from[1:]  # the first window scores j < short: not candidates
    out = torch.full((count, length), float("nan"), dtype=torch.float32)
    if not len(starts):
        return out
    offsets = torch.arange(short)
    per_batch = max(1, batch_tokens // short)
    # Every (window, short window) pair, in batches: a short window is a row of `short` inputs.
    pairs = [(w, i) for w in range(count) for i in range(len(starts))]
    for b in range(0, len(pairs), per_batch):
        chunk = pairs[b : b + per_batch]
        rows = torch.tensor([w for w, _ in chunk])
        begin = torch.from_numpy(starts[[i for _, i in chunk]])
        idx = begin[:, None] + offsets
        losses = token_losses(model, x[rows[:, None], idx], y[rows[:, None], idx], batch_tokens)
        for r, (w, i) in enumerate(chunk):
            s, f = int(starts[i]), int(score_from[i])
            out[w, s + f : s + short] = losses[r, f:]
    return out


def select(long: torch.Tensor, short: torch.Tensor, short_len: int, alpha: float, beta: float) -> torch.Tensor:
    """The key tokens (bool, the shape of long): targets at j >= short_len with
    loss_short - loss_long > alpha and -loss_long > beta."""
    candidate = torch.zeros_like(long, dtype=torch.bool)
    candidate[:, short_len:] = True
    lsd = short - long
    lcl = -long
    return candidate & (lsd > alpha) & (lcl > beta)


def selection_id(digest: str, key: torch.Tensor) -> str:
    """Names one selection: the text and which of its targets are key tokens."""
    h = hashlib.sha256(digest.encode())
    h.update(np.asarray(key.shape, dtype=np.int64).tobytes())
    h.update(np.packbits(key.numpy().astype(np.uint8)).tobytes())
    return h.hexdigest()[:16]


_CUTTING = ("normalizer", "pre_tokenizer", "model", "added_tokens")  # what decides the ids a text is cut into


def same_tokenizer(a: str | None, b: str | None) -> bool:
    """Whether two tokenizer.json texts cut text into the same ids (formatting, padding and
    truncation aside)."""
    if not a or not b:
        return False
    pa, pb = json.loads(a), json.loads(b)
    return all(pa.get(k) == pb.get(k) for k in _CUTTING)


def tokenizer_digest(text: str | None) -> str | None:
    """A tokenizer.json by what `same_tokenizer` compares: equal digests, the same ids."""
    if not text:
        return None
    parsed = json.loads(text)
    cutting = json.dumps({k: parsed.get(k) for k in _CUTTING}, sort_keys=True)
    return hashlib.sha256(cutting.encode()).hexdigest()[:16]


# --- the evaluator's losses, kept in a file keyed by what they depend on ---------------------------


def cache_key(evaluator: dict, digest: str, short: int, stride: int) -> dict:
    """What the evaluator's losses depend on: its weights, method and the text, K and S."""
    return {"evaluator": evaluator, "text": digest, "short": short, "stride": stride}


def cache_file(folder: str, key: dict) -> str:
    name = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(folder, f"key_tokens-{name}.npz")


def read_cached(path: str, key: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(long, short) losses kept in `path` for exactly `key`, else None (a file another key wrote, or
    one that cannot be read, is scored again)."""
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            kept = json.loads(str(f["key"]))
            if kept != json.loads(json.dumps(key, default=str)):
                return None
            return torch.from_numpy(f["long"].copy()), torch.from_numpy(f["short"].copy())
    except (OSError, ValueError, KeyError) as e:
        log.warning("%s cannot be read (%s); the evaluator scores the text again.", path, e)
        return None


def write_cached(path: str, key: dict, long: torch.Tensor, short: torch.Tensor, about: dict) -> None:
    """`about`: the evaluator as a probe that reads this file in its place needs it (KeptEvaluator)."""
    with replaced_atomically(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                key=np.array(json.dumps(key, default=str)),
                about=np.array(json.dumps(about, default=str)),
                long=long.numpy(),
                short=short.numpy(),
            )


@dataclass
class KeptEvaluator:
    """An evaluator read from the losses it kept (key_tokens.evaluator_losses=<folder>): what a probe
    needs of it is its losses on the text, so a folder of key_tokens-*.npz files written by one
    evaluator stands in for its checkpoint, on a machine that does not have it or cannot run it.
    The files say which evaluator wrote them (its weights, method, training length, tokenizer), and a
    length, text, K or S they do not hold is refused, never computed."""

    path: str  # the folder
    identity: dict
    scaling: dict | None
    train_len: int
    scheme: str
    method: str
    tokenizer: str | None  # tokenizer_digest of the evaluator's tokenizer
    checkpoint: str | None
    keys: dict[str, dict]  # file -> its key (cache_key)
    shapes: dict[str, tuple]  # file -> (windows, length)

    def file_for(self, key: dict) -> str | None:
        wanted = json.loads(json.dumps(key, default=str))
        return next((p for p, k in self.keys.items() if k == wanted), None)

    def held(self) -> str:
        """What the files hold, for a refusal: each file's windows, K, S and text."""
        return "; ".join(
            f"{w} windows of {t} tokens with K = {k['short']}, S = {k['stride']} (text {k['text']})"
            for p, k in sorted(self.keys.items(), key=lambda pk: (self.shapes[pk[0]][1], pk[1]["short"]))
            for w, t in [self.shapes[p]]
        )


def read_kept(folder: str, setting: str = "key_tokens.evaluator_losses") -> KeptEvaluator:
    """The evaluator whose losses `folder` keeps (every key_tokens-*.npz in it, all of one evaluator)."""
    names = []
    if os.path.isdir(folder):
        names = sorted(n for n in os.listdir(folder) if n.startswith("key_tokens-") and n.endswith(".npz"))
    if not names:
        raise ConfigError(
            f"{setting}={folder} holds no key_tokens-*.npz file: give the folder where a key-token run kept its "
            f"evaluator's losses (its out=, or its key_tokens.cache=), or name the evaluator itself with "
            f"key_tokens.evaluator=<checkpoint, run folder or hf:model>."
        )
    keys, shapes, abouts = {}, {}, {}
    for name in names:
        path = os.path.join(folder, name)
        try:
            with np.load(path, allow_pickle=False) as f:
                keys[path] = json.loads(str(f["key"]))
                abouts[path] = json.loads(str(f["about"])) if "about" in f.files else None
                shapes[path] = tuple(int(v) for v in f["long"].shape)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{setting}: {path} cannot be read as an evaluator's kept losses ({e}).") from None
        if abouts[path] is None:
            raise ConfigError(
                f"{setting}: {path} was written before kept losses named their evaluator (its training length and "
                f"tokenizer), so it cannot stand in for it. Run the probe once with key_tokens.evaluator=<the "
                f"evaluator> and key_tokens.cache={folder} to write them again."
            )
    first = next(iter(keys))
    for path in keys:
        same = [keys[path]["evaluator"]] + [abouts[path].get(k) for k in ("train_len", "tokenizer")]
        if same != [keys[first]["evaluator"]] + [abouts[first].get(k) for k in ("train_len", "tokenizer")]:
            raise ConfigError(
                f"{setting}={folder} holds the losses of more than one evaluator ({first}: weights "
                f"{keys[first]['evaluator']['identity'].get('weights')}; {path}: weights "
                f"{keys[path]['evaluator']['identity'].get('weights')}), and key tokens are chosen by one. Give a "
                f"folder that holds one evaluator's files."
            )
    about = abouts[first]
    return KeptEvaluator(
        path=folder,
        identity=keys[first]["evaluator"]["identity"],
        scaling=keys[first]["evaluator"].get("scaling"),
        train_len=int(about["train_len"]),
        scheme=about.get("scheme", "?"),
        method=about.get("method", "?"),
        tokenizer=about.get("tokenizer"),
        checkpoint=about.get("checkpoint"),
        keys=keys,
        shapes=shapes,
    )


def kept_losses(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(path, allow_pickle=False) as f:
        return torch.from_numpy(f["long"].copy()), torch.from_numpy(f["short"].copy())


def evaluator_losses(
    model, x: torch.Tensor, y: torch.Tensor, short: int, stride: int, batch_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluator's (long, short) losses of every target, (count, length) float32 each."""
    was = model.training
    model.eval()
    try:
        long = token_losses(model, x, y, batch_tokens).float()
        return long, short_losses(model, x, y, short, stride, batch_tokens)
    finally:
        model.train(was)


# --- the model under test ------------------------------------------------------------------------


def _ppl(loss: float | None) -> float | None:
    return None if loss is None else float(np.exp(min(loss, 700.0)))


def score(losses: torch.Tensor, key: torch.Tensor, resamples: int, seed: int, length: int) -> dict:
    """Plain and key-token PPL of a model's per-target losses (count, length), with 95% bootstrap
    intervals over windows (a window's targets share their context), and the per-window sums they
    come from."""
    d = losses.double()
    per_window = d.sum(1).numpy()
    key_sum = (d * key).sum(1).numpy()
    key_count = key.sum(1).numpy().astype(np.float64)
    n_key = int(key_count.sum())
    loss = float(d.mean())
    key_loss = float(key_sum.sum() / n_key) if n_key else None
    out = {
        "windows": int(d.shape[0]),
        "tokens": int(d.numel()),
        "key_tokens": n_key,
        "key_share": n_key / d.numel(),
        "loss": loss,
        "ppl": _ppl(loss),
        "key_loss": key_loss,
        "key_ppl": _ppl(key_loss),
        # Per-window sums (each window scores `length` targets): two models scored on the same selection are
        # compared window by window (a paired bootstrap, rope_lm.compare.long_range_compare).
        "per_window": {
            "loss": [float(v) for v in per_window],
            "key_loss": [float(v) for v in key_sum],
            "key_count": [int(v) for v in key_count],
        },
    }
    counts = np.full(d.shape[0], float(d.shape[1]))
    lo, hi = bootstrap.ppl_interval(per_window, counts, resamples, np.random.default_rng([int(seed), length, 0]))
    klo, khi = (None, None)
    if n_key:
        # The same windows drawn for both: a resample with no key token gives no key PPL and is left out.
        klo, khi = bootstrap.ppl_interval(key_sum, key_count, resamples, np.random.default_rng([int(seed), length, 0]))
    out.update(ppl_lo=lo, ppl_hi=hi, key_ppl_lo=klo, key_ppl_hi=khi)
    return out


def check(short: int | None, stride: int | None, alpha: float, beta: float, lengths: list[int] | None) -> None:
    """K, S and the thresholds, before any model reads a token (None: not resolved yet, checked once it is)."""
    if (short is not None and short < 1) or (stride is not None and (stride < 1 or (short and stride > short))):
        raise ConfigError(
            f"key_tokens.short={short} and key_tokens.stride={stride}: the short context K must be a positive "
            f"number of tokens and the stride S between 1 and K (S = 1: every token's short context is exactly K; "
            f"null: K / 4, the paper's 4,096 / 1,024)."
        )
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not np.isfinite(value):
            raise ConfigError(f"key_tokens.{name}={value} must be a finite number (the paper: alpha 2, beta -2).")
    past = [T for T in lengths or [] if short is not None and T <= short]
    if past:
        raise ConfigError(
            f"key_tokens: the length {past[0]} is not longer than the short context K = {short}, so no token has "
            f"more context in the long reading than in the short one and none can be a key token. Give lengths "
            f"above K (key_tokens.lengths= or key_tokens.multipliers= of the evaluator's training length), or a "
            f"shorter key_tokens.short=."
        )
