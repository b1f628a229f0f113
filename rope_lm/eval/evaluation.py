"""Perplexity past the training length (docs/evaluation.md: the protocols).

Three protocols (`eval.protocol`) cut windows of L tokens from the token cache
in different ways; scoring, per-position curves and intervals are shared.

stream (default): the first N+1 tokens of the evaluation split, N a multiple
  of the longest L, are cut into non-overlapping windows of L inputs (the last
  one shorter where L does not divide N); each window starts fresh, so every L
  scores exactly the same N target tokens. Bootstrap unit: the window.
documents: the documents of the split with at least L+1 tokens (a document's
  tokens end with its end-of-text token), each truncated to its first L+1
  tokens and scored as one window, as PI / YaRN / LongLoRA report PG-19 and
  proof-pile. Every length scores the same documents (those long enough for
  the longest length) when there are any; otherwise each length scores the
  documents long enough for it, and the row says how many. Unit: the document.
  With `document_tokens` B: the first B targets of each document (B rounded
  down to a multiple of the longest L) cut into windows of L as the stream
  protocol cuts its N, so every length scores the same targets of the same
  documents and no window crosses a document's end; many windows per held-out
  book where one window per book gives too few tokens. Unit: the window.
sliding: the same N targets as stream, each scored once with up to L tokens of
  context: windows of L start every `sliding_stride` tokens and score only
  their last `stride` targets (the first window scores all of its own). Many
  windows go through one forward pass. Unit: a block of L consecutive targets
  (the stream protocol's windows), since single windows of a small stride are
  strongly correlated.

PPL = exp(mean token cross-entropy); tokens at window positions >= L_train are
also reported on their own: that is where extrapolation happens. Every PPL and
the PPL relative to L_train carry a 95% bootstrap interval (rope_lm.eval.bootstrap).
"""

from dataclasses import dataclass, field
import logging
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.eval import bootstrap, cost
from rope_lm.model.head import scoring_chunk, token_cross_entropy

log = logging.getLogger("rope_lm")
PROTOCOLS = ("stream", "documents", "sliding")


