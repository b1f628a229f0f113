"""scripts/check_published.py: each rule's verdict equals a hand reading of
small results, from run folders and from compare.py's CSV alike."""

import json
import math
import os
import sys

import pytest

from rope_lm.compare import published as P
from rope_lm.compare import published_rules as R
from rope_lm.compare.ppl import compare
from rope_lm.compare.task_compare import compare_tasks
from rope_lm.core.errors import ConfigError
from tests import forked
from tests.conftest import ROOT
from tests.test_compare import write_run

# PPL at L = 64, 128, 256, 1024: alibi flat, rope mild then steep, sinusoidal steep at once.
PPL = {
    "alibi": {64: 20.0, 128: 19.6, 256: 19.4, 1024: 19.0},
    "rope": {64: 20.0, 128: 21.4, 256: 30.0, 1024: 54.0},
    "sinusoidal": {64: 20.0, 128: 44.0, 256: 90.0, 1024: 300.0},
}


def sweep(tmp_path, ppl=PPL, rel_half=None):
    """Run folders of `ppl`; with rel_half, each result also carries the evaluation's interval of
    PPL(k x L) / PPL(L), of that half-width past L (a study with intervals; without, one without)."""
    root = tmp_path / "sweep"
    for i, (scheme, table) in enumerate(ppl.items()):
        run = write_run(root / f"{i}_{scheme}", scheme, {"none": table.get}, lengths=sorted(table))
        if rel_half is not None:
            path = os.path.join(run, "results.json")
            with open(path) as f:
                results = json.load(f)
            for row in results["results"]:
                rel, half = row["ppl"] / table[results["train_len"]], rel_half * (row["length"] > results["train_len"])
                row.update(ppl_rel_lo=rel - half, ppl_rel_hi=rel + half)
            with open(path, "w") as f:
                json.dump(results, f)
    return str(root)


def claim(**kw):
    return {"id": "c", "study": "pe", "source": "s", "published": "p", **kw}


def test_ratio_rules_read_relative_ppl(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path, rel_half=0.01)])
    v = R.ratio_between(claim(rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25), rows)
    assert (v.ours, v.verdict) == ("1.07 [1.06, 1.08] at 2 x L", R.MATCHED)  # 21.4 / 20
    v = R.ratio_between(claim(rule="ratio_between", series="rope", multiplier=16, min=1.35, max=5.4), rows)
    assert (v.ours, v.verdict) == ("2.70 [2.69, 2.71] at 16 x L", R.MATCHED)  # 54 / 20
    v = R.ratio_between(claim(rule="ratio_between", series="sinusoidal", multiplier=2, min=2.5), rows)
    assert (v.ours, v.verdict) == ("2.20 [2.19, 2.21] at 2 x L", R.NOT_MATCHED)
    v = R.ratio_between(claim(rule="ratio_between", series="rope", multiplier=8, min=1.0), rows)
    assert v.verdict == R.NOT_COMPARABLE  # 512 was not evaluated
    v = R.ratio_at_most(claim(rule="ratio_at_most", series="alibi", from_multiplier=2, max=1.0), rows)
    assert (v.ours, v.verdict) == ("0.95-0.98 over 2-16 x L (highest at 2 x L, [0.97, 0.99])", R.MATCHED)
    v = R.ratio_at_most(claim(rule="ratio_at_most", series="rope", from_multiplier=2, max=1.05), rows)
    assert v.verdict == R.NOT_MATCHED and v.ours.endswith("interval above 1.05 at 2, 4, 16 x L")
    # The same study without intervals: the points alone are no verdict
    bare = P.ppl_rows([sweep(tmp_path / "bare")])
    for c in (
        claim(rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25),
        claim(rule="ratio_at_most", series="alibi", from_multiplier=2, max=1.0),
    ):
        v = R.RULES[c["rule"]](c, bare)
        assert v.verdict == R.NOT_COMPARABLE and v.ours.endswith(R.NO_INTERVALS), v


def rel_point(scheme, k, rel, lo, hi, method="none", seed=0, train_len=64):
    """One row of a compare.csv at k x L: relative PPL with its interval (PPL 100 at L)."""
    return {
        "scheme": scheme,
        "method": method,
        "label": f"{scheme}+{method} ({seed})",
        "seed": seed,
        "train_len": train_len,
        "length": int(k * train_len),
        "ratio": float(k),
        "ppl": 100.0 * rel,
        "ppl_rel": rel,
        "ppl_rel_lo": lo,
        "ppl_rel_hi": hi,
    }


@pytest.mark.parametrize(
    "interval, bounds, verdict",
    [
        ((1.03, 1.08), {"max": 1.1}, R.MATCHED),  # wholly inside
        ((1.12, 1.20), {"max": 1.1}, R.NOT_MATCHED),  # wholly above
        ((1.05, 1.15), {"max": 1.1}, R.TIED),  # the point (1.07) is inside, the interval straddles 1.1
        ((1.02, 1.09), {"min": 1.0, "max": 1.25}, R.MATCHED),
        ((0.97, 1.05), {"min": 1.0, "max": 1.25}, R.TIED),  # the point 1.07 inside, the interval straddles 1.0
        ((0.90, 0.98), {"min": 1.0, "max": 1.25}, R.NOT_MATCHED),
    ],
)
def test_thresholds_read_the_whole_interval(interval, bounds, verdict):
    """real_ntk_flat_at_2x (<= 1.1) and rope_mild_at_2x (in [1.0, 1.25]): the point 1.07 decides nothing;
    the interval inside the band matches, wholly outside fails, across an end is noise (tied)."""
    rows = [rel_point("rope", 1, 1.0, 1.0, 1.0), rel_point("rope", 2, 1.07, *interval)]
    v = R.ratio_between(claim(rule="ratio_between", series="rope", multiplier=2, **bounds), rows)
    assert v.verdict == verdict and v.ours.startswith(f"1.07 [{interval[0]:.2f}, {interval[1]:.2f}] at 2 x L")
    # ratio_at_most reads every k x L the same way
    flat = claim(rule="ratio_at_most", series="rope", from_multiplier=2, max=bounds["max"])
    if "min" not in bounds:
        assert R.ratio_at_most(flat, rows).verdict == verdict
    # no interval: not comparable, whatever the point
    bare = [dict(r, ppl_rel_lo=None, ppl_rel_hi=None) for r in rows]
    assert R.ratio_between(claim(rule="ratio_between", series="rope", multiplier=2, **bounds), bare).verdict == (
        R.NOT_COMPARABLE
    )
    assert R.ratio_at_most(flat, bare).verdict == R.NOT_COMPARABLE


def test_seeds_without_intervals_are_read_by_their_spread():
    """Seeds give the band their spread (lowest to highest) where runs carry no interval."""
    rows = [rel_point("rope", 1, 1.0, None, None, seed=s) for s in (0, 1)]
    c = claim(rule="ratio_between", series="rope", multiplier=2, max=1.1)
    near = rows + [rel_point("rope", 2, x, None, None, seed=s) for s, x in ((0, 1.02), (1, 1.06))]
    assert R.ratio_between(c, near).verdict == R.MATCHED
    spread = rows + [rel_point("rope", 2, x, None, None, seed=s) for s, x in ((0, 1.02), (1, 1.16))]
    v = R.ratio_between(c, spread)
    assert v.verdict == R.TIED and v.ours.startswith("1.09 [1.02, 1.16] at 2 x L")


def test_order_rule_needs_intervals_and_seed_average(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path)])
    c = claim(rule="ppl_order", metric="ppl_rel", multiplier=2, order=["alibi", "rope", "sinusoidal"])
    v = R.ppl_order(c, rows)  # one seed, no intervals: the order cannot be told from noise
    assert v.verdict == R.NOT_COMPARABLE and v.ours.startswith("alibi 0.980 < rope 1.070 < sinusoidal 2.200")
    # Two seeds of one scheme: their PPLs are averaged (21.4 and 31.4 at 2 x L).
    two = [dict(r, ppl=r["ppl"] + 10 * (r["length"] == 128), seed=1) for r in rows if r["scheme"] == "rope"]
    assert R._series(rows + two, "rope")[2.0]["ppl"] == pytest.approx((21.4 + 31.4) / 2)
    assert R._series(rows + two, "rope")[2.0]["ppl_band"] == pytest.approx((21.4, 31.4))  # the seed spread


def point(scheme, ppl, lo, hi, method="none", length=128, train_len=64, seed=0):
    return {
        "scheme": scheme,
        "method": method,
        "label": f"{scheme}+{method}",
        "seed": seed,
        "train_len": train_len,
        "length": length,
        "ratio": length / train_len,
        "ppl": ppl,
        "ppl_lo": lo,
        "ppl_hi": hi,
    }


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        ((20.0, 19.0, 21.0), (21.5, 20.5, 22.5), R.TIED),  # in order, intervals overlap
        ((20.0, 19.0, 21.0), (25.0, 24.0, 26.0), R.MATCHED),  # in order, apart
        ((25.0, 24.0, 26.0), (20.0, 19.0, 21.0), R.NOT_MATCHED),  # reversed, apart
        ((21.5, 20.5, 22.5), (20.0, 19.0, 21.0), R.TIED),  # reversed within the intervals
    ],
)
def test_noise_decides_ties(a, b, verdict):
    c = claim(rule="ppl_order", metric="ppl", multiplier=2, order=["alibi", "rope"])
    v = R.ppl_order(c, [point("alibi", *a), point("rope", *b)])
    assert v.verdict == verdict
    assert f"alibi {a[0]:.1f} [{a[1]:.1f}, {a[2]:.1f}]" in v.ours  # the figures that decided it
    if verdict == R.TIED:
        assert "within the intervals: alibi ~ rope" in v.ours


def test_seed_spread_is_the_band_where_runs_have_no_interval():
    c = claim(rule="ppl_order", metric="ppl", multiplier=2, order=["alibi", "rope"])
    rows = [dict(point("alibi", x, None, None, seed=s), label=f"alibi {s}") for s, x in enumerate((20.0, 22.0))] + [
        dict(point("rope", x, None, None, seed=s), label=f"rope {s}") for s, x in enumerate((21.0, 23.0))
    ]
    assert R.ppl_order(c, rows).verdict == R.TIED
    far = [dict(r, ppl=r["ppl"] + 10) if r["scheme"] == "rope" else r for r in rows]
    assert R.ppl_order(c, far).verdict == R.MATCHED


