"""Percentile-bootstrap intervals for perplexities.

A perplexity is exp(total loss / total tokens) over *units* (stream windows,
documents, or blocks of sliding-window targets). Tokens inside a unit are
correlated (they share a context), so units, not tokens, are what is
resampled: B times, draw as many units as there are, with replacement, and
take PPL = exp(sum of drawn losses / sum of drawn tokens); the 2.5 and 97.5
percentiles of the B values are the 95% interval.

A relative PPL (ppl at L over ppl at L_train) is resampled *paired* when both
perplexities are sums over the same units, or over partitions where one nests
in the other (stream windows of L_train inside windows of L, a multiple of
it; the same documents at both lengths): the finer side is summed onto the
coarser partition and both sides are drawn with the same indices, so text
that is easy at both lengths does not count as noise. Otherwise (different
document sets) the two sides are resampled independently.
"""

from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
# Resample draws are made in chunks of at most this many indices, so that
# 1000 resamples of 30k single-token sliding windows do not need gigabytes.
_CHUNK = 1 << 22


@dataclass
class Units:
    """Per-unit sums of one evaluation: unit u covers count[u] scored tokens
    whose losses sum to loss[u] (beyond: only tokens at window positions >=
    L_train). keys identify the unit: a document index, or the first target
    index of a span whose end is ends[u] (None for documents)."""

    kind: str  # "window" | "document" | "block"
    keys: np.ndarray
    loss: np.ndarray
    count: np.ndarray
    loss_beyond: np.ndarray
    count_beyond: np.ndarray
    ends: np.ndarray | None = None

    def __len__(self):
        return len(self.keys)


def _rng(seed: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *[int(s) for s in salt]])