@dataclass
class EvalConfig:
    lengths: list[int] | None = None  # absolute lengths; default: train_len x multipliers
    multipliers: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    token_budget: int = 32_768  # target tokens scored at every length (documents: budget / longest L documents)
    batch_tokens: int = 16_384  # tokens per forward pass
    position_buckets: int = 32
    sliding_stride: int | None = None  # protocol sliding: its stride; stream: also a sliding-window PPL
    split: str = "test"
    protocol: str = "stream"  # stream | documents | sliding
    max_documents: int | None = None  # documents protocol: documents per length (default from token_budget)
    document_tokens: int | None = None  # documents protocol: score each document's first B targets in windows of L
    bootstrap: int = 1000  # resamples for the 95% intervals; 0: no intervals
    seed: int = 0  # of the bootstrap resampling

    def resolve_lengths(self, train_len: int) -> list[int]:
        raw = list(self.lengths) if self.lengths else [m * train_len for m in self.multipliers]
        if not raw:
            raise ConfigError(
                "eval.multipliers is empty (and eval.lengths unset): there is no length to evaluate. "
                "Give at least one, e.g. eval.multipliers=[1,2,4] or eval.lengths=[128,512]."
            )
        for v in raw:
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(
                    f"Evaluation length {v!r} is not positive or not finite (settings eval.lengths / eval.multipliers); "
                    f"give positive token counts, e.g. eval.multipliers=[1,2,4]."
                )
        return sorted({int(round(v)) for v in raw})

    def validate(self):
        for key in ("token_budget", "batch_tokens", "position_buckets"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"eval.{key}={getattr(self, key)} must be a positive integer.")
        if self.sliding_stride is not None and self.sliding_stride <= 0:
            raise ConfigError(
                f"eval.sliding_stride={self.sliding_stride} must be a positive integer (or null to skip)."
            )
        if self.split not in ("train", "valid", "test"):
            raise ConfigError(f"eval.split={self.split!r} is not a split; use train, valid or test.")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"eval.protocol={self.protocol!r} is not an evaluation protocol. Use stream (non-overlapping "
                f"windows of the concatenated split, the default), documents (documents of at least L+1 tokens, "
                f"each truncated to L+1, as the PI/YaRN papers report PG-19) or sliding (each token scored once "
                f"with up to L tokens of context; set eval.sliding_stride too)."
            )
        if self.protocol == "sliding" and self.sliding_stride is None:
            raise ConfigError(
                "eval.protocol=sliding needs eval.sliding_stride, the number of new tokens each window scores: "
                "256 or 512 as in the PI/YaRN papers, 1 as in the ALiBi paper (feasible for short L), e.g. "
                "eval.sliding_stride=256. A stride of L or more is the stream protocol."
            )
        if self.max_documents is not None and (not isinstance(self.max_documents, int) or self.max_documents <= 0):
            raise ConfigError(
                f"eval.max_documents={self.max_documents!r} must be a positive integer (the number of documents "
                f"scored at every length under eval.protocol=documents), or null to take eval.token_budget / the "
                f"longest length."
            )
        if self.document_tokens is not None and (
            not isinstance(self.document_tokens, int)
            or isinstance(self.document_tokens, bool)
            or self.document_tokens <= 0
        ):
            raise ConfigError(
                f"eval.document_tokens={self.document_tokens!r} must be a positive number of tokens (each document's "
                f"first that many targets, cut into windows of L, under eval.protocol=documents), or null for one "
                f"window of L per document."
            )
        if self.document_tokens is not None and self.protocol != "documents":
            raise ConfigError(
                f"eval.document_tokens={self.document_tokens} applies to eval.protocol=documents only (it is "
                f"{self.protocol}); set eval.protocol=documents, or drop eval.document_tokens."
            )
        if not isinstance(self.bootstrap, int) or isinstance(self.bootstrap, bool) or self.bootstrap < 0:
            raise ConfigError(
                f"eval.bootstrap={self.bootstrap!r} must be a whole number of bootstrap resamples: 1000 gives "
                f"stable 95% intervals, 0 turns the intervals off."
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"eval.seed={self.seed!r} must be an integer (it seeds the bootstrap resampling).")