def test_rules_read_compare_csv_like_run_folders(tmp_path):
    folder = sweep(tmp_path, rel_half=0.01)
    out = str(tmp_path / "cmp")
    compare([folder], out)
    assert P.ppl_rows([out]) and P.ppl_rows([out]) != []
    c = claim(rule="ppl_order", metric="ppl", multiplier=16, order=["alibi", "rope", "sinusoidal"])
    assert R.ppl_order(c, P.ppl_rows([out])).ours == R.ppl_order(c, P.ppl_rows([folder])).ours
    # A train-long reference row (compare.py references=) is no arm of the study: the rope claim reads one rope.
    long = write_run(tmp_path / "long", "rope", {"none": lambda L: 9.0}, train_len=1024, lengths=[64, 128, 1024])
    with_ref = str(tmp_path / "cmp_ref")
    compare([folder], with_ref, references=[long])
    ratio = claim(rule="ratio_between", series="rope", multiplier=16, min=1.35, max=5.4)
    assert any(r["trained_at"] == 1024 for r in P._read_csv(os.path.join(with_ref, "compare.csv")))
    assert R.ratio_between(ratio, P.ppl_rows([with_ref])).verdict == R.MATCHED
    finetune = claim(rule="ppl_order", metric="ppl", multiplier=2, train_len="max", order=["rope+yarn", "rope+pi"])
    ft = str(tmp_path / "ft")
    write_run(os.path.join(ft, "a"), "rope", {"none": lambda L: 50.0}, train_len=64)
    write_run(os.path.join(ft, "b"), "rope", {"yarn": lambda L: 30.0, "pi": lambda L: 40.0}, train_len=256)
    v = R.ppl_order(finetune, P.ppl_rows([ft]))
    assert v.ours.startswith("rope+yarn 30.0 < rope+pi 40.0 (ppl at 2 x L)")


def task_run(directory, task, scheme, beyond):
    buckets = [
        {"label": "1-3", "sizes": [1, 3], "inside": True, "accuracy": 1.0, "n": 10},
        {"label": "4-6", "sizes": [4, 6], "inside": False, "accuracy": beyond[0], "n": 10},
        {"label": "7-9", "sizes": [7, 9], "inside": False, "accuracy": beyond[1], "n": 30},
    ]
    for b in buckets:
        b.update(accuracy_lo=b["accuracy"], accuracy_hi=b["accuracy"], max_tokens=10)
    acc = (beyond[0] * 10 + beyond[1] * 30) / 40
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "task_results.json"), "w") as f:
        json.dump(
            {
                "kind": "task",
                "task": task,
                "scheme": scheme,
                "method": "none",
                "seed": 0,
                "train_sizes": [1, 3],
                "test_max": 9,
                "buckets": buckets,
                "beyond": {"accuracy": acc},
            },
            f,
        )


def test_task_mrr_from_runs_and_from_csv(tmp_path):
    root = tmp_path / "tasks"
    # 10 and 30 instances in the buckets 4-6 and 7-9. copy: nope 8 of 40, rope and sinusoidal 0: learned
    # (nope's Wilson interval [0.105, 0.348] is above chance + 0.05); sort: nope 2, rope 4, sinusoidal 2 of 40:
    # no interval clears 0.05 (rope's is [0.040, 0.231]), so sort ranks nothing.
    task_run(root / "0", "copy", "nope", (0.5, 0.1))
    task_run(root / "1", "copy", "rope", (0.0, 0.0))
    task_run(root / "2", "copy", "sinusoidal", (0.0, 0.0))
    task_run(root / "3", "sort", "nope", (0.2, 0.0))
    task_run(root / "4", "sort", "rope", (0.4, 0.0))
    task_run(root / "5", "sort", "sinusoidal", (0.2, 0.0))
    c = claim(rule="task_mrr", above=["nope"], below=["rope", "sinusoidal"])
    v = R.task_mrr(c, P.task_rows([str(root)]))
    # Both tasks, ties shared: nope (1 + 1/2) / 2 = rope (1/2 + 1) / 2 = 0.75, and averaged: 0.70 each: nope is
    # not above rope. Size buckets: nope (1 + 1 + 1/2 + 1) / 4 = 0.875 > rope 0.75. Copy alone: nope 1 > 0.5.
    # Ties by intervals: sort ties all three (rank 1 each), copy puts nope apart: nope 1 > rope 0.75.
    assert v.verdict == R.NOT_ROBUST
    assert v.ours.startswith(
        "nope 1.00 > rope 0.50 > sinusoidal 0.50 (mean reciprocal rank over the 1 learned task of 2, ties by 95% "
        "intervals; not comparable, no scheme learned them: sort); the claim holds under 4 of 6 readings"
    )
    mrr = {s["reading"]: (s["units"], s["mrr"], s["holds"]) for s in v.detail}
    assert mrr["per task, ties share the better rank (the earlier rule)"] == (
        2,
        {"nope": 0.75, "rope": 0.75, "sinusoidal": 0.5},
        False,
    )
    assert mrr["per task, tied ranks averaged"][1] == pytest.approx({"nope": 0.7, "rope": 0.7, "sinusoidal": 0.4})
    assert mrr["per task x size bucket"] == (4, {"nope": 0.875, "rope": 0.75, "sinusoidal": 0.625}, True)
    assert mrr["ties by 95% interval overlap"] == (2, {"nope": 1.0, "rope": 0.75, "sinusoidal": 0.75}, True)
    out = str(tmp_path / "cmp")
    compare_tasks([str(root)], out)
    assert R.task_mrr(c, P.task_rows([out])).ours == v.ours
    assert R.task_mrr({**c, "below": ["sinusoidal"]}, P.task_rows([out])).verdict == R.MATCHED
    no_sin = R.task_mrr({**c, "below": ["rope", "t5"]}, P.task_rows([out]))
    assert no_sin.verdict == R.NOT_COMPARABLE and no_sin.ours.startswith("not comparable: no t5 run")


def test_wilson_interval():
    assert R.wilson(10, 20) == pytest.approx((0.2993, 0.7007), abs=1e-4)  # the textbook case
    lo, hi = R.wilson(0, 64)
    assert lo == 0 and hi == pytest.approx(R.WILSON_Z**2 / (64 + R.WILSON_Z**2))  # 0 right is not [0, 0]
    assert R.wilson(64, 64) == pytest.approx((1 - hi, 1.0))


def test_chance_is_the_most_frequent_answer():
    """Parity's one answer bit is right half the time by guessing; a copy of 7 digits almost never."""
    assert R.chance_rate("parity", ((7, 8), (9, 10))) == pytest.approx(0.5, abs=0.03)
    assert R.chance_rate("copy", ((7, 8),)) < 0.01
    assert R.chance_rate("no_such_task", ((7, 8),)) == 0.0


def task_point(task, scheme, accuracy, n=100, seed=0, buckets=None):
    """A task row as task_rows reads it: accuracy past the training sizes over n instances, one bucket
    (7-8) unless given as [(label, accuracy, n), ...]."""
    buckets = buckets or [("7-8", accuracy, n)]
    return {
        "task": task,
        "scheme": scheme,
        "method": "none",
        "seed": seed,
        "accuracy": accuracy,
        "n": n,
        "buckets": [P._size_bucket(label, m, a) for label, a, m in buckets],
    }


def ranked(table: dict, **kw) -> list[dict]:
    """{task: {scheme: accuracy}} as task rows."""
    return [task_point(t, s, a, **kw) for t, by in table.items() for s, a in by.items()]


MRR_CLAIM = claim(rule="task_mrr", above=["a"], below=["b", "c"])


def test_task_mrr_matches_only_what_every_reading_shows():
    # a apart above b, b apart above c, on both tasks: every reading agrees
    v = R.task_mrr(MRR_CLAIM, ranked({"copy": {"a": 0.9, "b": 0.5, "c": 0.1}, "sort": {"a": 0.8, "b": 0.4, "c": 0.0}}))
    assert v.verdict == R.MATCHED and v.ours.endswith("the claim holds under 6 of 6 readings")
    # reversed: no reading shows it
    v = R.task_mrr(MRR_CLAIM, ranked({"copy": {"a": 0.1, "b": 0.9, "c": 0.5}, "sort": {"a": 0.0, "b": 0.8, "c": 0.4}}))
    assert v.verdict == R.NOT_MATCHED and v.ours.endswith("the claim holds under 0 of 6 readings")


def test_task_mrr_noise_decides_ties():
    """a above b by 5 points on 100 instances a task: the points rank a first, the 95% intervals
    ([0.40, 0.60] against [0.35, 0.55]) do not tell them apart: not robust, not matched."""
    rows = ranked({"copy": {"a": 0.50, "b": 0.45, "c": 0.0}, "sort": {"a": 0.90, "b": 0.85, "c": 0.0}})
    v = R.task_mrr(MRR_CLAIM, rows)
    held = {s["reading"]: s["holds"] for s in v.detail}
    assert v.verdict == R.NOT_ROBUST and not held["ties by 95% interval overlap"]
    assert held["per task, ties share the better rank (the earlier rule)"]
    assert v.detail[-1]["mrr"] == pytest.approx({"a": 1.0, "b": 1.0, "c": 1 / 3})  # a and b share rank 1
    # The same gap on 2,000 instances is beyond the intervals: every reading shows it
    big = ranked({"copy": {"a": 0.50, "b": 0.45, "c": 0.0}, "sort": {"a": 0.90, "b": 0.85, "c": 0.0}}, n=2000)
    assert R.task_mrr(MRR_CLAIM, big).verdict == R.MATCHED


def test_task_mrr_reads_seed_spread():
    """Two seeds of a (0.8 and 0.3 on 1,000 instances) average above b's (0.5, 0.5); each seed's interval is
    narrow, but the seeds disagree: a's band is their spread, which covers b, so the intervals tie them."""
    rows = [task_point("copy", "a", x, n=1000, seed=s) for s, x in ((0, 0.8), (1, 0.3))]
    rows += [task_point("copy", "b", 0.5, n=1000, seed=s) for s in (0, 1)]
    rows += [task_point("copy", "c", 0.0, n=1000, seed=s) for s in (0, 1)]
    v = R.task_mrr(MRR_CLAIM, rows)
    held = {s["reading"]: s["holds"] for s in v.detail}
    assert held["per task, ties share the better rank (the earlier rule)"]  # 0.55 > 0.5
    assert not held["ties by 95% interval overlap"] and v.verdict == R.NOT_ROBUST
    one_seed = [r for r in rows if r["seed"] == 0]  # 0.8 against 0.5: apart
    assert R.task_mrr(MRR_CLAIM, one_seed).verdict == R.MATCHED


