"""The evaluation takes the plain method's row where a method changes nothing (TransformerLM.plain_at: YaRN
or PI with factor auto at or below L), instead of scoring the same numbers again; the rows of every method
equal an evaluation of that method alone, its relative PPL's paired interval included."""

import copy
import json

import pytest

from rope_lm.eval import evaluation
from tests.test_window_controls import L, cfg, evaluate, measured, rows_of, stream, tiny  # noqa: F401 (a fixture)


@pytest.fixture
def scored(monkeypatch):
    """(method label, length) of every length scored."""
    calls = []
    real = evaluation._score_length

    def counted(model, stream, length, *args, **kwargs):
        calls.append((model.scaling.label, length))
        return real(model, stream, length, *args, **kwargs)

    monkeypatch.setattr(evaluation, "_score_length", counted)
    return calls


def same(a: dict, b: dict) -> bool:
    drop = ("method", "same_as")
    return json.dumps({k: v for k, v in measured(a).items() if k not in drop}, sort_keys=True) == json.dumps(
        {k: v for k, v in measured(b).items() if k not in drop}, sort_keys=True
    )


def test_a_method_that_is_plain_at_L_takes_nones_row_there_and_scores_the_rest(stream, tmp_path, scored):
    model = tiny("rope")
    both = evaluate(model, stream, tmp_path / "both", controls=(), methods=[None, {"name": "yarn"}])
    assert scored == [("none", L), ("none", 2 * L), ("none", 4 * L), ("yarn", 2 * L), ("yarn", 4 * L)]
    yarn, none = rows_of(both, "yarn"), rows_of(both, "none")
    assert yarn[L]["same_as"] == "none" and same(yarn[L], none[L]) and "seconds" not in yarn[L]
    assert all("same_as" not in r for r in (yarn[2 * L], yarn[4 * L]))
    alone = evaluate(tiny("rope"), stream, tmp_path / "alone", controls=(), methods=[{"name": "yarn"}])
    for length, row in rows_of(alone, "yarn").items():
        assert same(yarn[length], row), length  # the 2L and 4L intervals paired with none's windows at L
    md = (tmp_path / "both" / "results.md").read_text()
    assert "| yarn | not scored (same as none) |" in md


def test_log_n_is_never_plain_and_a_fixed_factor_neither(stream, tmp_path, scored):
    model = tiny("rope")
    methods = [None, {"name": "yarn", "logn": True}, {"name": "yarn", "factor": 2.0}]
    results = evaluate(model, stream, tmp_path, controls=(), methods=methods)
    assert sorted(length for label, length in scored if label != "none") == [L, L, 2 * L, 2 * L, 4 * L, 4 * L]
    assert not any("same_as" in r for r in results["results"])


def test_a_later_sitting_scores_L_once_for_every_method_plain_there(stream, tmp_path, scored):
    """none kept from an earlier sitting (its windows not held): the first method plain at L scores L again
    for its relative PPL's paired interval, and the next one takes those windows too."""
    model = tiny("rope")
    first = evaluate(model, stream, tmp_path / "first", controls=(), methods=[None], eval_cfg=cfg())
    earlier = copy.deepcopy(first)
    del scored[:]
    later = evaluate(
        model,
        stream,
        tmp_path / "later",
        controls=(),
        methods=[None, {"name": "yarn"}, {"name": "pi"}],
        results=earlier,
    )
    assert scored == [("yarn", L), ("yarn", 2 * L), ("yarn", 4 * L), ("pi", 2 * L), ("pi", 4 * L)]
    assert rows_of(later, "pi")[L]["same_as"] == "none" and "same_as" not in rows_of(later, "yarn")[L]
    alone = evaluate(tiny("rope"), stream, tmp_path / "alone", controls=(), methods=[{"name": "pi"}])
    for length, row in rows_of(alone, "pi").items():
        assert same(rows_of(later, "pi")[length], row), length


def test_a_later_sitting_in_the_same_folder_pairs_with_the_windows_the_first_one_kept(stream, tmp_path, scored):
    """eval_units.npz beside results.json keeps every scored row's windows: a method stopped after L and 2L,
    continued in its folder, scores 4L alone (its relative PPL pairs with L's kept windows), and its ratios
    to the window control come without scoring anything again; the rows equal an evaluation that never
    stopped. A folder whose units file is gone scores L again, as before."""
    from rope_lm.eval.units_file import UNITS_NPZ, load_units

    model = tiny("rope")
    out = tmp_path / "run"
    whole = evaluate(model, stream, out, methods=[None])
    held = load_units(str(out / UNITS_NPZ))
    assert sorted(held) == ["none", "window"] and sorted(held["none"]) == [L, 2 * L, 4 * L]
    earlier = copy.deepcopy(whole)
    earlier["status"] = "evaluating"
    earlier["results"] = [r for r in earlier["results"] if r["method"] == "none" and r["length"] < 4 * L]
    del scored[:]
    again = evaluate(model, stream, out, methods=[None], results=copy.deepcopy(earlier))
    # (the window control at L is none's row: cut to L, a model of L reads what it reads whole)
    assert scored == [("none", 4 * L), ("window", 2 * L), ("window", 4 * L)]
    pairs = list(zip(again["results"], whole["results"]))
    assert len(pairs) == 6 and all(a["method"] == b["method"] and same(a, b) for a, b in pairs)
    (out / UNITS_NPZ).unlink()
    del scored[:]
    evaluate(model, stream, out, methods=[None], results=copy.deepcopy(earlier))
    assert scored[:2] == [("none", L), ("none", 4 * L)]


def test_a_control_narrower_than_L_takes_nones_row_below_its_width_with_its_own_relative_ppl(stream, tmp_path):
    """The bound's control: a model of L cut to L / 2 computes at L / 2 what it computes whole, so that row is
    none's, but its PPL relative to L is over the control's own PPL at L, not none's (none's ratio copied
    across read 1.12 where the control's is 1.09 for the bound of seed 0), with the paired interval of the
    control alone."""
    half = cfg(multipliers=[0.5, 1, 2])
    both = evaluate(tiny("rope"), stream, tmp_path / "both", methods=[None], eval_cfg=half, window=L // 2)
    window, none = rows_of(both, "window"), rows_of(both, "none")
    assert window[L // 2]["same_as"] == "none" and window[L]["ppl"] != none[L]["ppl"]
    assert window[L // 2]["ppl_rel"] == pytest.approx(window[L // 2]["ppl"] / window[L]["ppl"])
    assert window[L // 2]["ppl_rel_lo"] <= window[L // 2]["ppl_rel"] <= window[L // 2]["ppl_rel_hi"]
    alone = evaluate(
        tiny("rope"),
        stream,
        tmp_path / "alone",
        controls=(),
        methods=[{"name": "window", "window": L // 2}],
        eval_cfg=half,
    )
    for length, row in rows_of(alone, "window").items():
        assert same(window[length], row), length
