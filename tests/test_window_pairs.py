"""One model's methods compared on the same windows (rope_lm/compare/ppl_pairs.py): two evaluation folders of
the same weights are paired over the windows both scored (their per-window losses, eval_units.npz), in
compare.csv, compare.md and the claims' rules; and `rescore_units`, which scores a kept row's windows again
for an evaluation made before those losses were kept."""

import json
import math
import os
import sys

import numpy as np
import pytest

from rope_lm.compare import published_rules as R
from rope_lm.compare.ppl import compare
from rope_lm.compare.ppl_pairs import PAIRED_COLUMN
from rope_lm.compare.published import ppl_rows
from rope_lm.core.errors import ConfigError
from rope_lm.eval.bootstrap import Units
from rope_lm.eval.units_file import UNITS_NPZ, load_units, save_units
from tests import forked
from tests.conftest import ROOT, write_corpus
from tests.test_compare import read_csv, write_run

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "run_before_house")  # RoPE, trained at 16 tokens
COUNTS = np.array([100.0, 200.0, 150.0, 300.0, 250.0])  # tokens of five documents at 32 tokens (2 x L)
RNG = np.random.default_rng(7)
LOSS = COUNTS * RNG.uniform(2.0, 5.0, len(COUNTS))  # very unequal documents: wide unpaired intervals
SHIFT = 0.1  # nats a token the second method loses on every document


def _units(loss, counts=COUNTS):
    zeros = np.zeros(len(counts))
    return Units("document", np.arange(len(counts)), np.asarray(loss, float), np.asarray(counts), zeros, zeros)


def _folder(path, layers, loss, counts=COUNTS, identity="w1", methods=None, controls=None):
    """A Gemma-like evaluation folder: YaRN on the layers `layers`, one model by its weights (`identity`); its
    row at 32 tokens is the PPL of the units written beside it, with a wide interval (the books' spread)."""
    ppl32 = math.exp(loss.sum() / counts.sum())
    methods = methods or {"yarn": lambda L: {16: 10.0, 32: ppl32}[L]}
    write_run(
        path,
        "rope+layout",
        methods,
        train_len=16,
        lengths=[16, 32],
        protocol="documents",
        ci=lambda L: 0.3 * ppl32,
        config={"model_identity": {"weights": identity, "step": None}, "scaled_layers": layers},
    )
    with open(os.path.join(path, "results.json")) as f:
        results = json.load(f)
    results["eval"].update(bootstrap=400, seed=0)
    for label, control in (controls or {}).items():
        results["methods"][label]["control"] = control
    with open(os.path.join(path, "results.json"), "w") as f:
        json.dump(results, f)
    save_units(os.path.join(path, UNITS_NPZ), {m: {32: _units(loss, counts)} for m in methods})
    return str(path)


def _rows(out):
    rows = read_csv(out / "compare.csv")
    return {(r["label"], int(r["length"])): r for r in rows}


def test_two_folders_of_one_model_are_paired_exactly_where_the_bands_overlap(tmp_path):
    """The second method loses SHIFT nats a token more on every document: its PPL over the first's is
    exp(SHIFT) in every resample, so the paired interval is that one number, while the two PPL intervals
    overlap. compare.csv, compare.md and the rule read the pair; a reversed order is rejected."""
    a = _folder(tmp_path / "global", None, LOSS)
    b = _folder(tmp_path / "all", "all", LOSS + SHIFT * COUNTS)
    compare([a, b], str(tmp_path / "cmp"))
    rows = _rows(tmp_path / "cmp")
    label_a, label_b = sorted({lab for lab, _ in rows}, key=lambda lab: "all" in lab)
    assert "scaled_layers=all" in label_b and "scaled_layers=None" in label_a
    pair = json.loads(rows[(label_b, 32)][PAIRED_COLUMN])[label_a]
    assert pair["units"] == len(COUNTS)
    for v in (pair["ratio"], pair["lo"], pair["hi"]):
        assert v == pytest.approx(math.exp(SHIFT), rel=1e-9)
    back = json.loads(rows[(label_a, 32)][PAIRED_COLUMN])[label_b]
    assert back["ratio"] == pytest.approx(math.exp(-SHIFT), rel=1e-9)
    assert rows[(label_a, 16)][PAIRED_COLUMN] == ""  # no units kept at 16: nothing to pair
    # The PPL intervals overlap: unpaired, noise would decide.
    lo_b, hi_a = float(rows[(label_b, 32)]["ppl_lo"]), float(rows[(label_a, 32)]["ppl_hi"])
    assert lo_b < hi_a
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "### Methods on one model, paired on the same windows" in md
    assert f"| {label_a} / {label_b} | **lower** (0.905 [0.905, 0.905]) |" in md
    # The results page renders the same table from compare.csv alone (a `pairs` block).
    from rope_lm.compare.results_page import render

    assert render(f"{tmp_path / 'cmp' / 'compare.csv'} pairs") == (
        f"| first / second | 32 (2×) |\n|---|---|\n| {label_a} / {label_b} | **lower** (0.905 [0.905, 0.905]) |"
    )

    for source in ([str(tmp_path / "cmp")], [str(tmp_path / "cmp" / "compare.csv")]):  # as check_published reads
        found = ppl_rows(source)
        claim = {"multiplier": 2, "order": [label_a, label_b]}
        verdict = R.ppl_order(claim, found)
        assert verdict.verdict == R.MATCHED, verdict.ours
        assert "paired on the same windows" in verdict.ours and "0.905 [0.905, 0.905]" in verdict.ours
        assert R.ppl_order({"multiplier": 2, "order": [label_b, label_a]}, found).verdict == R.NOT_MATCHED
        below = R.each_below({"multiplier": 2, "better": [label_a], "worse": label_b}, found)
        assert below.verdict == R.MATCHED and "paired on the same windows" in below.ours
        # At 1 x L neither kept its windows: the two intervals decide there (the same PPL: tied).
        everywhere = R.worse_everywhere({"series": label_b, "reference": label_a}, found)
        assert everywhere.verdict == R.TIED and "within the intervals at 1 x L" in everywhere.ours
        assert "(ratio 1.105 [1.105, 1.105] over 5 documents, paired)" in everywhere.ours


