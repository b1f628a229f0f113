"""scripts/compare.py on long-range probe folders (rope_lm/compare/long_range_compare.py): one row per
model with its seeds together, the drop's mean ± sd and t-interval over seeds checked by hand, a lone
seed's own bootstrap interval, key-token PPL beside PPL; the comparison written beside the perplexity
one when a folder holds both, none without long_range.json; runs on other text or other key tokens
refused in one paragraph. The files are the real probe's (run once on the tiny fixture), with the
scheme, seed and numbers set per run."""

import copy
import csv
import json
import math
import os

import pytest

from rope_lm.compare.compare_run import CompareSettings, compare_folders
from rope_lm.compare.long_range_compare import LONG_RANGE_JSON, compare_long_range, find_long_range_results
from rope_lm.core.errors import ConfigError
from rope_lm.probes import long_range_run as LR
from tests.conftest import ROOT, write_corpus
from tests.test_compare import write_run

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")  # RoPE, trained at 16 tokens
T975 = {1: 12.706204736174696, 2: 4.302652729749464}  # Student's t, 0.975 quantile, by df (tables)

# scheme -> seed -> (drop at d = 8, drop at d = 32, key-token PPL, PPL at T = 32)
RUNS = {
    "rope": {0: (0.5, 0.10, 20.0, 10.0), 1: (0.7, 0.30, 22.0, 11.0), 2: (0.9, 0.20, 27.0, 12.0)},
    "alibi": {0: (0.4, 0.00, 30.0, 9.0), 1: (0.6, -0.20, 34.0, 9.5)},
}


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """The probe's own long_range.json: distances 8 and 32 (0.5 and 2 x L = 16), key tokens at T = 32."""
    where = tmp_path_factory.mktemp("long_range_compare")
    corpus = {"path": write_corpus(where / "corpus"), "cache_dir": str(where / "cache")}
    s = LR.LongRangeSettings(
        ckpt=FIXTURE,
        repeated_span={"span": 4, "distances": [8, 32], "samples": 4},
        key_tokens={"evaluator": FIXTURE, "lengths": [32], "token_budget": 256},
        data=corpus,
        bootstrap=50,
        batch_tokens=512,
        device="cpu",
        out=str(where / "out"),
    )
    LR.run_long_range(s)
    with open(where / "out" / LR.RESULTS) as f:
        return json.load(f)


def write_probe(record, folder, scheme, seed, numbers, edit=lambda r: None):
    r = copy.deepcopy(record)
    r["scheme"] = r["config"]["pos"]["name"] = scheme
    r["config"]["seed"] = seed
    near, far, key_ppl, ppl = numbers
    for row, drop in zip(r["repeated_span"]["rows"], (near, far)):
        row["drop"]["loss"] = drop
    (row,) = r["key_tokens"]["rows"]
    row.update(key_tokens=12, key_ppl=key_ppl, ppl=ppl)
    edit(r)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LONG_RANGE_JSON), "w") as f:
        json.dump(r, f)
    return r


def write_study(record, root):
    for scheme, seeds in RUNS.items():
        for seed, numbers in seeds.items():
            write_probe(
                record, os.path.join(root, f"{scheme}_{seed}", "diagnostics", "long_range"), scheme, seed, numbers
            )


def hand(values):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def test_the_file_name_is_the_probes():
    assert LONG_RANGE_JSON == LR.RESULTS


def test_seeds_are_one_model_each_with_mean_sd_and_t_interval_by_hand(record, tmp_path):
    write_study(record, tmp_path / "study")
    assert len(find_long_range_results([str(tmp_path / "study")])) == 5
    out = compare_long_range([str(tmp_path / "study")], str(tmp_path / "cmp"))
    assert [(label, sorted(r["config"]["seed"] for r in runs)) for label, runs in out["groups"]] == [
        ("alibi", [0, 1]),
        ("rope", [0, 1, 2]),
    ]
    rows = {(r["label"], r["quantity"], r["at"]): r for r in out["rows"]}
    for scheme, seeds in RUNS.items():
        for i, (quantity, at) in enumerate((("drop", 8), ("drop", 32), ("key_ppl", 32), ("ppl", 32))):
            values = [numbers[i] for numbers in seeds.values()]
            row = rows[(scheme, quantity, at)]
            assert (row["n"], row["interval"], row["seeds"]) == (len(values), "t", " ".join(map(str, seeds)))
            assert (row["mean"], row["sd"], row["lo"], row["hi"]) == pytest.approx(hand(values), rel=1e-9)
    with open(out["files"]["csv"], newline="") as f:
        written = {(r["label"], r["quantity"], r["at"]): r for r in csv.DictReader(f)}
    assert float(written[("rope", "drop", "8")]["hi"]) == pytest.approx(0.7 + 4.302652729749464 * 0.2 / math.sqrt(3))
    assert float(written[("alibi", "drop", "32")]["lo"]) == pytest.approx(
        -0.1 - 12.706204736174696 * math.sqrt(0.02) / math.sqrt(2)
    )

    md = open(out["files"]["markdown"]).read()
    assert "shows a drop clearly above 0 at d > L" in md
    assert "| 8 | 0.5 | alibi | 2 | 0.500 ± 0.141 | [-0.771, 1.771] |" in md
    assert "| 8 | 0.5 | rope | 3 | 0.700 ± 0.200 | [0.203, 1.197] |" in md
    assert "| 32 | 2 | rope | 3 | 0.200 ± 0.100 | [-0.048, 0.448] |" in md
    assert "| 32 | 2 | rope | 3 | 23.00 ± 3.61 | 11.00 ± 1.00 |" in md
    assert "T = 32: 12 of 256 targets" in md


