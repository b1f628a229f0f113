"""The window-L control (eval.controls=[window]): each run cut to its training
length L on its own weights, evaluated after its own method on the same
windows; each method's PPL over the control's per length with a paired
bootstrap interval; resumable, and added to a finished run without training
it again."""

import copy
import json
import os

import numpy as np
import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.eval import bootstrap
from rope_lm.eval.cost import COST_KEYS
from rope_lm.eval.evaluation import EvalConfig, evaluate_lengths
from rope_lm.eval.results import new_results
from rope_lm.model.transformer import build_model
from rope_lm.runs import eval_run
from rope_lm.runs.config import resolve_run
from rope_lm.runs.eval_run import evaluate_and_report
from rope_lm.runs.pipeline import claim_train, train_and_evaluate
from rope_lm.runs.run_folder import RUN_CONFIG, describe
from tests.conftest import TINY_MODEL

L = 8
RESAMPLES = 200


class Stream:
    """The token cache as evaluate_and_report reads it: one split of random tokens, one document."""

    def __init__(self, tokens):
        self._tokens = tokens

    def tokens(self, split):
        return self._tokens

    def doc_starts(self, split):
        return np.array([0])


@pytest.fixture(scope="module")
def stream():
    return np.random.default_rng(0).integers(0, 50, size=300).astype(np.uint16)


def tiny(pos: str, scaling=None):
    torch.manual_seed(0)
    return build_model(TINY_MODEL, {"name": pos}, scaling, vocab_size=50, train_len=L).eval()


def cfg(**extra) -> EvalConfig:
    options = dict(multipliers=[1, 2, 4], token_budget=256, batch_tokens=256, position_buckets=4, bootstrap=RESAMPLES)
    return EvalConfig(**{**options, **extra})


def evaluate(model, stream, out, controls=("window",), results=None, methods=None, eval_cfg=None, window=None):
    results = results or new_results({}, {"fingerprint": "x"}, L, "tiny")
    return evaluate_and_report(
        model,
        Stream(stream),
        eval_cfg or cfg(),
        methods or [None],
        str(out),
        results,
        controls=list(controls),
        control_window=window,
    )


def measured(row: dict) -> dict:
    """A row's numbers without what scoring it cost (seconds and memory differ between two sittings)."""
    return {k: v for k, v in row.items() if k not in COST_KEYS}


def rows_of(results, method):
    return {r["length"]: r for r in results["results"] if r["method"] == method}


@pytest.mark.parametrize("pos", ["alibi", "nope", "rope"])
def test_the_control_equals_a_separate_evaluation_with_scaling_window(pos, stream, tmp_path):
    model = tiny(pos)
    results = evaluate(model, stream, tmp_path)
    assert results["status"] == "complete" and model.scaling.name == "none"  # the model is left as it came
    assert results["controls"]["window"]["applies"] and results["methods"]["window"]["control"] == "window"
    model.set_scaling({"name": "window"})
    alone = {r["length"]: r for r in evaluate_lengths(model, stream, cfg(), L)}
    control = rows_of(results, "window")
    assert sorted(control) == [8, 16, 32]
    for length, row in alone.items():
        for key in ("ppl", "ppl_lo", "ppl_hi", "ppl_beyond", "ppl_rel", "tokens", "units"):
            assert control[length][key] == row[key], (length, key)
    # Cut to L the model differs from itself past L (NoPE, ALiBi, RoPE alike), and not at L.
    own = rows_of(results, "none")
    assert own[8]["ppl"] == control[8]["ppl"] and own[32]["ppl"] != control[32]["ppl"]
    md = open(tmp_path / "results.md").read()
    assert "## PPL over the window control's on the same windows (`window`)" in md


