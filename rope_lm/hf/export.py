"""export_hf: a rope-lm model as a transformers directory."""

import contextlib
import fnmatch
import json
import os

from rope_lm.core.errors import FULL, ConfigError, OutputError, size_text, write_failure, write_problem
from rope_lm.core.files import atomic_write, build_folder, replaced_atomically
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
    family = exporting_family(model)
    tensors = hf_state_dict(model, family.mlp_prefix if family else "mlp")
    files = {"model.safetensors": tensors}
    if tokenizer_json is not None:
        files["tokenizer.json"] = tokenizer_json
        # AutoTokenizer reads the class from here; the vocabulary is all in tokenizer.json.
        files["tokenizer_config.json"] = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    files["config.json"] = json.dumps(config, indent=2)
    try:
        if os.path.isdir(out_dir):  # a folder of the user's (no model in it): the files are added, each whole
            _write_files(out_dir, files, undo=True)
        else:  # a new folder: made aside and renamed into place, so a failed export leaves none
            build_folder(out_dir, lambda tmp: _write_files(tmp, files), "model export")
    except (OutputError, OSError) as e:  # OSError: the folder itself could not be made
        failed = e if isinstance(e, OutputError) else write_failure(out_dir, e)
        path = os.path.join(out_dir, os.path.basename(failed.failure["path"])) if failed.failure else out_dir
        if os.path.isdir(out_dir):
            kept = (
                f"Nothing of this export was kept: the files it had written were removed, and {out_dir} is as it was."
            )
        else:
            kept = f"Nothing of this export was kept: {out_dir} was not made."
        if write_problem(failed.failure["error"] if failed.failure else e) == FULL:
            need = sum(t.numel() * t.element_size() for t in tensors.values())
            need += sum(len(v) for v in files.values() if isinstance(v, str))
            kept += f" The export takes about {size_text(need)}."
        raise failed.reworded(path=path, kept=kept, setting="out=") from None
    return config


def _write_files(folder: str, files: dict, undo: bool = False):
    """The weights first and config.json last: a folder cut short by a kill has no config.json, so no loader takes
    it for a whole model (and the next export into it is refused by its model.safetensors, not overwritten).
    undo: a failed write removes the files written before it (none of them was there before: refuse_model_folder)."""
    done = []
    try:
        for name, content in files.items():
            path = os.path.join(folder, name)
            if name.endswith(".safetensors"):
                _write_weights(content, path)
            else:
                atomic_write(path, content)
            done.append(path)
    except BaseException:
        for path in done if undo else []:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise


def _write_weights(tensors: dict, path: str):
    """save_file into a temporary file renamed into place (the weights can be large: streamed, not held
    twice in memory as atomic_write's bytes would be)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    with replaced_atomically(path, errors=(OSError, SafetensorError)) as tmp:  # a full disk: SafetensorError
        save_file(tensors, tmp, metadata={"format": "pt"})