def test_tasks_no_scheme_learned_are_not_comparable():
    # scan: every scheme at 0 or 1 of 100 (no interval clears chance + 0.05): it ranks nothing
    table = {"copy": {"a": 0.6, "b": 0.3, "c": 0.0}, "scan": {"a": 0.0, "b": 0.0, "c": 0.01}}
    v = R.task_mrr(MRR_CLAIM, ranked(table))
    units = {s["reading"]: s["units"] for s in v.detail}
    assert units["learned tasks only"] == 1 and units["per task, tied ranks averaged"] == 2
    assert "not comparable, no scheme learned them: scan" in v.ours
    # chance is the task's: 0.2 on 100 instances is learned on copy (chance about 0), not on parity (0.5)
    assert R._learned(ranked({"copy": {"a": 0.2, "b": 0.0}}), ["a", "b"], "copy")
    assert not R._learned(ranked({"parity": {"a": 0.2, "b": 0.52}}), ["a", "b"], "parity")
    assert R._learned(ranked({"parity": {"a": 0.75, "b": 0.52}}, n=400), ["a", "b"], "parity")
    # no task learned at all: nothing to rank
    none = R.task_mrr(MRR_CLAIM, ranked({"scan": table["scan"], "addition": {"a": 0.0, "b": 0.0, "c": 0.0}}))
    assert none.verdict == R.NOT_COMPARABLE and "no scheme learned any of the 2 tasks" in none.ours
    # rows without instance counts make no intervals
    bare = [dict(r, n=None, buckets=[]) for r in ranked(table)]
    assert R.task_mrr(MRR_CLAIM, bare).verdict == R.NOT_COMPARABLE


def test_mrr_of_the_committed_task_study():
    """The five readings of issue 51 on the committed 4,000-step CSVs, and the verdict they make."""
    (c,) = [c for c in published_claims() if c["id"] == "tasks_nope_t5_first"]
    rows = P.task_rows([committed("length_generalization_4000"), committed("length_generalization_4000_sinusoidal")])
    v = R.task_mrr(c, rows)
    by = {s["reading"]: s for s in v.detail}
    order = lambda reading: sorted(by[reading]["mrr"], key=by[reading]["mrr"].get, reverse=True)
    page = by["per task, ties share the better rank (the earlier rule)"]["mrr"]
    assert [round(page[n], 2) for n in ("nope", "t5", "alibi")] == [0.68, 0.63, 0.57]
    assert order("per task, tied ranks averaged")[:3] == ["nope", "alibi", "t5"]
    sizes = by["per task x size bucket"]["mrr"]
    assert order("per task x size bucket")[0] == "alibi" and (round(sizes["alibi"], 2), round(sizes["nope"], 2)) == (
        0.78,
        0.77,
    )
    assert order("learned tasks only")[:3] == ["nope", "alibi", "t5"] and by["learned tasks only"]["units"] == 4
    assert order("ties by 95% interval overlap")[0] == "alibi"
    assert [s["holds"] for s in v.detail] == [True, False, False, False, False, False]
    assert v.verdict == R.NOT_ROBUST
    assert "not comparable, no scheme learned them: addition, scan" in v.ours


def test_script_prints_and_writes_the_table(tmp_path):
    folder = sweep(tmp_path, rel_half=0.01)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "check_published.py"),
            f"studies.pe_extrapolation=[{folder}]",
            f"studies.pe_with_window_control=[{folder}]",
            "studies.rope_scaling=[]",
            "studies.real_model=[]",
            "studies.real_model_retrieval=[]",
            "studies.train_positions=[]",
            "studies.search_longrope=[]",
            "studies.rope_base=[]",
            "studies.layouts=[]",
            "studies.gemma3_real=[]",  # the committed studies' folders, kept out of this hand-made sweep
            "studies.gemma3_retrieval=[]",
            "studies.content_schemes=[]",
            "studies.train_long_bound=[]",
            f"studies.length_generalization=[{tmp_path / 'none'}]",
            f"out={tmp_path / 'out'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.load(open(tmp_path / "out" / "check_published.json"))
    verdicts = {(r["id"], r["verdict"]) for r in rows}
    # conf/published.yaml's thresholds on the hand-made sweep above:
    assert ("rope_mild_at_2x", R.MATCHED) in verdicts and ("sinusoidal_at_2x", R.MATCHED) in verdicts
    assert ("rope_far", R.MATCHED) in verdicts
    # ALiBi is flat (0.95-0.98, each interval below 1.05), but the sweep has no window-L control to beat: the
    # flat claim alone matches, the claim that ALiBi reads past L (alone or bundled with flat) is not comparable
    rules = {c["id"]: c["rule"] for c in published_claims()}
    for claim_id, rule_name in rules.items():
        if rule_name == "ratio_at_most" and claim_id.startswith("alibi"):
            assert (claim_id, R.MATCHED) in verdicts
        if rule_name == "beats_own_window":
            assert (claim_id, R.NOT_COMPARABLE) in verdicts
    assert ("su_zero_shot_order", R.NOT_COMPARABLE) in verdicts
    assert ("tasks_nope_t5_first", R.NOT_COMPARABLE) in verdicts
    assert "| **rope_far** (sweep)" in done.stdout and "Sources:" in done.stdout
    claims = P.per_claim(rows)
    matched = 3 + sum(r == "ratio_at_most" for r in rules.values())  # rope_mild, rope_far, sinusoidal (+ flat)
    assert sum(c["verdict"] == R.MATCHED for c in claims) == matched
    last = done.stdout.rstrip().splitlines()[-1]
    assert last == P.summary_line(claims) and last.startswith(f"claims matched: {matched} of {len(claims)} (")


def test_runs_of_other_settings_are_not_averaged_as_seeds(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path)])
    other = [dict(r, label="rope (trainer.max_steps=2000)", ppl=r["ppl"] * 2) for r in rows if r["scheme"] == "rope"]
    mixed = [dict(r, label="rope (trainer.max_steps=600)") if r["scheme"] == "rope" else r for r in rows] + other
    c = claim(id="x", study="pe", rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25)
    with pytest.raises(R.Ambiguous, match="2 rope runs that are not seed replicas"):
        R.ratio_between(c, mixed)
    seeds = [dict(r, seed=1, label="rope (1)") for r in other]
    assert (
        R.ratio_between(
            c, [dict(r, seed=0, label="rope (0)") if r["scheme"] == "rope" else r for r in rows] + seeds
        ).verdict
        == R.MATCHED
    )


def test_a_comparison_folder_is_read_alone_not_with_a_comparison_kept_below_it(tmp_path):
    """docs/results/<study> holding its compare.csv and, in a subfolder, an older comparison of other runs:
    the check reads the study's own table; a folder without one of its own is still searched below."""
    out = tmp_path / "study"
    write_run(tmp_path / "new" / "rope_s0", "rope", {"none": lambda L: 10.0 * L / 64}, seed=0)
    write_run(tmp_path / "old" / "rope_s0", "rope", {"none": lambda L: 30.0 * L / 64}, seed=0)
    compare([str(tmp_path / "new")], str(out))
    compare([str(tmp_path / "old")], str(out / "first_runs"))
    ppl = {r["length"]: r["ppl"] for r in P.ppl_rows([str(out)]) if r["scheme"] == "rope"}
    assert ppl == {64: 10.0, 128: 20.0, 256: 40.0}
    assert len([r for r in P.ppl_rows([str(tmp_path)]) if r["scheme"] == "rope"]) == 6  # no table of its own


def test_a_study_entry_may_be_several_folders_read_together(tmp_path):
    root = sweep(tmp_path, rel_half=0.01)
    runs = sorted(os.path.join(root, d) for d in os.listdir(root))
    c = claim(rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25)
    alone, together = P.check_claims([c], {"pe": [runs[0], runs[:2]]})
    assert alone["verdict"] == R.NOT_COMPARABLE and together["verdict"] == R.MATCHED
    assert "| **c** (0_alibi + 1_rope)" in P.markdown([together])


def test_folders_of_one_name_under_two_studies_are_told_apart_in_the_table():
    names = P.short_names(
        ["out/budget_pg19/2_rope", "out/budget_stdlib/2_rope", "docs/results/pe_pg19", "x/pe_pg19_6000"]
    )
    assert names == {
        "out/budget_pg19/2_rope": "budget_pg19/2_rope",
        "out/budget_stdlib/2_rope": "budget_stdlib/2_rope",
        "docs/results/pe_pg19": "pe_pg19",
        "x/pe_pg19_6000": "pe_pg19_6000",
    }


def test_a_folder_without_results_yet_leaves_its_claims_not_comparable(tmp_path):
    root = sweep(tmp_path)
    pending = tmp_path / "pending"
    pending.mkdir()
    (pending / "results.json").write_text(json.dumps({"status": "failed", "error": "killed", "results": []}))
    rope = os.path.join(root, sorted(os.listdir(root))[1])
    c = claim(rule="ppl_order", metric="ppl_rel", multiplier=2, order=["alibi", "rope"])
    (row,) = P.check_claims([c], {"pe": [[rope, str(pending)]]})
    assert row["verdict"] == R.NOT_COMPARABLE and row["ours"] == "no alibi result at 2 x L"


# --- every claim can fail: a series its rule must reject ------------------------------


def committed(folder):
    return os.path.join(ROOT, "docs", "results", folder)


def alibi_and_window(control="alibi", shift=0.0, climb=1.0):
    """ALiBi flat past L (0.97 to 0.95 of its PPL at L, intervals 0.94-0.99) and a window-L control,
    `control` cut to its last L keys (by default ALiBi's own weights), at 0.95-0.97 + `shift` past L: with
    no shift, a model that reads nothing past L. `climb` multiplies ALiBi's relative PPL past L."""
    rows = []
    for length, rel in ((64, 1.0), (128, 0.97), (256, 0.96), (1024, 0.95)):
        past = length > 64
        for scheme, method, value, lo, hi in (
            ("alibi", "none", rel * (climb if past else 1.0), 0.94 * climb, 0.99 * climb),
            (control, "window", rel + shift * past, 0.95 + shift, 0.97 + shift),
        ):
            rows.append(
                {
                    "scheme": scheme,
                    "method": method,
                    "label": f"{scheme}+{method}",
                    "seed": 0,
                    "train_len": 64,
                    "length": length,
                    "ratio": length / 64,
                    "ppl": 100 * value,
                    "ppl_rel": value,
                    "ppl_rel_lo": lo if past else 1.0,
                    "ppl_rel_hi": hi if past else 1.0,
                }
            )
    return rows


