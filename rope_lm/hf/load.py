"""load_hf: a transformers checkpoint as a rope-lm TransformerLM."""

from dataclasses import dataclass, field
import json
import os

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.hf.config import settings_from_hf
from rope_lm.hf.gguf import converted_folder, is_gguf, source_info
from rope_lm.hf.weights import load_weights


@dataclass
class HFInfo:
    """Where a model came from and how it was mapped."""

    directory: str
    family: str  # llama | mistral | qwen2 | qwen3 | smollm3 | gemma3 | cohere2 | gpt_oss | llama4
    architecture: str
    settings: dict  # {'model', 'pos', 'scaling', 'train_len', 'vocab_size', ...}: build_model's arguments
    tokenizer_json: str | None  # the text of tokenizer.json, None when the directory has none
    max_position_embeddings: int
    notes: list[str] = field(default_factory=list)


def resolve(path_or_name: str, revision: str | None = None) -> str:
    """A local directory as given, GGUF input (a .gguf file, a folder holding
    one, pkg:<installed package>) converted once into a cached one, else a
    hub name downloaded (config, safetensors and tokenizer files only) into
    the Hugging Face cache."""
    if is_gguf(path_or_name):
        return converted_folder(path_or_name)
    if os.path.isdir(path_or_name):
        return path_or_name
    if os.path.exists(path_or_name) or path_or_name.count("/") != 1:
        raise ConfigError(f"hf={path_or_name!r} is neither a model directory nor a hub name (owner/name).")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(
            path_or_name,
            revision=revision,
            allow_patterns=[
                "config.json",
                "*.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ],
        )
    except Exception as e:  # no network, unknown repo, gated model: one message for the user
        raise ConfigError(
            f"Could not download {path_or_name!r} from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); pass a local directory instead."
        ) from None


def read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"{directory} has no config.json; is it a transformers model directory?")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. Fix the file "
            f"(or write it again with save_pretrained)."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} could not be read as UTF-8 text ({type(e).__name__}: {e}).") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{path} holds a JSON {type(config).__name__}, not the object of settings a transformers config.json holds."
        )
    return config


def build_empty(settings: dict, dtype: torch.dtype):
    """The model with parameters allocated but not initialised: built on the
    meta device (no random init of weights about to be overwritten), then
    given real storage once, in the target dtype. The positional scheme is
    rebuilt on the CPU since its buffers are computed, not loaded."""
    from rope_lm.model.transformer import build_model

    with torch.device("meta"):
        model = build_model(
            settings["model"], settings["pos"], settings["scaling"], settings["vocab_size"], settings["train_len"]
        )
    model = model.to(dtype).to_empty(device="cpu")
    model.rebuild_schemes()
    if model.cfg.tie_embeddings:  # to_empty gives each parameter its own storage
        model.lm_head.weight = model.wte.weight
    return model


def name_layers(settings: dict, scaled_layers) -> None:
    """The layers a method acts on, as the user names them: None keeps the
    model's own choice (the layer types its config scales, Gemma 3's global
    layers where it scales none), "all" every layer, a list of layer indices
    exactly those. Written into the layout's per-layer switch (`scaling:
    false` elsewhere), so the choice travels with the settings (a fine-tune's
    hparams, a LitLM's layers)."""
    if scaled_layers is None:
        return
    model = settings["model"]
    n = model["n_layer"]
    if scaled_layers == "all":
        chosen = set(range(n))
    elif isinstance(scaled_layers, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in scaled_layers
    ):
        chosen = set(scaled_layers)
        outside = sorted(i for i in chosen if not 0 <= i < n)
        if outside or not chosen:
            raise ConfigError(
                f"scaled_layers={list(scaled_layers)!r} names "
                + (f"layers {outside} of a model with {n} (0 to {n - 1})" if outside else "no layer")
                + '; give the indices of the layers the method acts on, "all", or None for the model\'s own '
                "choice."
            )
    else:
        raise ConfigError(
            f'scaled_layers={scaled_layers!r} must be None (the model\'s own choice of layers), "all" or a list '
            f"of layer indices (0 to {n - 1})."
        )
    layout = model.get("layout") or {"pattern": [{"pos": dict(settings["pos"]), "window": None}]}
    entries = layout.get("layers") or [layout["pattern"][i % len(layout["pattern"])] for i in range(n)]
    named = []
    for i, entry in enumerate(entries):
        entry = {k: v for k, v in entry.items() if k != "scaling"}
        if i not in chosen:
            entry["scaling"] = False
        named.append(entry)
    model["layout"] = {"layers": named}


