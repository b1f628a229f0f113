"""benchmarks/paired.py, the one way benchmarks time two sides: alternated
rounds, median and spread, and the verdict rule. Fake clocks and hand-made
figures only: nothing here is timed."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def paired():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import paired

    return paired


class FakeClock:
    """A clock that each side moves on by its own made-up duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def side(self, name, durations, calls):
        it = iter(durations)

        def call():
            calls.append(name)
            self.now += next(it)
            return name.upper()

        return call


def test_sides_alternate_round_after_round(paired):
    clock, calls = FakeClock(), []
    sides = [
        ("a", clock.side("a", [1.0, 2.0, 3.0], calls)),
        ("b", clock.side("b", [10.0, 20.0, 30.0], calls)),
    ]
    logged, seen = [], []
    out = paired.alternate(sides, 3, clock=clock, log=logged.append, on_round=lambda r, got: seen.append(r))
    assert calls == ["a", "b", "a", "b", "a", "b"] == out.order
    assert out.seconds == {"a": [1.0, 2.0, 3.0], "b": [10.0, 20.0, 30.0]}
    assert out.results == {"a": ["A", "A", "A"], "b": ["B", "B", "B"]}
    assert seen == [0, 1, 2] and len(logged) == 3 and logged[0] == "round 1/3 (wall s of each call): a 1 s, b 10 s"


def test_three_sides_keep_their_order_in_every_round(paired):
    clock, calls = FakeClock(), []
    sides = [(n, clock.side(n, [1.0] * 2, calls)) for n in ("a", "b", "c")]
    paired.alternate(sides, 2, clock=clock)
    assert calls == ["a", "b", "c", "a", "b", "c"]
    with pytest.raises(ValueError):
        paired.alternate([("a", lambda: 0), ("a", lambda: 0)], 1)


def test_median_spread_and_ratio_by_hand(paired):
    clock, calls = FakeClock(), []
    ours = [1.00, 1.04, 0.98, 1.02, 1.01]  # seconds
    theirs = [2.10, 2.00, 2.05, 2.02, 2.08]
    out = paired.alternate(
        [("rope-lm", clock.side("rope-lm", ours, calls)), ("peer", clock.side("peer", theirs, calls))], 5, clock=clock
    )
    c = paired.compare("step", "peer", out.seconds["peer"], "rope-lm", out.seconds["rope-lm"], limit=0.10)
    # By hand: sorted ours 0.98 1.00 1.01 1.02 1.04, median 1.01, range 0.98-1.04; theirs median 2.05, 2.00-2.10.
    assert c.bottom_spread.median == pytest.approx(1.01)
    assert (c.bottom_spread.lo, c.bottom_spread.hi) == pytest.approx((0.98, 1.04))
    assert c.bottom_spread.rel == pytest.approx(0.06 / 1.01)
    assert c.top_spread.median == pytest.approx(2.05)
    assert c.top_spread.rel == pytest.approx(0.10 / 2.05)
    assert c.ratio == pytest.approx(2.05 / 1.01)
    assert c.readable and c.ratio_text() == "2.03x"
    line = c.line()
    assert line == "step: peer 2.05 (2.00-2.10, 4.9%); rope-lm 1.01 (0.98-1.04, 5.9%); peer over rope-lm: 2.03x"
    assert paired.TOO_WIDE not in line
    assert c.record()["readable"] and c.record()["ratio_of_medians"] == pytest.approx(2.05 / 1.01)


def test_a_wide_spread_prints_the_verdict_instead_of_the_ratio(paired):
    # The reported case: a change of load between sides, seen as a wide spread over rounds.
    c = paired.compare("decode", "transformers", [0.30, 0.31, 0.29], "rope-lm", [0.20, 0.35, 0.30], limit=0.10)
    assert c.bottom_spread.rel == pytest.approx(0.15 / 0.30)
    assert not c.readable and c.ratio_text() == paired.TOO_WIDE
    line = c.line()
    assert paired.TOO_WIDE in line and "rope-lm 50.0% > 10.0%" in line
    assert not re.search(r"\d\.\d+x", line)  # no ratio presented
    report = paired.report([c, paired.compare("tight", "b", [2.0, 2.02], "a", [1.0, 1.01])])
    assert report.splitlines()[0].endswith(f"{paired.TOO_WIDE} (rope-lm 50.0% > 10.0%)")
    assert report.splitlines()[1].endswith("b over a: 2.00x")


def test_the_limit_is_inclusive_and_one_round_is_never_read(paired):
    at = paired.compare("x", "b", [1.0, 1.1], "a", [1.0, 1.0], limit=0.10)  # b: 0.1 / 1.05 < 0.10
    assert at.readable
    over = paired.compare("x", "b", [1.0, 1.2], "a", [1.0, 1.0], limit=0.10)
    assert not over.readable and "b 18.2% > 10.0%" in over.why
    once = paired.compare("x", "b", [1.0], "a", [2.0])
    assert not once.readable and "1 round" in once.why and once.ratio == 0.5
    assert paired.Spread.of([3.0]).text() == "3.00 (1 round)"


def test_settings_are_checked(paired):
    from rope_lm.core.errors import ConfigError

    paired.check(3, 0.1)
    for rounds, limit in [(0, 0.1), (2.5, 0.1), (True, 0.1), (3, 0), (3, "wide")]:
        with pytest.raises(ConfigError):
            paired.check(rounds, limit)
    with pytest.raises(ConfigError, match="eval_rounds=0"):
        paired.check(0, 0.1, "eval_rounds")
