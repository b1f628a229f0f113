"""Paired timing, the one way every benchmark sets two things side by side
(rope-lm and a peer, or two of rope-lm's paths).

* **Alternated, in one process**: `alternate` calls the sides in turn, one
  call each per round (A, B, A, B, ... or A, B, C, A, B, C, ...), for
  `rounds` rounds, so a change of the machine's load falls on every side
  alike instead of on whichever ran second.
* **Median and spread**: `Spread` reads a side's per-round figures as their
  median, their range (min-max) and their relative spread,
  (max - min) / median.
* **The verdict rule**: `compare` gives the ratio of the two medians, and
  reads it only where each side has at least 2 rounds and a relative spread
  of at most `limit` (10% unless a benchmark's `spread_limit` says
  otherwise). Otherwise the ratio is not a finding, and every place that
  would show it says "spread too wide to read a ratio" and which side was
  too spread (or that one round shows no spread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import statistics
import time

TOO_WIDE = "spread too wide to read a ratio"
ROUNDS = 3  # the default number of alternated rounds
LIMIT = 0.10  # the default largest relative spread (max - min) / median at which a ratio is read


def check(rounds, limit, key: str = "rounds") -> None:
    """A benchmark's `rounds` (named `key` there) and `spread_limit` settings, or a ConfigError."""
    from rope_lm.core.errors import ConfigError

    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ConfigError(
            f"{key}={rounds!r} must be a positive number of alternated rounds "
            f"(at least 2 for a ratio to be read; {ROUNDS} by default)."
        )
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit <= 0:
        raise ConfigError(
            f"spread_limit={limit!r} must be a positive fraction: the largest (max - min) / median "
            f"of a side at which a ratio is read ({LIMIT} by default)."
        )


@dataclass
class Rounds:
    """What `alternate` measured: per side, each round's seconds (by the
    clock around the call) and what the call returned; `order` is every call
    in the order made."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    results: dict[str, list] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def alternate(
    sides: Sequence[tuple[str, Callable[[], object]]],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
    log: Callable[[str], None] | None = None,
    on_round: Callable[[int, Rounds], None] | None = None,
) -> Rounds:
    """Call each side once per round, in the order given, for `rounds`
    rounds: A, B, A, B, ... Each call is timed by `clock`; a side that times
    itself (a fresh process, a part of a call) returns its own figures, kept
    in `results`. After each round: `log(text)` (each call's seconds) and
    `on_round(round index, what was measured so far)`, where given."""
    names = [name for name, _ in sides]
    if len(set(names)) != len(names):
        raise ValueError(f"side names must differ: {names}")
    out = Rounds({n: [] for n in names}, {n: [] for n in names})
    for r in range(rounds):
        for name, call in sides:
            t0 = clock()
            result = call()
            out.seconds[name].append(clock() - t0)
            out.results[name].append(result)
            out.order.append(name)
        if log:
            log(
                f"round {r + 1}/{rounds} (wall s of each call): "
                + ", ".join(f"{n} {out.seconds[n][-1]:.3g} s" for n in names)
            )
        if on_round:
            on_round(r, out)
    return out


@dataclass(frozen=True)
class Spread:
    """One side's figures over the rounds."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Spread:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("a side needs at least one round")
        return cls(values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    @property
    def rel(self) -> float:
        """(max - min) / median; infinite for a median of 0 with any spread."""
        width = self.hi - self.lo
        if width == 0:
            return 0.0
        return width / abs(self.median) if self.median else float("inf")

    def text(self) -> str:
        """'median (min-max, spread%)', or the median alone for one round."""
        f = _number
        if len(self.values) < 2:
            return f"{f(self.median)} (1 round)"
        return f"{f(self.median)} ({f(self.lo)}-{f(self.hi)}, {_percent(self.rel)})"

    def cell(self) -> str:
        """A table cell: 'median (min-max)'."""
        f = _number
        return f(self.median) if len(self.values) < 2 else f"{f(self.median)} ({f(self.lo)}-{f(self.hi)})"


def _number(v: float) -> str:
    """A figure at a sensible precision: 12,345 / 12.35 / 0.0123."""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1 or v == 0:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _percent(rel: float) -> str:
    return f"{100 * rel:.1f}%"


@dataclass(frozen=True)
class Comparison:
    """Two sides and the ratio of their medians, top over bottom, read by the rule."""

    label: str
    top: str
    top_spread: Spread
    bottom: str
    bottom_spread: Spread
    limit: float = LIMIT
    unit: str = ""

    @property
    def ratio(self) -> float:
        return self.top_spread.median / self.bottom_spread.median if self.bottom_spread.median else float("inf")

    @property
    def why(self) -> str | None:
        """None where the ratio can be read; otherwise what is too spread."""
        few = [n for n, s in ((self.top, self.top_spread), (self.bottom, self.bottom_spread)) if len(s.values) < 2]
        if few:
            return f"{' and '.join(few)}: 1 round, no spread to judge by"
        wide = [
            f"{n} {_percent(s.rel)}"
            for n, s in ((self.top, self.top_spread), (self.bottom, self.bottom_spread))
            if not s.rel <= self.limit
        ]
        return f"{', '.join(wide)} > {_percent(self.limit)}" if wide else None

    @property
    def readable(self) -> bool:
        return self.why is None

    def ratio_text(self, digits: int = 2) -> str:
        """'1.23x', or TOO_WIDE where the ratio cannot be read."""
        return f"{self.ratio:.{digits}f}x" if self.readable else TOO_WIDE

    def line(self, digits: int = 2) -> str:
        """The verdict line: both sides' median (min-max, spread), then the ratio or TOO_WIDE and why."""
        unit = f" {self.unit}" if self.unit else ""
        verdict = f"{self.ratio_text(digits)}" if self.readable else f"{TOO_WIDE} ({self.why})"
        return (
            f"{self.label}: {self.top} {self.top_spread.text()}{unit}; {self.bottom} {self.bottom_spread.text()}{unit}; "
            f"{self.top} over {self.bottom}: {verdict}"
        )

    def record(self) -> dict:
        """For a results JSON."""
        return {
            "label": self.label,
            "top": self.top,
            "bottom": self.bottom,
            "top_values": list(self.top_spread.values),
            "bottom_values": list(self.bottom_spread.values),
            "top_median": self.top_spread.median,
            "bottom_median": self.bottom_spread.median,
            "ratio_of_medians": self.ratio,
            "readable": self.readable,
            "verdict": self.ratio_text() if self.readable else f"{TOO_WIDE} ({self.why})",
            "spread_limit": self.limit,
        }


def compare(label: str, top: str, top_values, bottom: str, bottom_values, limit: float = LIMIT, unit: str = ""):
    """The ratio median(top_values) / median(bottom_values), read by the rule.
    For seconds, put the peer on top to get rope-lm's speed over the peer's."""
    return Comparison(label, top, Spread.of(top_values), bottom, Spread.of(bottom_values), limit, unit)


def rule_text(rounds: int, limit: float) -> str:
    """One line for a benchmark's header: how its figures were taken and read."""
    return (
        f"{rounds} alternated round(s) in this process (A, B, A, B, ...); each figure is the median "
        f"(min-max over rounds); a ratio of medians is read only where each side has 2 or more rounds and a "
        f"spread (max - min) / median of at most {100 * limit:.0f}%, otherwise: {TOO_WIDE}"
    )


def report(comparisons: Sequence[Comparison], digits: int = 2) -> str:
    """The verdict lines of a benchmark, one per comparison."""
    return "\n".join(c.line(digits) for c in comparisons)