def tasks_with_alibi_first():
    return ranked(
        {
            "copy": {"alibi": 0.6, "nope": 0.3, "t5": 0.2, "rope": 0.1, "sinusoidal": 0.0, "learned": 0.0},
            "sort": {"alibi": 0.5, "nope": 0.4, "t5": 0.1, "rope": 0.2, "sinusoidal": 0.1, "learned": 0.0},
        }
    )


def relative_at(series: str, k: float, rel: float, lo: float, hi: float) -> list[dict]:
    """One series' relative PPL at L and at k x L with its interval."""
    scheme, _, method = series.partition("+")
    return [rel_point(scheme, 1, 1.0, 1.0, 1.0, method or "none"), rel_point(scheme, k, rel, lo, hi, method or "none")]


def pretrained(ppl: dict, train_len=8192):
    """PPL rows of one pretrained model under several methods: {series: {length: (ppl, lo, hi)}};
    ppl_rel against the series' own PPL at the trained length."""
    rows = []
    for name, table in ppl.items():
        scheme, _, method = name.partition("+")
        for length, (v, lo, hi) in table.items():
            ref = table[train_len][0]
            rows.append(
                {
                    "scheme": scheme,
                    "method": method or "none",
                    "label": name,
                    "seed": None,
                    "train_len": train_len,
                    "length": length,
                    "ratio": length / train_len,
                    "ppl": v,
                    "ppl_lo": lo,
                    "ppl_hi": hi,
                    "ppl_rel": v / ref,
                }
            )
    return rows


def pi_helps_past_l():
    """PI x2 worse than the plain model inside the trained window, better past it."""
    return pretrained(
        {
            "rope": {4096: (28.0, 27.0, 29.0), 8192: (28.0, 27.0, 29.0), 16384: (63.0, 60.0, 66.0)},
            "rope+pi-x2": {4096: (60.0, 58.0, 62.0), 8192: (60.0, 58.0, 62.0), 16384: (40.0, 38.0, 42.0)},
        }
    )


def retrieval_json(directory, method, accuracy: dict, train_len=8192, half_width=0.1, config=None):
    """A scripts/retrieval.py result with one task (passkey): {length: accuracy}; config: the
    checkpoint's training settings."""
    from rope_lm.probes.effective_length import add_effective

    lengths = sorted(accuracy)
    by_length = [
        {
            "length": L,
            "accuracy": accuracy[L],
            "accuracy_lo": max(0.0, accuracy[L] - half_width),
            "accuracy_hi": min(1.0, accuracy[L] + half_width),
        }
        for L in lengths
    ]
    tasks = {"passkey": {"lengths": lengths, "by_length": by_length}}
    effective = add_effective(tasks, train_len=train_len)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "retrieval.json"), "w") as f:
        json.dump(
            {
                "scheme": "rope",
                "method": method,
                "train_len": train_len,
                "scoring": "teacher",
                "tasks": tasks,
                "effective": effective,
                **({"config": config} if config else {}),
            },
            f,
        )
    return str(directory)


def self_extend_loses_the_key():
    rows = []
    for method, acc in (
        ("none", {4096: 1.0, 8192: 1.0, 16384: 0.0}),
        ("self_extend", {4096: 1.0, 8192: 1.0, 16384: 0.4}),
    ):
        rows += [
            {
                "task": "passkey",
                "scheme": "rope",
                "method": method,
                "train_len": 8192,
                "length": L,
                "accuracy": a,
                "accuracy_lo": max(0.0, a - 0.1),
                "accuracy_hi": min(1.0, a + 0.1),
            }
            for L, a in acc.items()
        ]
    return rows


GEMMA_GLOBAL, GEMMA_ALL = "rope+layout + yarn (scaled_layers=None)", "rope+layout + yarn (scaled_layers=all)"


def dca_loses_the_key():
    """DCA past the plain model but only 40% of passkeys at 4 x L (32,768)."""
    rows = self_extend_loses_the_key()
    for r in rows:
        r.update(scheme="rope+layout", train_len=32768, length=r["length"] * 4)
        r["method"] = "dca" if r["method"] == "self_extend" else "none"
    return rows


def finetunes(pose: float, half: float = 5.0):
    """PPL at 2,048 tokens of fine-tuned runs, each recording its own fine-tuning length: PoSE with PI at 128
    (2,048 is 16 x its L), and PI / YaRN at 2,048 (1 x theirs)."""
    rows = []
    for method, train_pos, v, L in (
        ("pi-x32", "pose-x16", pose, 128),
        ("pi", "none", 100.0, 2048),
        ("yarn", "none", 96.0, 2048),
    ):
        rows.append(
            {
                "scheme": "rope",
                "method": method,
                "train_pos": train_pos,
                "label": f"rope+{method}@{train_pos}",
                "seed": None,
                "train_len": L,
                "length": 2048,
                "ratio": 2048 / L,
                "ppl": v,
                "ppl_lo": v - half,
                "ppl_hi": v + half,
            }
        )
    return rows


def search_json(directory, target, rows: dict, method="longrope", train_len=64, paired=None):
    """A scripts/search.py search.json: {label: (ppl, lo, hi)} of its test rows, and its paired ratios
    {"<a> / <b>": (lo, hi)}."""
    os.makedirs(directory, exist_ok=True)
    pairs = {
        k: {"ratio": rows[k.split(" / ")[0]][0] / rows[k.split(" / ")[1]][0], "lo": lo, "hi": hi}
        for k, (lo, hi) in (paired or {}).items()
    }
    with open(os.path.join(directory, "search.json"), "w") as f:
        json.dump(
            {
                "method": method,
                "target": target,
                "train_len": train_len,
                "paired": pairs,
                "test": {k: {"ppl": v, "ppl_lo": lo, "ppl_hi": hi, "tokens": 4096} for k, (v, lo, hi) in rows.items()},
            },
            f,
        )
    return str(directory)


def longrope_ties_yarn():
    return [
        {
            "method": "longrope",
            "target": t,
            "train_len": 64,
            "label": label,
            "ppl": v,
            "ppl_lo": v - 10,
            "ppl_hi": v + 10,
        }
        for t in (512, 1024)
        for label, v in (("longrope searched", 300.0), ("yarn defaults", 305.0))
    ]


def bases(ppl16: dict, half=5.0):
    """PPL rows of the rope_base study: {base: PPL at 16 x L} (PPL 100 at L), labelled as compare.py labels them."""
    rows = []
    for base, v in ppl16.items():
        label = f"rope (pos.base={base})"
        for length, p in ((64, 100.0), (1024, v)):
            rows.append(
                {
                    "scheme": "rope",
                    "method": "none",
                    "label": label,
                    "seed": None,
                    "train_len": 64,
                    "length": length,
                    "ratio": length / 64,
                    "ppl": p,
                    "ppl_lo": p - half,
                    "ppl_hi": p + half,
                    "ppl_rel": p / 100.0,
                    "ppl_rel_lo": (p - half) / 100.0,
                    "ppl_rel_hi": (p + half) / 100.0,
                }
            )
    return rows


def at_k(ppl: dict, k=2, half=0.5, train_len=8192, methods=True):
    """PPL rows at L and k x L: {label: PPL at k x L} (PPL 28 at L), labelled as compare.py labels them
    (with methods=False a label's "+..." is part of the scheme, as a layout's is)."""
    rows = []
    for label, v in ppl.items():
        scheme, _, method = label.partition("+") if methods else (label, "", "")
        for length, p in ((train_len, 28.0), (k * train_len, v)):
            rows.append(
                {
                    "scheme": scheme,
                    "method": method or "none",
                    "label": label,
                    "seed": None,
                    "train_len": train_len,
                    "length": length,
                    "ratio": length / train_len,
                    "ppl": p,
                    "ppl_lo": p - half,
                    "ppl_hi": p + half,
                }
            )
    return rows


def small_base(ppl16: float, passkey_far: float, passkey_at_l: float = 1.0):
    label = "rope (pos.base=10.0)"
    retrieval = [
        {
            "task": "passkey",
            "scheme": "rope",
            "method": "none",
            "label": label,
            "train_len": 64,
            "length": L,
            "accuracy": a,
            "accuracy_lo": a,
            "accuracy_hi": a,
        }
        for L, a in ((64, passkey_at_l), (1024, passkey_far))
    ]
    return {"ppl": bases({"10.0": ppl16}), "retrieval": retrieval}


def seeded(table: dict, train_len=64) -> list[dict]:
    """compare.csv rows of seed replicas, {series: {k: [PPL of seed 0, seed 1, ...]}}: a series is a scheme,
    scheme+method (rope+yarn) or a row label with its setting ("rope (pos.p_rope=0.75)"), each row labelled
    as compare.py labels seed replicas (the label, then " (seed=N)")."""
    rows = []
    for name, by_k in table.items():
        if "(" in name:
            scheme, method = name.split(" ")[0], "none"
        else:
            scheme, _, method = name.partition("+")
        for k, ppls in by_k.items():
            for seed, p in enumerate(ppls):
                rows.append(
                    {
                        "scheme": scheme,
                        "method": method or "none",
                        "label": f"{name.replace('+', ' + ')} (seed={seed})",
                        "seed": seed,
                        "train_len": train_len,
                        "length": int(k * train_len),
                        "ratio": float(k),
                        "ppl": float(p),
                    }
                )
    return rows


def task_runs(acc: dict, n=128) -> list[dict]:
    """Task rows of seed replicas past the training sizes, {scheme: {task: [accuracy of seed 0, 1, ...]}}."""
    return [
        {"task": t, "scheme": s, "method": "none", "seed": i, "accuracy": a, "n": n, "buckets": []}
        for s, by_task in acc.items()
        for t, accs in by_task.items()
        for i, a in enumerate(accs)
    ]


