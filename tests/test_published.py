"""scripts/check_published.py: each rule's verdict equals a hand reading of
small results, from run folders and from compare.py's CSV alike."""

import json
import os
import subprocess
import sys

import pytest

from rope_lm import published as P
from rope_lm.compare import compare
from rope_lm.task_compare import compare_tasks
from tests.conftest import ROOT
from tests.test_compare import write_run

# PPL at L = 64, 128, 256, 1024: alibi flat, rope mild then steep, sinusoidal steep at once.
PPL = {"alibi": {64: 20.0, 128: 19.6, 256: 19.4, 1024: 19.0},
       "rope": {64: 20.0, 128: 21.4, 256: 30.0, 1024: 54.0},
       "sinusoidal": {64: 20.0, 128: 44.0, 256: 90.0, 1024: 300.0}}


def sweep(tmp_path, ppl=PPL, seed_noise=None):
    root = tmp_path / "sweep"
    for i, (scheme, table) in enumerate(ppl.items()):
        write_run(root / f"{i}_{scheme}", scheme, {"none": table.get}, lengths=sorted(table))
    return str(root)


def claim(**kw):
    return {"id": "c", "study": "pe", "source": "s", "published": "p", **kw}


def test_ratio_rules_read_relative_ppl(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path)])
    v = P.ratio_between(claim(rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25), rows)
    assert (v.ours, v.verdict) == ("1.07 at 2 x L", P.MATCHED)  # 21.4 / 20
    v = P.ratio_between(claim(rule="ratio_between", series="rope", multiplier=16, min=1.35, max=5.4), rows)
    assert (v.ours, v.verdict) == ("2.70 at 16 x L", P.MATCHED)  # 54 / 20
    v = P.ratio_between(claim(rule="ratio_between", series="sinusoidal", multiplier=2, min=2.5), rows)
    assert (v.ours, v.verdict) == ("2.20 at 2 x L", P.NOT_MATCHED)
    v = P.ratio_between(claim(rule="ratio_between", series="rope", multiplier=8, min=1.0), rows)
    assert v.verdict == P.NOT_COMPARABLE  # 512 was not evaluated
    v = P.ratio_at_most(claim(rule="ratio_at_most", series="alibi", from_multiplier=2, max=1.0), rows)
    assert (v.ours, v.verdict) == ("0.95-0.98 over 2-16 x L (highest at 2 x L)", P.MATCHED)
    v = P.ratio_at_most(claim(rule="ratio_at_most", series="rope", from_multiplier=2, max=1.05), rows)
    assert v.verdict == P.NOT_MATCHED


def test_order_rule_and_seed_average(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path)])
    c = claim(rule="ppl_order", metric="ppl_rel", multiplier=2, order=["alibi", "rope", "sinusoidal"])
    v = P.ppl_order(c, rows)
    assert v.verdict == P.MATCHED and v.ours.startswith("alibi 0.980 < rope 1.070 < sinusoidal 2.200")
    v = P.ppl_order({**c, "order": ["rope", "alibi", "sinusoidal"]}, rows)
    assert v.verdict == P.NOT_MATCHED
    # Two seeds of one scheme: their PPLs are averaged (21.4 and 31.4 at 2 x L).
    two = [dict(r, ppl=r["ppl"] + 10 * (r["length"] == 128), seed=1) for r in rows if r["scheme"] == "rope"]
    assert P._series(rows + two, "rope")[2.0]["ppl"] == pytest.approx((21.4 + 31.4) / 2)


def test_rules_read_compare_csv_like_run_folders(tmp_path):
    folder = sweep(tmp_path)
    out = str(tmp_path / "cmp")
    compare([folder], out)
    assert P.ppl_rows([out]) and P.ppl_rows([out]) != []
    c = claim(rule="ppl_order", metric="ppl", multiplier=16, order=["alibi", "rope", "sinusoidal"])
    assert P.ppl_order(c, P.ppl_rows([out])).ours == P.ppl_order(c, P.ppl_rows([folder])).ours
    finetune = claim(rule="ppl_order", metric="ppl", multiplier=2, train_len="max", order=["rope+yarn", "rope+pi"])
    ft = str(tmp_path / "ft")
    write_run(os.path.join(ft, "a"), "rope", {"none": lambda L: 50.0}, train_len=64)
    write_run(os.path.join(ft, "b"), "rope", {"yarn": lambda L: 30.0, "pi": lambda L: 40.0}, train_len=256)
    v = P.ppl_order(finetune, P.ppl_rows([ft]))
    assert (v.ours, v.verdict) == ("rope+yarn 30.0 < rope+pi 40.0 (ppl at 2 x L)", P.MATCHED)


def task_run(directory, task, scheme, beyond):
    buckets = [{"label": "1-3", "sizes": [1, 3], "inside": True, "accuracy": 1.0, "n": 10},
               {"label": "4-6", "sizes": [4, 6], "inside": False, "accuracy": beyond[0], "n": 10},
               {"label": "7-9", "sizes": [7, 9], "inside": False, "accuracy": beyond[1], "n": 30}]
    for b in buckets:
        b.update(accuracy_lo=b["accuracy"], accuracy_hi=b["accuracy"], max_tokens=10)
    acc = (beyond[0] * 10 + beyond[1] * 30) / 40
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "task_results.json"), "w") as f:
        json.dump({"kind": "task", "task": task, "scheme": scheme, "method": "none", "seed": 0, "train_sizes": [1, 3], "test_max": 9,
                   "buckets": buckets, "beyond": {"accuracy": acc}}, f)