def scored_tokens(n_available: int, lengths: list[int], budget: int, split: str = "test") -> int:
    """N: the number of target tokens every length scores (stream, sliding)."""
    longest = max(lengths)
    usable = min(budget, n_available - 1)
    n = (usable // longest) * longest
    if n < longest:
        raise ConfigError(
            f"The {split} split has {n_available} tokens, too few for one window of the longest evaluation length "
            f"{longest} (it needs {longest + 1}). Use shorter lengths (eval.multipliers / eval.lengths) or a larger "
            f"corpus; eval.token_budget is {budget}."
        )
    return n


@dataclass
class DocumentPlan:
    """Which documents each length scores (indices into the split's documents)."""

    starts: np.ndarray  # token offset of every document of the split
    lengths: np.ndarray  # tokens of every document, its end-of-text token included
    chosen: dict  # evaluation length -> indices of the documents it scores
    shared: bool  # every length scores the same documents
    skipped: list  # evaluation lengths no document is long enough for
    tiled: int | None = None  # targets scored per document in windows of L (eval.document_tokens), else None


def plan_documents(
    doc_starts: np.ndarray,
    n_tokens: int,
    lengths: list[int],
    budget: int,
    max_documents: int | None,
    split: str = "test",
    document_tokens: int | None = None,
) -> DocumentPlan:
    starts = np.asarray(doc_starts, dtype=np.int64)
    sizes = np.diff(np.append(starts, n_tokens))
    longest = max(lengths)
    if document_tokens is not None:
        n = (document_tokens // longest) * longest
        if n < longest:
            raise ConfigError(
                f"eval.document_tokens={document_tokens} is shorter than the longest evaluation length {longest}: "
                f"each document must hold at least one window of it. Give eval.document_tokens >= {longest}."
            )
        long_enough = np.flatnonzero(sizes >= n + 1)
        if not len(long_enough):
            raise ConfigError(
                f"No document of the {split} split has the {n + 1} tokens eval.document_tokens={document_tokens} "
                f"asks to score (the longest has {int(sizes.max()) if len(sizes) else 0}). Lower "
                f"eval.document_tokens, or hold out longer documents."
            )
        k = max_documents or max(1, budget // n)
        return DocumentPlan(starts, sizes, {L: long_enough[:k] for L in lengths}, True, [], n)
    k = max_documents or max(1, budget // longest)
    shared = np.flatnonzero(sizes >= longest + 1)
    if len(shared):
        return DocumentPlan(starts, sizes, {L: shared[:k] for L in lengths}, True, [])
    # No document reaches the longest length: comparable sets are impossible,
    # so each length takes what it can, and says how many.
    chosen = {L: np.flatnonzero(sizes >= L + 1)[:k] for L in lengths}
    skipped = [L for L in lengths if len(chosen[L]) == 0]
    if len(skipped) == len(lengths):
        raise ConfigError(
            f"No document of the {split} split has the {min(lengths) + 1} tokens the shortest evaluation length "
            f"{min(lengths)} needs under eval.protocol=documents (the longest document has "
            f"{int(sizes.max()) if len(sizes) else 0} tokens). Use shorter lengths, a corpus of long documents "
            f"(PG-19), or eval.protocol=stream."
        )
    return DocumentPlan(starts, sizes, {L: c for L, c in chosen.items() if len(c)}, False, skipped)


def eval_summary(cfg: EvalConfig, stream_len: int, doc_starts: np.ndarray | None, train_len: int) -> dict:
    """What results.json records about the evaluation as a whole; raises a
    ConfigError when the split cannot serve the protocol."""
    lengths = cfg.resolve_lengths(train_len)
    out = {
        "split": cfg.split,
        "protocol": cfg.protocol,
        "lengths": lengths,
        "split_tokens": int(stream_len),
        "token_budget": cfg.token_budget,
        "bootstrap": cfg.bootstrap,
        "seed": cfg.seed,
        "interval": bootstrap.LEVEL,
    }
    if cfg.protocol == "documents":
        if doc_starts is None:
            raise ValueError("eval.protocol=documents needs the split's document starts")
        plan = plan_documents(
            doc_starts, stream_len, lengths, cfg.token_budget, cfg.max_documents, cfg.split, cfg.document_tokens
        )
        out.update(
            documents_shared=plan.shared,
            split_documents=int(len(plan.starts)),
            documents={str(L): int(len(c)) for L, c in plan.chosen.items()},
            scored_tokens={str(L): int(len(c)) * (plan.tiled or L) for L, c in plan.chosen.items()},
            skipped_lengths=plan.skipped,
            max_documents=cfg.max_documents,
        )
        if plan.tiled:
            out["document_tokens"] = plan.tiled
    else:
        out["scored_tokens"] = scored_tokens(stream_len, lengths, cfg.token_budget, cfg.split)
    if cfg.sliding_stride:
        out["sliding_stride"] = cfg.sliding_stride
    return out


def autocast_for(device):
    """How evaluation reads a model on `device`: bfloat16 autocast on CUDA, full precision elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def token_losses(model, windows: torch.Tensor, targets: torch.Tensor, batch_tokens: int) -> torch.Tensor:
    """Per-token cross-entropy (n_windows, L) in float32."""
    device = next(model.parameters()).device
    n, L = windows.shape
    per_batch = max(1, batch_tokens // L)
    out = []
    for s in range(0, n, per_batch):
        x = windows[s : s + per_batch].to(device)
        y = targets[s : s + per_batch].to(device)
        if hasattr(model, "hidden") and hasattr(model, "lm_head"):
            # Our model: logits a chunk of tokens at a time (rope_lm.model.head).
            with autocast_for(device):
                weight = model.lm_head.weight
                loss = token_cross_entropy(model.hidden(x), weight, y, scoring_chunk(weight.shape[0]))
        else:
            with autocast_for(device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        out.append(loss.view(x.shape).cpu())
    return torch.cat(out)


def _windowed_losses(model, tokens: torch.Tensor, starts: torch.Tensor, width: int, batch_tokens: int, tick=None):
    """token_losses of the windows tokens[s : s + width] (targets one later)
    for every s in starts, gathered a forward batch at a time so that the
    index matrix never holds more than a batch; (n_windows, width)."""
    per_batch = max(1, batch_tokens // width)
    offsets = torch.arange(width)
    out = []
    for b in range(0, len(starts), per_batch):
        idx = starts[b : b + per_batch, None] + offsets
        out.append(token_losses(model, tokens[idx], tokens[idx + 1], batch_tokens))
        if tick:
            tick(len(idx))
    return torch.cat(out)


def _bucket(total: torch.Tensor, count: torch.Tensor, buckets: int) -> dict:
    """Mean loss over buckets of positions, from the loss summed at each
    position and the number of tokens scored there."""
    L = total.numel()
    width = max(1, math.ceil(L / buckets))
    means = [float(total[s : s + width].sum() / count[s : s + width].sum()) for s in range(0, L, width)]
    return {"width": width, "start": list(range(0, L, width)), "loss": means}


def _ppl(loss: float | None) -> float | None:
    return None if loss is None else float(math.exp(min(loss, 700.0)))


def _row(L: int, train_len: int, total: torch.Tensor, count: torch.Tensor, n: int, buckets: int) -> dict:
    """The row of one length from the loss summed at each window position and
    the number of tokens scored there (n in all)."""
    loss = float(total.sum() / n)
    within = float(total[:train_len].sum() / count[:train_len].sum())
    beyond_count = int(count[train_len:].sum())
    beyond = float(total[train_len:].sum() / beyond_count) if beyond_count else None
    return {
        "length": L,
        "ratio": L / train_len,
        "tokens": n,
        "loss": loss,
        "ppl": _ppl(loss),
        "loss_within": within,
        "ppl_within": _ppl(within),
        "loss_beyond": beyond,
        "ppl_beyond": _ppl(beyond),
        "tokens_beyond": beyond_count,
        "per_position": _bucket(total, count, buckets),
    }


def _window_units(kind: str, keys, losses: torch.Tensor, widths: np.ndarray, train_len: int, ends=None):
    d = losses.double()
    return bootstrap.Units(
        kind=kind,
        keys=np.asarray(keys, dtype=np.int64),
        loss=d.sum(1).numpy(),
        count=np.asarray(widths, dtype=np.int64),
        loss_beyond=d[:, train_len:].sum(1).numpy(),
        count_beyond=np.maximum(0, np.asarray(widths) - train_len),
        ends=None if ends is None else np.asarray(ends, dtype=np.int64),
    )


def _tiles(model, stream, offset, L, n, train_len, batch_tokens, total, count, tick=None) -> list:
    """The n targets after stream[offset] in windows of L, each starting fresh
    (the last one shorter where L does not divide n, so that every length
    scores the same targets): their losses summed per position into total and
    count, and their bootstrap units (keyed by stream offset) returned."""
    tokens = torch.from_numpy(np.asarray(stream[offset : offset + n + 1], dtype=np.int64))
    full = n // L
    spans = [(0, full * L, L)] + ([(full * L, n, n - full * L)] if n % L else [])
    parts = []
    for start, end, width in spans:
        losses = _windowed_losses(model, tokens, torch.arange(start, end, width), width, batch_tokens, tick)
        total[:width] += losses.double().sum(0)
        count[:width] += losses.shape[0]
        keys = offset + np.arange(start, end, width)
        parts.append(_window_units("window", keys, losses, np.full(len(keys), width), train_len, keys + width))
    return parts


def _joined(parts) -> bootstrap.Units:
    return bootstrap.Units(
        "window",
        *[
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("keys", "loss", "count", "loss_beyond", "count_beyond", "ends")
        ],
    )


def _stream(model, stream, L, n, train_len, batch_tokens, buckets, tick=None):
    total = torch.zeros(L, dtype=torch.float64)  # loss summed over windows, per position
    count = torch.zeros(L, dtype=torch.float64)
    parts = _tiles(model, stream, 0, L, n, train_len, batch_tokens, total, count, tick)
    row = _row(L, train_len, total, count, n, buckets)
    row["windows"] = -(-n // L)
    return row, _joined(parts)


def _document_tiles(
    model, stream, L, docs: np.ndarray, plan: DocumentPlan, train_len, batch_tokens, buckets, tick=None
):
    """The first plan.tiled targets of every document, in windows of L."""
    total = torch.zeros(L, dtype=torch.float64)
    count = torch.zeros(L, dtype=torch.float64)
    parts = []
    for start in plan.starts[docs]:
        parts += _tiles(model, stream, int(start), L, plan.tiled, train_len, batch_tokens, total, count, tick)
    row = _row(L, train_len, total, count, len(docs) * plan.tiled, buckets)
    row.update(windows=len(docs) * -(-plan.tiled // L), documents=int(len(docs)), document_tokens=plan.tiled)
    return row, _joined(parts)


def sliding_windows(n: int, L: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(first input index, first scored position) of every window that scores
    targets 0 .. n-1 once each: the first window scores its min(n, L) targets,
    each later one the `stride` (the last: up to stride) targets after those."""
    stride = min(stride, L)
    first = min(n, L)
    begins = np.arange(first, n, stride)
    ends = np.minimum(begins + stride, n)
    starts = np.concatenate([[0], ends - L]).astype(np.int64)
    score_from = np.concatenate([[0], L - (ends - begins)]).astype(np.int64)
    return starts, score_from


@torch.no_grad()
def _sliding(model, stream, L, n, stride, train_len, batch_tokens, buckets, tick=None):
    """Returns (row, units, per-target losses in target order)."""
    stride = min(stride, L)
    tokens = torch.from_numpy(np.asarray(stream[: n + 1], dtype=np.int64))
    starts, score_from = sliding_windows(n, L, stride)
    width = min(n, L)
    per_batch = max(1, batch_tokens // width)
    offsets = torch.arange(width)
    scored, where = [], []
    for b in range(0, len(starts), per_batch):
        s = torch.from_numpy(starts[b : b + per_batch])
        idx = s[:, None] + offsets
        losses = token_losses(model, tokens[idx], tokens[idx + 1], batch_tokens)
        # Row-major order of the mask is target order: windows are in order
        # and each scores the targets right after the previous one's.
        mask = offsets[None, :] >= torch.from_numpy(score_from[b : b + per_batch])[:, None]
        scored.append(losses[mask])
        where.append(offsets.expand_as(mask)[mask])
        if tick:
            tick(len(s))
    target_loss = torch.cat(scored)
    position = torch.cat(where)
    assert target_loss.numel() == n
    d = target_loss.double()
    total = torch.zeros(L, dtype=torch.float64).index_add_(0, position, d)
    count = torch.zeros(L, dtype=torch.float64).index_add_(0, position, torch.ones_like(d))
    row = _row(L, train_len, total, count, n, buckets)
    row.update(stride=stride, windows=int(len(starts)))
    block = torch.arange(n) // L
    beyond = position >= train_len
    n_blocks = int(block[-1]) + 1
    keys = np.arange(n_blocks) * L
    units = bootstrap.Units(
        "block",
        keys,
        torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, block, d).numpy(),
        np.bincount(block.numpy(), minlength=n_blocks),
        torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, block[beyond], d[beyond]).numpy(),
        np.bincount(block[beyond].numpy(), minlength=n_blocks),
        np.minimum(keys + L, n),
    )
    return row, units, target_loss


def _documents(model, stream, L, docs: np.ndarray, plan: DocumentPlan, train_len, batch_tokens, buckets, tick=None):
    tokens = torch.from_numpy(np.asarray(stream, dtype=np.int64))
    starts = torch.from_numpy(plan.starts[docs])
    losses = _windowed_losses(model, tokens, starts, L, batch_tokens, tick)
    total = losses.double().sum(0)
    count = torch.full((L,), float(len(docs)), dtype=torch.float64)
    row = _row(L, train_len, total, count, len(docs) * L, buckets)
    row.update(windows=int(len(docs)), documents=int(len(docs)))
    units = _window_units("document", docs, losses, np.full(len(docs), L), train_len)
    return row, units


def _score_length(model, stream, L, n, cfg: EvalConfig, plan, train_len, tick) -> tuple[dict, bootstrap.Units]:
    """One length scored under cfg.protocol (with the stream protocol's extra
    sliding-window pass where asked): its row and its bootstrap units."""
    if cfg.protocol == "stream":
        row, units = _stream(model, stream, L, n, train_len, cfg.batch_tokens, cfg.position_buckets, tick)
    elif cfg.protocol == "sliding":
        row, units, _ = _sliding(
            model,
            stream,
            L,
            n,
            cfg.sliding_stride,
            train_len,
            cfg.batch_tokens,
            cfg.position_buckets,
            tick,
        )
    else:
        score = _document_tiles if plan.tiled else _documents
        row, units = score(
            model,
            stream,
            L,
            plan.chosen[L],
            plan,
            train_len,
            cfg.batch_tokens,
            cfg.position_buckets,
            tick,
        )
    row = {"protocol": cfg.protocol, **row, "unit": units.kind, "units": len(units)}
    if cfg.protocol == "stream" and cfg.sliding_stride:
        extra, extra_units, _ = _sliding(
            model, stream, L, n, cfg.sliding_stride, train_len, cfg.batch_tokens, cfg.position_buckets, tick
        )
        ci = bootstrap.intervals(extra_units, cfg.bootstrap, cfg.seed, L)
        row["sliding"] = {
            "length": L,
            "stride": extra["stride"],
            "tokens": extra["tokens"],
            "windows": extra["windows"],
            "loss": extra["loss"],
            "ppl": extra["ppl"],
            "ppl_lo": ci.get("ppl_lo"),
            "ppl_hi": ci.get("ppl_hi"),
        }
    return row, units


def evaluate_lengths(
    model,
    stream: np.ndarray,
    cfg: EvalConfig,
    train_len: int,
    on_result=None,
    doc_starts: np.ndarray | None = None,
    units_out: dict | None = None,
    kept: dict | None = None,
    kept_units: dict | None = None,
) -> list[dict]:
    """ppl@L for every configured length under cfg.protocol; calls
    on_result(row) for each length in ascending order, as soon as it and every
    shorter length are done. The training length is evaluated first, so that
    every row carries its PPL relative to it when reported. `units_out`, a
    dict, receives each length's bootstrap units (for paired comparisons of
    two evaluations on the same windows). `kept` (length -> row) holds rows an
    earlier sitting measured: those lengths are not scored again and their rows
    come back as they were, except the training length's when a new length
    needs its windows for a paired interval of its relative PPL and
    `kept_units` (length -> units) does not hold them."""
    summary = eval_summary(cfg, len(stream), doc_starts, train_len)
    lengths = [L for L in summary["lengths"] if L not in summary.get("skipped_lengths", [])]
    plan = None
    if cfg.protocol == "documents":
        plan = plan_documents(
            doc_starts,
            len(stream),
            lengths + summary["skipped_lengths"],
            cfg.token_budget,
            cfg.max_documents,
            cfg.split,
            cfg.document_tokens,
        )
        for L in plan.skipped:
            log.warning("ppl@%d skipped: no document of the %s split has %d tokens", L, cfg.split, L + 1)
    n = summary["scored_tokens"] if cfg.protocol != "documents" else None
    kept = {L: row for L, row in (kept or {}).items() if L in lengths}
    kept_units = {L: u for L, u in (kept_units or {}).items() if L in kept}
    if train_len in kept and train_len not in kept_units and cfg.bootstrap and any(L not in kept for L in lengths):
        del kept[train_len]  # scored again: the new lengths' relative PPL pairs with its windows
    order = sorted(lengths, key=lambda L: (L != train_len, L))
    bar = _progress(cfg, [L for L in lengths if L not in kept], n, plan)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rows, reference, done = [], None, {}
    emit = iter(sorted(lengths))
    next_up = next(emit, None)
    try:
        for L in order:
            if L in kept:
                row = kept[L]
                if "ppl_rel" not in row and (reference is not None or L == train_len):
                    # Another method's row taken for this one (runs.eval_run._plain_rows): relative to this one's L.
                    row = {**row, **_relative(row, kept_units.get(L), reference, cfg, L, train_len)}
                done[L] = row
                rows.append(row)
                if units_out is not None and L in kept_units:
                    units_out[L] = kept_units[L]
                if L == train_len:
                    reference = (row, kept_units.get(L))
            while next_up in done:
                if on_result:
                    on_result(done[next_up])
                next_up = next(emit, None)
            if L in kept:
                continue
            bar.set_postfix_str(f"L={L}")
            with cost.measured(device) as spent:
                row, units = _score_length(model, stream, L, n, cfg, plan, train_len, bar.update)
            row.update(spent)
            if units_out is not None:
                units_out[L] = units
            if cfg.protocol == "documents":
                row["documents_shared"] = plan.shared
            row.update(bootstrap.intervals(units, cfg.bootstrap, cfg.seed, L))
            if L == train_len:
                reference = (row, units)
            if reference is not None:
                row.update(_relative(row, units, reference, cfg, L, train_len))
            rows.append(row)
            done[L] = row
            while next_up in done:
                if on_result:
                    on_result(done[next_up])
                next_up = next(emit, None)
    finally:
        bar.close()
        model.train(was_training)
    return sorted(rows, key=lambda r: r["length"])


# A row's PPL relative to its method's at the training length, with that ratio's interval.
RELATIVE_KEYS = ("ppl_rel", "ppl_rel_lo", "ppl_rel_hi", "ppl_rel_paired")


def _relative(row: dict, units, reference: tuple | None, cfg: EvalConfig, L: int, train_len: int) -> dict:
    """ppl_rel of a row at L over the reference row (the same method at the training length), and its paired
    interval from both rows' windows where both are held (units None: a row kept without them)."""
    if L == train_len:
        return (
            dict(ppl_rel=1.0, ppl_rel_lo=1.0, ppl_rel_hi=1.0, ppl_rel_paired=True)
            if cfg.bootstrap
            else {"ppl_rel": 1.0}
        )
    ref_row, ref_units = reference
    out = {"ppl_rel": row["ppl"] / ref_row["ppl"]}
    if units is not None and ref_units is not None:  # None: kept from an earlier sitting, with no intervals asked for
        out.update(bootstrap.ratio_interval(units, ref_units, cfg.bootstrap, cfg.seed, L))
    return out


def _progress(cfg: EvalConfig, lengths: list[int], n: int | None, plan: DocumentPlan | None):
    """A bar over the windows of every length, with an ETA; silent unless
    stderr is a terminal (logs and sweeps stay clean)."""
    from tqdm.auto import tqdm

    total = 0
    for L in lengths:
        if cfg.protocol == "documents":
            total += len(plan.chosen[L]) * (-(-plan.tiled // L) if plan.tiled else 1)
            continue
        if cfg.protocol == "stream":
            total += -(-n // L)
        if cfg.sliding_stride:
            total += len(sliding_windows(n, L, cfg.sliding_stride)[0])
    return tqdm(
        total=total,
        unit="window",
        desc=f"eval ({cfg.protocol})",
        leave=False,
        dynamic_ncols=True,
        disable=not sys.stderr.isatty(),
    )