def check_windowed_layers(model) -> None:
    """Refuses a method on a sliding-window layer where it cannot act: a
    second rotary pass that starts at or past the keys the layer sees (ReRoPE,
    leaky ReRoPE, Self-Extend with their window, StreamingLLM's sinks read
    from before the method's own window) would leave the layer as it was
    while the results say the method ran there."""
    if model.layout is None:
        return
    windows = [model.layout[i].window for i in model.scaled_layers if model.layout[i].window is not None]
    if not windows:
        return
    T = 2 * model.cfg.train_len
    plan = model.scaling.plan(torch.arange(T), model.context(T))
    for window in windows:
        if plan.two_pass and plan.alt_from >= window:
            windowed = [j for j in model.scaled_layers if model.layout[j].window is not None]
            raise ConfigError(
                f"Extrapolation method {model.scaling.label!r} acts on pairs of tokens at least {plan.alt_from} "
                f"apart, and layers {windowed} see only their last {window} keys (their sliding window), so it "
                f"cannot act there. Leave those layers to the model (scaled_layers=None: "
                f"{_default_note(model)}), or give the method a window below {window} "
                f"(scaling.window=...) if it is to act inside the sliding window."
            )


def _default_note(model) -> str:
    full = [i for i, spec in enumerate(model.layout) if spec.window is None]
    return f"the full-attention layers {full}" if full else "the layers its config scales"


def load_hf(
    path_or_name: str,
    dtype: torch.dtype = torch.float32,
    sliding_window: str = "auto",
    revision: str | None = None,
    scaled_layers=None,
):
    """(TransformerLM in eval mode, tokenizers.Tokenizer or None, HFInfo) for a
    directory or hub name of a family rope-lm maps (rope_lm.hf.config and
    .families). The model runs under the method that reproduces the
    checkpoint's rope_scaling; model.set_scaling() swaps in any other.
    sliding_window: 'auto' maps Mistral's window to rope-lm's `window` method
    and the 2025 families' sliding layers to windows in their layout,
    'ignore' loads full attention (exact up to the window's length).
    scaled_layers: the layers a method acts on (name_layers): None, the
    model's own (Gemma 3: its global layers), "all", or a list of indices."""
    if sliding_window not in ("auto", "ignore"):
        raise ConfigError(f"sliding_window={sliding_window!r}: use auto or ignore.")
    directory = resolve(path_or_name, revision)
    config = read_config(directory)
    settings = settings_from_hf(config, sliding_window)
    name_layers(settings, scaled_layers)
    model = build_empty(settings, dtype)
    load_weights(model, directory, settings.get("mlp_prefix", "mlp"))
    model.eval()
    tokenizer, tokenizer_json = None, None
    tok_path = os.path.join(directory, "tokenizer.json")
    notes = []
    source = source_info(directory)
    if source:  # dequantised weights no longer show what they were
        settings["quantisation"] = source["quantisation"]
        notes.append(f"converted from {source['gguf_file']} ({source['quantisation']}, dequantised to float32)")
    if os.path.exists(tok_path):
        from tokenizers import Tokenizer

        with open(tok_path, encoding="utf-8") as f:
            tokenizer_json = f.read()
        tokenizer = Tokenizer.from_str(tokenizer_json)
    else:
        notes.append("no tokenizer.json: evaluate on pre-tokenized data or give data.tokenizer_file")
    if settings["scaling"]["name"] == "window":
        notes.append(
            f"sliding window {settings['scaling']['window']} mapped to scaling=window; another method "
            f"replaces it (full attention)"
        )
    info = HFInfo(
        directory=directory,
        family=settings["family"],
        architecture=config["architectures"][0],
        settings=settings,
        tokenizer_json=tokenizer_json,
        max_position_embeddings=settings["max_position_embeddings"],
        notes=notes,
    )
    return model, tokenizer, info