def test_a_lone_seed_shows_its_own_bootstrap_interval(record, tmp_path):
    r = write_probe(record, tmp_path / "one", "rope", 0, (0.5, 0.1, 20.0, 10.0))
    drop = r["repeated_span"]["rows"][0]["drop"]
    out = compare_long_range([str(tmp_path / "one")], str(tmp_path / "cmp"))
    row = next(x for x in out["rows"] if (x["quantity"], x["at"]) == ("drop", 8))
    assert (row["n"], row["mean"], row["sd"], row["interval"]) == (1, 0.5, None, "bootstrap")
    assert (row["lo"], row["hi"]) == (drop["loss_lo"], drop["loss_hi"])
    md = open(out["files"]["markdown"]).read()
    assert f"| 8 | 0.5 | rope | 1 | 0.500 | [{drop['loss_lo']:.3f}, {drop['loss_hi']:.3f}] (bootstrap) |" in md


def test_compare_writes_the_long_range_comparison_beside_the_perplexity_one(record, tmp_path):
    """Run folders holding results.json and the probe's folder below it: both comparisons, one out=."""
    write_study(record, tmp_path / "study")
    for scheme, seeds in RUNS.items():
        for seed in seeds:
            write_run(tmp_path / "study" / f"{scheme}_{seed}", scheme, train_len=16, seed=seed)
    out = tmp_path / "cmp"
    written = compare_folders(CompareSettings(path=str(tmp_path / "study"), out=str(out)))
    assert set(written) == {"long_range", "ppl"}
    assert {"compare.md", "compare.csv", "compare_long_range.md", "compare_long_range.csv"} <= set(os.listdir(out))
    assert "| 8 | 0.5 | rope | 3 | 0.700 ± 0.200 |" in (out / "compare_long_range.md").read_text()


def test_a_folder_without_long_range_results_writes_no_such_comparison(tmp_path):
    write_run(tmp_path / "sweep" / "0_rope", "rope")
    out = tmp_path / "cmp"
    written = compare_folders(CompareSettings(path=str(tmp_path / "sweep"), out=str(out)))
    assert set(written) == {"ppl"}
    assert "compare.md" in os.listdir(out) and not [n for n in os.listdir(out) if "long_range" in n]


def test_runs_on_other_text_or_other_key_tokens_are_refused_naming_the_folders(record, tmp_path):
    write_probe(record, tmp_path / "a" / "rope_0", "rope", 0, RUNS["rope"][0])
    # another tokenizer cuts the split into other tokens
    other_text = lambda r: r["text"].update(digest="0123456789abcdef")
    write_probe(record, tmp_path / "a" / "alibi_0", "alibi", 0, RUNS["alibi"][0], other_text)
    with pytest.raises(ConfigError, match=r"read different text") as e:
        compare_folders(CompareSettings(path=str(tmp_path / "a"), out=str(tmp_path / "cmp")))
    assert "a/rope_0" in str(e.value) and "a/alibi_0" in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "cmp")

    write_probe(record, tmp_path / "b" / "rope_0", "rope", 0, RUNS["rope"][0])
    # another evaluator chose them
    other_keys = lambda r: r["key_tokens"]["rows"][0].update(selection="fedcba9876543210")
    write_probe(record, tmp_path / "b" / "alibi_0", "alibi", 0, RUNS["alibi"][0], other_keys)
    with pytest.raises(ConfigError, match=r"length 32, .* different key tokens.*b/alibi_0.*b/rope_0"):
        compare_long_range([str(tmp_path / "b")], str(tmp_path / "cmp"))


def _with_windows(key_loss, key_count, loss, window=False, weights=None):
    """An edit for write_probe: the key-token row's per-window sums (and the PPLs they give), and for the
    window control its method."""

    def edit(r):
        (row,) = r["key_tokens"]["rows"]
        n = len(key_loss)
        row["per_window"] = {"loss": list(loss), "key_loss": list(key_loss), "key_count": list(key_count)}
        row["windows"], row["tokens"] = n, n * row["length"]
        row["key_ppl"] = math.exp(sum(key_loss) / sum(key_count))
        row["ppl"] = math.exp(sum(loss) / (n * row["length"]))
        if weights is not None:
            r["model"]["weights"] = weights  # each seed is a model of its own
        if window:
            r["method"] = "window"
            r["settings"]["common"]["scaling"] = {"name": "window", "window": 16}

    return edit