def split_runs(inside: dict, beyond: float = 0.0, n=128) -> list[dict]:
    """Task rows of seed replicas with their exact match inside the training sizes (a test split's
    trained sizes at other settings), {scheme: {task: [accuracy inside of seed 0, 1, ...]}}; past
    them every run scores `beyond`."""
    return [
        {
            "task": t,
            "scheme": s,
            "method": "none",
            "seed": i,
            "accuracy": beyond,
            "n": n,
            "buckets": [],
            "inside": {"accuracy": a, "n": n},
        }
        for s, by_task in inside.items()
        for t, accs in by_task.items()
        for i, a in enumerate(accs)
    ]


RoPE, P_RoPE = "rope (pos.p_rope=1.0)", "rope (pos.p_rope=0.75)"


# claim id -> the rows its rule must reject: committed results of a model too small or too
# short-trained for the claim, or constructed.
CONTROLS = {
    "alibi_flat": lambda: alibi_and_window(climb=1.2),  # climbs to 1.16 [1.13, 1.19] at 2 x L
    "alibi_uses_context": alibi_and_window,  # no better than itself cut to L
    # The 600-step readings (their CSVs carry no interval), with one: RoPE below its PPL at L at 2 x L, and
    # mild at 16 x L (pe_wikitext2's 1.09); sinusoidal 1.18 at 2 x L (pe_pg19's)
    "rope_mild_at_2x": lambda: relative_at("rope", 2, 0.98, 0.97, 0.99),
    "rope_far": lambda: relative_at("rope", 16, 1.09, 1.07, 1.11),
    "sinusoidal_at_2x": lambda: relative_at("sinusoidal", 2, 1.18, 1.15, 1.21),
    "tasks_nope_t5_first": tasks_with_alibi_first,
    "su_zero_shot_order": lambda: P.ppl_rows([committed("rope_scaling_pg19_6000")]),  # PI beats plain RoPE
    "finetuned_yarn_ntk_pi": lambda: P.ppl_rows([committed("finetune_pg19_6000")]),  # YaRN ~ NTK
    # A tiny model trained at 64 tokens: RoPE only 1.06 at 2 x L, NTK 1.16 and YaRN 1.25 there.
    "real_unscaled_rises": lambda: P.ppl_rows([committed("pe_stdlib_6000")]),
    "real_pi_without_finetune_hurts": pi_helps_past_l,
    "real_ntk_flat_at_2x": lambda: P.ppl_rows([committed("rope_scaling_pg19_6000")]),
    "real_yarn_flat_at_2x": lambda: P.ppl_rows([committed("rope_scaling_pg19_6000")]),
    "real_self_extend_passkey": self_extend_loses_the_key,
    # YaRN on the global layers at 1.3 [1.25, 1.36] of its PPL at L at 2 x L: above the band
    "gemma3_yarn_global_flat_at_2x": lambda: [
        {**r, "ppl_rel_lo": r["ppl_rel"] - 0.05, "ppl_rel_hi": r["ppl_rel"] + 0.06}
        for r in pretrained({GEMMA_GLOBAL: {32768: (20.0, 19.5, 20.5), 65536: (26.0, 25.0, 27.0)}}, train_len=32768)
    ],
    # every layer extended does better than the global layers alone (beyond the intervals)
    "gemma3_local_layers_extended_hurts": lambda: pretrained(
        {
            GEMMA_GLOBAL: {32768: (20.0, 19.5, 20.5), 65536: (30.0, 29.0, 31.0)},
            GEMMA_ALL: {32768: (20.0, 19.5, 20.5), 65536: (22.0, 21.0, 23.0)},
        },
        train_len=32768,
    ),
    "gemma3_dca_passkey_4x": dca_loses_the_key,
    "pose_near_full_length": lambda: finetunes(pose=150.0),  # 1.56 x YaRN's, apart beyond the intervals
    "longrope_search_beats_yarn": longrope_ties_yarn,
    "real_longrope_beats_yarn": lambda: at_k({"rope+longrope-x2": 30.0, "rope+yarn": 28.3}),  # searched, but worse
    # A layout level with RoPE at 16 x L (within the intervals), one worse beyond them, SSMax no better.
    "nope_every_4_beats_rope": lambda: at_k(
        {"rope+nope_every_4": 60.3, "rope": 60.0}, k=16, train_len=64, methods=False
    ),
    "rnope_beats_rope": lambda: at_k({"rope+local_global": 75.0, "rope": 60.0}, k=16, train_len=64, methods=False),
    "ssmax_beats_softmax": lambda: at_k({"rope+ssmax": 61.0, "rope": 60.0}, k=16, train_len=64, methods=False),
    "small_base_ppl_without_retrieval": lambda: small_base(ppl16=110.0, passkey_far=0.9),  # still retrieves
    "far_bases_beat_10000": lambda: bases({"500.0": 300.0, "1000000.0": 150.0, "10000.0": 200.0}),  # 500 worse
    # FoX below RoPE at 2-8 x L but above it at 16 x L in every seed
    "fox_below_rope": lambda: seeded(
        {"fox": {2: [40, 41, 42], 16: [90, 95, 93]}, RoPE: {2: [45, 46, 47], 16: [80, 82, 81]}}
    ),
    # stick-breaking below in two seeds, above in the third: training noise decides (tied)
    "stick_breaking_below_rope": lambda: seeded(
        {"stick_breaking": {2: [40, 41, 50], 16: [60, 62, 90]}, RoPE: {2: [45, 46, 47], 16: [80, 82, 81]}}
    ),
    # RoPE solves counting past the training sizes too: the task says nothing of CoPE's positions
    "cope_counts_where_rope_fails": lambda: task_runs(
        {
            "cope": {"counting": [0.97, 0.98, 0.99], "selective_copy": [0.99, 1.0, 1.0]},
            "rope": {"counting": [0.95, 0.97, 0.96], "selective_copy": [0.1, 0.05, 0.0]},
        },
        n=512,
    ),
    # RoPE copies at the dense split as well as CoPE: the density says nothing of CoPE's positions
    "cope_copies_at_other_densities": lambda: split_runs(
        {
            "cope": {"selective_copy@dense": [1.0, 1.0, 0.99], "selective_copy@sparse": [0.98, 1.0, 0.97]},
            "rope": {"selective_copy@dense": [0.97, 0.99, 1.0], "selective_copy@sparse": [0.1, 0.0, 0.05]},
        },
        n=512,
    ),
    # p-RoPE 5% above RoPE in every seed, at L and past it
    "p_rope_at_or_below_rope": lambda: seeded(
        {P_RoPE: {1: [21.0, 21.1, 20.9], 2: [42.0, 44.1, 46.2]}, RoPE: {1: [20.0, 20.1, 19.9], 2: [40, 42, 44]}}
    ),
    # The bound above itself cut to 64 at 2 x 64 in every seed (it did not learn to read the longer context),
    # below it at 16 x 64: not read past L at every length
    "train_long_bound_reads_past_L": lambda: seeded(
        {
            "rope": {0.125: [160, 161, 162], 1: [140, 141, 142]},
            "rope+window": {0.125: [158, 159, 160], 1: [150, 151, 152]},
        },
        train_len=1024,
    ),
    # PoPE below RoPE in every seed, but not below RoPE with YaRN (level with it)
    "pope_below_rope_and_yarn": lambda: seeded(
        {
            "pope": {2: [30, 31, 32], 16: [35, 36, 37]},
            RoPE: {2: [45, 46, 47], 16: [80, 82, 81]},
            "rope+yarn": {2: [29, 32, 31], 16: [36, 35, 38]},
        }
    ),
}


def published_claims():
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(os.path.join(ROOT, "conf", "published.yaml")))["claims"]


@pytest.mark.parametrize("c", published_claims(), ids=lambda c: c["id"])
def test_every_published_claim_rejects_its_control(c):
    assert c["id"] in CONTROLS, f"claim {c['id']} has no control: add the series its rule must reject to CONTROLS"
    v = R.RULES[c["rule"]](c, CONTROLS[c["id"]]())
    assert v.verdict in (R.NOT_MATCHED, R.TIED), v


def test_a_claim_counts_once_however_many_folders():
    rows = (
        [{"id": "a", "claim": "", "rule": "", "verdict": v} for v in (R.MATCHED, R.NOT_MATCHED, R.NOT_MATCHED)]
        + [{"id": "b", "claim": "", "rule": "", "verdict": v} for v in (R.TIED, R.NOT_COMPARABLE)]
        + [{"id": "c", "claim": "", "rule": "", "verdict": R.NOT_COMPARABLE}]
        + [{"id": "d", "claim": "", "rule": "", "verdict": v} for v in (R.TIED, R.NOT_ROBUST, R.NOT_COMPARABLE)]
        + [{"id": "e", "claim": "", "rule": "", "verdict": v} for v in (R.NOT_ROBUST, R.NOT_MATCHED)]
    )
    claims = P.per_claim(rows)
    assert [(c["id"], c["verdict"], c[R.MATCHED], c["folders"]) for c in claims] == [
        ("a", R.MATCHED, 1, 3),
        ("b", R.TIED, 0, 2),
        ("c", R.NOT_COMPARABLE, 0, 1),
        ("d", R.NOT_ROBUST, 0, 3),  # a reading decided one folder: more than noise deciding the others
        ("e", R.NOT_MATCHED, 0, 2),  # a folder that contradicts it outweighs one that depends on the reading
    ]
    assert P.summary_line(claims) == "claims matched: 1 of 5 (not matched 1, not robust 1, tied 1, not comparable 1)"
    assert P.summary_line(claims[:1]) == "claims matched: 1 of 1"
    md = P.markdown([dict(r, source="s", published="p", results=None, ours="") for r in rows])
    assert "| 0 of 3, tied on 1, not robust on 1, not comparable on 1 | **not robust** |" not in md  # VERDICTS order
    assert "| 0 of 3, not robust on 1, tied on 1, not comparable on 1 | **not robust** |" in md
    assert "Per folder: 1 matched, 3 not matched, 2 not robust, 2 tied, 3 not comparable." in md


FLAT = claim(rule="ratio_at_most", series="alibi", from_multiplier=2, max=1.05)
USES_CONTEXT = claim(rule="beats_own_window", series="alibi", from_multiplier=2)


