"""Searching a method's settings (rope_lm/eval/search.py, rope_lm/eval/longrope_search.py,
scripts/search.py): the spaces and the evolution on objectives with a known
optimum, then the script on a tiny checkpoint, whose config file
scripts/eval_extrapolation.py loads."""

import json
import math
import os

import numpy as np
import pytest
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.eval import search as S
from rope_lm.eval.longrope_search import Evolution, constrain, evolve, seeds
from rope_lm.positional import frequencies as F
from rope_lm.scaling import method_label
from tests.test_diagnostics import assert_one_paragraph, run_script, save_tiny_checkpoint


class Bowl:
    """A stand-in objective: a known optimum, the trial count, and a refusal region."""

    def __init__(self, best: dict, train_len=16, target=128):
        self.best, self.train_len, self.target, self.calls = best, train_len, target, []

    @property
    def ratio(self):
        return self.target / self.train_len

    def __call__(self, options):
        self.calls.append(options)
        if options.get("window") == 1:
            raise ConfigError("refused")
        return 10 + sum(math.log(options[k] / v) ** 2 for k, v in self.best.items())


@pytest.mark.parametrize("method", ["yarn", "self_extend", "ntk"])
def test_optuna_starts_from_the_defaults_and_improves_on_them(method):
    obj = Bowl(
        {
            "yarn": {"factor": 3.0, "beta_fast": 10.0, "beta_slow": 2.0, "attention_factor": 1.1},
            "self_extend": {"window": 5, "group": 7},
            "ntk": {"factor": 20.0},
        }[method]
    )
    history = S.optuna_search(method, obj, trials=25, seed=0)
    assert len(history) == 25 == len(obj.calls)
    first = history[0]
    assert first["origin"] == "defaults" and first["params"] == pytest.approx(S.SEARCHES[method].defaults(obj))
    best = S.best_of(history)
    assert best["ppl"] < first["ppl"] and all(o["name"] == method for o in obj.calls)
    assert best["ppl"] == min(r["ppl"] for r in history if r["ppl"] is not None)


def test_self_extend_defaults_are_the_methods_auto_settings():
    from rope_lm.positional.base import PosContext
    from rope_lm.scaling import build_scaling

    obj = Bowl({}, train_len=32, target=256)
    d = S.self_extend_defaults(obj)
    method = build_scaling({"name": "self_extend"})
    ctx = PosContext(seq_len=256, train_len=32, scaling=method)
    assert d == {"window": 16, "group": method.group_size(256, 16, ctx)}


def test_unknown_methods_are_refused():
    with pytest.raises(ConfigError, match="method='alibi' cannot be searched; searchable methods are yarn"):
        S.check_method("alibi")