def hf_init(path_or_name: str, dtype: torch.dtype = torch.float32, sliding_window: str = "auto", scaled_layers=None):
    """What a fine-tune from a transformers model needs, in the shape of a
    rope-lm checkpoint: (model, tokenizer_json, hparams), hparams holding the
    LitLM arguments that describe the model (model, pos, scaling,
    vocab_size, train_len). A fine-tune builds LitLM(**hparams, optim=...,
    max_steps=..., scaling=<its method>) and loads model.state_dict() into
    lit.model, as init_from does with a rope-lm checkpoint."""
    model, _, info = load_hf(path_or_name, dtype, sliding_window, scaled_layers=scaled_layers)
    s = info.settings
    hparams = {
        "model": s["model"],
        "pos": s["pos"],
        "scaling": s["scaling"],
        "vocab_size": s["vocab_size"],
        "train_len": s["train_len"],
    }
    return model, info.tokenizer_json, hparams


def hf_lit(
    path_or_name: str,
    optim: dict | None = None,
    max_steps: int = 0,
    scaling: dict | None = None,
    dtype: torch.dtype = torch.float32,
    sliding_window: str = "auto",
    scaled_layers=None,
    **lit_options,
):
    """A LitLM holding a transformers model's weights, with its tokenizer
    (lit.tokenizer_json), ready to evaluate or fine-tune where a rope-lm
    checkpoint's LitLM would be: `scaling` (a conf/scaling dict) replaces
    the checkpoint's own method, `optim` / `max_steps` / `lit_options` are
    LitLM's arguments. The LitLM is built on the meta device and takes the
    loaded tensors as its parameters, so the weights exist once.
    scaled_layers: the layers `scaling` acts on (load_hf)."""
    from rope_lm.train.lit import LitLM

    model, tokenizer_json, hparams = hf_init(path_or_name, dtype, sliding_window, scaled_layers)
    if scaling is not None:
        hparams["scaling"] = scaling
    with torch.device("meta"):
        lit = LitLM(**hparams, optim=optim or {}, max_steps=max_steps, layers=model.layout, **lit_options)
    lit.model.load_state_dict(model.state_dict(), assign=True)
    lit.model.rebuild_schemes()  # computed buffers, not in the state dict
    if lit.model.cfg.tie_embeddings:  # assign gives the two names separate Parameter objects
        lit.model.lm_head.weight = lit.model.wte.weight
    lit.tokenizer_json = tokenizer_json
    check_windowed_layers(lit.model)
    return lit


def hf_checkpoint(
    path_or_name: str, dtype: torch.dtype = torch.float32, sliding_window: str = "auto", scaled_layers=None
) -> dict:
    """A transformers model in the shape torch.load gives a rope-lm Lightning
    checkpoint: {'hyper_parameters': {model, pos, scaling, vocab_size,
    train_len}, 'state_dict': {'model.<name>': tensor}, 'tokenizer_json'},
    so code that reads a checkpoint's weights and settings (init_from) reads
    a transformers model unchanged. The tensors are the loaded model's own
    (no copy)."""
    model, tokenizer_json, hparams = hf_init(path_or_name, dtype, sliding_window, scaled_layers)
    return {
        "hyper_parameters": hparams,
        "tokenizer_json": tokenizer_json,
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
    }
