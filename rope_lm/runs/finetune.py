"""Fine-tuning from a trained model (`init_from=<ckpt, run dir or hf:...>`):
its weights, its training length and vocabulary, its tokenizer, and the
architecture settings a fine-tune must keep."""

import dataclasses
import logging

from rope_lm.core.errors import ConfigError
from rope_lm.model.recompute import SETTING
from rope_lm.model.transformer import check_fit
from rope_lm.runs.config import RunConfig
from rope_lm.runs.resume import own_tokenizer
from rope_lm.runs.trained import read_start

log = logging.getLogger("rope_lm")

# Model settings that do not change what the weights mean; a fine-tune may set them anew.
FINETUNE_FREE_MODEL_KEYS = {"name", "dropout", "attention", SETTING}


def load_init_from(run: RunConfig, out_dir: str) -> dict:
    """`init_from=<ckpt or run dir>`: start from a trained model's weights.

    The new model keeps the checkpoint's training length (so a method with
    `factor: auto` trains at s = data.seq_len / L_original, and is evaluated
    at that s on shorter sequences, PosContext.tuned_len) and its vocabulary, and
    the corpus is tokenized with the checkpoint's tokenizer (a different
    data.tokenizer_file is refused). The corpus may differ from the
    checkpoint's: fine-tuning on new text is what init_from is for. model.*
    and pos.* must equal the checkpoint's; a difference is refused here,
    before any data or training work. An imported model (`hf:`) brings its
    own architecture: model.* and pos.* of the run do not apply, and the
    default `scaling=none` keeps the model's own rope_scaling: its settings
    are resolved here, the run's in resolve_run. Returns what
    `init_from_hparams` and `apply_init_from` need, with data_cfg switched
    to that tokenizer, and the settings (layer specs included) the run
    trains with."""
    given = run.init_from
    saved = read_start(given, "init_from")
    hp = dict(saved["hyper_parameters"])
    if given.startswith("hf:"):
        keep_own = run.scaling.get("name") == "none" and not run.scaling.get("logn")
        scaling = (hp.get("scaling") if keep_own else run.scaling) or {"name": "none"}
        # The imported architecture, trained with or without recomputing activations as this run asks.
        model = {**hp["model"], SETTING: run.model.get(SETTING, False)}
        run = dataclasses.replace(run, model=model, pos=hp["pos"], scaling=scaling)
    diffs = [
        f"pos.{k}: checkpoint {hp['pos'].get(k)!r}, this run {run.pos.get(k)!r}"
        for k in sorted(set(hp["pos"]) | set(run.pos))
        if hp["pos"].get(k) != run.pos.get(k)
    ]
    diffs += [
        f"model.{k}: checkpoint {hp['model'].get(k)!r}, this run {run.model.get(k)!r}"
        for k in sorted((set(hp["model"]) | set(run.model)) - FINETUNE_FREE_MODEL_KEYS)
        if hp["model"].get(k) != run.model.get(k)
    ]
    if diffs:
        raise ConfigError(
            f"init_from={given!r} was trained with different model/positional settings ({'; '.join(diffs)}). "
            f"A fine-tune keeps the checkpoint's architecture: set these to the checkpoint's values (its run's "
            f".hydra/config.yaml lists them all)."
        )
    train_len, vocab_size = int(hp["train_len"]), int(hp["vocab_size"])
    # The model must run at the new length with the checkpoint's L (e.g. a learned table of L rows).
    mcfg = run.model_config(vocab_size=vocab_size, train_len=train_len)
    if given.startswith("hf:"):  # the imported architecture, not the one resolve_run resolved
        run = dataclasses.replace(run, layers=mcfg.resolve(run.pos))
    check_fit(mcfg, run.pos, run.scaling, max(run.lengths + [run.data.seq_len]), run.layers)
    data_cfg = own_tokenizer(
        run.data,
        saved.get("tokenizer_json"),
        out_dir,
        f"init_from={given!r}",
        "a fine-tune must read the token ids its weights were trained on",
    )
    log.info("Fine-tuning %s (trained at L=%d) at data.seq_len=%d", saved["path"], train_len, data_cfg.seq_len)
    weights = {k[len("model.") :]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    return {
        "path": saved["path"],
        "train_len": train_len,
        "vocab_size": vocab_size,
        "weights": weights,
        "tuned_len": max(data_cfg.seq_len, int(hp.get("tuned_len") or 0)),
        "data_cfg": data_cfg,
        "model": run.model,
        "pos": run.pos,
        "scaling": run.scaling,
        "layers": run.layers,
    }


def init_from_hparams(init: dict, hparams: dict) -> None:
    """Give the new LitLM the checkpoint's training length and vocabulary, and
    the length it is now fine-tuned at (PosContext.tuned_len)."""
    if hparams["vocab_size"] > init["vocab_size"]:
        raise ConfigError(
            f"The fine-tuning corpus is tokenized into {hparams['vocab_size']} tokens but init_from's model has "
            f"{init['vocab_size']}; fine-tune with the checkpoint's tokenizer (leave data.tokenizer_file unset)."
        )
    hparams.update(vocab_size=init["vocab_size"], train_len=init["train_len"], tuned_len=init["tuned_len"])


def apply_init_from(init: dict, lit) -> None:
    lit.model.load_state_dict(init["weights"])