def test_other_weights_or_other_windows_are_not_paired_and_the_bands_decide(tmp_path):
    claim_of = lambda rows: {"multiplier": 2, "order": sorted({r["label"] for r in rows}, key=lambda x: "all" in x)}  # noqa: E731
    for name, second in (
        ("weights", dict(identity="w2")),  # another model: training noise is not in a window pair
        ("windows", dict(counts=COUNTS + 1)),  # the same documents cut otherwise: not the same text
    ):
        a = _folder(tmp_path / name / "global", None, LOSS)
        loss = LOSS + SHIFT * second.get("counts", COUNTS)
        b = _folder(tmp_path / name / "all", "all", loss, **second)
        compare([a, b], str(tmp_path / name / "cmp"))
        assert all(r[PAIRED_COLUMN] == "" for r in read_csv(tmp_path / name / "cmp" / "compare.csv")), name
        rows = ppl_rows([str(tmp_path / name / "cmp")])
        verdict = R.ppl_order(claim_of(rows), rows)
        assert verdict.verdict == R.TIED and "paired" not in verdict.ours, (name, verdict.ours)


def test_identical_rows_say_nothing_and_a_page_block_without_pairs_is_refused(tmp_path):
    """A method that changes nothing at a length has the plain model's rows there: 1.000 [1.000, 1.000] is left
    out of the table; a `pairs` block over a comparison with no pair says why in one paragraph."""
    from rope_lm.compare.ppl_pairs import pairs_table
    from rope_lm.compare.results_page import render

    same = {"ratio": 1.0, "lo": 1.0, "hi": 1.0, "units": 3}
    other = {"ratio": 0.9, "lo": 0.8, "hi": 0.95, "units": 3}
    assert pairs_table({("a", 32): {"b": same}, ("b", 32): {"a": same}}, ["a", "b"], [32], 16) == ""
    table = pairs_table({("a", 32): {"b": same}, ("a", 64): {"b": other}}, ["a", "b"], [32, 64], 16)
    assert table == "| first / second | 64 (4×) |\n|---|---|\n| a / b | **lower** (0.900 [0.800, 0.950]) |"
    a = _folder(tmp_path / "one", None, LOSS)
    b = _folder(tmp_path / "two", "all", LOSS, identity="w2")
    compare([a, b], str(tmp_path / "cmp"))
    with pytest.raises(ConfigError, match="has no series of one model paired on the same windows"):
        render(f"{tmp_path / 'cmp' / 'compare.csv'} pairs")


def test_a_run_and_its_own_control_are_not_paired_again(tmp_path):
    """The evaluation pairs a method with its control itself (the rows' `controls`): compare adds nothing."""
    f = _folder(
        tmp_path / "run",
        None,
        LOSS,
        methods={"none": lambda L: 10.0, "window": lambda L: 11.0},
        controls={"window": "window"},
    )
    compare([f], str(tmp_path / "cmp"))
    assert all(r[PAIRED_COLUMN] == "" for r in read_csv(tmp_path / "cmp" / "compare.csv"))
    assert "paired on the same windows" not in (tmp_path / "cmp" / "compare.md").read_text().split("control")[-1]


# --- rescore_units: an evaluation made before per-window losses were kept ---------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    where = tmp_path_factory.mktemp("pairs_corpus")
    return {"path": write_corpus(where / "corpus"), "cache_dir": str(where / "cache")}


