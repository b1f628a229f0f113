"""Perplexity past the training length (DESIGN.md, "Evaluation, precisely").

ppl@L: the first N+1 tokens of the evaluation split, N a multiple of the
longest L, are cut into non-overlapping windows of L inputs (the last one
shorter where L does not divide N); each window starts fresh, so every L
scores exactly the same N target tokens.
PPL = exp(mean token cross-entropy). Tokens at window positions >= L_train
are also reported on their own: that is where extrapolation happens.
"""

from dataclasses import dataclass, field
import math

import numpy as np
import torch
import torch.nn.functional as F

from rope_lm.errors import ConfigError
from rope_lm.head import token_cross_entropy


@dataclass
class EvalConfig:
    lengths: list[int] | None = None  # absolute lengths; default: train_len x multipliers
    multipliers: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    token_budget: int = 32_768  # target tokens scored at every length
    batch_tokens: int = 16_384  # tokens per forward pass
    position_buckets: int = 32
    sliding_stride: int | None = None  # also score each token once with up to L context
    split: str = "test"

    def resolve_lengths(self, train_len: int) -> list[int]:
        raw = list(self.lengths) if self.lengths else [m * train_len for m in self.multipliers]
        for v in raw:
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(
                    f"Evaluation length {v!r} is not positive (settings eval.lengths / eval.multipliers); "
                    f"give positive token counts, e.g. eval.multipliers=[1,2,4]."
                )
        return sorted({int(round(v)) for v in raw})

    def validate(self):
        for key in ("token_budget", "batch_tokens", "position_buckets"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"eval.{key}={getattr(self, key)} must be a positive integer.")
        if self.sliding_stride is not None and self.sliding_stride <= 0:
            raise ConfigError(f"eval.sliding_stride={self.sliding_stride} must be a positive integer (or null to skip).")
        if self.split not in ("train", "valid", "test"):
            raise ConfigError(f"eval.split={self.split!r} is not a split; use train, valid or test.")


def scored_tokens(n_available: int, lengths: list[int], budget: int, split: str = "test") -> int:
    """N: the number of target tokens every length scores."""
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


def _autocast(device):
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
            # Our model: logits a chunk of tokens at a time (rope_lm.head).
            with _autocast(device):
                loss = token_cross_entropy(model.hidden(x), model.lm_head.weight, y)
        else:
            with _autocast(device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        out.append(loss.view(x.shape).cpu())
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


def ppl_at_length(model, stream: np.ndarray, L: int, n: int, train_len: int, batch_tokens: int, buckets: int) -> dict:
    tokens = torch.from_numpy(np.asarray(stream[: n + 1], dtype=np.int64))
    full = n // L
    # A length that does not divide N (1.25 x L_train, say) ends in one shorter
    # window, so that every length still scores exactly the same N targets.
    spans = [(0, full * L, L)] + ([(full * L, n, n - full * L)] if n % L else [])
    total = torch.zeros(L, dtype=torch.float64)  # loss summed over windows, per position
    count = torch.zeros(L, dtype=torch.float64)
    for start, end, width in spans:
        losses = token_losses(model, tokens[start:end].view(-1, width), tokens[start + 1 : end + 1].view(-1, width), batch_tokens)
        total[:width] += losses.double().sum(0)
        count[:width] += losses.shape[0]
    loss = float(total.sum() / n)
    within = float(total[:train_len].sum() / count[:train_len].sum())
    beyond_count = int(count[train_len:].sum())
    beyond = float(total[train_len:].sum() / beyond_count) if beyond_count else None
    return {
        "length": L,
        "ratio": L / train_len,
        "tokens": n,
        "windows": full + (1 if n % L else 0),
        "loss": loss,
        "ppl": _ppl(loss),
        "loss_within": within,
        "ppl_within": _ppl(within),
        "loss_beyond": beyond,
        "ppl_beyond": _ppl(beyond),
        "tokens_beyond": beyond_count,
        "per_position": _bucket(total, count, buckets),
    }


@torch.no_grad()
def sliding_window_ppl(model, stream: np.ndarray, L: int, n: int, stride: int, batch_tokens: int) -> dict:
    """Each of the n target tokens scored once, with up to L tokens of context:
    windows of L start every `stride` tokens and score only their last
    `stride` targets (the first window scores all of its own)."""
    stride = min(stride, L)
    tokens = torch.from_numpy(np.asarray(stream[: n + 1], dtype=np.int64))
    total, begin = 0.0, 0
    while begin < n:
        end = min(n, begin + (L if begin == 0 else stride))
        start = max(0, end - L)
        losses = token_losses(model, tokens[start:end][None], tokens[start + 1 : end + 1][None], batch_tokens)[0]
        total += float(losses[begin - start :].sum())
        begin = end
    count = n
    loss = total / count
    return {"length": L, "stride": stride, "tokens": count, "loss": loss, "ppl": _ppl(loss)}


def evaluate_lengths(model, stream: np.ndarray, cfg: EvalConfig, train_len: int, on_result=None) -> list[dict]:
    """ppl@L for every configured length; calls on_result(row) as each completes."""
    lengths = cfg.resolve_lengths(train_len)
    n = scored_tokens(len(stream), lengths, cfg.token_budget, cfg.split)
    was_training = model.training
    model.eval()
    rows = []
    try:
        for L in lengths:
            row = ppl_at_length(model, stream, L, n, train_len, cfg.batch_tokens, cfg.position_buckets)
            if cfg.sliding_stride:
                row["sliding"] = sliding_window_ppl(model, stream, L, n, cfg.sliding_stride, cfg.batch_tokens)
            rows.append(row)
            if on_result:
                on_result(row)
    finally:
        model.train(was_training)
    return rows