def test_alibi_flat_and_alibi_reading_past_l_are_two_claims(tmp_path):
    """Flat is what a model that reads nothing past L gives too: the flat claim matches on a flat ALiBi
    whatever its control, the claim that it reads past L only against ALiBi itself cut to L."""
    no_gain = alibi_and_window()  # flat, and level with its own window-L control
    assert R.ratio_at_most(FLAT, no_gain).verdict == R.MATCHED
    v = R.beats_own_window(USES_CONTEXT, no_gain)
    assert v.verdict == R.TIED and "within the intervals of the control at 2, 4, 16 x L" in v.ours
    gains = alibi_and_window(shift=0.06)  # its own window 1.01-1.03 past L: apart above ALiBi's 0.94-0.99
    assert R.beats_own_window(USES_CONTEXT, gains).verdict == R.MATCHED
    v = R.beats_own_window(USES_CONTEXT, alibi_and_window(shift=-0.06))  # the window below it, apart
    assert v.verdict == R.NOT_MATCHED and "above the control beyond the intervals at 2, 4, 16 x L" in v.ours
    # A window control on other weights (RoPE cut to L) is no control of ALiBi's: not comparable
    v = R.beats_own_window(USES_CONTEXT, alibi_and_window(control="rope", shift=0.06))
    assert v.verdict == R.NOT_COMPARABLE and "control missing: no alibi+window" in v.ours
    # A folder without intervals: not comparable for both claims
    bare = P.ppl_rows([sweep(tmp_path)])
    assert R.ratio_at_most(FLAT, bare).verdict == R.NOT_COMPARABLE
    assert R.beats_own_window(USES_CONTEXT, [dict(r, ppl_rel_lo=None, ppl_rel_hi=None) for r in gains]).verdict == (
        R.NOT_COMPARABLE
    )
    # ALiBi climbing past L: not flat (and its reading past L is another claim)
    assert R.ratio_at_most(FLAT, alibi_and_window(climb=1.2)).verdict == R.NOT_MATCHED
    straddles = alibi_and_window(climb=1.08)  # 1.05 at 2 x L, its interval [1.02, 1.07] straddles 1.05
    assert R.ratio_at_most(FLAT, straddles).verdict == R.TIED


def seeded_alibi_and_window(gains: list[float], spread=0.02) -> list[dict]:
    """ALiBi and ALiBi cut to L, one pair of runs a seed, each run's interval +- `spread` (so the unpaired
    intervals of the two always overlap); past L seed s's ALiBi is gains[s] x its own window's PPL."""
    rows = []
    for seed, gain in enumerate(gains):
        at_l = 100.0 + 5 * seed  # seeds differ far more than the gain: only pairing by seed sees it
        for length, rel in ((64, 1.0), (128, 0.97), (256, 0.96)):
            for method, factor in (("none", gain if length > 64 else 1.0), ("window", 1.0)):
                value = rel * factor
                rows.append(
                    {
                        "scheme": "alibi",
                        "method": method,
                        "label": f"alibi{' + window' * (method == 'window')} (seed={seed})",
                        "seed": seed,
                        "train_len": 64,
                        "length": length,
                        "ratio": length / 64,
                        "ppl": at_l * value,
                        "ppl_rel": value,
                        "ppl_rel_lo": value - spread,
                        "ppl_rel_hi": value + spread,
                    }
                )
    return rows


def test_reading_past_l_is_a_paired_ratio_over_seeds_not_two_overlapping_intervals():
    """Each seed's ALiBi 0.2-0.4% below itself cut to L: the unpaired intervals overlap (tied on them),
    the per-seed ratio's t-interval over 3 seeds lies below 1: matched. One seed the other way: the
    interval straddles 1 (training noise decides); every seed above: not matched."""
    v = R.beats_own_window(USES_CONTEXT, seeded_alibi_and_window([0.996, 0.997, 0.998]))
    assert v.verdict == R.MATCHED, v
    assert "alibi / alibi+window, paired over 3 seeds: 2 x L 0.997 [0.995, 0.999]" in v.ours
    assert R.beats_own_window(USES_CONTEXT, seeded_alibi_and_window([0.99, 0.995, 1.01])).verdict == R.TIED
    assert R.beats_own_window(USES_CONTEXT, seeded_alibi_and_window([1.01, 1.02, 1.015])).verdict == R.NOT_MATCHED
    # One seed of each: no t-interval over seeds; no paired column either: the unpaired intervals (tied)
    one = [r for r in seeded_alibi_and_window([0.996, 0.997, 0.998]) if r["seed"] == 0]
    v = R.beats_own_window(USES_CONTEXT, one)
    assert v.verdict == R.TIED and "(unpaired intervals)" in v.ours
    # ... with the evaluation's paired bootstrap on the same windows (compare.csv's paired_with): read on it
    paired = [
        dict(r, paired_with={"alibi + window (seed=0)": {"ratio": 0.996, "lo": 0.994, "hi": 0.998, "units": 64}})
        if r["method"] == "none" and r["length"] > 64
        else r
        for r in one
    ]
    v = R.beats_own_window(USES_CONTEXT, paired)
    assert v.verdict == R.MATCHED and "paired on the same windows: 2 x L 0.996 [0.994, 0.998] over 64" in v.ours


def test_a_claim_missing_a_setting_of_its_rule_is_refused_before_any_reading(tmp_path):
    c = claim(id="flat", rule="ratio_at_most", series="alibi", from_multiplier=2)
    with pytest.raises(ConfigError, match="'flat' .*needs series, from_multiplier, max .missing: max"):
        P.check_claims([c], {"pe": [str(tmp_path / "nowhere")]})


def test_worse_everywhere_needs_every_length_apart():
    c = claim(rule="worse_everywhere", series="rope+pi-x2", reference="rope")
    v = R.worse_everywhere(c, pi_helps_past_l())
    assert v.verdict == R.NOT_MATCHED and "lower than rope beyond the intervals at 2 x L" in v.ours
    hurts = [
        dict(r, ppl=r["ppl"] + 30, ppl_lo=r["ppl_lo"] + 30, ppl_hi=r["ppl_hi"] + 30)
        if r["method"] == "pi-x2" and r["length"] == 16384
        else r
        for r in pi_helps_past_l()
    ]
    v = R.worse_everywhere(c, hurts)  # 70 [68, 72] vs 63 [60, 66] at 2 x L, and above at 0.5 and 1 x L
    assert v.verdict == R.MATCHED and v.ours.startswith(
        "0.5 x L: rope+pi-x2 60.0 [58.0, 62.0] vs rope 28.0 [27.0, 29.0]"
    )
    close = [dict(r, ppl_lo=r["ppl"] - 20) if r["method"] == "pi-x2" and r["length"] == 16384 else r for r in hurts]
    v = R.worse_everywhere(c, close)
    assert v.verdict == R.TIED and "within the intervals at 2 x L" in v.ours
    assert R.worse_everywhere({**c, "reference": "alibi"}, hurts).verdict == R.NOT_COMPARABLE


def test_retrieval_rule_from_result_folders_and_from_compare_csv(tmp_path):
    from rope_lm.compare.retrieval_compare import compare_retrieval

    none = retrieval_json(tmp_path / "r" / "none", "none", {2048: 1.0, 8192: 1.0, 12288: 0.2, 16384: 0.0})
    kept = retrieval_json(tmp_path / "r" / "se", "self_extend", {2048: 1.0, 8192: 1.0, 12288: 1.0, 16384: 0.9})
    c = claim(rule="retrieval_kept", series="rope+self_extend", task="passkey", min=0.8, control="rope")
    v = R.retrieval_kept(c, P.retrieval_rows([str(tmp_path / "r")]))
    assert v.verdict == R.MATCHED
    assert v.ours == "12288: 100% [90%, 100%] vs rope 20% [10%, 30%]; 16384: 90% [80%, 100%] vs rope 0% [0%, 10%]"
    compare_retrieval([str(tmp_path / "r")], str(tmp_path / "cmp"))
    assert P.retrieval_rows([str(tmp_path / "cmp")]) == P.retrieval_rows([str(tmp_path / "r")])
    assert R.retrieval_kept(c, P.retrieval_rows([str(tmp_path / "cmp")])).ours == v.ours
    # below the bar at one length past L, the whole interval ([50%, 70%]): not matched; the interval across it
    # ([65%, 85%]): tied; the plain model as good: tied; no control: not comparable
    retrieval_json(kept, "self_extend", {2048: 1.0, 8192: 1.0, 12288: 1.0, 16384: 0.6})
    assert R.retrieval_kept(c, P.retrieval_rows([str(tmp_path / "r")])).verdict == R.NOT_MATCHED
    retrieval_json(kept, "self_extend", {2048: 1.0, 8192: 1.0, 12288: 1.0, 16384: 0.75})
    v = R.retrieval_kept(c, P.retrieval_rows([str(tmp_path / "r")]))
    assert v.verdict == R.TIED and v.ours.endswith("the interval straddles 80% at 16384")
    bare = [dict(r, accuracy_lo=None, accuracy_hi=None) for r in P.retrieval_rows([str(tmp_path / "r")])]
    assert R.retrieval_kept(c, bare).verdict == R.NOT_COMPARABLE
    retrieval_json(kept, "self_extend", {2048: 1.0, 8192: 1.0, 12288: 1.0, 16384: 0.9})
    retrieval_json(none, "none", {2048: 1.0, 8192: 1.0, 12288: 1.0, 16384: 0.9})
    v = R.retrieval_kept(c, P.retrieval_rows([str(tmp_path / "r")]))
    assert v.verdict == R.TIED and "rope retrieves within the intervals at every length" in v.ours
    assert R.retrieval_kept(c, P.retrieval_rows([kept])).verdict == R.NOT_COMPARABLE


def test_close_to_reads_training_positions_in_the_series_name(tmp_path):
    c = claim(
        rule="close_to", series="rope+pi-x32@pose-x16", references=["rope+pi", "rope+yarn"], length=2048, max_ratio=1.1
    )
    # The ratio's interval from the ends of the two: 99 / 97 to 101 / 95, wholly below 1.1
    v = R.close_to(c, finetunes(pose=100.0, half=1.0))
    assert v.verdict == R.MATCHED and v.ours == (
        "rope+pi-x32@pose-x16 100.0 [99.0, 101.0] vs rope+yarn 96.0 [95.0, 97.0] (ratio 1.04 [1.02, 1.06]) at "
        "2048 tokens"
    )
    v = R.close_to(c, finetunes(pose=100.0))  # 1.04, but the interval [0.94, 1.15] straddles 1.1
    assert v.verdict == R.TIED and v.ours.endswith("the ratio's interval straddles 1.1")
    assert R.close_to(c, finetunes(pose=120.0, half=30.0)).verdict == R.TIED  # 1.25 x, the intervals wide
    assert R.close_to(c, finetunes(pose=105.0, half=1.0)).verdict == R.TIED  # 1.09 x: [1.07, 1.12]
    v = R.close_to(c, finetunes(pose=150.0))
    assert v.verdict == R.NOT_MATCHED and "(ratio 1.56 [1.44, 1.70])" in v.ours
    plain = [dict(r, train_pos="none") if r["method"] == "pi-x32" else r for r in finetunes(pose=100.0)]
    assert R.close_to(c, plain).verdict == R.NOT_COMPARABLE  # no run trained on PoSE ids
    bare = [dict(r, ppl_lo=None, ppl_hi=None) for r in finetunes(pose=100.0, half=1.0)]
    assert R.close_to(c, bare).verdict == R.NOT_COMPARABLE  # no intervals: the point 1.04 decides nothing