def test_eval_control_window_cuts_the_model_to_that_width_instead_of_its_training_length(stream, tmp_path):
    # A model fine-tuned at a longer length read against itself cut to its base's L (train_long_bound).
    model = tiny("rope")
    results = evaluate(model, stream, tmp_path, window=L // 2)
    assert results["controls"]["window"]["options"] == {"name": "window", "window": L // 2}
    model.set_scaling({"name": "window", "window": L // 2})
    alone = {r["length"]: r for r in evaluate_lengths(model, stream, cfg(), L)}
    control = rows_of(results, "window")
    for length, row in alone.items():
        assert control[length]["ppl"] == row["ppl"], length
    # Cut to L / 2 the model reads less than itself already at L.
    assert rows_of(results, "none")[L]["ppl"] != control[L]["ppl"]
    assert rows_of(results, "none")[L]["controls"]["window"]["paired"]
    # The width of the training length is the plain control.
    same = evaluate(tiny("rope"), stream, tmp_path / "same", window=L)
    assert same["controls"]["window"]["options"]["window"] == "auto"
    # A table names the narrower control's width; the plain one stays "+ window".
    from rope_lm.compare.ppl_groups import group_runs
    from rope_lm.compare.ppl_runs import load_runs

    for folder, label in ((tmp_path, f"tiny + window ({L // 2} keys)"), (tmp_path / "same", "tiny + window")):
        runs, _ = load_runs([str(folder / "results.json")])
        assert [s.label for s in group_runs(runs, False)[0].series] == ["tiny", label]


def test_the_paired_ratio_equals_a_hand_computation_on_the_units(stream, tmp_path):
    model = tiny("alibi")
    results = evaluate(model, stream, tmp_path)
    units = {}
    for method in ({"name": "none"}, {"name": "window"}):
        model.set_scaling(method)
        units[method["name"]] = {}
        evaluate_lengths(model, stream, cfg(), L, units_out=units[method["name"]])
    own, control = rows_of(results, "none"), rows_of(results, "window")
    for length in (8, 16, 32):
        a, b = units["none"][length], units["window"][length]
        assert np.array_equal(a.keys, b.keys)  # the same windows
        # By hand: B resamples of the windows, the same indices on both sides, ratio of the two PPLs.
        rng = np.random.default_rng([0, length, 1])
        idx = rng.integers(0, len(a), size=(RESAMPLES, len(a)))
        draws = np.exp(a.loss[idx].sum(1) / a.count[idx].sum(1) - b.loss[idx].sum(1) / b.count[idx].sum(1))
        lo, hi = np.percentile(draws, [2.5, 97.5])
        pair = own[length]["controls"]["window"]
        assert pair["ratio"] == pytest.approx(own[length]["ppl"] / control[length]["ppl"], rel=1e-12)
        assert pair["ratio"] == pytest.approx(np.exp(a.loss.sum() / a.count.sum() - b.loss.sum() / b.count.sum()))
        assert (pair["lo"], pair["hi"]) == pytest.approx((lo, hi), rel=1e-12)
        assert pair["paired"] is True and pair["units"] == len(a)
    assert "controls" not in control[16]  # the control is not read against itself


def test_the_search_reads_its_pairs_with_the_same_helper():
    """search.paired_ratios is bootstrap.paired_ratio over every two settings."""
    from rope_lm.eval.search import paired_ratios

    rng = np.random.default_rng(3)
    loss = rng.uniform(20, 40, size=(2, 12))

    def units(i):
        keys = np.arange(12) * 8
        return bootstrap.Units("window", keys, loss[i], np.full(12, 8), loss[i] / 2, np.full(12, 4), keys + 8)

    u = {"a": units(0), "b": units(1)}
    rows = {k: {"ppl": float(np.exp(u[k].loss.sum() / u[k].count.sum()))} for k in u}
    got = paired_ratios(rows, u, 300, 5, 64)["b / a"]
    want = bootstrap.paired_ratio(u["b"], u["a"], rows["b"]["ppl"], rows["a"]["ppl"], 300, 5, 64)
    assert got == {k: want[k] for k in ("ratio", "lo", "hi")} and want["paired"]


def test_a_stop_during_the_control_keeps_the_methods_rows_and_the_same_command_finishes_it(
    stream, tmp_path, monkeypatch
):
    model = tiny("alibi")
    whole = evaluate(model, stream, tmp_path / "whole")
    # What a stop after the method, part-way through the control, leaves in results.json.
    earlier = copy.deepcopy(whole)
    earlier["status"] = "evaluating"
    earlier["results"] = [r for r in earlier["results"] if not (r["method"] == "window" and r["length"] > 8)]
    for r in earlier["results"]:
        if r["method"] == "none" and r["length"] > 8:
            del r["controls"]
    calls = []
    real = eval_run.evaluate_lengths

    def counted(model, *args, **kwargs):
        calls.append((model.scaling.label, kwargs.get("on_result") is not None or len(args) > 3))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(eval_run, "evaluate_lengths", counted)
    again = evaluate(model, stream, tmp_path / "again", results=earlier)
    # The control measured anew, the method's windows scored once more for their units (no rows of it written).
    assert calls == [("window", True), ("none", False)]
    assert again["status"] == "complete"
    assert [json.dumps(measured(r), sort_keys=True) for r in again["results"]] == [
        json.dumps(measured(r), sort_keys=True) for r in whole["results"]
    ]


@pytest.mark.parametrize("resamples", [RESAMPLES, 0])
def test_a_method_stopped_part_way_keeps_the_lengths_it_finished(stream, tmp_path, monkeypatch, resamples):
    """A stop after some lengths of a method (a long evaluation over sittings, e.g. Gemma 3 at 64k): the same
    command scores only the lengths it lacks, and the training length again only when a new length's paired
    interval needs its windows; the rows equal an evaluation that never stopped."""
    from rope_lm.eval import evaluation

    model = tiny("rope")
    eval_cfg = cfg(bootstrap=resamples)
    whole = evaluate(model, stream, tmp_path / "whole", controls=(), eval_cfg=eval_cfg)
    earlier = copy.deepcopy(whole)
    earlier["status"] = "evaluating"
    earlier["results"] = [r for r in earlier["results"] if r["length"] < 4 * L]  # L and 2L done, 4L not
    scored = []
    real = evaluation._score_length

    def counted(model, stream, L, *args, **kwargs):
        scored.append(L)
        return real(model, stream, L, *args, **kwargs)

    monkeypatch.setattr(evaluation, "_score_length", counted)
    again = evaluate(model, stream, tmp_path / "again", controls=(), results=earlier, eval_cfg=eval_cfg)
    assert scored == ([L, 4 * L] if resamples else [4 * L])  # L's windows again only for the new length's interval
    assert again["status"] == "complete" and [r["length"] for r in again["results"]] == [L, 2 * L, 4 * L]
    assert [measured(r) for r in again["results"]] == [measured(r) for r in whole["results"]]
    if resamples:
        assert again["results"][2]["ppl_rel_lo"] < again["results"][2]["ppl_rel"] < again["results"][2]["ppl_rel_hi"]


def test_a_method_stopped_part_way_with_a_control_pairs_every_length_it_kept(stream, tmp_path):
    """The lengths kept from the first sitting get their ratio to the control too (their windows scored
    again for it), as an evaluation that never stopped gives them: a stop after some lengths of the method,
    before any of the control's, was left with ratios only at the lengths scored in the second sitting."""
    model = tiny("rope")
    whole = evaluate(model, stream, tmp_path / "whole")
    earlier = copy.deepcopy(whole)
    earlier["status"] = "evaluating"
    earlier["results"] = [r for r in earlier["results"] if r["method"] == "none" and r["length"] < 4 * L]
    for r in earlier["results"]:
        r.pop("controls", None)  # the control had not run yet
    again = evaluate(model, stream, tmp_path / "again", results=earlier)
    assert again["status"] == "complete"
    assert {L: set(r.get("controls") or {}) for L, r in rows_of(again, "none").items()} == {
        L: {"window"} for L in (L, 2 * L, 4 * L)
    }
    assert [json.dumps(measured(r), sort_keys=True) for r in again["results"]] == [
        json.dumps(measured(r), sort_keys=True) for r in whole["results"]
    ]


def test_a_model_trained_under_a_method_records_why_the_control_does_not_apply(stream, tmp_path):
    model = tiny("rope", {"name": "pi", "factor": 2.0})
    results = evaluate(model, stream, tmp_path, methods=[{"name": "pi", "factor": 2.0}])
    control = results["controls"]["window"]
    assert control["applies"] is False and "trained under scaling=pi-x2" in control["reason"]
    assert {r["method"] for r in results["results"]} == {"pi-x2"} and results["status"] == "complete"
    md = open(tmp_path / "results.md").read()
    assert "Control `window` not evaluated: the model was trained under scaling=pi-x2" in md


def test_a_listed_window_at_L_is_the_control_and_another_window_sharing_its_label_is_refused(stream, tmp_path):
    model = tiny("alibi")
    results = evaluate(model, stream, tmp_path / "a", methods=[{"name": "none"}, {"name": "window"}])
    assert sorted({r["method"] for r in results["results"]}) == ["none", "window"]  # evaluated once
    assert rows_of(results, "none")[32]["controls"]["window"]["paired"]
    with pytest.raises(ConfigError, match=r"scaling lists window with window=4, which shares its label"):
        evaluate(model, stream, tmp_path / "b", methods=[{"name": "none"}, {"name": "window", "window": 4}])


@pytest.mark.parametrize(
    "controls, words",
    [
        ("window", "must be a list of control names"),
        (["windows"], "windows is not a control. The controls are: window"),
        (["window", "window"], "a control is listed twice"),
    ],
)
def test_bad_controls_are_one_paragraph_before_any_work(tiny_config, controls, words):
    tiny_config["eval"]["controls"] = controls
    with pytest.raises(ConfigError, match=words):
        resolve_run(tiny_config)


@pytest.mark.parametrize(
    "controls, window, words",
    [
        (["window"], 0, "eval.control_window=0 must be a positive whole number of tokens"),
        (["window"], "64", "eval.control_window='64' must be a positive whole number"),
        ([], 64, r"eval.control_window=64 sets the width of the window control, but eval.controls=\[\] does not"),
    ],
)
def test_a_bad_control_window_is_one_paragraph_before_any_work(tiny_config, controls, window, words):
    tiny_config["eval"].update(controls=controls, control_window=window)
    with pytest.raises(ConfigError, match=words):
        resolve_run(tiny_config)


def test_a_control_added_to_a_finished_run_is_evaluated_without_training_it_again(tiny_config, tmp_path):
    out = str(tmp_path / "run")

    def sitting(run):
        folder, start = claim_train(run, out)
        try:
            return describe(start), train_and_evaluate(run, out, claimed=(folder, start))
        finally:
            folder.release()  # as train.py's next job in the same process finds it

    _, first = sitting(resolve_run({**tiny_config, "existing": "continue"}))
    assert "controls" not in first and {r["method"] for r in first["results"]} == {"none"}
    ckpt = os.path.join(out, "checkpoints", "last.ckpt")
    stamp = os.path.getmtime(ckpt)

    given = copy.deepcopy(tiny_config)
    given["eval"]["controls"] = ["window"]
    run = resolve_run({**given, "existing": "continue"})
    how, second = sitting(run)  # run.yaml lacks eval.controls: the same run, not refused
    assert how == "evaluating its final checkpoint"
    assert os.path.getmtime(ckpt) == stamp  # not trained again
    assert rows_of(second, "none") == {
        k: {**v, "controls": rows_of(second, "none")[k]["controls"]} for k, v in rows_of(first, "none").items()
    }
    assert sorted(rows_of(second, "window")) == [16, 32, 64] and second["training"] == first["training"]
    assert all(r["controls"]["window"]["paired"] for r in rows_of(second, "none").values())
    assert "controls" in open(os.path.join(out, RUN_CONFIG)).read()
    assert sitting(run) == ("its results are complete; skipped", {"skipped": "its results are complete"})

    # A finished run whose checkpoints are gone (its light files kept) stays skipped, saying why.
    light = str(tmp_path / "light")
    os.makedirs(light)
    for name in ("results.json", RUN_CONFIG):
        with open(os.path.join(out, name)) as f:
            text = f.read()
        if name == "results.json":
            saved = json.loads(text)
            saved.pop("controls")
            saved["results"] = [r for r in saved["results"] if r["method"] == "none"]
            saved["methods"] = {"none": saved["methods"]["none"]}
            text = json.dumps(saved)
        with open(os.path.join(light, name), "w") as f:
            f.write(text)
    folder, start = claim_train(run, light)
    assert "its control(s) window cannot be added: its checkpoints are gone" in describe(start)


def test_eval_extrapolation_adds_a_control_to_a_finished_evaluation(tiny_corpus, tmp_path):
    """scripts/eval_extrapolation.py eval.controls=[window] existing=continue on a complete folder evaluates
    only the control (the method's rows kept as they were), then pairs them."""
    from tests.conftest import ROOT
    from tests.test_evaluation_continues_the_same_model import evaluate

    fixture = os.path.join(ROOT, "tests", "fixtures", "run_before_house")
    out = str(tmp_path / "eval")
    rc, text = evaluate(fixture, out, tiny_corpus)
    assert rc == 0, text
    first = json.load(open(os.path.join(out, "results.json")))
    rc, text = evaluate(fixture, out, tiny_corpus, "eval.controls=[window]", "existing=continue")
    assert rc == 0, text
    both = json.load(open(os.path.join(out, "results.json")))
    kept = [{k: v for k, v in r.items() if k != "controls"} for r in both["results"] if r["method"] == "none"]
    assert kept == first["results"] and both["status"] == "complete"
    assert sorted(rows_of(both, "window")) == [16, 32]
    assert all(r["controls"]["window"]["paired"] for r in rows_of(both, "none").values())
    assert "PPL over the window control's on the same windows" in open(os.path.join(out, "results.md")).read()


def test_an_evaluation_from_before_an_eval_option_existed_still_continues(tiny_corpus, tmp_path):
    """results.json of an evaluation begun before eval.control_window existed lacks the key; the same command
    today (the key at its default, None) continues it rather than calling it another evaluation."""
    from tests.conftest import ROOT
    from tests.test_evaluation_continues_the_same_model import evaluate

    fixture = os.path.join(ROOT, "tests", "fixtures", "run_before_house")
    out = str(tmp_path / "eval")
    rc, text = evaluate(fixture, out, tiny_corpus)
    assert rc == 0, text
    path = os.path.join(out, "results.json")
    saved = json.load(open(path))
    assert "control_window" in saved["config"]["eval"]
    del saved["config"]["eval"]["control_window"]
    saved["status"] = "evaluating"
    saved["results"] = saved["results"][:1]
    json.dump(saved, open(path, "w"))
    rc, text = evaluate(fixture, out, tiny_corpus, "existing=continue")
    assert rc == 0, text
    assert json.load(open(path))["status"] == "complete"
