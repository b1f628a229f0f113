"""Differences over seeds (scripts/compare.py on a sweep with several seeds a
scheme): each scheme against its own window-L control and two schemes against
each other, per length, as per-seed log ratios on the same windows with a
t-interval over seeds; a difference holds across seeds only when that
interval excludes 0, and is named within training noise otherwise."""

import json
import math
import os

import pytest

from rope_lm.compare.noise import HOLDS, WITHIN_TRAINING_NOISE, seed_interval, seed_verdict, t_cdf, t_quantile
from rope_lm.compare.ppl import compare
from tests.test_compare import read_csv, write_run

T_975_2 = 4.302652729749464  # t_{0.975, 2}: the 95% two-sided quantile for 3 seeds


def test_t_quantiles_are_students():
    assert t_quantile(0.975, 2) == pytest.approx(T_975_2, abs=1e-9)
    assert t_quantile(0.975, 1) == pytest.approx(12.706204736174707, abs=1e-8)
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959966, abs=1e-5)  # the normal's, at many seeds
    assert t_cdf(0.0, 3) == pytest.approx(0.5) and t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5))
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 7, 10, 30, 120):
        assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-10)


def test_the_seed_interval_equals_a_hand_computation():
    values = [0.10, 0.16, 0.04]
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    got = seed_interval(values)
    assert (got["n"], got["mean"], got["sd"]) == (3, pytest.approx(mean), pytest.approx(sd))
    half = T_975_2 * sd / math.sqrt(3)
    assert (got["lo"], got["hi"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert seed_verdict(got) == WITHIN_TRAINING_NOISE  # 0.10 ± 0.149 holds 0
    assert seed_verdict(seed_interval([0.10, 0.12, 0.11])) == HOLDS  # 0.11 ± 0.025 does not
    assert seed_verdict(seed_interval([-0.10, -0.12, -0.11])) == HOLDS
    assert seed_interval([0.3]) is None and seed_verdict(None) is None


def sweep(tmp_path, ratios: dict, ppl: dict) -> str:
    """A sweep of schemes x 3 seeds, each run evaluated with its own window control: `ratios[scheme]` the
    per-seed PPL / control PPL at 256 tokens (4 x L), `ppl[scheme]` the per-seed PPL there."""
    root = tmp_path / "sweep"
    for scheme in ratios:
        for seed in range(3):
            p, r = ppl[scheme][seed], ratios[scheme][seed]
            own = {64: 10.0, 128: 12.0, 256: p}
            d = write_run(
                root / f"{scheme}_seed{seed}",
                scheme,
                {"none": own.get, "window": lambda L, own=own, r=r: own[L] / (r if L == 256 else 1.0)},
                lengths=[64, 128, 256],
                seed=seed,
                ci=lambda L: 0.1,
                # seed 0 ran before the control existed: its recorded settings lack it, yet it is the same experiment
                config={"eval": {"controls": ["window"]}} if seed else None,
            )
            results = json.load(open(os.path.join(d, "results.json")))
            for row in results["results"]:
                if row["method"] == "none":
                    ratio = r if row["length"] == 256 else 1.0
                    row["controls"] = {
                        "window": {"ratio": ratio, "lo": ratio - 0.01, "hi": ratio + 0.01, "paired": True}
                    }
            json.dump(results, open(os.path.join(d, "results.json"), "w"))
    return str(root)


RATIOS = {"alibi": [0.80, 0.82, 0.79], "nope": [0.80, 0.82, 1.60]}  # nope: one seed differs a lot
PPL = {"alibi": [20.0, 21.0, 19.5], "nope": [30.0, 31.0, 29.0]}


@pytest.fixture
def compared(tmp_path):
    out = compare([sweep(tmp_path, RATIOS, PPL)], str(tmp_path / "cmp"))
    return out, {(r["label"], int(r["length"])): r for r in read_csv(out["files"]["seeds_csv"])}


def test_a_consistent_difference_holds_and_one_seed_far_off_is_within_training_noise(compared):
    out, rows = compared
    labels = sorted({label for label, _ in rows})
    assert labels == ["alibi (3 seeds)", "alibi + window (3 seeds)", "nope (3 seeds)", "nope + window (3 seeds)"]
    for scheme, want in (("alibi", "below the control"), ("nope", WITHIN_TRAINING_NOISE)):
        row = rows[(f"{scheme} (3 seeds)", 256)]
        logs = [math.log(r) for r in RATIOS[scheme]]
        mean = sum(logs) / 3
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
        half = T_975_2 * sd / math.sqrt(3)
        assert float(row["control_log_ratio_mean"]) == pytest.approx(mean)
        assert float(row["control_log_ratio_sd"]) == pytest.approx(sd)
        assert float(row["control_log_ratio_lo"]) == pytest.approx(mean - half)
        assert float(row["control_log_ratio_hi"]) == pytest.approx(mean + half)
        assert float(row["control_ratio"]) == pytest.approx(math.exp(mean))
        assert float(row["control_ratio_hi"]) == pytest.approx(math.exp(mean + half))
        assert row["control_holds_across_seeds"] == str(want != WITHIN_TRAINING_NOISE)
        assert row["control_verdict"] == want and row["control"] == "window" and row["control_n_seeds"] == "3"
    # Each seed's own interval excludes 1 for nope too: only the seeds show it is training noise.
    assert rows[("nope (3 seeds)", 128)]["control_verdict"] == WITHIN_TRAINING_NOISE  # a ratio of 1, sd 0
    assert rows[("alibi + window (3 seeds)", 256)]["control"] == ""  # the control is not read against itself
    md = open(out["files"]["markdown"]).read()
    section = md.split("### Against its own window-L control, across seeds")[1].split("###")[0]
    assert (
        "| alibi (3 seeds) | 1.00 [1.00, 1.00], d +0.000 ± 0.000 within training noise "
        "| 0.80 [0.77, 0.84], d -0.219 ± 0.019 **holds** |"
    ) in section
    assert "- 256: within training noise: nope (3 seeds)" in section
    assert "t = 4.303 for 3 seeds" in section


def test_two_schemes_paired_by_seed_hold_or_not_by_the_t_interval(tmp_path):
    ppl = {"alibi": [20.0, 21.0, 19.5], "nope": [30.0, 31.0, 29.0], "t5": [19.0, 24.0, 20.5]}
    ratios = {k: [0.9, 0.9, 0.9] for k in ppl}
    out = compare([sweep(tmp_path, ratios, ppl)], str(tmp_path / "cmp"))
    pairs = {(r["a"], r["b"], int(r["length"])): r for r in read_csv(out["files"]["seed_pairs_csv"])}
    assert {(a, b) for a, b, _ in pairs} == {
        ("alibi (3 seeds)", "nope (3 seeds)"),
        ("alibi (3 seeds)", "t5 (3 seeds)"),
        ("nope (3 seeds)", "t5 (3 seeds)"),
    }  # no control among them
    for (a, b), want in ((("alibi", "nope"), "a lower"), (("alibi", "t5"), WITHIN_TRAINING_NOISE)):
        row = pairs[(f"{a} (3 seeds)", f"{b} (3 seeds)", 256)]
        logs = [math.log(x / y) for x, y in zip(ppl[a], ppl[b])]  # paired by seed: seed s of a with seed s of b
        mean = sum(logs) / 3
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
        half = T_975_2 * sd / math.sqrt(3)
        assert (float(row["log_ratio_lo"]), float(row["log_ratio_hi"])) == (
            pytest.approx(mean - half),
            pytest.approx(mean + half),
        )
        assert float(row["ratio"]) == pytest.approx(math.exp(mean)) and row["seeds"] == "0;1;2"
        assert row["verdict"] == want and row["holds_across_seeds"] == str(want != WITHIN_TRAINING_NOISE)
    md = open(out["files"]["markdown"]).read()
    assert "### Run against run, across seeds" in md
    assert "within training noise: alibi (3 seeds) vs t5 (3 seeds)" in md


def test_a_single_run_is_read_against_its_own_control_with_the_paired_interval(tmp_path):
    """One seed a scheme: compare.md reads each run against its own control's paired interval (yes / no / tied)
    and compare.csv keeps it, so a committed table read back gives the same section."""
    root = sweep(tmp_path, {"alibi": [0.80, 1.20, 1.0]}, {"alibi": [20.0, 21.0, 19.5]})
    runs = [os.path.join(root, f"alibi_seed{s}") for s in range(3)]
    for d, seed in zip(runs, range(3)):  # three runs told apart by a setting, not seeds: no aggregate
        results = json.load(open(os.path.join(d, "results.json")))
        results["config"].pop("seed", None)
        results["config"]["study"] = {"arm": seed}
        json.dump(results, open(os.path.join(d, "results.json"), "w"))
    first = compare(runs, str(tmp_path / "one"))
    md = open(first["files"]["markdown"]).read()
    section = md.split("### Against its own window-L control (paired, on the same windows)")[1]
    assert "| alibi (study.arm=0) | tied (1.000 [0.990, 1.010]) | **yes** (0.800 [0.790, 0.810]) |" in section
    assert "| alibi (study.arm=1) | tied (1.000 [0.990, 1.010]) | no (1.200 [1.190, 1.210]) |" in section
    assert "| alibi (study.arm=2) | tied (1.000 [0.990, 1.010]) | tied (1.000 [0.990, 1.010]) |" in section
    again = compare([first["files"]["csv"]], str(tmp_path / "again"))
    assert (
        open(again["files"]["markdown"]).read().split("### Against its own window-L control")[1]
        == md.split("### Against its own window-L control")[1]
    )
