"""The one front door to a trained model: a rope-lm checkpoint (a .ckpt file
or a run folder) or a transformers model (`hf:<folder or hub name>`), opened
for study (evaluation, diagnostics, retrieval, export) or read as the start
of a fine-tune, with the tokenizer it carries and its own corpus.

    t = open_model("outputs/<run>")          # or "hf:HuggingFaceTB/SmolLM-135M"
    t.model, t.train_len, t.tokenizer_json

Every path that reads a trained model comes through here, so the checks
(a missing file, a file that is not a checkpoint, a model this version cannot
build) and their messages are the same whichever script the user ran.
"""

from dataclasses import dataclass
import functools
import hashlib
import os
import re

import torch

from rope_lm.core.devices import resolve_device
from rope_lm.core.errors import ConfigError
from rope_lm.core.files import atomic_write
from rope_lm.model.layout import UNRESOLVED
from rope_lm.train.checkpointing import load_checkpoint, read_checkpoint, resolve_checkpoint

HF = "hf:"


@dataclass
class Trained:
    lit: "LitLM"  # noqa: F821  (eval mode, on the device)
    source: str  # as the user gave it, kept verbatim for results
    path: str  # the checkpoint file read (absolute), or "hf:<name>" for an imported model

    @property
    def model(self):
        return self.lit.model

    @property
    def hparams(self):
        return self.lit.hparams

    @property
    def tokenizer_json(self) -> str | None:
        return getattr(self.lit, "tokenizer_json", None)

    @property
    def train_len(self) -> int:
        return self.lit.model.cfg.train_len

    @property
    def train_positions(self) -> str:
        """How training drew its position ids, as compare.py labels it (none, pose-x16, randomized-x16)."""
        from rope_lm.train_positions import train_positions_label

        return train_positions_label(self.hparams.get("train_pos"))

    @property
    def settings(self) -> dict:
        """What the model was trained with (model, pos, data, optim, steps, seed) as plain data: what a
        comparison tells two checkpoints of one scheme apart by (rope_lm.compare.labels)."""
        from omegaconf import OmegaConf

        plain = lambda v: OmegaConf.to_container(v) if OmegaConf.is_config(v) else dict(v) if isinstance(v, dict) else v
        return {
            k: plain(self.hparams[k])
            for k in ("model", "pos", "data", "optim", "max_steps", "train_pos", "seed")
            if k in self.hparams
        }

    @property
    def scheme(self) -> str:
        """The scheme as the run's results.json names it: the positional scheme with a layout's and the
        softmax options' tags (rope+nope_every_4, rope+ssmax), so a diagnostic's rows match the run's."""
        from rope_lm.model.layout import scheme_label

        hp = self.hparams
        model = hp.get("model")
        return scheme_label(dict(hp["pos"]), dict(model) if isinstance(model, dict) else None)

    @property
    def step(self) -> int | None:
        """The training step the checkpoint was written at (None for an imported model)."""
        return getattr(self.lit, "trained_step", None)

    @functools.cached_property
    def weights_digest(self) -> str:
        """A checksum of the weights: what tells a continued evaluation that it reads the same model,
        whatever path names it (a copy, a symlink, a relative path) and whatever file was rewritten
        under that path since."""
        return weights_digest(self.model)

    @property
    def identity(self) -> dict:
        """The model by content, as a resumable result records it: the weights' checksum and the step."""
        return {"weights": self.weights_digest, "step": self.step}

    @property
    def imported(self) -> bool:
        return self.path.startswith(HF)

    def tokenizer(self):
        """The tokenizers.Tokenizer the model was trained with."""
        from tokenizers import Tokenizer

        if not self.tokenizer_json:
            raise ConfigError(
                f"{self.source} carries no tokenizer (a checkpoint from before tokenizers were stored "
                f"in checkpoints, or a model folder without tokenizer.json); retrain, or use a model "
                f"that has one."
            )
        return Tokenizer.from_str(self.tokenizer_json)