def _draws(n_units: int, resamples: int, rng: np.random.Generator, per: int | None = None):
    """Index matrices of `per` (default: at most _CHUNK entries) rows, B x n_units in all."""
    per = per or max(1, _CHUNK // max(1, n_units))
    for s in range(0, resamples, per):
        yield rng.integers(0, n_units, size=(min(per, resamples - s), n_units))


def _percentiles(values: np.ndarray) -> tuple[float, float] | tuple[None, None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    lo, hi = np.percentile(values, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return float(lo), float(hi)


def _exp(x):
    return np.exp(np.minimum(x, 700.0))


def ppl_interval(loss: np.ndarray, count: np.ndarray, resamples: int, rng: np.random.Generator):
    """95% interval of exp(sum loss / sum count) over resampled units; (None,
    None) with fewer than two units (one unit has no spread to resample)."""
    loss, count = np.asarray(loss, np.float64), np.asarray(count, np.float64)
    if resamples <= 0 or len(loss) < 2:
        return None, None
    out = []
    for idx in _draws(len(loss), resamples, rng):
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(_exp(loss[idx].sum(1) / count[idx].sum(1)))
    return _percentiles(np.concatenate(out))


def intervals(units: Units, resamples: int, seed: int, length: int) -> dict:
    """Intervals for the PPL over all tokens, within and beyond L_train, from
    one set of resampled units (so the three are consistent draw by draw)."""
    if resamples <= 0:
        return {}
    out = {}
    loss_within = units.loss - units.loss_beyond
    count_within = units.count - units.count_beyond
    for name, loss, count in (
        ("ppl", units.loss, units.count),
        ("ppl_within", loss_within, count_within),
        ("ppl_beyond", units.loss_beyond, units.count_beyond),
    ):
        if count.sum() == 0:
            continue
        lo, hi = ppl_interval(loss, count, resamples, _rng(seed, length))
        out[f"{name}_lo"], out[f"{name}_hi"] = lo, hi
    return out


def _nest(fine: Units, coarse: Units) -> np.ndarray | None:
    """For each unit of `fine`, the unit of `coarse` that contains it, or None
    when fine does not nest in coarse (or they cover different tokens)."""
    if fine.kind == "document" or coarse.kind == "document":
        if fine.kind == coarse.kind and np.array_equal(fine.keys, coarse.keys):
            return np.arange(len(fine))
        return None
    if fine.ends is None or coarse.ends is None or fine.count.sum() != coarse.count.sum():
        return None
    if fine.keys[0] != coarse.keys[0] or fine.ends[-1] != coarse.ends[-1]:
        return None
    owner = np.searchsorted(coarse.keys, fine.keys, side="right") - 1
    if (owner < 0).any() or (fine.ends > coarse.ends[owner]).any():
        return None
    if len(np.unique(owner)) != len(coarse):
        return None
    return owner


def pair(a: Units, b: Units):
    """(a loss, a count, b loss, b count) on one common partition, or None."""
    for fine, coarse, flip in ((a, b, False), (b, a, True)):
        owner = _nest(fine, coarse)
        if owner is not None:
            n = len(coarse)
            f_loss = np.bincount(owner, weights=fine.loss, minlength=n)
            f_count = np.bincount(owner, weights=fine.count, minlength=n)
            c = (coarse.loss.astype(np.float64), coarse.count.astype(np.float64))
            return (c + (f_loss, f_count)) if flip else ((f_loss, f_count) + c)
    return None


def ratio_interval(a: Units, b: Units, resamples: int, seed: int, length: int) -> dict:
    """Interval of ppl(a) / ppl(b): paired where the unit sets coincide or
    nest, else independent; says which."""
    if resamples <= 0:
        return {}
    common = pair(a, b)
    if common is not None:
        la, ca, lb, cb = common
        if len(la) < 2:
            return {"ppl_rel_lo": None, "ppl_rel_hi": None, "ppl_rel_paired": True}
        out, rng = [], _rng(seed, length, 1)
        for idx in _draws(len(la), resamples, rng):
            out.append(_exp(la[idx].sum(1) / ca[idx].sum(1) - lb[idx].sum(1) / cb[idx].sum(1)))
        lo, hi = _percentiles(np.concatenate(out))
        return {"ppl_rel_lo": lo, "ppl_rel_hi": hi, "ppl_rel_paired": True}
    if len(a) < 2 or len(b) < 2:
        return {"ppl_rel_lo": None, "ppl_rel_hi": None, "ppl_rel_paired": False}
    rng_a, rng_b = _rng(seed, length, 2), _rng(seed, length, 3)
    out, per = [], max(1, _CHUNK // max(len(a), len(b)))
    la, ca, lb, cb = (np.asarray(x, np.float64) for x in (a.loss, a.count, b.loss, b.count))
    for ia, ib in zip(_draws(len(a), resamples, rng_a, per), _draws(len(b), resamples, rng_b, per)):
        out.append(_exp(la[ia].sum(1) / ca[ia].sum(1) - lb[ib].sum(1) / cb[ib].sum(1)))
    lo, hi = _percentiles(np.concatenate(out))
    return {"ppl_rel_lo": lo, "ppl_rel_hi": hi, "ppl_rel_paired": False}


def paired_ratio(a: Units, b: Units, ppl_a: float, ppl_b: float, resamples: int, seed: int, length: int) -> dict:
    """ppl_a / ppl_b of two evaluations at one length (two methods, or a method
    and its control, on one model), with ratio_interval's 95% interval: paired
    over the units both were scored on where they coincide or nest, so the
    difficulty of the text they share is no noise; `paired` says which, `units`
    how many units were resampled together (None when not paired)."""
    common = pair(a, b)
    ci = ratio_interval(a, b, resamples, seed, length)
    return {
        "ratio": ppl_a / ppl_b,
        "lo": ci.get("ppl_rel_lo"),
        "hi": ci.get("ppl_rel_hi"),
        "paired": common is not None,
        "units": len(common[0]) if common is not None else None,
    }


def mean_interval(values, resamples: int, seed: int, *salt: int) -> tuple[float, float] | tuple[None, None]:
    """95% percentile interval of the mean of per-item values (e.g. 0/1
    exact-match outcomes of independent instances, the unit resampled);
    (None, None) with fewer than two items or no resamples."""
    values = np.asarray(values, np.float64)
    if resamples <= 0 or len(values) < 2:
        return None, None
    rng = _rng(seed, *salt)
    return _percentiles(np.concatenate([values[idx].mean(1) for idx in _draws(len(values), resamples, rng)]))
