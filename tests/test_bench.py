"""benchmarks/bench.py runs end to end at a toy size and writes its JSON.
Smoke only: no timing is asserted (the machine is shared and timings vary).
The timing rule they share (benchmarks/paired.py) is tested with fake clocks
in tests/test_paired_timing.py."""

import json
import os
import re
import sys

import yaml

from tests import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_toy_run_writes_json(tmp_path):
    model = tmp_path / "toy.yaml"
    model.write_text(yaml.safe_dump({"name": "toy", "n_layer": 1, "n_head": 2, "d_model": 48, "mlp_ratio": 4.0}))
    out = tmp_path / "bench.json"
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench.py"),
            f"models=[{model}]",
            "schemes=[rope]",
            "vocab_size=300",
            "seq_len=16",
            "batch_size=2",
            "warmup=1",
            "steps=1",
            "repeats=1",
            "eval_lengths=[32]",
            "eval_rounds=2",
            "threads=1",
            "peers=[hf,plain,lightning]",
            f"out={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()  # the app writes only its out= file
    saved = json.loads(out.read_text())
    for key in ("machine", "load_average", "settings", "rows", "ratios", "targets", "table", "notes", "git_commit"):
        assert key in saved, key
    assert {"nproc", "cpu", "torch", "transformers", "threads"} <= set(saved["machine"])
    train = {r["peer"]: r for r in saved["rows"] if r["phase"] == "train"}
    assert set(train) == {"hf", "plain", "lightning"}, train
    for row in train.values():
        assert row["tokens_per_s"] > 0 and row["params"] > 0 and row["peak_mem_mb"] > 0, row
    # Equal parameters by construction (Llama's SwiGLU sized at 2/3 of mlp_ratio * d).
    assert train["hf"]["params"] == train["plain"]["params"]
    evals = {r["peer"]: r for r in saved["rows"] if r["phase"] == "eval"}
    assert set(evals) == {"ours", "hf"} and all(r["seq_len"] == 32 and r["tokens_per_s"] > 0 for r in evals.values())
    assert all(len(r["tokens_per_s_repeats"]) == 2 for r in evals.values())  # eval_rounds alternated processes
    assert {t["target"] for t in saved["targets"]} >= {"ours/HF (plain loops) >= 1.1", "Lightning/plain (rope) >= 0.95"}
    # One training round shows no spread: its ratios are not read, and the targets say so instead of holding.
    train_targets = [t for t in saved["targets"] if t["target"].startswith(("ours/HF", "Lightning/plain"))]
    assert train_targets and all(t["holds"] is None and "1 round" in t["why"] for t in train_targets)
    assert all("ratio_of_medians" in r and "median_of_round_ratios" in r for r in saved["ratios"])
    assert "| toy | rope | train | lightning |" in saved["table"]
    assert "[?] toy: ours/HF (plain loops) >= 1.1: spread too wide to read a ratio" in done.stdout


def test_bench_help_and_bad_setting(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "bench.py")
    done = forked.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "python benchmarks/bench.py" in done.stdout and "eval_lengths" in done.stdout
    done = forked.run(
        [sys.executable, script, "peers=[hf,nosuch]", "repeats=0", "eval_lengths=[]"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "configuration error: Unknown bench peer(s) nosuch" in done.stderr
    assert len(done.stderr.strip().split("\n\n")) == 1 and "Traceback" not in done.stderr + done.stdout


def test_decoding_benchmark_compares_the_same_tokens(tmp_path):
    """benchmarks/decoding.py at a toy size: the cached cell gives the tokens of re-reading, and transformers'
    cached decoding of the exported weights gives the same greedy tokens (a wrong cache argument would not)."""
    done = forked.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "decoding.py"),
            "models=[llama_tiny]",
            "contexts=[48]",
            "new_tokens=4",
            "train_len=32",
            "vocab=300",
            "threads=1",
            "rounds=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| llama_tiny | 48 |")]
    assert len(rows) == 2, done.stdout
    assert all(row.rstrip(" |").endswith("yes") for row in rows), done.stdout
    # The sides alternate (cache, re-reading, transformers) in each of the 2 rounds, and each comparison ends
    # in a ratio or in the verdict, never in a bare ratio of a spread it cannot stand.
    rounds = [line for line in done.stderr.splitlines() if line.startswith("[llama_tiny C=48] round")]
    assert [r.split(" (")[0] for r in rounds] == ["[llama_tiny C=48] round 1/2", "[llama_tiny C=48] round 2/2"]
    assert all(r.index("rope-lm") < r.index("re-reading") < r.index("transformers") for r in rounds)
    verdicts = [line for line in done.stdout.splitlines() if line.startswith(("one cell,", "decode step", "prefill"))]
    assert len(verdicts) == 3, done.stdout
    assert all(re.search(r"over [\w-]+: (\d+\.\d+x|spread too wide to read a ratio \()", v) for v in verdicts)
    done = forked.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "decoding.py"), "rounds=0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "rounds=0 must be a positive number of alternated rounds" in done.stderr


def test_flops_per_token_counts_the_keys_each_layer_reads():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_analysis import flops_per_token

    shape = {"n_layer": 4, "d_model": 8, "tie_embeddings": False}
    counts = {"params_non_embedding": 1000}
    assert flops_per_token(counts, shape, 50, 1024, False) == 2 * 1000 + 4 * (4 * 1024) * 8
    windowed = {
        **shape,
        "layout": {"pattern": [{"window": 64}, {"window": 64}, {"window": 64}, {"pos": {"name": "nope"}}]},
    }
    assert flops_per_token(counts, windowed, 50, 1024, True) == 6 * 1000 + 12 * (3 * 64 + 1024) * 8
    assert flops_per_token(counts, windowed, 50, 32, False) == 2 * 1000 + 4 * (4 * 32) * 8  # a window past T reads T
