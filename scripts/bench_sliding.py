"""Sliding-window vs non-overlapping evaluation throughput at equal L.

    python scripts/bench_sliding.py                      # tiny model, L = 512, 1024, 2048, stride 256
    python scripts/bench_sliding.py --lengths 256 512 --stride 64 --tokens 16384

Scored target tokens per second of the `stream` protocol (non-overlapping
windows) and of the `sliding` protocol (rope_lm.evaluation, many windows per
forward pass) on the same N tokens, best of --repeats. The weights are random:
throughput does not depend on them, nor on the token values.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv):
    import numpy as np
    import torch
    import yaml

    from rope_lm.evaluation import _sliding, _stream
    from rope_lm.model import build_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="conf/model/<name>.yaml")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--stride", type=int, default=256)
    p.add_argument("--tokens", type=int, default=8192, help="target tokens scored at every length")
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with open(os.path.join(ROOT, "conf", "model", f"{args.model}.yaml")) as f:
        model_cfg = yaml.safe_load(f)
    torch.manual_seed(0)
    model = build_model(model_cfg, {"name": "rope"}, None, vocab_size=args.vocab, train_len=args.train_len).eval()
    n = (args.tokens // max(args.lengths)) * max(args.lengths)
    stream = np.random.default_rng(0).integers(0, args.vocab, size=n + 1).astype(np.uint16)

    def best(fn):
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    print(f"model {args.model}, {n} target tokens per length, stride {args.stride}, "
          f"{torch.get_num_threads()} threads, best of {args.repeats}")
    print("| L | stream tok/s | sliding tok/s | windows | slowdown |")
    print("|---|---|---|---|---|")
    for L in args.lengths:
        t_stream = best(lambda: _stream(model, stream, L, n, args.train_len, args.batch_tokens, 32))
        windows = []
        t_slide = best(lambda: windows.append(
            _sliding(model, stream, L, n, args.stride, args.train_len, args.batch_tokens, 32)[0]["windows"]))
        print(f"| {L} | {n / t_stream:,.0f} | {n / t_slide:,.0f} | {windows[0]} | {t_slide / t_stream:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
