"""export_hf: a rope-lm model as a transformers directory."""

import json
import os

from rope_lm.hf.config import hf_config
from rope_lm.hf.weights import hf_state_dict


def export_hf(model, tokenizer_json: str | None, out_dir: str) -> dict:
    """Write config.json, model.safetensors and (when given) tokenizer.json
    that transformers.AutoModelForCausalLM.from_pretrained(out_dir) loads
    with the same logits; ConfigError, before writing anything, for a model
    transformers cannot express. Returns the config written."""
    from safetensors.torch import save_file

    config = hf_config(model)  # refuses first
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file(hf_state_dict(model), os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    if tokenizer_json is not None:
        with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tokenizer_json)
        # AutoTokenizer reads the class from here; the vocabulary is all in tokenizer.json.
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return config


def export_checkpoint(ckpt: str, out_dir: str) -> dict:
    """export_hf for a rope-lm checkpoint (.ckpt or run directory), with the
    tokenizer stored in it."""
    from rope_lm.diagnostics import load_checkpoint

    lit, _ = load_checkpoint(ckpt)
    return export_hf(lit.model, lit.tokenizer_json, out_dir)
