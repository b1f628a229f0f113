"""What a perplexity comparison is made of, and its statistics.

A comparison only means something when every run scored the same text with the
same tokenizer and was trained at the same length, so runs are keyed by
(corpus fingerprint + evaluation split, tokenizer, training length, protocol):
GroupKey. Each (run, extrapolation method) pair is one *series*: one table row
and one line. Its relative PPL is ppl@L divided by the same series' ppl at
L_train (falling back to the run's direct-extrapolation series, then to any
series of the run, where the series itself was not evaluated at L_train).

Series whose runs differ only in `seed` are also aggregated (SeedAggregate):
mean ± sd across seeds per length, the per-seed values kept. Rows are "within
noise" of each other when their noise intervals overlap: a single run's 95%
bootstrap interval, or an aggregate's seed spread mean ± 2 sd
(docs/studies.md).

A run evaluated with controls (eval.controls) records in each row its PPL over
the control's on the same windows (Series.control). Over seeds, that ratio's
log, and the log ratio of two aggregates' PPLs paired by seed (seed_pairs),
get a t-interval over the seeds (noise.seed_interval): a difference that
includes training noise.
"""

from dataclasses import dataclass, field
import math
import os
import re

from rope_lm.compare.noise import HOLDS, WINDOW_CONTROL, seed_interval, seed_verdict, within_noise


@dataclass(frozen=True)
class GroupKey:
    fingerprint: str
    split: str
    tokenizer: str
    train_len: int
    protocol: str = "stream"

    def describe(self) -> str:
        proto = "" if self.protocol == "stream" else f", protocol {self.protocol}"
        return (
            f"corpus {self.fingerprint} ({self.split} split), tokenizer {self.tokenizer}, trained at "
            f"L={self.train_len}{proto}"
        )

    def slug(self) -> str:
        proto = "" if self.protocol == "stream" else f"_{self.protocol}"
        return re.sub(
            r"[^A-Za-z0-9_.-]+", "-", f"L{self.train_len}_{self.tokenizer}_{self.fingerprint[:8]}_{self.split}{proto}"
        )


@dataclass
class Series:
    run_dir: str
    scheme: str
    method: str
    train_len: int
    rows: dict  # length -> result row
    label: str = ""
    reference_ppl: float | None = None  # ppl at L_train used for the relative column
    reference_self: bool = False  # the reference is this series' own ppl at L_train
    seed: int | None = None
    setting: str = ""  # the run's config without NOT_A_SETTING, and the method: equal for seed replicas
    train_pos: str = "none"  # how training drew its position ids (rope_lm/train_positions/), e.g. pose-x16
    flat_config: dict = field(default_factory=dict)  # the run's config as dotted keys (labels.flat_settings)
    given_label: str = ""  # a committed compare.csv's label, kept as it is
    trained_at: int | None = None  # a reference row's own training length (train_len is its table's)
    # The weights it was evaluated with (ppl_pairs: series of one model are paired on the same windows): the
    # evaluation's model_identity, or a training run's folder; "" where unknown (a committed compare.csv).
    model: str = ""
    is_control: bool = False  # its run's own control (eval.controls), paired with the run's methods already
    control_width: int | None = None  # a window control's width where it is not the table's L (eval.control_window)
    resampling: tuple[int, int] = (0, 0)  # the evaluation's bootstrap resamples and seed

    def ppl(self, length):
        row = self.rows.get(length)
        return None if row is None else row.get("ppl")

    def noise(self, length) -> tuple[float, float] | None:
        row = self.rows.get(length) or {}
        if row.get("ppl_lo") is None or row.get("ppl_hi") is None:
            return None
        return row["ppl_lo"], row["ppl_hi"]

    def control(self, length, name: str = WINDOW_CONTROL) -> dict | None:
        """{ratio, lo, hi, paired, ...}: this series' PPL over its own run's control's at a length, on the
        same windows, as the evaluation recorded it; None where it recorded none."""
        pair = ((self.rows.get(length) or {}).get("controls") or {}).get(name)
        return pair if pair and pair.get("ratio") is not None else None


@dataclass
class SeedAggregate:
    """Series that differ only in seed: per length, the per-seed PPLs."""

    label: str
    members: list  # Series, ordered by seed

    @property
    def scheme(self):
        return self.members[0].scheme

    @property
    def method(self):
        return self.members[0].method

    def values(self, length, relative_to=None) -> dict:
        """PPL per seed; with `relative_to` (L_train), each seed's PPL over its
        own at that length."""
        v = {s.seed: s.ppl(length) for s in self.members if s.ppl(length) is not None}
        if relative_to is None:
            return v
        base = self.values(relative_to)
        return {k: x / base[k] for k, x in v.items() if k in base}

    def stats(self, length, relative_to=None) -> dict | None:
        """mean, sd (n - 1 in the denominator), min, max over seeds (of PPL,
        or relative to `relative_to`); None unless at least two seeds reached
        this length."""
        v = list(self.values(length, relative_to).values())
        if len(v) < 2:
            return None
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1))
        return {"n": len(v), "mean": mean, "sd": sd, "min": min(v), "max": max(v)}

    def ppl(self, length):
        st = self.stats(length)
        return None if st is None else st["mean"]

    def control_log_ratios(self, length, name: str = WINDOW_CONTROL) -> dict:
        """seed -> ln(PPL / its own run's control's PPL) on the same windows, for the seeds that recorded it."""
        out = {}
        for s in self.members:
            pair = s.control(length, name)
            if pair is not None and pair["ratio"] > 0:
                out[s.seed] = math.log(pair["ratio"])
        return out

    def control_stats(self, length, name: str = WINDOW_CONTROL) -> dict | None:
        """The per-seed log ratios to the control: mean, sd, 95% t-interval (noise.seed_interval), the
        verdict (noise.seed_verdict) and the values; None with fewer than two seeds."""
        values = self.control_log_ratios(length, name)
        st = seed_interval(values.values())
        return None if st is None else {**st, "values": values, "verdict": seed_verdict(st)}

    def noise(self, length) -> tuple[float, float] | None:
        st = self.stats(length)
        return None if st is None else (st["mean"] - 2 * st["sd"], st["mean"] + 2 * st["sd"])


