"""(lead's interim copy; replaced by the helper's trained.py at merge)"""

from dataclasses import dataclass
import os

import torch

from rope_lm.config import split_data
from rope_lm.errors import ConfigError
from rope_lm.files import atomic_write


@dataclass
class Trained:
    lit: object
    source: str
    path: str

    @property
    def model(self):
        return self.lit.model

    @property
    def hparams(self):
        return self.lit.hparams

    @property
    def tokenizer_json(self):
        return getattr(self.lit, "tokenizer_json", None)


def open_model(source, device="auto", scaling=None, setting="ckpt"):
    from rope_lm.checkpointing import load_checkpoint

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not source:
        raise ConfigError(f"{setting}= is required")
    if source.startswith("hf:"):
        from rope_lm.hf import hf_lit

        lit, path = hf_lit(source[3:]).to(device).eval(), source
    else:
        lit, path = load_checkpoint(source, device, setting)
    if scaling:
        lit.model.set_scaling(scaling)
    return Trained(lit, source, path)


def read_start(source, setting="init_from"):
    from rope_lm.checkpointing import read_checkpoint, resolve_checkpoint

    if source.startswith("hf:"):
        from rope_lm.hf import hf_checkpoint

        saved, path = hf_checkpoint(source[3:]), source
    else:
        path = resolve_checkpoint(source, setting)
        saved = read_checkpoint(path)
    return {"path": path, "hyper_parameters": saved["hyper_parameters"], "state_dict": saved["state_dict"],
            "tokenizer_json": saved.get("tokenizer_json")}


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror}).") from None


def write_tokenizer(tokenizer_json, directory):
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path) or _read(path) != tokenizer_json:
        atomic_write(path, tokenizer_json)
    return path


def checkpoint_cache(lit, data_overrides, work_dir):
    from rope_lm.data import prepare

    data_options = {**(lit.hparams.get("data") or {}), **(data_overrides or {})}
    if lit.tokenizer_json:
        os.makedirs(work_dir, exist_ok=True)
        data_options["tokenizer_file"] = write_tokenizer(lit.tokenizer_json, work_dir)
    data_cfg, source = split_data(data_options)
    cache = prepare(data_cfg, source)
    if cache.vocab_size > lit.model.cfg.vocab_size:
        raise ConfigError("vocab")
    return cache, data_options