def test_compare_csv_names_the_training_positions(tmp_path):
    d = write_run(
        tmp_path / "pose", "rope", {"none": lambda L: 10.0}, config={"train_pos": {"name": "pose", "factor": 16}}
    )
    out = str(tmp_path / "cmp")
    compare([d], out)
    rows = P.ppl_rows([out])
    assert {r["train_pos"] for r in rows} == {"pose-x16"} and R._series(rows, "rope@pose-x16")
    assert R._series(rows, "rope") == {}


def test_search_rule_reads_search_json_at_every_target(tmp_path):
    c = claim(rule="search_beats", method="longrope", better="longrope searched", worse="yarn defaults")
    search_json(
        tmp_path / "s" / "x8",
        512,
        {
            "none": (900.0, 850.0, 950.0),
            "yarn defaults": (400.0, 390.0, 410.0),
            "longrope searched": (350.0, 340.0, 360.0),
        },
    )
    x16 = tmp_path / "s" / "x16"
    search_json(x16, 1024, {"yarn defaults": (500.0, 490.0, 510.0), "longrope searched": (450.0, 440.0, 460.0)})
    search_json(tmp_path / "s" / "yarn", 512, {"yarn searched": (10.0, 9.0, 11.0)}, method="yarn")
    v = R.search_beats(c, P.search_rows([str(tmp_path / "s")]))
    assert v.verdict == R.MATCHED
    assert v.ours == (
        "512 (8 x L): longrope searched 350.0 [340.0, 360.0] vs yarn defaults 400.0 [390.0, 410.0]; "
        "1024 (16 x L): longrope searched 450.0 [440.0, 460.0] vs yarn defaults 500.0 [490.0, 510.0]"
    )
    search_json(x16, 1024, {"yarn defaults": (500.0, 490.0, 510.0), "longrope searched": (505.0, 495.0, 515.0)})
    assert R.search_beats(c, P.search_rows([str(tmp_path / "s")])).verdict == R.TIED
    search_json(x16, 1024, {"yarn defaults": (500.0, 490.0, 510.0), "longrope searched": (600.0, 590.0, 610.0)})
    assert R.search_beats(c, P.search_rows([str(tmp_path / "s")])).verdict == R.NOT_MATCHED
    assert (
        R.search_beats({**c, "method": "self_extend"}, P.search_rows([str(tmp_path / "s")])).verdict == R.NOT_COMPARABLE
    )


def test_search_rule_decides_on_the_paired_ratio_where_the_search_reports_one(tmp_path):
    """Both PPLs' own intervals overlap (the windows' spread), but on the same windows the searched
    setting is lower on almost every resample: the paired interval of the ratio decides."""
    c = claim(rule="search_beats", method="longrope", better="longrope searched", worse="yarn defaults")
    rows = {"yarn defaults": (34.0, 30.0, 38.7), "longrope searched": (32.4, 28.6, 36.9)}
    pair = "longrope searched / yarn defaults"
    for (lo, hi), verdict in (((0.93, 0.98), R.MATCHED), ((0.9, 1.01), R.TIED), ((1.01, 1.05), R.NOT_MATCHED)):
        search_json(tmp_path / "s", 512, rows, paired={pair: (lo, hi)})
        v = R.search_beats(c, P.search_rows([str(tmp_path / "s")]))
        assert v.verdict == verdict and f"ratio {32.4 / 34.0:.3f} [{lo:.3f}, {hi:.3f}] paired" in v.ours
    search_json(tmp_path / "s", 512, rows)  # no paired ratio: the separate intervals overlap
    assert R.search_beats(c, P.search_rows([str(tmp_path / "s")])).verdict == R.TIED


def test_each_below_reads_row_labels():
    c = claim(
        rule="each_below",
        multiplier=16,
        better=["rope (pos.base=500.0)", "rope (pos.base=1000000.0)"],
        worse="rope (pos.base=10000.0)",
    )
    v = R.each_below(c, bases({"500.0": 120.0, "1000000.0": 150.0, "10000.0": 200.0}))
    assert v.verdict == R.MATCHED and v.ours == (
        "rope (pos.base=500.0) 120.0 [115.0, 125.0], rope (pos.base=1000000.0) "
        "150.0 [145.0, 155.0] vs rope (pos.base=10000.0) 200.0 [195.0, 205.0] "
        "(ppl at 16 x L)"
    )
    assert R.each_below(c, bases({"500.0": 120.0, "1000000.0": 196.0, "10000.0": 200.0})).verdict == R.TIED
    assert R.each_below(c, bases({"500.0": 120.0, "10000.0": 200.0})).verdict == R.NOT_COMPARABLE


def test_ppl_kept_retrieval_lost():
    c = claim(
        rule="ppl_kept_retrieval_lost",
        series="rope (pos.base=10.0)",
        task="passkey",
        multiplier=16,
        max_ppl_rel=1.5,
        min_at_l=0.5,
        max_accuracy=0.2,
    )
    v = R.ppl_kept_retrieval_lost(c, small_base(ppl16=110.0, passkey_far=0.1))
    assert (v.ours, v.verdict) == (
        "PPL 1.10 [1.05, 1.15] x its PPL at L at 16 x L; passkey 100% [100%, 100%] at L, 10% [10%, 10%] at 16 x L",
        R.MATCHED,
    )
    assert R.ppl_kept_retrieval_lost(c, small_base(ppl16=300.0, passkey_far=0.1)).verdict == R.NOT_MATCHED
    v = R.ppl_kept_retrieval_lost(c, small_base(ppl16=148.0, passkey_far=0.1))  # [1.43, 1.53] across 1.5
    assert v.verdict == R.TIED and v.ours.endswith("PPL straddling its bound")
    assert R.ppl_kept_retrieval_lost(c, small_base(110.0, 0.0, passkey_at_l=0.1)).verdict == R.NOT_COMPARABLE
    # retrieval at L not shown beyond its interval (60% [40%, 80%], 50% needed): nothing to lose past L
    rows = small_base(ppl16=110.0, passkey_far=0.1, passkey_at_l=0.6)
    rows["retrieval"] = [
        dict(r, accuracy_lo=0.4, accuracy_hi=0.8) if r["length"] == 64 else r for r in rows["retrieval"]
    ]
    v = R.ppl_kept_retrieval_lost(c, rows)
    assert v.verdict == R.NOT_COMPARABLE and "is not shown to retrieve at L" in v.ours
    # no intervals: not comparable, though every point is inside its bound
    bare = small_base(ppl16=110.0, passkey_far=0.1)
    bare["ppl"] = [dict(r, ppl_rel_lo=None, ppl_rel_hi=None) for r in bare["ppl"]]
    assert R.ppl_kept_retrieval_lost(c, bare).verdict == R.NOT_COMPARABLE


def test_a_layout_series_is_read_by_its_whole_scheme_name():
    """A layout's scheme holds a "+" (rope+nope_every_4): its rows are its own, not RoPE's under a
    method called nope_every_4, so the layout claims can match as well as fail."""
    claim = next(c for c in published_claims() if c["id"] == "nope_every_4_beats_rope")
    better = at_k({"rope+nope_every_4": 50.0, "rope": 60.0}, k=16, train_len=64, methods=False)
    assert R.RULES[claim["rule"]](claim, better).verdict == R.MATCHED
    with_method = [dict(r, method="yarn", label=r["label"] + "+yarn") for r in better]
    assert R._series(better + with_method, "rope+nope_every_4+yarn")[16.0]["ppl"] == 50.0
    assert R._series(better + with_method, "rope+nope_every_4")[16.0]["ppl"] == 50.0


# --- positions that read the content (issue 52): seed-paired and task rules ---------------------

