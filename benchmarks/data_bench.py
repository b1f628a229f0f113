"""Token-cache build throughput and peak memory on a generated corpus.

    python benchmarks/data_bench.py                          # 1 GB, data.num_proc = 1 and 2
    python benchmarks/data_bench.py size_gb=10 procs=[16] memory_mb=2048

The corpus is ``size_gb`` of made-up English-like prose (Zipf-distributed
words, 70-character lines) in ``book_mb`` .txt files, generated once. Each
build runs in a fresh process (rope_lm.data.token_cache.prepare: plan + fingerprint,
tokenizer training, tokenization, checksums) into an empty cache folder; the
benchmark samples the build's process tree every 0.2 s and reports its peak
resident memory (RSS of the main process, largest worker, and the tree's PSS,
which counts pages shared by forked workers once). Settings: --help.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task

BUILD = """
import dataclasses, json, logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
from rope_lm.data.token_cache import DataConfig, prepare
from rope_lm.data.corpus import SourceConfig
import pyarrow, tokenizers, tqdm.auto
with open("/proc/self/statm") as f:
    base = int(f.read().split()[1]) * resource.getpagesize() / 2**20
options = json.loads(sys.argv[1])
source_keys = {f.name for f in dataclasses.fields(SourceConfig)}
data = DataConfig(**{k: v for k, v in options.items() if k not in source_keys})
source = SourceConfig(**{k: v for k, v in options.items() if k in source_keys})
cache = prepare(data, source)
with open("/proc/self/status") as f:  # VmHWM: ru_maxrss would keep the parent's size from before exec
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
print("RESULT", json.dumps({"tokens": sum(cache.meta["tokens"].values()), "base_rss_mb": base,
      "main_rss_mb": peak,
      "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def generate(directory: str, size_gb: float, book_mb: float, seed: int) -> int:
    """Write the corpus unless a complete one is there; return its bytes."""
    import numpy as np

    done = os.path.join(directory, ".complete")
    want = f"{size_gb}:{book_mb}:{seed}"
    if os.path.exists(done) and open(done).read() == want:
        return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".txt"))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1 / np.arange(1, 27) ** 0.9
    words = ["".join(rng.choice(letters, rng.integers(1, 11), p=weights / weights.sum())) for _ in range(20_000)]
    zipf = 1 / np.arange(1, len(words) + 1)
    picks = rng.choice(len(words), size=2_000_000, p=zipf / zipf.sum())
    text = " ".join(words[i] for i in picks)
    text = text.replace(" the ", ". The ")
    lines = [text[i : i + 70] + "\n" for i in range(0, len(text), 70)]  # a pool of ~16 MB of lines
    book_lines = max(1, int(book_mb * 2**20 / 71))
    total, n = 0, 0
    while total < size_gb * 2**30:
        start = int(rng.integers(0, len(lines) - book_lines)) if len(lines) > book_lines else 0
        body = f"Book {n}\n" + "".join(lines[start : start + book_lines])
        with open(os.path.join(directory, f"book{n:06d}.txt"), "w") as f:
            f.write(body)
        total += len(body)
        n += 1
    with open(done, "w") as f:
        f.write(want)
    return total


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
    except OSError:
        return 0.0


def build(options: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD, json.dumps(options)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    peak = [0.0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_pss_mb(p) for p in _tree(proc.pid)))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = proc.stdout.read()
    proc.wait()
    seconds = time.perf_counter() - started
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"the build failed:\n{log[-3000:]}")
    result = json.loads(log.split("RESULT", 1)[1])
    encode = re.search(r"Tokenized ([\d.]+) MB in ([\d.]+) s", log)
    return {
        **result,
        "seconds": seconds,
        "tree_pss_mb": peak[0],
        "encoded_mb": float(encode.group(1)),
        "encode_seconds": float(encode.group(2)),
    }


@hydra.main(config_path="../conf", config_name="bench_data", version_base="1.3")
@hydra_task
def main(cfg):
    a = OmegaConf.to_container(cfg, resolve=True)
    t = time.perf_counter()
    size = generate(a["corpus_dir"], a["size_gb"], a["book_mb"], a["seed"])
    print(f"corpus: {size / 1e6:.0f} MB in {a['corpus_dir']} ({time.perf_counter() - t:.0f} s to generate or find)")
    rows = []
    for n in a["procs"]:
        cache_dir = tempfile.mkdtemp(prefix="bench-data-cache-")
        try:
            r = build(
                {
                    "name": "bench",
                    "source": "files",
                    "path": a["corpus_dir"],
                    "cache_dir": cache_dir,
                    "num_proc": n,
                    "memory_mb": a["memory_mb"],
                    "vocab_size": a["vocab_size"],
                    "tokenizer_train_chars": a["tokenizer_train_chars"],
                    "max_docs": a["max_docs"],
                }
            )
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        r.update(
            num_proc=n,
            memory_mb=a["memory_mb"],
            build_mb_per_s=r["encoded_mb"] / r["seconds"],
            encode_mb_per_s=r["encoded_mb"] / r["encode_seconds"],
        )
        rows.append(r)
        print(
            f"num_proc={n}: {r['encoded_mb']:.0f} MB, {r['tokens']:,} tokens in {r['seconds']:.0f} s "
            f"({r['build_mb_per_s']:.2f} MB/s whole build, {r['encode_mb_per_s']:.2f} MB/s tokenizing); peak "
            f"memory: tree PSS {r['tree_pss_mb']:.0f} MB, main RSS {r['main_rss_mb']:.0f} MB (after imports "
            f"{r['base_rss_mb']:.0f} MB), "
            f"largest worker RSS {r['worker_rss_mb']:.0f} MB",
            flush=True,
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "load_average": load,
        "corpus_mb": size / 1e6,
        "settings": a,
        "rows": rows,
    }
    print(f"load average at the end: {load}")
    if a["out"]:
        with open(a["out"], "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
