"""A diverged model's perplexity (NaN or infinite) is a missing point: the run's
own plot and a comparison that holds it are written, never die on a log axis,
and the table shows the value as missing."""

import json
import math
import os

from rope_lm.compare.ppl import compare
from rope_lm.eval.report import log_binned, plot
from tests.test_compare import read_csv, write_run


def results_with(tmp_path, values):
    run = write_run(tmp_path / "run", "rope", {"none": lambda L: values[L]}, lengths=sorted(values))
    with open(os.path.join(run, "results.json")) as f:
        return json.load(f)


def test_a_runs_plot_with_nan_and_inf_perplexity_is_written(tmp_path):
    results = results_with(tmp_path, {64: 10.0, 128: float("nan"), 256: float("inf")})
    path = tmp_path / "ppl.png"
    plot(results, str(path))
    assert path.stat().st_size > 0


def test_a_runs_plot_with_no_finite_perplexity_at_all_is_written(tmp_path):
    results = results_with(tmp_path, {64: float("nan"), 128: float("nan")})
    for row in results["results"]:
        row["per_position"]["loss"] = [float("nan")] * len(row["per_position"]["loss"])
    path = tmp_path / "ppl.png"
    plot(results, str(path))
    assert path.stat().st_size > 0


def test_per_position_bins_skip_non_finite_losses():
    per_position = {"start": [0, 1, 2, 3], "width": 1, "loss": [1.0, float("nan"), 3.0, float("inf")]}
    centres, losses = log_binned(per_position, 4)
    assert all(math.isfinite(v) for v in losses)
    assert sorted(losses) == [1.0, 3.0]


def test_a_comparison_holding_a_diverged_run_is_written_with_the_value_missing(tmp_path):
    sweep = tmp_path / "sweep"
    write_run(sweep / "0_rope_none_L64", "rope", {"none": lambda L: {64: 10.0, 128: 20.0, 256: 80.0}[L]})
    write_run(
        sweep / "1_alibi_none_L64",
        "alibi",
        {"none": lambda L: {64: 12.0, 128: float("nan"), 256: float("inf")}[L]},
    )
    out = tmp_path / "cmp"
    compare([str(sweep)], str(out))
    for name in ("compare.md", "compare.csv", "ppl_vs_length.png", "per_position.png"):
        assert (out / name).stat().st_size > 0, name
    rows = {(r["scheme"], r["length"]): r for r in read_csv(out / "compare.csv")}
    assert float(rows[("rope", "128")]["ppl"]) == 20.0
    assert rows[("alibi", "128")]["ppl"] in ("", "nan")
    assert "nan" not in (out / "compare.md").read_text().lower().replace("nano", "")


def test_an_evaluation_that_overflows_is_never_complete(tiny_config, tmp_path, monkeypatch):
    """Finite weights, a NaN perplexity at one length: results.json says failed, names the row,
    keeps the others; the run stops with one paragraph (exit 1 from the command line)."""
    import pytest

    from rope_lm.core.errors import EvaluationNotFinite
    import rope_lm.runs.eval_run as E
    from rope_lm.runs.pipeline import train_and_evaluate

    real = E.evaluate_lengths

    def overflowing(model, stream, cfg, train_len, on_result, **kw):
        def poisoned(row):
            on_result({**row, "ppl": float("nan")} if row["length"] == max(cfg.resolve_lengths(train_len)) else row)

        return real(model, stream, cfg, train_len, poisoned, **kw)

    monkeypatch.setattr(E, "evaluate_lengths", overflowing)
    out = tmp_path / "run"
    with pytest.raises(EvaluationNotFinite, match=r"not a number for 1 of 3 .* none at 64 tokens \(nan\)"):
        train_and_evaluate(tiny_config, str(out))
    with open(out / "results.json") as f:
        results = json.load(f)
    assert results["status"] == "failed" and "not a number" in results["error"]
    assert [math.isfinite(r["ppl"]) for r in results["results"]] == [True, True, False]
    assert (out / "ppl_vs_length.png").stat().st_size > 0
