"""scripts/compare.py and rope_lm.compare.ppl on synthetic results files; wandb
grouping/tags and the offline summary run."""

import csv
import json
import math
import os
import sys

import pytest

from rope_lm.compare.ppl import compare
from rope_lm.compare.ppl_runs import find_results, tokenizer_id
from rope_lm.compare.ppl_wandb import log_to_wandb
from rope_lm.compare.results_page import render
from rope_lm.core.errors import ConfigError
from rope_lm.train.loggers import run_tags, sweep_group
from tests import forked
from tests.conftest import ROOT


def per_position(L, base_loss):
    width = max(1, L // 4)
    return {
        "width": width,
        "start": list(range(0, L, width)),
        "loss": [base_loss + 0.1 * i for i in range(len(range(0, L, width)))],
    }


def write_run(
    directory,
    scheme="rope",
    methods=None,
    train_len=64,
    fingerprint="abc123",
    vocab=4096,
    lengths=None,
    split="test",
    tokens=1024,
    status="complete",
    group=None,
    seed=None,
    ci=None,
    protocol=None,
    config=None,
):
    """A results.json as pipeline.evaluate_and_report writes it; methods maps
    a label to a function length -> ppl."""
    methods = methods if methods is not None else {"none": lambda L: 10.0 * L / train_len}
    lengths = lengths or [train_len, 2 * train_len, 4 * train_len]
    rows = []
    for m, f in methods.items():
        for L in lengths:
            ppl = f(L)
            if ppl is None:
                continue
            rows.append(
                {
                    "method": m,
                    "length": L,
                    "ratio": L / train_len,
                    "tokens": tokens,
                    "windows": tokens // L,
                    "loss": math.log(ppl),
                    "ppl": ppl,
                    "loss_within": math.log(ppl),
                    "ppl_within": ppl,
                    "loss_beyond": math.log(ppl) if L > train_len else None,
                    "ppl_beyond": ppl * 1.5 if L > train_len else None,
                    "per_position": per_position(L, math.log(ppl)),
                }
            )
            if ci:  # half-width of a 95% interval around the ppl
                rows[-1].update(ppl_lo=ppl - ci(L), ppl_hi=ppl + ci(L))
    results = {
        "scheme": scheme,
        "train_len": train_len,
        "status": status,
        "corpus": {"source": "stdlib", "fingerprint": fingerprint},
        "config": {
            "data": {"vocab_size": vocab, "tokenizer_train_chars": 4_000_000},
            "logger": {"name": "wandb", "group": group, "project": "rope-lm-test"},
            **({"seed": seed} if seed is not None else {}),
            **(config or {}),
        },
        "eval": {"split": split, "lengths": lengths, **({"protocol": protocol} if protocol else {})},
        "methods": {m: {} for m in methods},
        "results": rows,
    }
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "results.json"), "w") as f:
        json.dump(results, f)
    return str(directory)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_sweep_dir_table_csv_and_plots(tmp_path):
    sweep = tmp_path / "sweep"
    write_run(sweep / "0_rope_none_L64", "rope", {"none": lambda L: {64: 10.0, 128: 20.0, 256: 80.0}[L]})
    write_run(sweep / "1_alibi_none_L64", "alibi", {"none": lambda L: {64: 12.0, 128: 12.6, 256: 13.2}[L]})
    (sweep / "1_alibi_none_L64" / "checkpoints").mkdir()
    out = tmp_path / "cmp"
    summary = compare([str(sweep)], str(out))
    for name in ("compare.md", "compare.csv", "ppl_vs_length.png", "per_position.png"):
        assert (out / name).stat().st_size > 0, name
    rows = {(r["label"], int(r["length"])): r for r in read_csv(out / "compare.csv")}
    assert len(rows) == 6
    assert float(rows[("rope", 256)]["ppl"]) == 80.0
    assert float(rows[("rope", 256)]["ppl_rel"]) == pytest.approx(8.0)  # 80 / ppl@64 of the same run
    assert float(rows[("alibi", 128)]["ppl_rel"]) == pytest.approx(1.05)
    assert float(rows[("alibi", 128)]["ratio"]) == 2.0
    md = (out / "compare.md").read_text()
    assert "| rope | 10.00 | 20.00 | 80.00 |" in md
    assert "| rope | 1.00 | 2.00 | 8.00 |" in md  # relative table
    assert "256 (4×)" in md
    assert len(summary["groups"]) == 1


def test_methods_of_one_run_are_series_and_reference_falls_back(tmp_path):
    # yarn was not evaluated at L_train: its relative PPL uses the run's direct (none) series
    run = write_run(
        tmp_path / "eval", "rope", {"none": lambda L: 10.0 * L / 64, "yarn": lambda L: None if L == 64 else 11.0}
    )
    summary = compare([run], str(tmp_path / "out"))
    rows = {(r["label"], int(r["length"])): r for r in summary["rows"]}
    assert set(label for label, _ in rows) == {"rope", "rope + yarn"}
    assert rows[("rope + yarn", 128)]["ppl_rel"] == pytest.approx(1.1)


def test_duplicate_labels_get_their_run_directory(tmp_path):
    write_run(tmp_path / "s" / "seed1", "rope")
    write_run(tmp_path / "s" / "seed2", "rope")
    labels = {s.label for g in compare([str(tmp_path / "s")], str(tmp_path / "o"))["groups"] for s in g.series}
    assert labels == {"rope (seed1)", "rope (seed2)"}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"fingerprint": "other"}, "corpus"),
        ({"split": "valid"}, "corpus"),
        ({"vocab": 8192}, "tokenizer"),
        ({"train_len": 128}, "training length"),
    ],
)
def test_mixed_runs_are_refused(tmp_path, change, words):
    write_run(tmp_path / "s" / "a", "rope")
    write_run(tmp_path / "s" / "b", "alibi", **change)
    with pytest.raises(ConfigError, match=f"differ in {words}.*group=true"):
        compare([str(tmp_path / "s")], str(tmp_path / "o"))
    assert not (tmp_path / "o" / "compare.csv").exists()


