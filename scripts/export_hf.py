"""Write a trained rope-lm checkpoint as a transformers model directory
(config.json, model.safetensors, tokenizer.json) that
AutoModelForCausalLM.from_pretrained(out) loads with the same logits.

    python scripts/export_hf.py ckpt=outputs/<run dir> out=exported/my-llama
    python scripts/export_hf.py ckpt=outputs/<run dir>/checkpoints/last.ckpt out=exported/my-llama

Only models transformers can express are written: pos=rope (pairing half,
every channel rotated), model.mlp=swiglu, and a method with an HF rope_type
and a fixed factor (none, pi, dynamic_ntk, yarn, llama3, longrope); others
are refused with the reason (docs/pretrained.md).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rope_lm.cli import user_errors  # noqa: E402
from rope_lm.errors import ConfigError  # noqa: E402


def parse(argv: list[str]) -> dict:
    args = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in ("ckpt", "out"):
            raise ConfigError(f"Argument {arg!r}: use ckpt=<run dir or .ckpt> out=<directory>.")
        args[key] = value
    missing = [k for k in ("ckpt", "out") if not args.get(k)]
    if missing:
        raise ConfigError(f"{' and '.join(k + '=' for k in missing)} required: ckpt=<run dir or .ckpt> out=<directory>.")
    return args


def main(argv: list[str]):
    from rope_lm.hf import export_checkpoint

    args = parse(argv)
    config = export_checkpoint(args["ckpt"], args["out"])
    print(f"wrote {config['architectures'][0]} ({config['rope_parameters']['rope_type']} RoPE) to {args['out']}")


if __name__ == "__main__":
    with user_errors():
        main(sys.argv[1:])
