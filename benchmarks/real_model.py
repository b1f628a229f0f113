"""rope-lm's evaluation forward against a plain transformers loop on a real
pretrained model (SmolLM2-135M from the real-model extra by default).

Both score one window of L tokens of PG-19 text: rope-lm through
rope_lm.eval.evaluation.token_losses (the path every evaluation takes: the
chunked head, rope_lm/model/head.py), transformers as a user would write it
(`model(ids).logits`, then the cross-entropy). Each (peer, length, round)
runs in a fresh process, so its peak RSS is its own; a warm-up forward of 256
tokens comes first in each. The two peers alternate (rope-lm, transformers,
rope-lm, ...) for `rounds` rounds (benchmarks/paired.py): seconds are medians
with their range, and the speed ratio is read only where both sides' spread is
within `spread_limit` ("spread too wide to read a ratio" otherwise). Both
perplexities are printed: they must agree.

    python benchmarks/real_model.py
    python benchmarks/real_model.py lengths=[512,1024] rounds=5

Settings: python benchmarks/real_model.py --help.
"""

import multiprocessing as mp
import os
import sys

import hydra
from omegaconf import OmegaConf
from paired import alternate, check, compare, report, rule_text

from rope_lm.cli import hydra_task

PEERS = ("rope-lm", "transformers")


def _tokens(folder: str, text: str, n: int) -> list[int]:
    from transformers import AutoTokenizer

    from rope_lm.core.errors import ConfigError

    files = sorted(os.path.join(text, f) for f in os.listdir(text)) if os.path.isdir(text) else [text]
    tok = AutoTokenizer.from_pretrained(folder)
    ids: list[int] = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tok(f.read())["input_ids"]
        if len(ids) > n:
            return ids[: n + 1]
    raise ConfigError(f"text={text} holds {len(ids)} tokens; the longest length needs {n + 1}. Give more text.")


def _measure(peer: str, folder: str, ids: list[int], threads: int | None, queue):
    """In a fresh process: one warm-up, one timed forward; seconds, loss, peak RSS."""
    import resource
    import time

    import torch
    from torch.nn import functional as F

    if threads:
        torch.set_num_threads(threads)
    x = torch.tensor(ids[:-1])[None]
    y = torch.tensor(ids[1:])[None]
    if peer == "rope-lm":
        from rope_lm.eval.evaluation import token_losses
        from rope_lm.runs.trained import open_model

        model = open_model("hf:" + folder, device="cpu").model

        def loss(a, b):
            return token_losses(model, a, b, batch_tokens=a.shape[1]).mean()
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        model.config._attn_implementation = "sdpa"

        def loss(a, b):
            with torch.no_grad():
                logits = model(a).logits
            return F.cross_entropy(logits.float().flatten(0, 1), b.flatten())

    loss(x[:, :256], y[:, :256])
    t0 = time.perf_counter()
    value = float(loss(x, y))
    seconds = time.perf_counter() - t0
    queue.put({"seconds": seconds, "loss": value, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def _run(peer, folder, ids, threads) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(peer, folder, ids, threads, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


@hydra.main(config_path="../conf", config_name="bench_real_model", version_base="1.3")
@hydra_task
def main(cfg):
    import math

    import torch

    from rope_lm.core.errors import ConfigError
    from rope_lm.core.files import write_json
    from rope_lm.core.tables import markdown_table
    from rope_lm.hf.gguf import converted_folder, is_gguf

    a = OmegaConf.to_container(cfg, resolve=True)
    if not a["lengths"] or any(int(L) < 257 for L in a["lengths"]):
        raise ConfigError(f"lengths={a['lengths']} must be lengths above 256 (the warm-up's).")
    check(a["rounds"], a["spread_limit"])
    limit = a["spread_limit"]
    source = a["source"]
    folder = converted_folder(source) if is_gguf(source) else source
    ids = _tokens(folder, a["text"], max(a["lengths"]))
    print(
        f"{source} -> {folder}; torch {torch.__version__}, {a['threads'] or torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    print(rule_text(a["rounds"], limit))
    rows, records, verdicts = [], [], []
    for L in a["lengths"]:
        # Alternated (rope-lm, transformers, rope-lm, ...), each forward in a fresh process, so a drift in the
        # machine's load falls on both.
        sides = [(peer, lambda peer=peer: _run(peer, folder, ids[: L + 1], a["threads"])) for peer in PEERS]

        def log(text, L=L):
            print(f"[L={L}] {text}", file=sys.stderr, flush=True)

        runs = alternate(sides, a["rounds"], log=log).results
        secs = {p: [r["seconds"] for r in runs[p]] for p in PEERS}
        c = compare(f"L={L}", "transformers", secs["transformers"], "rope-lm", secs["rope-lm"], limit, "s")
        verdicts.append(c)
        med = {"rope-lm": c.bottom_spread.median, "transformers": c.top_spread.median}
        peak = {p: max(r["peak_mb"] for r in runs[p]) for p in PEERS}
        ppl = {p: math.exp(runs[p][0]["loss"]) for p in PEERS}
        rows.append(
            [
                L,
                c.bottom_spread.cell(),
                c.top_spread.cell(),
                f"{L / med['rope-lm']:.0f}",
                f"{L / med['transformers']:.0f}",
                c.ratio_text(),
                f"{peak['rope-lm']:.0f}",
                f"{peak['transformers']:.0f}",
                f"{ppl['rope-lm']:.3f}",
                f"{ppl['transformers']:.3f}",
            ]
        )
        records.append(
            {
                "length": L,
                "seconds": med,
                "peak_mb": peak,
                "ppl": ppl,
                "ratio": c.ratio,
                "comparison": c.record(),
                "runs": runs,
            }
        )
    print(
        markdown_table(
            [
                "L",
                "rope-lm s",
                "transformers s",
                "rope-lm tok/s",
                "transformers tok/s",
                "ratio (speed, >= 1.0 is the target)",
                "rope-lm peak MB",
                "transformers peak MB",
                "rope-lm PPL",
                "transformers PPL",
            ],
            rows,
        )
    )
    print("\nEach comparison: median (min-max, spread) of each side, then the ratio of medians\n")
    print(report(verdicts))
    if a["out"]:
        write_json(
            a["out"],
            {
                "source": source,
                "folder": folder,
                "text": a["text"],
                "rounds": a["rounds"],
                "spread_limit": limit,
                "results": records,
            },
        )


if __name__ == "__main__":
    main()