def test_task_ranking_from_runs_and_from_csv(tmp_path):
    root = tmp_path / "tasks"
    # copy: nope 0.5*10+0.1*30 -> 0.2, rope 0.0; sort: nope 0.4, rope 0.1 (0.4*10 + 0*30 = 4 / 40)
    task_run(root / "0", "copy", "nope", (0.5, 0.1))
    task_run(root / "1", "copy", "rope", (0.0, 0.0))
    task_run(root / "2", "sort", "nope", (0.4, 0.4))
    task_run(root / "3", "sort", "rope", (0.4, 0.0))
    c = claim(rule="task_ranking", above=["nope"], below=["rope"])
    v = P.task_ranking(c, P.task_rows([str(root)]))
    assert (v.ours, v.verdict) == ("nope 30% > rope 5% (mean exact match past the training sizes, 2 tasks)", P.MATCHED)
    out = str(tmp_path / "cmp")
    compare_tasks([str(root)], out)
    assert P.task_ranking(c, P.task_rows([out])).ours == v.ours
    assert P.task_ranking({**c, "above": ["rope"], "below": ["nope"]}, P.task_rows([out])).verdict == P.NOT_MATCHED
    assert P.task_ranking({**c, "above": ["t5"]}, P.task_rows([out])).verdict == P.NOT_COMPARABLE


def test_script_prints_and_writes_the_table(tmp_path):
    folder = sweep(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "check_published.py"),
                           f"studies.pe_extrapolation=[{folder}]", "studies.rope_scaling=[]",
                           f"studies.length_generalization=[{tmp_path / 'none'}]", f"out={tmp_path / 'out'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.load(open(tmp_path / "out" / "check_published.json"))
    verdicts = {(r["id"], r["verdict"]) for r in rows}
    # conf/published.yaml's thresholds on the hand-made sweep above:
    assert ("alibi_flat", P.MATCHED) in verdicts and ("rope_mild_at_2x", P.MATCHED) in verdicts
    assert ("sinusoidal_at_2x", P.MATCHED) in verdicts and ("order_at_2x", P.MATCHED) in verdicts
    assert ("su_zero_shot_order", P.NOT_COMPARABLE) in verdicts
    assert ("tasks_nope_t5_first", P.NOT_COMPARABLE) in verdicts
    assert "| **rope_far** (sweep)" in done.stdout and "Sources:" in done.stdout


def test_runs_of_other_settings_are_not_averaged_as_seeds(tmp_path):
    rows = P.ppl_rows([sweep(tmp_path)])
    other = [dict(r, label="rope (trainer.max_steps=2000)", ppl=r["ppl"] * 2) for r in rows if r["scheme"] == "rope"]
    mixed = [dict(r, label="rope (trainer.max_steps=600)") if r["scheme"] == "rope" else r for r in rows] + other
    c = claim(id="x", study="pe", rule="ratio_between", series="rope", multiplier=2, min=1.0, max=1.25)
    with pytest.raises(P.Ambiguous, match="2 rope runs that are not seed replicas"):
        P.ratio_between(c, mixed)
    seeds = [dict(r, seed=1, label="rope (1)") for r in other]
    assert P.ratio_between(c, [dict(r, seed=0, label="rope (0)") if r["scheme"] == "rope" else r for r in rows]
                           + seeds).verdict == P.MATCHED


def test_a_study_entry_may_be_several_folders_read_together(tmp_path):
    root = sweep(tmp_path)
    runs = sorted(os.path.join(root, d) for d in os.listdir(root))
    c = claim(rule="ppl_order", metric="ppl_rel", multiplier=2, order=["alibi", "rope"])
    alone, together = P.check_claims([c], {"pe": [runs[0], runs[:2]]})
    assert alone["verdict"] == P.NOT_COMPARABLE and together["verdict"] == P.MATCHED
    assert "| **c** (0_alibi + 1_rope)" in P.markdown([together])


def test_folders_of_one_name_under_two_studies_are_told_apart_in_the_table():
    names = P.short_names(["out/budget_pg19/2_rope", "out/budget_stdlib/2_rope", "docs/results/pe_pg19", "x/pe_pg19_6000"])
    assert names == {"out/budget_pg19/2_rope": "budget_pg19/2_rope", "out/budget_stdlib/2_rope": "budget_stdlib/2_rope",
                     "docs/results/pe_pg19": "pe_pg19", "x/pe_pg19_6000": "pe_pg19_6000"}


def test_a_folder_without_results_yet_leaves_its_claims_not_comparable(tmp_path):
    root = sweep(tmp_path)
    pending = tmp_path / "pending"
    pending.mkdir()
    (pending / "results.json").write_text(json.dumps({"status": "failed", "error": "killed", "results": []}))
    rope = os.path.join(root, sorted(os.listdir(root))[1])
    c = claim(rule="ppl_order", metric="ppl_rel", multiplier=2, order=["alibi", "rope"])
    (row,) = P.check_claims([c], {"pe": [[rope, str(pending)]]})
    assert row["verdict"] == P.NOT_COMPARABLE and row["ours"] == "no alibi result at 2 x L"
