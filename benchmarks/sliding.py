"""Sliding-window vs non-overlapping evaluation throughput at equal L.

    python benchmarks/sliding.py                                  # tiny model, L = 512, 1024, 2048, stride 256
    python benchmarks/sliding.py lengths=[256,512] stride=64 tokens=16384

Scored target tokens per second of the `stream` protocol (non-overlapping
windows) and of the `sliding` protocol (many windows per forward pass) on the
same N tokens, best of `repeats`, both through rope_lm.eval.evaluation's public
evaluate_lengths. Each sliding window runs L tokens through the model to score
`stride` of them, so the scored-token slowdown cannot fall below L / stride;
the forward-token column (tokens through the model per second) shows how close
to that floor the batched implementation comes. The weights are random: throughput depends on neither them
nor the token values. Settings: python benchmarks/sliding.py --help.
"""

import sys
import time

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="bench_sliding", version_base="1.3")
@hydra_task
def main(cfg):
    import numpy as np
    import torch

    from rope_lm.core.tables import markdown_table
    from rope_lm.core.typed import typed_dataclass
    from rope_lm.eval.evaluation import EvalConfig, evaluate_lengths
    from rope_lm.model.transformer import build_model

    a = OmegaConf.to_container(cfg, resolve=True)
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    torch.manual_seed(0)
    model = build_model(a["model"], {"name": "rope"}, None, vocab_size=a["vocab"], train_len=a["train_len"]).eval()
    n = (a["tokens"] // max(a["lengths"])) * max(a["lengths"])
    stream = np.random.default_rng(0).integers(0, a["vocab"], size=n + 1).astype(np.uint16)

    def tokens_per_s(L, **protocol):
        ecfg = typed_dataclass(
            EvalConfig,
            {"lengths": [L], "token_budget": n, "batch_tokens": a["batch_tokens"], "bootstrap": 0, **protocol},
            "eval.",
            "eval",
        )
        best = float("inf")
        for _ in range(a["repeats"]):
            t = time.perf_counter()
            rows = evaluate_lengths(model, stream, ecfg, a["train_len"])
            best = min(best, time.perf_counter() - t)
        return n / best, rows[0], best

    print(
        f"model {a['model'].get('name')}, {n} target tokens per length, stride {a['stride']}, "
        f"{torch.get_num_threads()} threads, best of {a['repeats']}"
    )
    rows = []
    for L in a["lengths"]:
        stream_tps, _, _ = tokens_per_s(L, protocol="stream")
        slide_tps, row, seconds = tokens_per_s(L, protocol="sliding", sliding_stride=a["stride"])
        forward_tps = row["windows"] * L / seconds  # stream: its forward tokens are its scored tokens
        floor = max(1.0, L / a["stride"])
        rows.append(
            [
                L,
                f"{stream_tps:,.0f}",
                f"{slide_tps:,.0f}",
                f"{stream_tps / slide_tps:.2f}x",
                f"{floor:.0f}x",
                f"{forward_tps:,.0f}",
                f"{stream_tps / forward_tps:.2f}x",
            ]
        )
        print(f"L={L} measured", file=sys.stderr, flush=True)
    print(
        markdown_table(
            [
                "L",
                "stream scored tok/s",
                "sliding scored tok/s",
                "slowdown",
                "floor L/stride",
                "sliding forward tok/s",
                "forward ratio",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