def test_each_model_against_its_own_window_paired_over_windows_or_over_seeds(record, tmp_path):
    """The ratio of a model's key-token PPL (and PPL) to its own window control's: a lone seed gets the paired
    bootstrap over the windows (here every key token of the control costs exactly 0.2 nats more, so every
    resample gives exp(-0.2): a paired interval of no width, where the windows' own spread is wide); seeds get
    the t-interval of their per-seed log ratios, by hand, shown as ratios."""
    counts = [3, 1, 4, 1, 5, 9, 2, 6]
    key_loss = [c * v for c, v in zip(counts, (2.0, 3.5, 1.0, 4.0, 2.5, 1.5, 3.0, 2.0))]
    loss = [32 * v for v in (5.0, 5.5, 4.8, 6.0, 5.2, 4.9, 5.1, 5.3)]
    shifted = [k + 0.2 * c for k, c in zip(key_loss, counts)]
    root = tmp_path / "one"
    write_probe(record, root / "rope_0", "rope", 0, (0.5, 0.1, 0, 0), _with_windows(key_loss, counts, loss))
    write_probe(record, root / "rope_0_w", "rope", 0, (0, 0, 0, 0), _with_windows(shifted, counts, loss, True))
    other = _with_windows(key_loss, counts, loss)

    def other_weights(r):
        other(r)
        r["model"]["weights"] = "another model"

    write_probe(record, root / "alibi_0", "alibi", 0, (0.5, 0.1, 0, 0), other_weights)
    out = compare_long_range([str(root)], str(tmp_path / "cmp"))
    rows = {(r["label"], r["quantity"]): r for r in out["rows"] if r["quantity"].endswith("_over_window")}
    assert set(rows) == {("rope", "key_ppl_over_window"), ("rope", "ppl_over_window")}  # alibi has no control
    key = rows[("rope", "key_ppl_over_window")]
    assert (key["n"], key["interval"]) == (1, "paired bootstrap")
    assert key["mean"] == pytest.approx(math.exp(-0.2)) and (key["lo"], key["hi"]) == pytest.approx(
        (math.exp(-0.2),) * 2
    )
    plain = rows[("rope", "ppl_over_window")]
    assert plain["mean"] == pytest.approx(1.0) and (plain["lo"], plain["hi"]) == pytest.approx((1.0, 1.0))
    md = open(out["files"]["markdown"]).read()
    assert "## Against its own window" in md
    assert f"| 32 | 2 | rope | 1 | {math.exp(-0.2):.3f} [{math.exp(-0.2):.3f}, {math.exp(-0.2):.3f}] (paired) |" in md

    # Three seeds, each with its own control 0.1, 0.2 and 0.4 nats a key token worse.
    root = tmp_path / "seeds"
    for seed, c in enumerate((0.1, 0.2, 0.4)):
        worse = [k + c * n for k, n in zip(key_loss, counts)]
        mine = _with_windows(key_loss, counts, loss, weights=f"seed {seed}")
        control = _with_windows(worse, counts, loss, True, weights=f"seed {seed}")
        write_probe(record, root / f"r{seed}", "rope", seed, (0, 0, 0, 0), mine)
        write_probe(record, root / f"w{seed}", "rope", seed, (0, 0, 0, 0), control)
    out = compare_long_range([str(root)], str(tmp_path / "cmp2"))
    (key,) = [r for r in out["rows"] if r["quantity"] == "key_ppl_over_window"]
    # Read as the rules read ratios: the t-interval of the per-seed log ratios (-0.1, -0.2, -0.4), its mean
    # and ends taken back to ratios, so the interval stays positive however wide the seeds' spread.
    mean, sd, lo, hi = hand([-0.1, -0.2, -0.4])
    assert (key["n"], key["interval"], key["seeds"]) == (3, "t, log", "0 1 2")
    assert (key["mean"], key["sd"], key["lo"], key["hi"]) == pytest.approx(
        (math.exp(mean), sd, math.exp(lo), math.exp(hi)), rel=1e-9
    )
    assert key["values"] == " ".join(f"{math.exp(-c):.6g}" for c in (0.1, 0.2, 0.4))
    md = open(out["files"]["markdown"]).read()
    shown = f"{math.exp(mean):.3f} ×/÷ {math.exp(sd):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"
    assert f"| 32 | 2 | rope | 3 | {shown} |" in md


def test_the_probe_keeps_the_per_window_sums_its_ppls_come_from(record):
    for row in record["key_tokens"]["rows"]:
        per = row["per_window"]
        assert len(per["loss"]) == len(per["key_loss"]) == len(per["key_count"]) == row["windows"]
        assert sum(per["key_count"]) == row["key_tokens"]
        assert math.exp(sum(per["loss"]) / row["tokens"]) == pytest.approx(row["ppl"], rel=1e-9)
        if row["key_tokens"]:
            assert math.exp(sum(per["key_loss"]) / row["key_tokens"]) == pytest.approx(row["key_ppl"], rel=1e-9)
