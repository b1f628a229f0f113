"""End to end: config dict -> cache -> training -> results files."""

import json
import logging
import os

from rope_lm.runs.pipeline import train_and_evaluate


def test_tiny_train_and_eval_writes_results(tiny_config, tmp_path, caplog):
    out = str(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="rope_lm"):
        results = train_and_evaluate(tiny_config, out)
    for name in ("results.json", "results.md", "ppl_vs_length.png", "checkpoints/last.ckpt", "checkpoints/best.ckpt"):
        assert os.path.exists(os.path.join(out, name)), name
    saved = json.load(open(os.path.join(out, "results.json")))
    assert [r["length"] for r in saved["results"]] == [16, 32, 64]
    assert len({r["tokens"] for r in saved["results"]}) == 1  # same token budget at every length
    assert saved["corpus"]["fingerprint"] and saved["config"]["pos"]["name"] == "rope"
    assert saved["training"]["steps"] == 6
    assert results["results"][1]["loss_beyond"] is not None and results["results"][0]["loss_beyond"] is None
    assert "| none |" in open(os.path.join(out, "results.md")).read()
    # each validation puts a progress line in the log (train.log under train.py), the last with nothing left
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [p.split(":")[0] for p in progress] == ["step 3/6", "step 6/6"]
    assert "val/loss" in progress[0] and "tokens/s" in progress[0] and "left" in progress[0]
    assert "left" not in progress[1]


def test_fractional_multipliers_as_the_pe_extrapolation_preset_uses(tiny_config, tmp_path):
    tiny_config["eval"]["multipliers"] = [1, 1.25, 1.5, 2, 4]
    out = str(tmp_path / "run")
    train_and_evaluate(tiny_config, out)
    saved = json.load(open(os.path.join(out, "results.json")))
    assert [r["length"] for r in saved["results"]] == [16, 20, 24, 32, 64]
    assert {r["tokens"] for r in saved["results"]} == {256} and saved["status"] == "complete"


def test_a_crash_during_evaluation_is_not_reported_as_complete(tiny_config, tmp_path, monkeypatch):
    import pytest

    import rope_lm.eval.evaluation as evaluation

    real = evaluation.token_losses

    def fails_at_the_second_length(model, windows, *args):
        if windows.shape[1] > 16:  # every protocol scores its windows through token_losses
            raise RuntimeError("simulated failure")
        return real(model, windows, *args)

    monkeypatch.setattr(evaluation, "token_losses", fails_at_the_second_length)
    out = str(tmp_path / "run")
    with pytest.raises(RuntimeError, match="simulated"):
        train_and_evaluate(tiny_config, out)
    saved = json.load(open(os.path.join(out, "results.json")))
    assert [r["length"] for r in saved["results"]] == [16] and saved["status"] == "evaluating"