def test_longrope_seeds_are_pi_ntk_and_yarn():
    rot, base, L, T = 16, 10000.0, 32, 256
    start = seeds(rot, base, L, T)
    assert np.allclose(start["pi"], 8.0)
    # NTK-aware: base * s^(d/(d-2)) divides pair i's frequency by s^(2i/(d-2)).
    assert np.allclose(start["ntk"], 8.0 ** (2 * np.arange(rot // 2) / (rot - 2)), rtol=1e-5)
    theta = F.plain_inv_freq(rot, base).numpy()
    assert np.allclose(theta / start["yarn"], F.yarn(rot, base, L, T)[0].double().numpy())
    assert start["yarn"][0] == pytest.approx(1.0) and start["yarn"][-1] == pytest.approx(8.0)


def test_the_constraint_makes_factors_monotone_and_bounded():
    lam = constrain(np.array([0.5, 3.0, 2.0, 20.0, 4.0]), s=4.0, max_scale=1.25)
    assert lam.tolist() == [1.0, 3.0, 3.0, 5.0, 5.0]


def test_the_evolution_finds_a_known_optimum_within_the_constraints():
    rot, L, T = 16, 32, 256
    goal = 1 + 7 * np.linspace(0, 1, rot // 2) ** 1.5  # monotone, within [1, s = 8]

    def distance(factors):
        return 1.0 + float(np.sum((np.log(factors) - np.log(goal)) ** 2))

    settings = Evolution(population=12, generations=8, parents=4)
    history = evolve(distance, rot, 10000.0, L, T, settings, seed=0)
    for r in history:
        f = np.array(r["factors"])
        assert (np.diff(f) >= 0).all() and f.min() >= 1.0 and f.max() <= 1.25 * 8 + 1e-9
    start = min(r["ppl"] for r in history if r["generation"] == 0)
    last = min(r["ppl"] for r in history)
    assert last - 1.0 < 0.5 * (start - 1.0)  # more than halfway to the optimum (1.0) from the best seed
    assert {r["origin"].split(" ")[0] for r in history[12:]} <= {"crossover", "mutation"}
    assert len({tuple(r["factors"]) for r in history}) == len(history)  # each candidate evaluated once
    assert history == evolve(distance, rot, 10000.0, L, T, settings, seed=0)  # seeded


@pytest.mark.parametrize(
    "key,value,pattern",
    [("parents", 20, "must not exceed"), ("mutation", 1.5, "probability"), ("population", 0, "positive integer")],
)
def test_bad_evolution_settings_are_refused(key, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        Evolution(**{key: value}).validate()


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_cache, tiny_data_options, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    save_tiny_checkpoint(str(run / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options)
    return str(run)


def test_the_report_says_why_one_test_window_has_no_interval():
    from scripts.search import _table

    row = {"ppl": 27.5, "ppl_lo": None, "ppl_hi": None, "tokens": 16384}
    md = _table(
        {
            "method": "longrope",
            "target": 16384,
            "train_len": 8192,
            "checkpoint": "hf:x",
            "trials": 3,
            "validation": {"tokens": 16384, "best_ppl": 29.3},
            "test": {"none": row, "longrope searched": row},
        }
    )
    assert "no interval: 16384 test tokens make 1 window" in md and "27.50 |" in md


SMALL = ["multiplier=4", "val_tokens=256", "test_tokens=256", "bootstrap=50", "batch_tokens=512"]


def test_a_yarn_search_writes_a_config_that_eval_extrapolation_loads(tiny_ckpt, tmp_path):
    out = tmp_path / "search"
    run_script("search.py", f"ckpt={tiny_ckpt}", "method=yarn", "trials=3", *SMALL, f"out={out}")
    summary = json.load(open(out / "search.json"))
    trials = json.load(open(out / "trials.json"))
    assert summary["target"] == 64 and len(trials) == 3 and trials[0]["origin"] == "defaults"
    assert summary["validation"]["best_ppl"] == min(t["ppl"] for t in trials)
    best = yaml.safe_load(open(out / "best.yaml"))
    assert best["name"] == "yarn" and best["beta_fast"] == min(trials, key=lambda t: t["ppl"])["options"]["beta_fast"]
    assert set(summary["test"]) == {"none", "window (L)", "yarn defaults", "yarn searched"}
    for row in summary["test"].values():
        assert row["ppl_lo"] <= row["ppl"] <= row["ppl_hi"]
    assert (out / "trials.png").stat().st_size > 0 and "yarn searched" in open(out / "search.md").read()
    assert "95% bootstrap interval over windows" in open(out / "search.md").read()
    test = summary["test"]
    pairs = [("yarn defaults", "none"), ("yarn searched", "none"), ("yarn searched", "yarn defaults")]
    for a, b in pairs + [("yarn searched", "window (L)"), ("window (L)", "none")]:
        r = summary["paired"][f"{a} / {b}"]
        assert r["ratio"] == pytest.approx(test[a]["ppl"] / test[b]["ppl"]) and r["lo"] <= r["ratio"] <= r["hi"]
    assert "yarn searched / yarn defaults" in open(out / "search.md").read()
    # The trials scored the validation split: the winner's validation PPL is measured again there.
    from rope_lm.runs.trained import checkpoint_token_cache, open_model

    t = open_model(tiny_ckpt, "cpu", best)
    cache, _ = checkpoint_token_cache(t.lit, {}, str(tmp_path / "tok"))
    obj = S.objective(t.model, cache.tokens("valid"), 64, 256, 512)
    assert obj(best) == pytest.approx(summary["validation"]["best_ppl"], rel=1e-6)
    assert obj.eval_cfg.split == "valid"
    run_script(
        "eval_extrapolation.py",
        f"ckpt={tiny_ckpt}",
        f"scaling=none,{out / 'best.yaml'}",
        "eval.multipliers=[1,4]",
        "eval.token_budget=256",
        f"out={tmp_path / 'eval'}",
    )
    results = json.load(open(tmp_path / "eval" / "results.json"))
    # results name the method by its label: a searched fixed factor is part of it (yarn-x1.7)
    assert results["methods"][method_label(best)]["options"]["beta_fast"] == best["beta_fast"]


def test_a_longrope_search_keeps_its_factors_monotone(tiny_ckpt, tmp_path):
    out = tmp_path / "search"
    run_script(
        "search.py",
        f"ckpt={tiny_ckpt}",
        "method=longrope",
        "longrope.population=4",
        "longrope.generations=1",
        "longrope.parents=2",
        *SMALL,
        f"out={out}",
    )
    best = yaml.safe_load(open(out / "best.yaml"))
    trials = json.load(open(out / "trials.json"))
    assert [t["origin"] for t in trials[:3]] == ["pi", "ntk", "yarn"] and len(trials) <= 8
    assert best["name"] == "longrope" and best["factor"] == 4.0 and len(best["long_factor"]) == 8
    assert (np.diff(best["long_factor"]) >= 0).all()
    assert set(json.load(open(out / "search.json"))["test"]) == {
        "none",
        "window (L)",
        "yarn defaults",
        "longrope searched",
    }


def test_the_window_row_is_the_model_cut_to_L_and_a_search_from_before_it_gets_it_without_new_trials(
    tiny_ckpt, tmp_path
):
    out = tmp_path / "search"
    run_script("search.py", f"ckpt={tiny_ckpt}", "method=yarn", "trials=2", *SMALL, f"out={out}")
    summary = json.load(open(out / "search.json"))
    # The window row is scaling=window at the model's training length, scored on the same test windows.
    from rope_lm.eval.evaluation import evaluate_lengths
    from rope_lm.eval.search import final_config, objective
    from rope_lm.runs.trained import checkpoint_token_cache, open_model

    t = open_model(tiny_ckpt, "cpu", {"name": "window", "window": 16})
    cache, _ = checkpoint_token_cache(t.lit, {}, str(tmp_path / "tok"))
    cfg = final_config(objective(t.model, cache.tokens("valid"), 64, 256, 512).eval_cfg, 256, 50, 0)
    want = evaluate_lengths(t.model, cache.tokens("test"), cfg, 16)[0]
    assert summary["test"]["window (L)"]["ppl"] == pytest.approx(want["ppl"], rel=1e-6)
    assert summary["test"]["window (L)"]["ppl"] != pytest.approx(summary["test"]["none"]["ppl"], rel=1e-6)

    # A complete search.json from before the window row: continuing adds it and runs no trial again.
    older = json.loads(json.dumps(summary))
    del older["test"]["window (L)"]
    older["paired"] = {k: v for k, v in older["paired"].items() if "window" not in k}
    json.dump(older, open(out / "search.json", "w"))
    trials = open(out / "trials.json").read()
    done = run_script(
        "search.py", f"ckpt={tiny_ckpt}", "method=yarn", "trials=2", *SMALL, f"out={out}", "existing=continue"
    )
    said = done.stdout + done.stderr
    again = json.load(open(out / "search.json"))
    assert open(out / "trials.json").read() == trials and "predates its window-L test row" in said
    assert again["test"] == summary["test"] and again["paired"] == summary["paired"]
    done = run_script(
        "search.py", f"ckpt={tiny_ckpt}", "method=yarn", "trials=2", *SMALL, f"out={out}", "existing=continue"
    )
    assert "holds a complete search" in done.stdout + done.stderr


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["method=alibi"], "method='alibi' cannot be searched"),
        (["method=yarn", "target=16"], "The target length 16 must exceed the model's training length 16"),
        (["method=yarn", "longrope.parents=20"], "longrope.parents=20 must not exceed longrope.population=16"),
        (["method=yarn", "conf_name=yarn"], "conf/scaling/yarn.yaml exists already and is never overwritten"),
    ],
)
def test_bad_searches_are_refused_in_one_paragraph(tiny_ckpt, tmp_path, args, pattern):
    done = run_script("search.py", f"ckpt={tiny_ckpt}", *args, f"out={tmp_path / 'out'}", status=2)
    assert_one_paragraph(done, pattern)
    assert not (tmp_path / "out").exists()


def test_a_scheme_without_rope_is_refused(tiny_cache, tiny_data_options, tmp_path):
    ckpt = save_tiny_checkpoint(
        str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options, pos={"name": "alibi"}
    )
    done = run_script("search.py", f"ckpt={ckpt}", "method=ntk", f"out={tmp_path / 'out'}", status=2)
    assert_one_paragraph(done, "does not apply to positional scheme 'alibi'")


def test_the_script_has_help(tmp_path):
    done = run_script("search.py", "--help", cwd=tmp_path)
    assert "python scripts/search.py" in done.stdout and "== Settings (defaults) ==" in done.stdout
    assert os.listdir(tmp_path) == []


def test_a_search_whose_final_files_cannot_all_be_written_leaves_the_folder_as_a_stopped_search(
    tiny_ckpt, tmp_path, monkeypatch
):
    """best.yaml, trials.png, search.json and search.md are one set: a disk that fills at the plot keeps no
    best.yaml beside a search.json still saying "searching", and existing=continue then finishes the set."""
    import errno

    from rope_lm.core.errors import OutputError, write_failure
    from rope_lm.probes import search_run

    out = tmp_path / "search"
    s = search_run.SearchSettings(
        ckpt=str(tiny_ckpt), trials=2, multiplier=4, val_tokens=256, test_tokens=256, bootstrap=20,
        batch_tokens=512, device="cpu", out=str(out),
    )  # fmt: skip

    def options(name):
        with open(os.path.join(os.path.dirname(__file__), "..", "conf", "scaling", f"{name}.yaml")) as f:
            return yaml.safe_load(f)

    def full(history, path, *args):
        raise write_failure(path, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(search_run, "_plot", full)
    with pytest.raises(OutputError, match="trials.png"):
        search_run.search_checkpoint(s, options, str(tmp_path / "conf"))
    assert not (out / "best.yaml").exists() and not (out / "search.md").exists()
    assert json.load(open(out / "search.json"))["status"] == search_run.SEARCHING
    monkeypatch.undo()
    s.existing = "continue"
    summary = search_run.search_checkpoint(s, options, str(tmp_path / "conf"))
    assert summary["status"] == search_run.COMPLETE and summary["trials"] == 2
    assert (out / "best.yaml").exists() and (out / "trials.png").exists() and (out / "search.md").exists()
