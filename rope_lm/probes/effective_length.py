"""RULER's effective length (Hsieh et al., 2024) for the retrieval battery:
the longest context length up to which a task's accuracy stays above a
threshold. Torch-free, so compare.py's tables read it too.

RULER's threshold is Llama-2-7B's score at 4K (85.6%), one bar for every
model. The models trained here are far smaller and reach lower scores even
at their training length, so the bar is a setting: by default an absolute
accuracy of 50% (THRESHOLD), the same for every method and model, so that
two methods' effective lengths are compared against one bar (a method that
is worse at L is not excused) and a length counts only where the task is
solved more often than not, far above the chance of guessing a room, a
word or a 5-digit number. relative=true makes the bar a fraction of the
task's own accuracy at the training length instead: a question of how far
what the model can do at L survives, for models too weak to pass 50% at L.
"""

from rope_lm.core.errors import ConfigError

THRESHOLD = 0.5


def check_threshold(threshold, relative) -> None:
    """threshold= and relative= as the effective length reads them, or one paragraph."""
    if not isinstance(relative, bool):
        raise ConfigError(
            f"effective.relative={relative!r} must be true or false (false: effective.threshold is an "
            f"accuracy; true: a fraction of the task's own accuracy at the training length)."
        )
    ok = isinstance(threshold, (int, float)) and not isinstance(threshold, bool)
    if relative and not (ok and 0 < threshold < 1):
        raise ConfigError(
            f"effective.threshold={threshold!r} with effective.relative=true must be a fraction "
            f"within (0, 1) of the task's accuracy at the training length (e.g. 0.8)."
        )
    if not relative and not (ok and 0 <= threshold < 1):
        raise ConfigError(
            f"effective.threshold={threshold!r} must be an accuracy within [0, 1) (default "
            f"{THRESHOLD}); a length counts when its accuracy is above it."
        )


def effective_length(lengths: list[int], accuracies: list[float], bar: float) -> dict:
    """RULER's effective length: the longest length up to which the accuracy
    stays above `bar` (strictly: RULER counts scores that exceed its bar),
    read from the shortest length up and stopping at the first length that
    is not above. A dip that recovers at a longer length therefore ends it at
    the dip: RULER's wording ("the maximum length whose performance exceeds
    the threshold") would also fit the recovered length, but none of its
    published rows has such a dip, and a length the model fails on the way
    to is no length it can be trusted with. length is None when the
    shortest length is not above (RULER's "<4K"); at_least is true when
    every length is, so the real one may be longer (RULER's ">128K");
    lengths_above lists every length above the bar, recoveries included."""
    pairs = sorted(zip(lengths, accuracies))
    above = [a > bar for _, a in pairs]
    good = 0
    while good < len(pairs) and above[good]:
        good += 1
    return {
        "length": pairs[good - 1][0] if good else None,
        "at_least": good == len(pairs),
        "bar": bar,
        "shortest": pairs[0][0],
        "lengths_above": [L for (L, _), ok in zip(pairs, above) if ok],
    }


def _reference(lengths: list[int], train_len: int | None) -> int:
    """The length a relative threshold scales: the training length where it
    was evaluated, else the shortest length."""
    return train_len if train_len in lengths else min(lengths)


def add_effective(
    results: dict, threshold: float = THRESHOLD, relative: bool = False, train_len: int | None = None
) -> dict:
    """Each task's effective length into results[task]["effective"]; returns
    the settings and the effective length of the tasks' mean accuracy (RULER's
    headline number averages its tasks the same way)."""
    check_threshold(threshold, relative)

    def one(lengths, accuracies):
        ref = _reference(lengths, train_len)
        bar = threshold * dict(zip(lengths, accuracies))[ref] if relative else threshold
        return {**effective_length(lengths, accuracies, bar), **({"reference_length": ref} if relative else {})}

    for r in results.values():
        r["effective"] = one([row["length"] for row in r["by_length"]], [row["accuracy"] for row in r["by_length"]])
    lengths = next(iter(results.values()))["lengths"]
    mean = [_mean([r["by_length"][j]["accuracy"] for r in results.values()]) for j in range(len(lengths))]
    return {
        "threshold": threshold,
        "relative": relative,
        "tasks": list(results),
        "mean": {"accuracy": mean, **one(list(lengths), mean)},
    }


def effective_label(e: dict, train_len: int | None = None) -> str:
    """2048 (16×), ≥2048 when above at every length tested, <128 when not at the first."""
    if e["length"] is None:
        return f"<{e['shortest']}"
    times = f" ({e['length'] / train_len:g}×)" if train_len else ""
    return ("≥" if e["at_least"] else "") + f"{e['length']}{times}"


def threshold_note(effective: dict) -> str:
    """The rule in one sentence, for the markdown reports."""
    bar = (
        f"{effective['threshold']:g} x the task's own accuracy at the training length"
        if effective["relative"]
        else f"{effective['threshold']:.0%}"
    )
    return (
        f"Effective length: the longest length up to which accuracy stays above {bar} (RULER's rule, read from "
        f"the shortest length up: a dip ends it even if a longer length recovers); ≥: above at every length "
        f"tested; <: not above at the shortest."
    )


def _mean(xs) -> float:
    return sum(float(x) for x in xs) / len(xs)