def weights_digest(model) -> str:
    """A checksum of a model's weights (its state dict, names and bytes): equal for a trained model in
    memory and the same model read back from its checkpoint."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _required(source: str | None, setting: str):
    if not source:
        raise ConfigError(
            f"{setting}= is required: a .ckpt file, a run directory with checkpoints/last.ckpt, or "
            f"hf:<model folder or hub name>."
        )


def _hf_name(source: str, setting: str) -> str | None:
    """The folder or hub name of `hf:<name>`, None for a rope-lm checkpoint."""
    if not source.startswith(HF):
        return None
    name = source[len(HF) :]
    if not name.strip():
        raise ConfigError(
            f"{setting}={source!r} names no model: give hf:<model folder or hub name>, e.g. "
            f"hf:HuggingFaceTB/SmolLM-135M."
        )
    return name


def open_model(
    source: str,
    device: str = "auto",
    scaling: dict | None = None,
    setting: str = "ckpt",
    layers=UNRESOLVED,
    scaled_layers=None,
    sliding_window: str = "auto",
) -> Trained:
    """A trained model in eval mode on `device` ("auto": cuda when there is
    one), optionally under another extrapolation method (`scaling`, options
    as the scaling config group gives them) instead of the one it was
    trained with. A bad source is a ConfigError naming `setting`. `layers`:
    a rope-lm checkpoint's layer specs where the caller resolved its run's
    settings already (RunConfig.layers); left out, they are resolved here,
    once, from the checkpoint's settings. `scaled_layers`: for an imported
    model, the layers a method acts on (rope_lm.hf.load.name_layers), and
    `sliding_window`: "ignore" gives its sliding-window layers full attention."""
    _required(source, setting)
    device = resolve_device(device)
    name = _hf_name(source, setting)
    if name is not None:
        from rope_lm.hf.load import hf_lit

        lit, path = (
            hf_lit(name, sliding_window=sliding_window, scaled_layers=scaled_layers).to(device).eval(),
            HF + name,
        )
    else:
        lit, ckpt = load_checkpoint(source, device, setting, layers)
        path = os.path.abspath(ckpt)
    if scaling:
        lit.model.set_scaling(scaling)
        if name is not None:
            from rope_lm.hf.load import check_windowed_layers

            check_windowed_layers(lit.model)
    return Trained(lit=lit, source=source, path=path)


def read_start(source: str, setting: str = "init_from") -> dict:
    """What a fine-tune starts from, without building a model:
    {"path", "hyper_parameters", "state_dict", "tokenizer_json"}; "path" is
    the checkpoint file read, or "hf:<name>"."""
    _required(source, setting)
    name = _hf_name(source, setting)
    if name is not None:
        from rope_lm.hf.load import hf_checkpoint

        saved, path = hf_checkpoint(name), HF + name
    else:
        path = resolve_checkpoint(source, setting)
        saved = read_checkpoint(path)
    return {
        "path": path,
        "hyper_parameters": saved["hyper_parameters"],
        "state_dict": saved["state_dict"],
        "tokenizer_json": saved.get("tokenizer_json"),
    }


def output_home(path: str, kind: str) -> str:
    """Where a study of the model at `path` (a checkpoint file or
    `hf:<name>`, as Trained.path) writes by default: <run>/<kind> for a
    checkpoint in a run's checkpoints/ (else <its folder>/<kind>),
    outputs/<kind>/<model> for an imported model."""
    if path.startswith(HF):
        model = path[len(HF) :].strip("/").replace("/", "--").replace(":", "-")
        return os.path.join("outputs", kind, model)
    parent = os.path.dirname(os.path.abspath(path))
    run = os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else parent
    return os.path.join(run, kind)


def write_tokenizer(tokenizer_json: str, directory: str) -> str:
    """The checkpoint's tokenizer as <directory>/tokenizer.json."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path) or read_text(path) != tokenizer_json:
        atomic_write(path, tokenizer_json)
    return path


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror}).") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}): a binary file, or "
            f"text in another encoding. Give a text file (convert it with iconv -t UTF-8), or the text itself."
        ) from None


def model_label(path: str) -> str:
    """A short name of the model at `path` (Trained.path): an imported
    model's folder or hub name, or a checkpoint's run folder."""
    if path.startswith(HF):
        name = os.path.basename(path[len(HF) :].rstrip("/\\")) or "hf"
    else:
        parent = os.path.dirname(os.path.abspath(path))
        name = os.path.basename(os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else parent)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"


def _corpus_name(model: str, options: dict) -> str:
    where = options.get("path") or options.get("hf_name") or options.get("source") or "corpus"
    where = os.path.basename(str(where).rstrip("/\\")) or str(where)
    return f"{model}-{re.sub(r'[^A-Za-z0-9._-]+', '-', where).strip('-.') or 'corpus'}"


def checkpoint_token_cache(lit, data_overrides: dict | None, work_dir: str, model_path: str | None = None):
    """(token cache, data options) of a checkpoint's own corpus (or its
    settings with overrides), tokenized with the tokenizer the checkpoint
    carries, so the model sees exactly the ids it was trained on. A corpus
    the checkpoint was not trained on (an imported model's, or data.path=
    and the like given) without a data.name is named after the model at
    model_path (Trained.path) and the source, e.g. the token cache
    SmolLM2-135M-pg19-sample-<key>, not the default corpus's name."""
    from rope_lm.data.split import split_data
    from rope_lm.data.token_cache import prepare

    own, overrides = lit.hparams.get("data") or {}, data_overrides or {}
    data_options = {**own, **overrides}
    other_source = not own or any(k in overrides and overrides[k] != own.get(k) for k in ("path", "source", "hf_name"))
    if model_path and other_source and "name" not in overrides:
        data_options["name"] = _corpus_name(model_label(model_path), data_options)
    if lit.tokenizer_json:
        os.makedirs(work_dir, exist_ok=True)
        data_options["tokenizer_file"] = write_tokenizer(lit.tokenizer_json, work_dir)
    data_cfg, source = split_data(data_options)
    cache = prepare(data_cfg, source)
    if cache.vocab_size > lit.model.cfg.vocab_size:
        raise ConfigError(
            f"The evaluation tokenizer has {cache.vocab_size} tokens but the model only "
            f"{lit.model.cfg.vocab_size}; evaluate with the checkpoint's own tokenizer."
        )
    return cache, data_options
