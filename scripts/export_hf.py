"""Write a trained rope-lm checkpoint as a transformers model directory
(config.json, model.safetensors, tokenizer.json) that
AutoModelForCausalLM.from_pretrained(out) loads with the same logits.

    python scripts/export_hf.py ckpt=outputs/<run dir> out=exported/my-llama
    python scripts/export_hf.py ckpt=outputs/<run dir>/checkpoints/last.ckpt out=exported/my-llama

Only models transformers can express are written: pos=rope (pairing half,
every channel rotated), model.mlp=swiglu, and a method with an HF rope_type
and a fixed factor (none, pi, dynamic_ntk, yarn, llama3, longrope) as a
Llama / Qwen2; a layout or the block options of the 2025 families as the
family that has them (SmolLM3, Qwen3, Gemma 3, Cohere2, gpt-oss, Llama 4);
others are refused with the reason (docs/pretrained.md).
"""

import hydra

from rope_lm.cli import hydra_task
from rope_lm.core.errors import ConfigError


@hydra.main(config_path="../conf", config_name="export_hf", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.runs.export import export_checkpoint

    missing = [k for k in ("ckpt", "out") if not cfg[k]]
    if missing:
        raise ConfigError(
            f"{' and '.join(k + '=' for k in missing)} required: ckpt=<run dir or .ckpt> out=<directory>."
        )
    config = export_checkpoint(cfg.ckpt, cfg.out)
    rope = config["rope_parameters"]
    # Gemma 3 keeps one set of parameters per layer type
    types = sorted({p["rope_type"] for p in rope.values()} if "rope_type" not in rope else {rope["rope_type"]})
    print(f"wrote {config['architectures'][0]} ({' / '.join(types)} RoPE) to {cfg.out}")


if __name__ == "__main__":
    main()
