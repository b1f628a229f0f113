"""The repeated-span probe: does a model read context d tokens back, with no task format to learn?

A span of s tokens of held-out text is placed at the start of a sequence, then filler (other held-out
text), then the same span again, its second copy starting d tokens after the first:

    with copy:     span | filler (d - s tokens) | span
    without copy:  other | filler (d - s tokens) | span      (other: held-out text of s tokens)

Both sequences have d + s tokens, the same filler and the same second copy; only the first s tokens
differ. A model whose tokenizer puts tokens before a text (Gemma's <bos>) reads them first, as it
reads a document: `prefix`, not scored, adds them before the first copy and moves nothing else. The
score is the model's loss on the second copy's s tokens (mean NLL per token), with and without the
first copy. Every token of the second copy has its own earlier copy exactly d positions
back, so a model that reads that far can copy it and its loss falls well below the no-copy loss; a
model that cannot see d tokens back scores both the same. The difference is paired: the same span,
filler and positions on both sides, so what is left is what the first copy told the model.

Draws depend only on the seed, the sample's index, the span length, the longest distance and the
text: every distance (and every model reading the same split) scores the same spans, and distance d
uses the last d - s tokens of one filler drawn for the longest distance, so the text right before
the second copy is the same at every distance and only the first copy's distance changes.
"""

from dataclasses import dataclass

import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.eval import bootstrap
from rope_lm.eval.evaluation import token_losses


@dataclass(frozen=True)
class Draw:
    """One sample's stream offsets: the span (s tokens), the text that stands for the first copy
    without it (s tokens), and the filler (longest distance - s tokens)."""

    span: int
    other: int
    filler: int


def needed_tokens(span: int, longest: int) -> int:
    """Tokens of held-out text one sample takes: span, the text replacing it, the longest filler."""
    return 2 * span + (longest - span)


def check(span: int, distances: list[int], n_tokens: int | None = None, split: str = "test") -> None:
    """The distances fit the span (a copy never overlaps the other) and the text holds one sample."""
    if span < 1:
        raise ConfigError(f"repeated_span.span={span} must be a positive number of tokens (e.g. 32).")
    short = [d for d in distances if d < span]
    if short:
        raise ConfigError(
            f"repeated_span: the distance {short[0]} is shorter than the span ({span} tokens), so the two copies "
            f"would overlap; the distance is from the first copy's start to the second's. Give a span of at most "
            f"{min(distances)} tokens (repeated_span.span=) or distances of at least {span} "
            f"(repeated_span.distances= or repeated_span.multipliers=)."
        )
    if n_tokens is not None and n_tokens < needed_tokens(span, max(distances)):
        raise ConfigError(
            f"The {split} split has {n_tokens} tokens, too few for one repeated-span sample at the longest "
            f"distance {max(distances)}: it takes {needed_tokens(span, max(distances))} (the span, the text that "
            f"replaces its first copy, and {max(distances) - span} tokens of filler). Use shorter distances or a "
            f"larger corpus (data.*)."
        )


def draw(n_tokens: int, span: int, longest: int, samples: int, seed: int) -> list[Draw]:
    """`samples` draws of three disjoint regions of a stream of n_tokens tokens, in a random order
    with random gaps between them; sample i depends on (seed, i) alone, so more samples keep the
    earlier ones."""
    filler = longest - span
    slack = n_tokens - needed_tokens(span, longest)
    if slack < 0:
        raise ConfigError(f"{n_tokens} tokens cannot hold a span of {span} and a filler of {filler}.")
    out = []
    for i in range(samples):
        rng = np.random.default_rng([int(seed), i])
        cuts = np.sort(rng.integers(0, slack + 1, size=3))
        gaps = np.diff(np.concatenate([[0], cuts]))  # the gap before each of the three regions in turn
        sizes = {"span": span, "other": span, "filler": filler}
        order = [("span", "other", "filler")[k] for k in rng.permutation(3)]
        at, where = 0, {}
        for gap, name in zip(gaps, order):
            at += int(gap)
            where[name] = at
            at += sizes[name]
        out.append(Draw(where["span"], where["other"], where["filler"]))
    return out


def sequences(
    stream, draws: list[Draw], span: int, longest: int, distance: int, prefix: list[int] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """(with copy, without copy): (samples, len(prefix) + distance + span) int64 token rows."""
    rows_with, rows_without = [], []
    head = np.asarray(prefix, dtype=np.int64)
    filler_len = longest - span
    tail = distance - span  # the filler's last `tail` tokens sit between the copies
    for d in draws:
        copy = np.asarray(stream[d.span : d.span + span], dtype=np.int64)
        other = np.asarray(stream[d.other : d.other + span], dtype=np.int64)
        end = d.filler + filler_len
        fill = np.asarray(stream[end - tail : end], dtype=np.int64)
        rows_with.append(np.concatenate([head, copy, fill, copy]))
        rows_without.append(np.concatenate([head, other, fill, copy]))
    return torch.from_numpy(np.stack(rows_with)), torch.from_numpy(np.stack(rows_without))


def second_copy_losses(model, rows: torch.Tensor, span: int, batch_tokens: int) -> np.ndarray:
    """Each row's mean NLL over its last `span` tokens (the second copy), predicted from all before."""
    losses = token_losses(model, rows[:, :-1], rows[:, 1:], batch_tokens)
    return losses[:, -span:].double().mean(1).numpy()


def _interval(values: np.ndarray, resamples: int, seed: int, *salt: int) -> dict:
    """Mean and 95% interval of per-sample mean losses, and the same resamples' PPL."""
    lo, hi = bootstrap.mean_interval(values, resamples, seed, *salt)
    # ppl_interval draws the indices mean_interval drew from the same seed: one set of resamples.
    count = np.ones_like(values)
    plo, phi = bootstrap.ppl_interval(values, count, resamples, np.random.default_rng([int(seed), *salt]))
    mean = float(values.mean())
    return {
        "loss": mean,
        "loss_lo": lo,
        "loss_hi": hi,
        "ppl": float(np.exp(min(mean, 700.0))),
        "ppl_lo": plo,
        "ppl_hi": phi,
    }


def score_distance(
    model,
    stream,
    draws: list[Draw],
    span: int,
    longest: int,
    distance: int,
    train_len: int,
    batch_tokens: int,
    resamples: int,
    seed: int,
    prefix: list[int] = (),
) -> dict:
    """One distance's row: the second copy's loss with and without the first copy, their paired
    difference (drop = without - with, positive where the copy helped), each with a 95% bootstrap
    interval over samples, and every sample's losses."""
    with_copy, without = sequences(stream, draws, span, longest, distance, prefix)
    copied = second_copy_losses(model, with_copy, span, batch_tokens)
    alone = second_copy_losses(model, without, span, batch_tokens)
    drop = alone - copied
    lo, hi = bootstrap.mean_interval(drop, resamples, seed, distance, 2)
    return {
        "distance": int(distance),
        "ratio": distance / train_len,
        "sequence": int(len(prefix) + distance + span),
        "span": int(span),
        "samples": len(draws),
        "copy": _interval(copied, resamples, seed, distance, 0),
        "nocopy": _interval(alone, resamples, seed, distance, 1),
        "drop": {"loss": float(drop.mean()), "loss_lo": lo, "loss_hi": hi},
        "ppl_ratio": float(np.exp(-drop.mean())),
        "per_sample": {"copy": [float(v) for v in copied], "nocopy": [float(v) for v in alone]},
    }