@dataclass
class Run:
    path: str  # the results.json
    results: dict
    key: GroupKey
    series: list[Series] = field(default_factory=list)

    @property
    def dir(self) -> str:
        return os.path.dirname(self.path)


@dataclass
class Group:
    key: GroupKey
    runs: list[Run]
    window_pairs: dict | None = None  # ppl_pairs.window_pairs, computed once

    @property
    def series(self) -> list[Series]:
        return [s for r in self.runs for s in r.series]

    @property
    def lengths(self) -> list[int]:
        return sorted({L for s in self.series for L in s.rows})

    def seed_aggregates(self) -> list[SeedAggregate]:
        """Series of the same setting and method run with two or more seeds."""
        by_setting: dict[str, list[Series]] = {}
        for s in self.series:
            if s.seed is not None and s.trained_at is None:
                by_setting.setdefault(s.setting, []).append(s)
        out, names = [], {}
        for members in by_setting.values():
            if len({s.seed for s in members}) < 2 or len({s.seed for s in members}) != len(members):
                continue  # one seed, or a seed run twice: nothing to aggregate, or not a seed replica
            members = sorted(members, key=lambda s: s.seed)
            # The runs' own name without its seed ("rope (pos.p_rope=0.75) (seed=1)" -> "rope (pos.p_rope=0.75)"),
            # so an aggregate reads as the setting that tells it from the others; a number only where none does.
            named = {re.sub(r" \(seed=[^)]*\)", "", s.label) for s in members}
            base = members[0].scheme if members[0].method == "none" else f"{members[0].scheme} + {members[0].method}"
            if len(named) == 1 and all(s.label for s in members):
                base = named.pop()
            names[base] = names.get(base, 0) + 1
            label = base if names[base] == 1 else f"{base} #{names[base]}"
            out.append(SeedAggregate(f"{label} ({len(members)} seeds)", members))
        return out

    def noise_rows(self) -> list:
        """The rows judged for noise: each seed aggregate, and every series
        that is not part of one; reference rows (another training length, an
        upper bound) are no contenders."""
        aggs = self.seed_aggregates()
        inside = {id(s) for a in aggs for s in a.members}
        return aggs + [s for s in self.series if id(s) not in inside and s.trained_at is None]

    def best_and_peers(self, length) -> tuple[object, set] | None:
        """The row with the lowest PPL at a length, and the ids of the rows
        within noise of it (the best included); None without any interval."""
        rows = [r for r in self.noise_rows() if r.ppl(length) is not None]
        if not rows:
            return None
        best = min(rows, key=lambda r: r.ppl(length))
        if best.noise(length) is None:
            return None
        return best, {id(r) for r in rows if within_noise(best.noise(length), r.noise(length))}


def seed_pair(a: SeedAggregate, b: SeedAggregate, length) -> dict | None:
    """a against b at a length over the seeds both ran: per seed s, ln(PPL_a,s / PPL_b,s) (the same windows:
    one group), paired by seed; mean, sd, 95% t-interval (noise.seed_interval), verdict and the values; None
    with fewer than two common seeds."""
    va, vb = a.values(length), b.values(length)
    values = {k: math.log(va[k] / vb[k]) for k in va if k in vb and va[k] > 0 and vb[k] > 0}
    st = seed_interval(values.values())
    return None if st is None else {**st, "values": values, "verdict": seed_verdict(st)}


def seed_pairs(g: Group) -> list[tuple]:
    """(a, b) for every two seed aggregates of a group that are not controls, in table order."""
    aggs = [a for a in g.seed_aggregates() if a.method != WINDOW_CONTROL]
    return [(a, b) for i, a in enumerate(aggs) for b in aggs[i + 1 :]]


def control_verdict(st: dict | None) -> str | None:
    """Where a seed aggregate stands against its own control at a length, over seeds."""
    if st is None:
        return None
    if st["verdict"] != HOLDS:
        return st["verdict"]
    return "below the control" if st["hi"] < 0 else "above the control"


def pair_verdict(st: dict | None) -> str | None:
    """Where the first of a seed pair stands against the second at a length, over seeds."""
    if st is None:
        return None
    if st["verdict"] != HOLDS:
        return st["verdict"]
    return "a lower" if st["hi"] < 0 else "a higher"


def relative(s: Series, L: int):
    """ppl@L over the series' reference PPL at L_train (None where either is missing)."""
    p = s.ppl(L)
    return None if p is None or not s.reference_ppl else p / s.reference_ppl


def relative_interval(s: Series, L: int) -> tuple:
    """The evaluation's own interval of the relative PPL, valid only where the
    reference is the series' own PPL at L_train (as the evaluation computed it)."""
    row = s.rows.get(L) or {}
    if not s.reference_self:
        return None, None
    return row.get("ppl_rel_lo"), row.get("ppl_rel_hi")


def noise_flag(g: Group, row, L):
    """Whether a row (a series or a seed aggregate) is within noise of the best at a length."""
    judged = g.best_and_peers(L)
    if judged is None or row.ppl(L) is None or row.noise(L) is None or getattr(row, "trained_at", None) is not None:
        return None  # not judged (a reference row is no contender)
    return id(row) in judged[1]