T_975_2 = 4.302652729911275  # the 0.975 quantile of Student's t with 2 degrees of freedom


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """ratio, lo, hi of a / b paired by seed, written out: the mean of ln(a_s / b_s) +- t sd / sqrt(n)."""
    d = [math.log(x / y) for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = T_975_2 * sd / math.sqrt(len(d))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


BELOW = claim(rule="below_across_seeds", series="fox", reference=RoPE, from_multiplier=2)


def test_below_across_seeds_is_the_seed_t_interval_of_the_paired_log_ratio():
    fox, rope = {2: [40, 41, 42], 16: [60, 62, 61]}, {2: [45, 46, 47], 16: [80, 82, 81]}
    v = R.below_across_seeds(BELOW, seeded({"fox": {1: [20, 20, 20], **fox}, RoPE: {1: [20, 20, 20], **rope}}))
    assert v.verdict == R.MATCHED
    for k in (2, 16):  # every length from 2 x L on, 1 x L not read
        r, lo, hi = paired(fox[k], rope[k])
        assert f"{k} x L {r:.3f} [{lo:.3f}, {hi:.3f}]" in v.ours
    assert "1 x L" not in v.ours and "paired over 3 seeds" in v.ours
    # One length where the interval straddles 1: tied; one where it lies above: not matched
    tied = R.below_across_seeds(BELOW, seeded({"fox": {**fox, 16: [60, 62, 90]}, RoPE: rope}))
    assert tied.verdict == R.TIED and "straddling 1 at 16 x L" in tied.ours
    above = R.below_across_seeds(BELOW, seeded({"fox": {**fox, 16: [90, 95, 93]}, RoPE: rope}))
    assert above.verdict == R.NOT_MATCHED and "above 1 at 16 x L" in above.ours
    # The same means with one seed: no interval, no verdict
    one = R.below_across_seeds(BELOW, seeded({"fox": {k: v[:1] for k, v in fox.items()}, RoPE: rope}))
    assert one.verdict == R.NOT_COMPARABLE and "needs 2 or more" in one.ours
    # "At or below" is a margin: 3% above RoPE is within 1.05, not within 1.02
    up = seeded({"fox": {2: [46.35, 47.38, 48.41]}, RoPE: {2: [45, 46, 47]}})
    assert R.below_across_seeds(dict(BELOW, max_ratio=1.05), up).verdict == R.MATCHED
    assert R.below_across_seeds(dict(BELOW, max_ratio=1.02), up).verdict == R.NOT_MATCHED


def test_below_across_seeds_needs_every_reference_and_seeded_runs():
    pope = {2: [30, 31, 32], 16: [35, 36, 37]}
    rows = seeded(
        {"pope": pope, RoPE: {2: [45, 46, 47], 16: [80, 82, 81]}, "rope+yarn": {2: [40, 41, 42], 16: [50, 52, 51]}}
    )
    c = claim(rule="below_across_seeds", series="pope", reference=[RoPE, "rope+yarn"], from_multiplier=2)
    v = R.below_across_seeds(c, rows)
    assert v.verdict == R.MATCHED and "pope / rope+yarn" in v.ours and f"pope / {RoPE}" in v.ours
    # YaRN evaluated by scripts/eval_extrapolation.py records no seed: not comparable, said so
    unseeded = [dict(r, seed=None, label=f"rope + yarn ({r['seed']})") if r["method"] == "yarn" else r for r in rows]
    v = R.below_across_seeds(c, unseeded)
    assert v.verdict == R.NOT_COMPARABLE and "rope+yarn has runs without a seed" in v.ours
    # Against a reference not run: not comparable; a reference above beyond the seeds decides first
    assert R.below_across_seeds(c, [r for r in rows if r["method"] != "yarn"]).verdict == R.NOT_COMPARABLE
    worse = [dict(r, ppl=r["ppl"] * 3) if r["scheme"] == "pope" else r for r in rows if r["method"] != "yarn"]
    assert R.below_across_seeds(c, worse).verdict == R.NOT_MATCHED


def test_below_across_seeds_reads_rope_and_p_rope_as_compare_labels_them(tmp_path):
    """p-RoPE runs are pos=rope runs: compare.py tells them apart by pos.p_rope, and the claims name them so;
    the rule's ratios equal compare_seed_pairs.csv's, from the CSV and from the run folders alike."""
    sweep = tmp_path / "sweep"
    table = {
        "rope": ({"name": "rope", "p_rope": 1.0}, {64: [20.0, 20.4, 19.8], 128: [30.0, 33.0, 31.0]}),
        "p_rope": ({"name": "rope", "p_rope": 0.75}, {64: [19.0, 19.9, 19.6], 128: [27.0, 29.0, 28.5]}),
        "fox": ({"name": "fox"}, {64: [19.5, 20.0, 19.0], 128: [22.0, 23.5, 22.4]}),
    }
    for arm, (pos, by_length) in table.items():
        scheme = pos["name"]
        for seed in range(3):
            write_run(
                sweep / f"{arm}_seed{seed}_none_L64",
                scheme,
                {"none": lambda L, t=by_length, s=seed: t[L][s]},
                lengths=[64, 128],
                seed=seed,
                config={"pos": pos},
            )
    out = tmp_path / "cmp"
    compare([str(sweep)], str(out))
    labels = {r["label"] for r in P._read_csv(str(out / "compare.csv"))}
    assert {f"{RoPE} (seed=0)", f"{P_RoPE} (seed=2)", "fox (seed=1)"} <= labels
    pairs = {(r["a"], r["b"], int(r["length"])): r for r in P._read_csv(str(out / "compare_seed_pairs.csv"))}
    p_rope = claim(rule="below_across_seeds", series=P_RoPE, reference=RoPE, from_multiplier=1)
    for rows in (P.ppl_rows([str(out)]), P.ppl_rows([str(sweep)])):
        v = R.below_across_seeds(BELOW, rows)
        # compare.py's pair of fox with RoPE (its seed aggregates are "rope" and "rope #2": RoPE is the one
        # whose seed-0 ratio is 22 / 30)
        (pair,) = [
            r
            for (a, _, length), r in pairs.items()
            if a.startswith("fox") and length == 128 and r["per_seed"].startswith(f"0={22.0 / 30.0!r}")
        ]
        assert f"2 x L {pair['ratio']:.3f} [{pair['ratio_lo']:.3f}, {pair['ratio_hi']:.3f}]" in v.ours
        assert f"2 x L {paired([22.0, 23.5, 22.4], [30.0, 33.0, 31.0])[0]:.3f}" in v.ours
        w = R.below_across_seeds(p_rope, rows)
        assert w.ours.startswith(f"{P_RoPE} / {RoPE}, paired over 3 seeds: 1 x L")
        assert w.verdict in (R.MATCHED, R.TIED, R.NOT_MATCHED)
    # A plain "rope" names both arms here: refused as runs that are not seed replicas
    with pytest.raises(R.Ambiguous):
        R.below_across_seeds(dict(BELOW, reference="rope"), P.ppl_rows([str(out)]))


TASK_CLAIM = claim(
    rule="task_solved_where_control_fails",
    series="cope",
    control="rope",
    tasks=["counting", "selective_copy"],
    min=0.9,
    max_control=0.5,
)


def test_task_solved_where_control_fails():
    solved = {"counting": [0.97, 0.98, 0.99], "selective_copy": [0.99, 1.0, 1.0]}
    fails = {"counting": [0.2, 0.25, 0.3], "selective_copy": [0.1, 0.05, 0.0]}
    v = R.task_solved_where_control_fails(TASK_CLAIM, task_runs({"cope": solved, "rope": fails}, n=512))
    assert v.verdict == R.MATCHED and "counting: cope 98% [" in v.ours and "(3 seeds)" in v.ours
    # the band is the seeds' Wilson intervals, lowest low to highest high
    lo = R.wilson(0.97 * 512, 512)[0]
    assert f"counting: cope 98% [{lo:.0%}, " in v.ours
    # CoPE short of 90% on one task: not matched; a seed straddling: tied
    short = {**solved, "selective_copy": [0.6, 0.7, 0.65]}
    v = R.task_solved_where_control_fails(TASK_CLAIM, task_runs({"cope": short, "rope": fails}, n=512))
    assert v.verdict == R.NOT_MATCHED and "cope below 90%" in v.ours
    edge = {**solved, "counting": [0.97, 0.9, 0.95]}
    v = R.task_solved_where_control_fails(TASK_CLAIM, task_runs({"cope": edge, "rope": fails}, n=512))
    assert v.verdict == R.TIED
    # no RoPE run of a task, or no counts: not comparable
    rows = [r for r in task_runs({"cope": solved, "rope": fails}) if (r["scheme"], r["task"]) != ("rope", "counting")]
    v = R.task_solved_where_control_fails(TASK_CLAIM, rows)
    assert v.verdict == R.NOT_COMPARABLE and "counting: no rope run" in v.ours
    bare = [dict(r, n=None) for r in task_runs({"cope": solved, "rope": fails})]
    assert R.task_solved_where_control_fails(TASK_CLAIM, bare).verdict == R.NOT_COMPARABLE


def test_task_claims_read_inside_the_training_sizes_where_told():
    """where: inside reads a split's trained sizes; the default still reads past them, and a
    wrong value is one paragraph."""
    density = claim(
        rule="task_solved_where_control_fails",
        series="cope",
        control="rope",
        tasks=["selective_copy@sparse"],
        min=0.9,
        max_control=0.5,
        where="inside",
    )
    rows = split_runs({"cope": {"selective_copy@sparse": [1.0, 0.99]}, "rope": {"selective_copy@sparse": [0.1, 0.2]}})
    v = R.task_solved_where_control_fails(density, rows)
    assert v.verdict == R.MATCHED and v.ours.endswith("(exact match inside the training sizes)")
    assert "inside the training sizes" in P.rule_text(density)
    # past the training sizes every run scores 0%: CoPE's claim fails there
    beyond = R.task_solved_where_control_fails({k: v for k, v in density.items() if k != "where"}, rows)
    assert beyond.verdict == R.NOT_MATCHED and beyond.ours.endswith("(exact match past the training sizes)")
    with pytest.raises(ConfigError, match="where='outside' must be beyond"):
        R.task_solved_where_control_fails(dict(density, where="outside"), rows)


def test_content_claims_read_not_comparable_until_their_studies_are_run(tmp_path):
    content = [c for c in published_claims() if c["study"] in ("content_schemes", "content_tasks")]
    assert {c["id"] for c in content} == {
        "fox_below_rope",
        "stick_breaking_below_rope",
        "cope_counts_where_rope_fails",
        "cope_copies_at_other_densities",
        "p_rope_at_or_below_rope",
        "pope_below_rope_and_yarn",
    }
    absent = str(tmp_path / "content_schemes_pg19_6000")
    rows = P.check_claims(content, {"content_schemes": [absent], "content_tasks": [str(tmp_path / "tasks")]})
    assert [r["verdict"] for r in rows] == [R.NOT_COMPARABLE] * len(content)
    assert all(r["ours"].startswith("not run (") for r in rows)
    from omegaconf import OmegaConf

    studies = OmegaConf.load(os.path.join(ROOT, "conf", "check_published.yaml"))["studies"]
    assert list(studies["content_schemes"]) == ["docs/results/content_schemes_pg19_6000"]
    assert list(studies["content_tasks"]) == ["docs/results/content_tasks_4000"]


def test_the_bound_s_claim_reads_its_own_window_control_paired_by_seed():
    """train_long_bound_reads_past_L: the run against its own rows cut to 64 tokens (scheme rope, method window),
    seed by seed, at the multipliers of its own L = 1,024 from 0.125 (128 tokens) on."""
    claim = next(c for c in published_claims() if c["id"] == "train_long_bound_reads_past_L")
    below = seeded(
        {
            "rope": {0.0625: [200, 201, 202], 0.125: [150, 151, 152], 1: [140, 141, 142]},
            "rope+window": {0.0625: [200, 201, 202], 0.125: [158, 159, 160], 1: [150, 151, 152]},
        },
        train_len=1024,
    )
    v = R.RULES[claim["rule"]](claim, below)
    assert v.verdict == R.MATCHED and "paired over 3 seeds" in v.ours and "0.125 x L" in v.ours
    one_seed = [r for r in below if r["seed"] == 0]
    assert R.RULES[claim["rule"]](claim, one_seed).verdict == R.NOT_COMPARABLE