def _evaluate(data, out, *extra):
    """scripts/eval_extrapolation.py as a user runs it: (exit status, stdout and stderr on one line)."""
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "eval_extrapolation.py"),
            f"ckpt={FIXTURE}",
            "scaling=none,yarn",
            "scaling.factor=2.0",
            f"data.path={data['path']}",
            f"data.cache_dir={data['cache_dir']}",
            "eval.multipliers=[1,2]",
            "eval.token_budget=128",
            "eval.batch_tokens=128",
            "eval.bootstrap=50",
            f"out={out}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _results(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def test_rescore_units_keeps_the_rows_and_adds_the_same_windows_losses(data, tmp_path):
    out = tmp_path / "eval"
    assert _evaluate(data, out)[0] == 0
    first = _results(out)
    assert list(first["methods"]) == ["none", "yarn-x2"]
    original = load_units(str(out / UNITS_NPZ))["yarn-x2"][32]
    os.remove(out / UNITS_NPZ)  # as an evaluation made before its windows' losses were kept
    rc, text = _evaluate(data, out, "existing=continue", "rescore_units={yarn-x2: [32]}")
    assert rc == 0, text
    assert "[yarn-x2] scoring its windows at [32] again for their per-window losses (rescore_units)" in text
    again = _results(out)
    assert [(r["method"], r["length"], r["ppl"]) for r in again["results"]] == [
        (r["method"], r["length"], r["ppl"]) for r in first["results"]
    ]
    kept = load_units(str(out / UNITS_NPZ))
    assert set(kept) == {"yarn-x2"} and set(kept["yarn-x2"]) == {32}  # that row's windows alone
    got = kept["yarn-x2"][32]
    assert np.array_equal(got.keys, original.keys) and np.array_equal(got.count, original.count)
    np.testing.assert_allclose(got.loss, original.loss, rtol=1e-5)
    row = next(r for r in first["results"] if r["method"] == "yarn-x2" and r["length"] == 32)
    assert math.exp(got.loss.sum() / got.count.sum()) == pytest.approx(row["ppl"], rel=1e-5)
    rc, text = _evaluate(data, out, "existing=continue", "rescore_units={yarn-x2: [32]}")  # held now: nothing to do
    assert rc == 0 and "its per-window losses at [32] are kept already" in text


@pytest.mark.parametrize(
    "value, existing, message",
    [
        ("{yarn-x2: 32}", "continue", "must map a method's label to the lengths"),
        ("[32]", "continue", "must map a method's label to the lengths"),
        ("{yarn-x2: [32]}", "refuse", "give that evaluation's folder as out= with existing=continue"),
        ("{ntk: [32]}", "continue", "which out=.* has no rows of \\(its methods: none, yarn-x2\\)"),
        ("{yarn-x2: [64]}", "continue", "holds its rows at \\[16, 32\\] only"),
    ],
)
def test_bad_rescore_units_are_one_paragraph_before_any_scoring(data, tmp_path, value, existing, message):
    import re

    out = tmp_path / "eval"
    assert _evaluate(data, out)[0] == 0
    before = (out / "results.json").read_bytes()
    rc, text = _evaluate(data, out, f"existing={existing}", f"rescore_units={value}")
    assert rc == 2 and re.search(message, text), text
    assert "Traceback" not in text and "scoring its windows" not in text
    assert (out / "results.json").read_bytes() == before


def test_rescore_units_needs_an_evaluation_to_continue(data, tmp_path):
    rc, text = _evaluate(data, tmp_path / "new", "existing=continue", "rescore_units={yarn-x2: [32]}")
    assert rc == 2 and "holds no evaluation to continue" in text, text


# --- a training run and an evaluation of its checkpoint ---------------------------------------------------------


def test_a_training_run_pairs_with_an_evaluation_of_its_checkpoint(tiny_config, tmp_path):
    """The run records its weights' checksum beside its results, the same one an evaluation of its checkpoint
    records, so its own rows and the evaluation's methods are paired on the same windows."""
    from rope_lm.runs.pipeline import train_and_evaluate
    from rope_lm.runs.trained import open_model

    run = tmp_path / "run"
    train_and_evaluate(tiny_config, str(run))
    identity = _results(run)["model_identity"]
    assert identity == {"weights": open_model(str(run)).weights_digest, "step": 6}
    data = tiny_config["data"]
    evaluation = tmp_path / "yarn"
    done = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "eval_extrapolation.py"), f"ckpt={run}", "scaling=yarn"]
        + [f"eval.{k}={v}" for k, v in tiny_config["eval"].items() if v is not None and k != "multipliers"]
        + ["eval.multipliers=[1,2,4]", f"data.cache_dir={data['cache_dir']}", f"out={evaluation}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _results(evaluation)["config"]["model_identity"] == identity
    compare([str(run), str(evaluation)], str(tmp_path / "cmp"))
    rows = _rows(tmp_path / "cmp")
    yarn = next(lab for lab, _ in rows if "yarn" in lab)
    plain = next(lab for lab, _ in rows if "yarn" not in lab and "window" not in lab)
    assert set(json.loads(rows[(yarn, 32)][PAIRED_COLUMN])) == {plain}
    # YaRN's factor is 1 at L: the two rows are one computation there, so the pair is exactly 1.
    assert json.loads(rows[(yarn, 16)][PAIRED_COLUMN])[plain]["ratio"] == pytest.approx(1.0)
