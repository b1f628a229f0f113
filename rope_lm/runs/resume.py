"""Checks of a checkpoint a run continues or starts from, before any work:
the same model, the corpus it was trained on, and its own tokenizer."""

import dataclasses

from rope_lm.core.errors import ConfigError
from rope_lm.runs.config import RunConfig
from rope_lm.runs.trained import read_text, write_tokenizer
from rope_lm.train.checkpointing import check_resumable, read_checkpoint


def own_tokenizer(data_cfg, tokenizer_json: str | None, out_dir: str, given_as: str, why: str):
    """data_cfg reading the token ids the checkpoint was trained on: its
    tokenizer written into the run folder. A different data.tokenizer_file
    is refused (`given_as` names the checkpoint as the user gave it, `why`
    says why it must keep its tokenizer)."""
    if not tokenizer_json:
        return data_cfg
    given = data_cfg.tokenizer_file
    if given and read_text(given) != tokenizer_json:
        raise ConfigError(
            f"data.tokenizer_file={given!r} is not the tokenizer {given_as} was trained with; {why}: leave "
            f"data.tokenizer_file unset and the checkpoint's own tokenizer is used."
        )
    return dataclasses.replace(data_cfg, tokenizer_file=write_tokenizer(tokenizer_json, out_dir))


def check_resume(ckpt_path: str, run: RunConfig, out_dir: str) -> dict:
    """The resumed run trains at least one more step (with existing=continue
    a finished checkpoint is allowed: only its evaluation is left), on the
    corpus its checkpoint was trained on, with the checkpoint's tokenizer.
    Returns the data settings to use, the corpus fingerprint to expect, the
    checkpoint's hyperparameters and the steps it has trained."""
    saved = read_checkpoint(ckpt_path)
    hp = saved["hyper_parameters"]
    check_resumable(
        ckpt_path,
        {"model": run.model, "pos": run.pos, "train_len": run.data.seq_len, "vocab_size": hp.get("vocab_size")},
        hp,
    )
    done = int(saved.get("global_step") or 0)
    if run.trainer.max_steps <= done and run.existing != "continue":
        raise ConfigError(
            f"The checkpoint {ckpt_path} has already trained {done} steps, and trainer.max_steps="
            f"{run.trainer.max_steps} asks for no more. To train longer give a larger total, e.g. "
            f"trainer.max_steps={done * 2}; to evaluate it again without training, use "
            f"scripts/eval_extrapolation.py ckpt={ckpt_path}; to finish an evaluation that stopped part-way, add "
            f"existing=continue."
        )
    data_cfg = own_tokenizer(
        run.data,
        saved.get("tokenizer_json"),
        out_dir,
        f"the checkpoint {ckpt_path}",
        "a resumed run keeps its own tokenizer",
    )
    corpus = (hp.get("corpus") or {}).get("fingerprint")
    return {
        "data_cfg": data_cfg,
        "corpus": (corpus, f"the checkpoint {ckpt_path}") if corpus else None,
        "hparams": hp,
        "steps": done,
    }
