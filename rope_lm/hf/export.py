"""export_hf: a rope-lm model as a transformers directory."""

import fnmatch
import json
import os

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import atomic_write, replaced_atomically
from rope_lm.hf.config import hf_config
from rope_lm.hf.families import exporting_family
from rope_lm.hf.weights import hf_state_dict

# What marks a folder as holding a transformers model (or its tokenizer): an export never writes over one.
MODEL_FILES = (
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
)


def refuse_model_folder(out_dir: str, setting: str = "out"):
    """ConfigError when out_dir holds a model already, naming its files."""
    if not os.path.isdir(out_dir):
        if os.path.exists(out_dir):
            raise ConfigError(f"{setting}={out_dir} is a file, not a folder; give a new folder to export into.")
        return
    held = sorted(f for f in os.listdir(out_dir) if any(fnmatch.fnmatch(f, p) for p in MODEL_FILES))
    if held:
        raise ConfigError(
            f"{setting}={out_dir} already holds a model ({', '.join(held)}); an export never overwrites "
            f"another model's files. Give a new folder (or remove these files yourself)."
        )


def export_hf(model, tokenizer_json: str | None, out_dir: str) -> dict:
    """Write config.json, model.safetensors and (when given) tokenizer.json
    that transformers.AutoModelForCausalLM.from_pretrained(out_dir) loads
    with the same logits; ConfigError, before writing anything, for a model
    transformers cannot express or a folder that holds a model already.
    Returns the config written."""
    config = hf_config(model)  # refuses first
    refuse_model_folder(out_dir)
    # The weights first and config.json last: a folder cut short by a kill has no config.json, so no loader takes
    # it for a whole model (and the next export into it is refused by its model.safetensors, not overwritten).
    family = exporting_family(model)
    _write_weights(
        hf_state_dict(model, family.mlp_prefix if family else "mlp"), os.path.join(out_dir, "model.safetensors")
    )
    if tokenizer_json is not None:
        atomic_write(os.path.join(out_dir, "tokenizer.json"), tokenizer_json)
        # AutoTokenizer reads the class from here; the vocabulary is all in tokenizer.json.
        atomic_write(
            os.path.join(out_dir, "tokenizer_config.json"), json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
        )
    atomic_write(os.path.join(out_dir, "config.json"), json.dumps(config, indent=2))
    return config


def _write_weights(tensors: dict, path: str):
    """save_file into a temporary file renamed into place (the weights can be large: streamed, not held
    twice in memory as atomic_write's bytes would be)."""
    from safetensors.torch import save_file

    with replaced_atomically(path) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
