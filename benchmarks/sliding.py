"""Sliding-window vs non-overlapping evaluation throughput at equal L.

    python benchmarks/sliding.py                                  # tiny model, L = 512, 1024, 2048, stride 256
    python benchmarks/sliding.py lengths=[256,512] stride=64 tokens=16384

Scored target tokens per second of the `stream` protocol (non-overlapping
windows) and of the `sliding` protocol (many windows per forward pass) on the
same N tokens, both through rope_lm.eval.evaluation's public evaluate_lengths,
the two protocols alternated for `rounds` rounds in this one process
(benchmarks/paired.py): medians with their range, and a ratio read only where
both sides' spread is within `spread_limit` ("spread too wide to read a
ratio" otherwise). Each sliding window runs L tokens through the model to score
`stride` of them, so the scored-token slowdown cannot fall below L / stride;
the forward-token column (tokens through the model per second) shows how close
to that floor the batched implementation comes. The weights are random: throughput depends on neither them
nor the token values. Settings: python benchmarks/sliding.py --help.
"""

import sys

import hydra
from omegaconf import OmegaConf
from paired import Spread, alternate, check, compare, report, rule_text

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
    check(a["rounds"], a["spread_limit"])
    limit = a["spread_limit"]
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    torch.manual_seed(0)
    model = build_model(a["model"], {"name": "rope"}, None, vocab_size=a["vocab"], train_len=a["train_len"]).eval()
    n = (a["tokens"] // max(a["lengths"])) * max(a["lengths"])
    stream = np.random.default_rng(0).integers(0, a["vocab"], size=n + 1).astype(np.uint16)

    def evaluate(L, **protocol):
        ecfg = typed_dataclass(
            EvalConfig,
            {"lengths": [L], "token_budget": n, "batch_tokens": a["batch_tokens"], "bootstrap": 0, **protocol},
            "eval.",
            "eval",
        )
        return lambda: evaluate_lengths(model, stream, ecfg, a["train_len"])[0]

    print(
        f"model {a['model'].get('name')}, {n} target tokens per length, stride {a['stride']}, "
        f"{torch.get_num_threads()} threads"
    )
    print(rule_text(a["rounds"], limit))
    rows, verdicts = [], []
    for L in a["lengths"]:
        sides = [
            ("stream", evaluate(L, protocol="stream")),
            ("sliding", evaluate(L, protocol="sliding", sliding_stride=a["stride"])),
        ]
        timed = alternate(
            sides, a["rounds"], log=lambda text, L=L: print(f"[L={L}] {text}", file=sys.stderr, flush=True)
        )
        # Scored targets per second: the slowdown is stream's over sliding's.
        c = compare(
            f"L={L} scored tok/s",
            "stream",
            [n / t for t in timed.seconds["stream"]],
            "sliding",
            [n / t for t in timed.seconds["sliding"]],
            limit,
        )
        windows = timed.results["sliding"][0]["windows"]
        forward = Spread.of(windows * L / t for t in timed.seconds["sliding"])  # tokens through the model per second
        f = compare(
            f"L={L} stream scored / sliding forward tok/s",
            "stream",
            c.top_spread.values,
            "sliding forward",
            forward.values,
            limit,
        )
        verdicts += [c, f]
        floor = max(1.0, L / a["stride"])
        rows.append(
            [
                L,
                c.top_spread.cell(),
                c.bottom_spread.cell(),
                c.ratio_text(),
                f"{floor:.0f}x",
                forward.cell(),
                f.ratio_text(),
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
    print("\nEach comparison: median (min-max, spread) of each side, then the ratio of medians\n")
    print(report(verdicts))


if __name__ == "__main__":
    main()
