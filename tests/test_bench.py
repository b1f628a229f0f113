"""benchmarks/bench.py runs end to end at a toy size and writes its JSON.
Smoke only: no timing is asserted (the machine is shared and timings vary)."""

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_toy_run_writes_json(tmp_path):
    model = tmp_path / "toy.yaml"
    model.write_text(yaml.safe_dump({"name": "toy", "n_layer": 1, "n_head": 2, "d_model": 48, "mlp_ratio": 4.0}))
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench.py"), f"models=[{model}]",
                           "schemes=[rope]", "vocab_size=300", "seq_len=16", "batch_size=2", "warmup=1", "steps=1",
                           "repeats=1", "eval_lengths=[32]", "threads=1", "peers=[hf,plain,lightning]", f"out={out}"],
                          cwd=tmp_path, capture_output=True, text=True)
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
    assert {t["target"] for t in saved["targets"]} >= {"ours/HF (plain loops) >= 1.1", "Lightning/plain (rope) >= 0.95"}
    assert "| toy | rope | train | lightning |" in saved["table"]


def test_bench_help_and_bad_setting(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "bench.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "python benchmarks/bench.py" in done.stdout and "eval_lengths" in done.stdout
    done = subprocess.run([sys.executable, script, "peers=[hf,nosuch]", "repeats=0", "eval_lengths=[]"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "configuration error: Unknown bench peer(s) nosuch" in done.stderr
    assert len(done.stderr.strip().split("\n\n")) == 1 and "Traceback" not in done.stderr + done.stdout