def test_group_writes_one_table_and_plot_per_setting(tmp_path):
    write_run(tmp_path / "s" / "a", "rope", train_len=64)
    write_run(tmp_path / "s" / "b", "alibi", train_len=64)
    write_run(tmp_path / "s" / "c", "rope", train_len=128, lengths=[128, 256])
    out = tmp_path / "o"
    summary = compare([str(tmp_path / "s")], str(out), group=True)
    assert len(summary["groups"]) == 2
    by_len = {g.key.train_len: g for g in summary["groups"]}
    assert {s.scheme for s in by_len[64].series} == {"rope", "alibi"}
    assert [s.scheme for s in by_len[128].series] == ["rope"]
    pngs = sorted(p for p in os.listdir(out) if p.endswith(".png"))
    assert len(pngs) == 4 and all("_L64_" in p or "_L128_" in p for p in pngs)
    rows = read_csv(out / "compare.csv")
    assert {r["group"] for r in rows if r["train_len"] == "128"} == {by_len[128].key.slug()}
    assert {r["group"] for r in rows if r["train_len"] == "64"} == {by_len[64].key.slug()}
    md = (out / "compare.md").read_text()
    assert "## Group 1:" in md and "## Group 2:" in md and "trained at L=128" in md


def test_unusable_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        find_results([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="No results.json"):
        find_results([str(tmp_path / "empty")])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        compare([str(tmp_path / "bad")], str(tmp_path / "o"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ConfigError, match="not a rope-lm results file"):
        compare([str(tmp_path / "other")], str(tmp_path / "o"))
    write_run(tmp_path / "interrupted", methods={}, status="interrupted")
    with pytest.raises(ConfigError, match="holds an evaluated length"):
        compare([str(tmp_path / "interrupted")], str(tmp_path / "o"))


def test_interrupted_runs_are_listed_as_skipped(tmp_path):
    write_run(tmp_path / "s" / "done", "rope")
    write_run(tmp_path / "s" / "killed", "alibi", methods={}, status="interrupted")
    summary = compare([str(tmp_path / "s")], str(tmp_path / "o"))
    assert [s.scheme for g in summary["groups"] for s in g.series] == ["rope"]
    text = (tmp_path / "o" / "compare.md").read_text()
    assert "INTERRUPTED: `" in text and "killed`: stopped at step" in text and "resume=" in text


def test_script_refuses_mixed_runs_in_one_paragraph(tmp_path):
    write_run(tmp_path / "s" / "a", "rope")
    write_run(tmp_path / "s" / "b", "rope", train_len=128)
    proc = forked.run(
        [sys.executable, os.path.join(ROOT, "scripts", "compare.py"), f"path={tmp_path / 's'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "configuration error" in proc.stderr and "group=true" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().split("\n\n")) == 1  # one paragraph


def test_script_help_and_two_paths(tmp_path):
    script = os.path.join(ROOT, "scripts", "compare.py")
    done = forked.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "paths=[" in done.stdout and "group: false" in done.stdout
    write_run(tmp_path / "a", "rope")
    write_run(tmp_path / "b", "alibi")
    done = forked.run(
        [sys.executable, script, f"paths=[{tmp_path / 'a'},{tmp_path / 'b'}]", f"out={tmp_path / 'o'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o" / "compare.csv").exists() and sorted(os.listdir(tmp_path)) == ["a", "b", "o"]


def test_logger_tags_and_sweep_group(tmp_path):
    config = {"pos": {"name": "alibi"}, "scaling": {"name": "none"}, "data": {"name": "stdlib", "seq_len": 64}}
    assert run_tags(config, ["mine"]) == ["scheme:alibi", "method:none", "train_len:64", "data:stdlib", "mine"]
    config["scaling"] = {"name": "pi", "logn": True}
    assert "method:pi+logn" in run_tags(config)
    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    (sweep / "0_rope").mkdir(parents=True)
    assert sweep_group(str(sweep / "0_rope")) is None  # no multirun.yaml: a single run
    (sweep / "multirun.yaml").write_text("{}\n")
    os.chdir(tmp_path)
    assert sweep_group(str(sweep / "0_rope")) == "2026-01-01/12-00-00"
    assert sweep_group("anything", sweep_dir=str(tmp_path / "study")) == "study"


def test_wandb_offline_summary_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    write_run(tmp_path / "s" / "a", "rope", group="pe_extrapolation-stdlib-L64")
    write_run(tmp_path / "s" / "b", "alibi", group="pe_extrapolation-stdlib-L64")
    summary = compare([str(tmp_path / "s")], str(tmp_path / "o"))
    assert summary["study"] == "pe_extrapolation-stdlib-L64"  # the runs' own wandb group
    offline = log_to_wandb(summary)
    assert offline and os.path.abspath(offline).startswith(os.path.abspath(tmp_path / "o"))
    assert any(f.endswith(".wandb") and os.path.getsize(os.path.join(offline, f)) > 0 for f in os.listdir(offline))


def test_wandb_logger_group_and_tags_offline(tmp_path, monkeypatch):
    from rope_lm.train.loggers import build_logger, finish

    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = tmp_path / "multirun" / "study"
    (sweep / "0_alibi").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    config = {"pos": {"name": "alibi"}, "scaling": {"name": "none"}, "data": {"name": "stdlib", "seq_len": 64}}
    logger = build_logger(
        {"name": "wandb", "mode": "auto", "project": "rope-lm-test", "group": None, "tags": []},
        str(sweep / "0_alibi"),
        "0_alibi",
        config=config,
    )
    try:
        run = logger.experiment
        assert run.group == sweep_group(str(sweep / "0_alibi")) and run.group.endswith("study")
        assert {"scheme:alibi", "method:none", "train_len:64"} <= set(run.tags)
    finally:
        finish(logger)


def test_run_logs_extrapolation_tables_and_summary_offline(tmp_path, monkeypatch):
    import wandb

    from rope_lm.eval.report import log_to_wandb as log_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    # yarn stopped after one length: its chart series is shorter, not padded with None
    write_run(tmp_path / "r", "rope", {"none": lambda L: 10.0 * L / 64, "yarn": lambda L: 12.0 if L == 64 else None})
    results = json.load(open(tmp_path / "r" / "results.json"))
    run = wandb.init(project="rope-lm-test", dir=str(tmp_path), mode="offline", reinit="finish_previous")
    try:
        log_run(run, results, str(tmp_path / "r"))
        assert run.summary["ppl@128/none"] == 20.0 and run.summary["ppl@2x/none"] == 20.0
        assert run.summary["ppl@1x/yarn"] == 12.0 and run.summary["train_len"] == 64
    finally:
        run.finish()


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)
        sweep = OmegaConf.to_container(cfg.hydra.sweeper.params) if cfg.hydra.sweeper.params else {}
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        return OmegaConf.to_container(cfg, resolve=True), sweep


def test_pe_extrapolation_preset_sweeps_every_scheme_and_fits_learned():
    from rope_lm.model.transformer import build_model

    cfg, sweep = compose(["+experiment=pe_extrapolation"])
    schemes = sweep["experiment/pe_scheme@_global_"].split(",")
    assert schemes == ["sinusoidal", "learned", "rope", "t5", "alibi", "nope", "kerple", "fire"]
    assert cfg["logger"]["group"] == "pe_extrapolation-stdlib-L64"
    from rope_lm.runs.eval_run import eval_settings

    assert cfg["eval"]["controls"] == ["window"]
    longest = max(eval_settings(cfg["eval"])[0].resolve_lengths(cfg["data"]["seq_len"]))
    assert longest == 16 * cfg["data"]["seq_len"]
    for scheme in schemes:  # each run would pass the pipeline's pre-training length check
        cfg, _ = compose(["+experiment=pe_extrapolation", f"experiment/pe_scheme@_global_={scheme}"])
        assert cfg["pos"]["name"] == scheme
        model = build_model(cfg["model"], cfg["pos"], cfg["scaling"], vocab_size=300, train_len=cfg["data"]["seq_len"])
        model.validate_length(longest)


def test_rope_scaling_and_finetune_presets():
    cfg, _ = compose(["+experiment=rope_scaling"])
    assert cfg["pos"]["name"] == "rope" and cfg["eval"]["multipliers"] == [1, 2, 4, 8, 16]
    cfg, sweep = compose(["+experiment=finetune_extension"])
    assert sweep == {"scaling": "none,pi,ntk,yarn"} and cfg["data"]["seq_len"] == 4 * 64
    assert cfg["init_from"] and "required" in cfg["init_from"]  # never silently null: init_from refuses it


def test_per_position_log_bins_keep_the_token_mean_and_widen_with_position():
    from rope_lm.eval.report import log_binned

    L, width = 62, 4  # the last bucket holds positions 60-61 only
    starts = list(range(0, L, width))
    losses = [float(s) for s in starts]
    centres, means = log_binned({"start": starts, "width": width, "loss": losses}, L, per_octave=2)
    sizes = [min(width, L - s) for s in starts]
    assert centres == sorted(centres) and len(centres) < len(starts)
    # Bin means weighted by the positions they cover give back the overall token mean.
    edges = [0]
    for c in centres[:-1]:
        edges.append(2 * c - edges[-1])  # each bin is centred on its span
    covered = [(2 * c - 2 * e) for c, e in zip(centres, edges)]
    assert sum(covered) == L
    assert sum(m * n for m, n in zip(means, covered)) == pytest.approx(sum(v * n for v, n in zip(losses, sizes)))
    # Two bins per doubling: buckets centred at 2 and 6 stay apart; 34 ... 61 (one octave and a bit) merge into <= 3 bins.
    assert means[0] == 0.0 and means[1] == 4.0
    assert sum(1 for c in centres if c > 32) <= 3


# --- seeds and noise ------------------------------------------------------------------------------


def test_runs_differing_only_in_seed_aggregate_to_mean_and_sd(tmp_path):
    sweep = tmp_path / "seeds"
    rope = {0: [10.0, 20.0, 80.0], 1: [11.0, 22.0, 86.0], 2: [12.0, 21.0, 83.0]}
    for seed, ppls in rope.items():
        write_run(sweep / f"rope_s{seed}", "rope", {"none": lambda L, p=ppls: p[[64, 128, 256].index(L)]}, seed=seed)
    write_run(sweep / "alibi_s0", "alibi", {"none": lambda L: 15.0}, seed=0)
    write_run(sweep / "alibi_s1", "alibi", {"none": lambda L: 15.0}, seed=1, vocab=8192, fingerprint="abc123")
    summary = compare([str(sweep)], str(tmp_path / "o"), group=True)
    (g,) = [g for g in summary["groups"] if any(s.scheme == "rope" for s in g.series)]
    (agg,) = g.seed_aggregates()  # the one alibi of this group has a single seed
    assert agg.label == "rope (3 seeds)" and [s.seed for s in agg.members] == [0, 1, 2]
    st = agg.stats(128)
    assert st["mean"] == pytest.approx(21.0) and st["sd"] == pytest.approx(1.0) and st["n"] == 3
    assert agg.stats(256)["sd"] == pytest.approx(3.0) and agg.noise(256) == pytest.approx((77.0, 89.0))
    rows = {int(r["length"]): r for r in read_csv(tmp_path / "o" / "compare_seeds.csv")}
    assert float(rows[64]["ppl_mean"]) == pytest.approx(11.0) and float(rows[64]["ppl_sd"]) == pytest.approx(1.0)
    assert rows[64]["per_seed"] == "0=10.0;1=11.0;2=12.0" and rows[64]["seeds"] == "0;1;2"
    md = (tmp_path / "o" / "compare.md").read_text()
    assert "| rope (3 seeds) | 11.00 ± 1.00 | 21.00 ± 1.00 | 83.00 ± 3.00 |" in md
    assert "seed 0 10.00, seed 1 11.00, seed 2 12.00" in md
    # Relative PPL per seed, each to its own PPL at 64: at 256 tokens 80/10, 86/11 and 83/12.
    rel = [8.0, 86 / 11, 83 / 12]
    mean = sum(rel) / 3
    assert float(rows[256]["rel_mean"]) == pytest.approx(mean)
    assert float(rows[256]["rel_sd"]) == pytest.approx((sum((x - mean) ** 2 for x in rel) / 2) ** 0.5)
    assert float(rows[128]["rel_mean"]) == pytest.approx((2.0 + 2.0 + 1.75) / 3)
    # The page's seeds block reads that file as it is (this comparison has two groups: group= picks one, as
    # in every block).
    assert render(f"{tmp_path / 'o' / 'compare_seeds.csv'} seeds group={rows[64]['group']}") == (
        "| scheme (seeds) | 64 (1×) | 2× | 4× | relative at 2× | 4× |\n|---|---|---|---|---|---|\n"
        "| rope (3 seeds) | 11.00 ± 1.00 | 21.00 ± 1.00 | 83.00 ± 3.00 | 1.92 ± 0.14 | 7.58 ± 0.58 |"
    )


def test_a_seed_aggregate_needs_the_same_settings(tmp_path):
    write_run(tmp_path / "s" / "a", "rope", seed=0)
    write_run(tmp_path / "s" / "b", "rope", seed=1, group="another-study")  # logger settings do not count
    write_run(tmp_path / "s" / "c", "rope", {"yarn": lambda L: 9.0}, seed=1)  # another method
    # run on another machine, validated and checkpointed more often, by a version of the code that has an
    # option more (unset: None): the same experiment
    write_run(
        tmp_path / "s" / "d",
        "rope",
        seed=2,
        config={
            "trainer": {"max_steps": 60, "val_every_n_steps": 7, "ckpt_every_n_steps": 7},
            "optim": {"lr": 0.002, "fused": None},
        },
    )
    write_run(
        tmp_path / "s" / "e",
        "rope",
        seed=3,
        config={
            "trainer": {"max_steps": 60, "val_every_n_steps": 9},
            "optim": {"lr": 0.002},
            "data": {"vocab_size": 4096, "tokenizer_train_chars": 4_000_000, "cache_dir": "/elsewhere/cache"},
        },
    )
    write_run(tmp_path / "s" / "f", "rope", seed=2, config={"trainer": {"max_steps": 90}})  # a longer training
    write_run(tmp_path / "s" / "g", "rope", seed=3, config={"trainer": {"max_steps": 90}})
    # runs continued from their own seed's base (train_long_bound's init_from names rope_seed<N>): replicas too
    for seed, run in ((0, "h"), (2, "i")):
        base = {"init_from": f"outputs/base/rope_seed{seed}_none_L64", "trainer": {"max_steps": 30}}
        write_run(tmp_path / "s" / run, "rope", seed=seed, config=base)
    summary = compare([str(tmp_path / "s")], str(tmp_path / "o"))
    (g,) = summary["groups"]
    assert sorted([s.run_dir[-1] for s in a.members] for a in g.seed_aggregates()) == [
        ["a", "b"],
        ["d", "e"],
        ["f", "g"],
        ["h", "i"],
    ]


def test_a_seed_aggregate_is_named_by_the_setting_that_tells_it_apart(tmp_path):
    """Two RoPE bases, two seeds each: the aggregates read "rope (pos.base=10) (2 seeds)", as their runs are
    named less their seed, not "rope" and "rope #2"."""
    for base in (10, 10000):
        for seed in (0, 1):
            write_run(tmp_path / "s" / f"b{base}_s{seed}", "rope", seed=seed, config={"pos": {"base": base}})
    summary = compare([str(tmp_path / "s")], str(tmp_path / "o"))
    (g,) = summary["groups"]
    assert sorted(a.label for a in g.seed_aggregates()) == [
        "rope (pos.base=10) (2 seeds)",
        "rope (pos.base=10000) (2 seeds)",
    ]
    labels = {r["label"] for r in read_csv(tmp_path / "o" / "compare_seeds.csv")}
    assert labels == {"rope (pos.base=10) (2 seeds)", "rope (pos.base=10000) (2 seeds)"}


def test_within_noise_rule_overlapping_intervals():
    from rope_lm.compare.noise import within_noise

    assert within_noise((10.0, 12.0), (11.5, 13.0)) and within_noise((11.5, 13.0), (10.0, 12.0))
    assert not within_noise((10.0, 12.0), (12.1, 13.0))
    assert within_noise((10.0, 12.0), None) is None


def test_rows_within_noise_of_the_best_are_flagged(tmp_path):
    sweep = tmp_path / "s"
    write_run(sweep / "rope", "rope", {"none": lambda L: {64: 10.0, 128: 20.0, 256: 80.0}[L]}, ci=lambda L: 0.5)
    write_run(sweep / "alibi", "alibi", {"none": lambda L: {64: 10.8, 128: 12.0, 256: 13.0}[L]}, ci=lambda L: 0.5)
    write_run(sweep / "t5", "t5", {"none": lambda L: {64: 12.0, 128: 12.7, 256: 30.0}[L]}, ci=lambda L: 0.3)
    summary = compare([str(sweep)], str(tmp_path / "o"))
    flags = {
        (r["label"], int(r["length"])): r["within_noise_of_best"] for r in read_csv(tmp_path / "o" / "compare.csv")
    }
    # 64: rope [9.5, 10.5] is best, alibi [10.3, 11.3] overlaps it, t5 [11.7, 12.3] does not
    assert flags[("rope", 64)] == "True" and flags[("alibi", 64)] == "True" and flags[("t5", 64)] == "False"
    # 128: alibi [11.5, 12.5] is best; t5 [12.4, 13.0] overlaps, rope does not
    assert (flags[("alibi", 128)], flags[("t5", 128)], flags[("rope", 128)]) == ("True", "True", "False")
    md = (tmp_path / "o" / "compare.md").read_text()
    assert "- 128: best alibi (12.00); within noise of it: t5" in md
    assert "- 256: best alibi (13.00); within noise of it: none" in md
    assert "| rope | 10.00 [9.50, 10.50] | 20.00 [19.50, 20.50] | 80.00 [79.50, 80.50] |" in md
    assert summary["seed_rows"] == []


def test_different_protocols_are_not_mixed(tmp_path):
    write_run(tmp_path / "s" / "a", "rope")
    write_run(tmp_path / "s" / "b", "rope", protocol="documents")
    with pytest.raises(ConfigError, match="differ in evaluation protocol"):
        compare([str(tmp_path / "s")], str(tmp_path / "o"))


def test_results_markdown_shows_intervals_protocol_and_documents():
    from rope_lm.eval.report import markdown_table

    rows = [
        {
            "method": "none",
            "protocol": "documents",
            "length": L,
            "ratio": L / 64,
            "tokens": 3 * L,
            "windows": 3,
            "documents": 3,
            "documents_shared": True,
            "unit": "document",
            "units": 3,
            "ppl": p,
            "ppl_lo": p - 0.4,
            "ppl_hi": p + 0.4,
            "ppl_beyond": None if L == 64 else p,
            "ppl_rel": p / 37.5,
            "ppl_rel_lo": 0.99,
            "ppl_rel_hi": 1.2,
            "per_position": per_position(L, 3.0),
        }
        for L, p in ((64, 37.5), (128, 40.25))
    ]
    results = {
        "scheme": "rope",
        "train_len": 64,
        "corpus": {"source": "pg19", "fingerprint": "f"},
        "eval": {"split": "test", "protocol": "documents", "bootstrap": 1000, "seed": 0},
        "results": rows,
    }
    md = markdown_table(results)
    assert "| none | 37.50 [37.10, 37.90] | 40.25 [39.85, 40.65] |" in md
    assert "Protocol `documents`" in md and "same 3 documents" in md and "1000 bootstrap resamples" in md
    assert "| none | 1.00 [0.99, 1.20] | 1.07 [0.99, 1.20] |" in md
    assert "| none | 3 docs, 192 tokens, 3 windows | 3 docs, 384 tokens, 3 windows |" in md
    for r in rows:
        r["documents_shared"] = False
    assert "128: 3 documents, 384 tokens" in markdown_table(results)


def test_run_wandb_log2_length_table_and_interval_in_summary(tmp_path):
    from rope_lm.eval.report import log_to_wandb as log_run

    write_run(tmp_path / "r", "rope", {"none": lambda L: 10.0 * L / 64, "yarn": lambda L: 12.0}, ci=lambda L: 1.0)
    results = json.load(open(tmp_path / "r" / "results.json"))

    class FakeRun:
        name = "run-1"

        def __init__(self):
            self.summary, self.logged = {}, {}

        def log(self, payload):
            self.logged.update(payload)

    run = FakeRun()
    log_run(run, results, str(tmp_path / "r"))
    table = run.logged["extrapolation/ppl_vs_log2_length_table"]
    assert table.columns == ["run", "method", "series", "length", "log2_length", "ppl", "lo", "hi"]
    assert ["run-1", "yarn", "rope + yarn", 256, 8.0, 12.0, 11.0, 13.0] in [list(r) for r in table.data]
    chart = run.logged["extrapolation/ppl_vs_log2_length"]
    assert chart.spec.fields == {"x": "log2_length", "y": "ppl", "stroke": "series"} and chart.table is table
    assert run.summary["ppl@128/none"] == 20.0 and run.summary["ppl@128/none/lo"] == 19.0
    assert run.summary["ppl@2x/none/hi"] == 21.0


def test_runs_of_one_scheme_are_named_by_the_settings_they_differ_in(tmp_path):
    """A budget sweep (trainer.max_steps=600,2000): one row per budget, named by it."""
    for i, steps in enumerate((600, 2000)):
        d = write_run(tmp_path / "budget" / f"{i}_rope", "rope", {"none": lambda L, s=steps: 10.0 * L / 64 + 1000 / s})
        results = json.load(open(os.path.join(d, "results.json")))
        results["config"]["trainer"] = {"max_steps": steps, "val_every_n_steps": 200}
        json.dump(results, open(os.path.join(d, "results.json"), "w"))
    out = tmp_path / "cmp"
    compare([str(tmp_path / "budget")], str(out))
    labels = {r["label"] for r in read_csv(out / "compare.csv")}
    assert labels == {"rope (trainer.max_steps=600)", "rope (trainer.max_steps=2000)"}


def test_study_presets_continue_and_their_budgets():
    from rope_lm.runs.config import resolve_run

    cfg, sweep = compose(["+experiment=pe_extrapolation"])
    assert cfg["existing"] == "continue" and cfg["trainer"]["max_steps"] == 6000
    smoke, smoke_sweep = compose(["+experiment=pe_extrapolation_smoke"])
    assert smoke["trainer"]["max_steps"] == 600 and smoke_sweep == sweep and smoke["existing"] == "continue"
    big, big_sweep = compose(["+experiment=pe_extrapolation_125m", "data.path=unused"])
    assert big_sweep == sweep and big["model"]["name"] == "llama_125m" and big["data"]["seq_len"] == 512
    for scheme in sweep["experiment/pe_scheme@_global_"].split(","):  # every scheme fits 32 x L, no weights built
        run = resolve_run(
            compose(
                ["+experiment=pe_extrapolation_125m", f"experiment/pe_scheme@_global_={scheme}", "data.path=unused"]
            )[0]
        )
        assert max(run.lengths) == 32 * 512 and run.eval.protocol == "documents"


def _task_run(tmp_path, folder, task, scheme, steps, hit):
    from rope_lm.probes.task_run import TASK_JSON

    acc = {"accuracy": hit, "accuracy_lo": hit, "accuracy_hi": hit, "n": 10}
    run = {
        "kind": "task",
        "task": task,
        "scheme": scheme,
        "method": "none",
        "seed": 0,
        "train_sizes": [1, 6],
        "test_max": 12,
        "inside": acc,
        "beyond": acc,
        "status": "complete",
        "buckets": [{"label": "7-8", "sizes": [7, 8], "inside": False, "max_tokens": 9, **acc}],
        "config": {
            "task": {"name": task},
            "pos": {"name": scheme},
            "train": {"steps": steps, "log_every": 5},
            "seed": 0,
            "threads": 1,
        },
    }
    os.makedirs(tmp_path / folder)
    (tmp_path / folder / TASK_JSON).write_text(json.dumps(run))


def test_task_runs_of_one_scheme_at_two_budgets_keep_both_rows_named_by_the_budget(tmp_path):
    from rope_lm.compare.task_compare import compare_tasks

    _task_run(tmp_path, "0_copy_rope", "copy", "rope", 1000, 0.25)
    _task_run(tmp_path, "1_copy_rope", "copy", "rope", 10000, 0.75)
    _task_run(tmp_path, "2_sort_rope", "sort", "rope", 10000, 0.5)  # its 1,000-step twin not run yet
    out = compare_tasks([str(tmp_path)], str(tmp_path / "cmp"))
    md = open(out["files"]["markdown"]).read()
    header = md.splitlines()[4]
    assert header == "| task (train sizes → tested) | rope (train.steps=1000) | rope (train.steps=10000) |"
    assert "| copy (1-6 → 12) | 25% [25%, 75%]" not in md  # both runs shown, neither overwritten
    assert "| copy (1-6 → 12) | 25% [25%, 25%] / 25% [25%, 25%] | 75% [75%, 75%] / 75% [75%, 75%] |" in md
    assert "| sort (1-6 → 12) | — | 50% [50%, 50%] / 50% [50%, 50%] |" in md
    labels = {r["label"] for r in csv.DictReader(open(out["files"]["csv"]))}
    assert labels == {"rope (train.steps=1000)", "rope (train.steps=10000)"}


def test_each_run_is_read_against_the_window_control(tmp_path):
    """yes / tied / no per length past L: relative PPL below, within or above the window-L control's intervals."""
    runs = []
    for scheme, method, rel, half in (
        ("alibi", "none", {128: 0.90, 256: 0.93}, 0.01),
        ("rope", "window", {128: 0.96, 256: 0.96}, 0.01),
        ("rope", "none", {128: 0.97, 256: 2.0}, 0.01),
    ):
        d = write_run(
            tmp_path / f"{scheme}-{method}",
            scheme,
            {method: lambda L, r=rel: 10.0 * r.get(L, 1.0)},
            lengths=[64, 128, 256],
        )
        results = json.load(open(os.path.join(d, "results.json")))
        for row in results["results"]:
            r = rel.get(row["length"], 1.0)
            row.update(ppl_rel=r, ppl_rel_lo=r - half, ppl_rel_hi=r + half)
        json.dump(results, open(os.path.join(d, "results.json"), "w"))
        runs.append(d)
    md = open(compare(runs, str(tmp_path / "out"))["files"]["markdown"]).read()
    section = md.split("### Against the window-L control (rope + window)")[1]
    assert "| alibi | **yes** (0.90 vs 0.96) | **yes** (0.93 vs 0.96) |" in section
    assert "| rope | tied (0.97 vs 0.96) | no (2.00 vs 0.96) |" in section
    alone = compare(runs[:1] + runs[2:], str(tmp_path / "out2"))
    assert "window-L control" not in open(alone["files"]["markdown"]).read()  # no control, no section


def test_one_command_compares_perplexity_runs_and_a_folder_of_retrieval_runs(tmp_path):
    """A sweep and a folder holding only retrieval.json files: both comparisons are written; the
    retrieval folder is not a perplexity run missing its results."""
    from tests.test_diagnostics import run_script
    from tests.test_published import retrieval_json

    write_run(tmp_path / "sweep" / "0_rope")
    retrieval_json(tmp_path / "battery" / "0_rope", "none", {64: 1.0, 128: 0.5}, train_len=64)
    out = tmp_path / "cmp"
    run_script("compare.py", f"paths=[{tmp_path / 'sweep'},{tmp_path / 'battery'}]", f"out={out}")
    assert {"compare.csv", "compare_retrieval.csv"} <= set(os.listdir(out))


def test_the_retrieval_comparison_reads_each_run_against_the_window_control(tmp_path):
    """Per task and length past L: higher than the window-L control beyond both intervals is a yes, lower a
    no, overlapping tied; without a window control the section is absent."""
    from rope_lm.compare.retrieval_compare import compare_retrieval
    from tests.test_published import retrieval_json

    retrieval_json(tmp_path / "r" / "window", "window", {64: 1.0, 128: 0.5, 256: 0.3}, train_len=64)
    retrieval_json(tmp_path / "r" / "reads", "yarn", {64: 1.0, 128: 0.9, 256: 0.35}, train_len=64)
    retrieval_json(tmp_path / "r" / "lost", "none", {64: 1.0, 128: 0.1, 256: 0.0}, train_len=64)
    retrieval_json(tmp_path / "r" / "other_L", "none", {128: 1.0, 256: 0.1}, train_len=128)  # no control at its L
    compare_retrieval([str(tmp_path / "r")], str(tmp_path / "cmp"))
    md = (tmp_path / "cmp" / "compare_retrieval.md").read_text()
    assert md.count("## Against the window-L control") == 1 and md.count("### passkey") == 1
    assert "## Against the window-L control (rope + window, L = 64)" in md
    assert "| rope + yarn | **yes** (90% vs 50%) | tied (35% vs 30%) |" in md
    assert "| rope (lost) | no (10% vs 50%) | no (0% vs 30%) |" in md  # two plain rope runs: told apart by folder
    os.remove(tmp_path / "r" / "window" / "retrieval.json")
    compare_retrieval([str(tmp_path / "r")], str(tmp_path / "cmp2"))
    assert "window-L control" not in (tmp_path / "cmp2" / "compare_retrieval.md").read_text()


def _with_rel_intervals(d, half=0.01):
    """The evaluation's paired interval of the relative PPL, as the pipeline writes it."""
    results = json.load(open(os.path.join(d, "results.json")))
    ref = {r["method"]: r["ppl"] for r in results["results"] if r["length"] == results["train_len"]}
    for row in results["results"]:
        r = row["ppl"] / ref[row["method"]]
        row.update(ppl_rel=r, ppl_rel_lo=r - half, ppl_rel_hi=r + half)
    json.dump(results, open(os.path.join(d, "results.json"), "w"))
    return d


def test_a_committed_table_stands_for_its_runs(tmp_path):
    """A compare.csv read back gives the same table and window verdicts as the runs it came from (whose
    folders may be gone); a new run beside a committed row of its name is told apart by its folder; a
    label filter picks rows, and an unknown label is refused with the labels there are."""
    runs = [
        _with_rel_intervals(write_run(tmp_path / name, scheme, {method: f}, lengths=[64, 128, 256], ci=lambda L: 0.2))
        for name, scheme, method, f in (
            ("a", "alibi", "none", lambda L: 10.0 - L / 256),
            ("w", "rope", "window", lambda L: 10.0),
            ("r", "rope", "none", lambda L: 10.0 * L / 64),
        )
    ]
    first = compare(runs, str(tmp_path / "first"))
    csv_path = first["files"]["csv"]
    again = compare([csv_path], str(tmp_path / "again"))
    cols = [
        "label",
        "scheme",
        "method",
        "length",
        "ppl",
        "ppl_lo",
        "ppl_hi",
        "ppl_rel",
        "ppl_rel_lo",
        "ppl_rel_hi",
        "within_noise_of_best",
        "run_dir",
        "train_len",
    ]
    assert [[r[c] for c in cols] for r in read_csv(again["files"]["csv"])] == [
        [r[c] for c in cols] for r in read_csv(csv_path)
    ]
    window = lambda s: s["files"]["markdown"] and open(s["files"]["markdown"]).read().split("### Against the window")[1]
    assert window(again) == window(first) and "| rope | no (" in window(first)

    rerun = write_run(tmp_path / "rerun" / "r", "rope", lengths=[64, 128, 256])
    labels = [r.label for r in compare([csv_path, rerun], str(tmp_path / "mixed"))["groups"][0].series]
    assert labels == ["alibi", "rope + window", "rope", "rope (rerun/r)"]
    picked = compare([f"{csv_path}:rope + window,rope"], str(tmp_path / "picked"))
    assert [s.label for s in picked["groups"][0].series] == ["rope + window", "rope"]
    with pytest.raises(ConfigError, match="no row labelled nope .*alibi, rope \\+ window, rope"):
        compare([f"{csv_path}:nope"], str(tmp_path / "bad"))


def test_a_train_long_reference_is_an_upper_bound_row(tmp_path):
    """A run trained at 4 x L joins the L table as a reference row: its own PPL at each length, relative
    to its PPL at L, labelled with its training length, never the best row; one of another corpus is
    refused."""
    short = [
        write_run(tmp_path / s, s, {"none": f}, lengths=[64, 128, 256], ci=lambda L: 0.5)
        for s, f in (("rope", lambda L: 10.0 * L / 64), ("alibi", lambda L: 11.0))
    ]
    long = write_run(
        tmp_path / "long",
        "rope",
        {"none": lambda L: 8.0 - L / 128},
        train_len=256,
        lengths=[64, 128, 256],
        ci=lambda L: 0.5,
    )
    out = compare(short, str(tmp_path / "out"), references=[long])
    rows = {(r["label"], int(r["length"])): r for r in read_csv(out["files"]["csv"])}
    ref = rows[("rope (trained at 256)", 256)]
    assert float(ref["ppl"]) == 6.0 and float(ref["ppl_rel"]) == pytest.approx(6.0 / 7.5)
    assert (ref["train_len"], ref["trained_at"], ref["ratio"]) == ("64", "256", "4.0")
    assert rows[("alibi", 256)]["trained_at"] == "64"
    assert ref["within_noise_of_best"] == "" and rows[("alibi", 256)]["within_noise_of_best"] == "True"
    md = open(out["files"]["markdown"]).read()
    assert "Reference rows, trained at a longer length" in md and "best alibi (11.00)" in md
    window = write_run(
        tmp_path / "window", "rope", {"window": lambda L: 10.0}, lengths=[64, 128, 256], ci=lambda L: 0.5
    )
    md = open(compare([*short, window], str(tmp_path / "with_window"), references=[long])["files"]["markdown"]).read()
    section = md.split("### Against the window-L control")[1]
    assert "| alibi |" in section and "trained at 256" not in section  # read on absolute PPL, not against L
    other = write_run(tmp_path / "other", "rope", train_len=256, lengths=[64, 128, 256], fingerprint="zzz")
    with pytest.raises(ConfigError, match="joins none of the compared tables"):
        compare(short, str(tmp_path / "out2"), references=[other])


def test_seed_replicas_are_named_by_their_seeds_and_the_same_settings_twice_by_folder(tmp_path):
    for name, seed in (("a", 0), ("b", 1), ("c", 1)):
        write_run(tmp_path / "runs" / name, "rope", seed=seed)
    write_run(tmp_path / "pair" / "x", "alibi", seed=2)
    write_run(tmp_path / "pair" / "y", "alibi", seed=3)
    labels = sorted(s.label for s in compare([str(tmp_path / "pair")], str(tmp_path / "o1"))["groups"][0].series)
    assert labels == ["alibi (seed=2)", "alibi (seed=3)"]
    labels = sorted(s.label for s in compare([str(tmp_path / "runs")], str(tmp_path / "o2"))["groups"][0].series)
    assert labels == ["rope (a)", "rope (b)", "rope (c)"]  # two share seed 1: only the folders tell them apart


def test_a_checkpoint_scored_on_a_split_it_was_not_trained_on_joins_no_table(tiny_cache, tiny_data_options, tmp_path):
    """Its BPE was trained on its own split, so the same book is cut into other tokens than those of the models
    trained on this split: the evaluation records where its tokenizer came from, and compare keeps its
    per-token PPL out of their tables (as a reference too); on its own split it joins as before."""
    from rope_lm.runs.eval_run import evaluate_checkpoint
    from tests.test_diagnostics import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(str(tmp_path / "run" / "checkpoints" / "last.ckpt"), tiny_cache, tiny_data_options)
    options = {"multipliers": [1, 2], "token_budget": 64, "batch_tokens": 64, "bootstrap": 0}
    own = evaluate_checkpoint(ckpt, [{"name": "none"}], options, {}, out_dir=str(tmp_path / "own"))
    other = evaluate_checkpoint(
        ckpt, [{"name": "none"}], options, {"test_fraction": 0.4}, out_dir=str(tmp_path / "other")
    )
    assert "tokenizer_trained_on" not in own["config"]
    assert other["config"]["tokenizer_trained_on"] == tiny_cache.corpus["fingerprint"] != other["corpus"]["fingerprint"]
    assert tokenizer_id(own["config"]) == "bpe320@200000"
    assert tokenizer_id(other["config"]) == f"bpe320@200000 of {tiny_cache.corpus['fingerprint']}"
    table = write_run(
        tmp_path / "table",
        "rope",
        train_len=8,
        lengths=[8, 16],
        fingerprint=other["corpus"]["fingerprint"],
        vocab=320,
        config={"data": {"vocab_size": 320, "tokenizer_train_chars": 200_000}},
    )
    long = write_run(
        tmp_path / "long",
        "rope",
        train_len=16,
        lengths=[8, 16],
        fingerprint=other["corpus"]["fingerprint"],
        config={
            "data": {"vocab_size": 320, "tokenizer_train_chars": 200_000},
            "tokenizer_trained_on": tiny_cache.corpus["fingerprint"],
        },
    )
    with pytest.raises(ConfigError, match="joins none of the compared tables.*trained on another split"):
        compare([table], str(tmp_path / "out"), references=[long])
    json_path = os.path.join(long, "results.json")
    results = json.load(open(json_path))
    del results["config"]["tokenizer_trained_on"]
    json.dump(results, open(json_path, "w"))
    assert compare([table], str(tmp_path / "out2"), references=[long])["groups"][0].series[-1].trained_at == 16


def test_retrieval_rows_are_named_like_the_perplexity_rows_of_the_same_checkpoints(tmp_path):
    """Two RoPE checkpoints differing in base: the battery's rows read `rope (pos.base=10.0)` as the
    PPL table's do (a claim reads both by that label), from the settings retrieval.py records."""
    from rope_lm.compare.retrieval_compare import compare_retrieval
    from tests.test_published import retrieval_json

    labels = set()
    for base in (10.0, 10000.0):
        cfg = {"pos": {"name": "rope", "base": base}, "model": {"n_layer": 4}, "seed": 1}
        write_run(tmp_path / "ppl" / f"b{base:g}", config=cfg)
        retrieval_json(tmp_path / "ret" / f"b{base:g}", "none", {64: 1.0, 128: 0.5}, train_len=64, config=cfg)
    ppl = {s.label for s in compare([str(tmp_path / "ppl")], str(tmp_path / "out"))["groups"][0].series}
    compare_retrieval([str(tmp_path / "ret")], str(tmp_path / "out"))
    labels = {r["label"] for r in read_csv(tmp_path / "out" / "compare_retrieval.csv")}
    assert labels == ppl == {"rope (pos.base=10.0)", "rope (pos.base=10000.0)"}


def test_train_long_presets_score_the_tables_they_bound():
    """train_long sits at the absolute lengths of the L = 64 tables, all inside its own training length,
    on their token budget; on PG-19 it evaluates as pe_headline does, on pe_headline's split."""
    from rope_lm.runs.config import resolve_run

    table = resolve_run(compose(["+experiment=pe_extrapolation"])[0])
    long = resolve_run(compose(["+experiment=train_long"])[0])
    assert long.lengths == table.lengths and max(long.lengths) == long.data.seq_len == 1024
    assert (
        long.trainer.max_steps * long.data.batch_size * 1024
        == table.trainer.max_steps * table.data.batch_size * table.data.seq_len
    )
    headline = compose(["+experiment=pe_headline"])[0]
    pg19 = compose(["+experiment=train_long_pg19"])[0]
    assert pg19["eval"] == {
        **headline["eval"],
        "lengths": pg19["eval"]["lengths"],
        "multipliers": pg19["eval"]["multipliers"],
        "controls": [],  # every train_long length lies inside its own L, where a window at L cuts nothing
    }
    assert {k: pg19["data"][k] for k in ("name", "path", "test_fraction", "valid_fraction")} == {
        k: headline["data"][k] for k in ("name", "path", "test_fraction", "valid_fraction")
    }


def test_gpu_presets_of_the_headline_and_its_train_long_row():
    """pe_headline_125m is pe_extrapolation_125m for the headline's schemes and seeds, named by scheme and seed;
    train_long_125m trains at its longest length on its token budget and scores its absolute lengths."""
    from rope_lm.runs.config import resolve_run

    big, big_sweep = compose(["+experiment=pe_extrapolation_125m", "data.path=unused"])
    head, sweep = compose(["+experiment=pe_headline_125m", "data.path=unused"])
    assert sweep == {"experiment/pe_scheme@_global_": "rope,alibi,nope,t5,sinusoidal", "seed": "0,1,2"}
    assert {k: head[k] for k in ("model", "data", "trainer", "eval", "optim")} == {
        k: big[k] for k in ("model", "data", "trainer", "eval", "optim")
    }
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = hydra_compose(
            config_name="config", overrides=["+experiment=pe_headline_125m", "seed=2"], return_hydra_config=True
        )
        assert cfg.hydra.sweep.subdir == "rope_seed2_none_L512"
    table = resolve_run(big)
    long = resolve_run(compose(["+experiment=train_long_125m", "data.path=unused"])[0])
    assert long.pos["name"] == "rope" and long.model["name"] == "llama_125m"
    assert long.lengths == table.lengths and max(long.lengths) == long.data.seq_len == 32 * 512
    assert (
        long.trainer.max_steps * long.data.batch_size * long.data.seq_len
        == table.trainer.max_steps * table.data.batch_size * table.data.seq_len
    )
    assert long.eval.protocol == table.eval.protocol == "documents"


def test_plot_styles_give_a_schemes_seeds_one_colour_and_other_schemes_others():
    from rope_lm.compare.ppl_plots import _styles
    from rope_lm.compare.ppl_series import Series

    def series(label, scheme, seed, method="none"):
        return Series(
            run_dir=label,
            scheme=scheme,
            method=method,
            train_len=64,
            rows={},
            label=label,
            seed=seed,
            setting=f"{scheme}|{method}|" if seed is not None else "",
        )

    styles = _styles(
        [
            series("rope (seed=0)", "rope", 0),
            series("rope (seed=1)", "rope", 1),
            series("alibi (seed=0)", "alibi", 0),
            series("alibi (seed=1)", "alibi", 1),
            series("rope + ntk", "rope", None, "ntk"),
            series("rope + ntk+logn", "rope", None, "ntk+logn"),
        ]
    )
    (r0, r1, a0, a1, n, nl) = styles
    assert r0[0] == r1[0] and a0[0] == a1[0] and r0[0] != a0[0]  # a colour per scheme
    assert r0[1] != r1[1] and a0[1] != a1[1]  # seeds apart by dash
    assert n[0] == nl[0] and n[1] != nl[1] and n[0] not in (r0[0], a0[0])  # a method's variants: one colour


def test_a_name_keeps_only_the_settings_that_tell_its_rows_apart():
    """RoPE, p-RoPE and a bound trained at 1,024 (with its own steps, learning rate and warmup) in one table:
    the names need the training length and the proportion alone, whatever else the bound changed; seed replicas
    still get their seeds."""
    from rope_lm.compare.labels import distinct_labels

    def flat(seq_len, steps, lr, warmup, p):
        return {
            "data.seq_len": seq_len,
            "max_steps": steps,
            "optim.lr": lr,
            "optim.warmup_steps": warmup,
            "pos.p_rope": p,
        }

    rope, p_rope, bound = (
        flat(64, 6000, 0.002, 50, 1.0),
        flat(64, 6000, 0.002, 50, 0.75),
        flat(1024, 300, 5e-4, 20, 1.0),
    )
    entries = [
        ("t", "rope", f, f"runs/{n}_seed{s}", s)
        for n, f in (("rope", rope), ("p", p_rope), ("b", bound))
        for s in (0, 1)
    ]
    assert distinct_labels(entries) == [
        "rope (data.seq_len=64, pos.p_rope=1.0) (seed=0)",
        "rope (data.seq_len=64, pos.p_rope=1.0) (seed=1)",
        "rope (data.seq_len=64, pos.p_rope=0.75) (seed=0)",
        "rope (data.seq_len=64, pos.p_rope=0.75) (seed=1)",
        "rope (data.seq_len=1024, pos.p_rope=1.0) (seed=0)",
        "rope (data.seq_len=1024, pos.p_rope=1.0) (seed=1)",
    ]
    # Without p-RoPE, the training length alone names the two; a learning-rate sweep is named by the rate.
    assert distinct_labels([e for e in entries if e[2] is not p_rope])[0] == "rope (data.seq_len=64) (seed=0)"
    lrs = [("t", "rope", {"optim.lr": lr, "data.seq_len": 64}, f"r{lr}", None) for lr in (1e-3, 2e-3)]
    assert distinct_labels(lrs) == ["rope (optim.lr=0.001)", "rope (optim.lr=0.002)"]
