"""Train short, evaluate long: one train run from a checked RunConfig.

train.py hands this module a RunConfig (rope_lm.runs.config.resolve_run); a plain
settings dict is checked here by the same mechanism. The folder decides how
the run starts (run_folder.RunFolder.claim: start, resume, only evaluate, or
skip); every check that can fail on user input runs before the corpus is
tokenized or a step is trained.
"""

import dataclasses
import logging
import os
import signal

from lightning.pytorch.utilities.exceptions import SIGTERMException

from rope_lm.data.loaders import LMDataModule, prepare
from rope_lm.eval.evaluation import eval_summary
from rope_lm.eval.report import new_results, write_views
from rope_lm.model.layout import scheme_label
from rope_lm.runs.config import RunConfig, resolve_run
from rope_lm.runs.eval_run import evaluate_and_report
from rope_lm.runs.finetune import apply_init_from, init_from_hparams, load_init_from
from rope_lm.runs.resume import check_resume
from rope_lm.runs.run_folder import (
    EvaluateOnly,
    Resume,
    RunFolder,
    Skip,
    Status,
    check_writable,
    hand_to_ranks,
    rank_zero_claim,
)
from rope_lm.runs.run_settings import BOOKKEEPING
from rope_lm.runs.trained import open_model
from rope_lm.scaling import method_label
from rope_lm.train.checkpointing import check_resumable, resolve_checkpoint
from rope_lm.train.lit import LitLM
from rope_lm.train.trainer import build_trainer, trainer_kwargs, wandb_run
from rope_lm.train_positions import build_train_positions

log = logging.getLogger("rope_lm")


def claim_train(run: RunConfig, out_dir: str):
    """(the run's folder, what the run does there): the folder is this run's
    (or its resume's) before anything is written in it. With existing=continue
    a finished checkpoint only needs its evaluation."""
    check_writable(out_dir)
    folder = RunFolder(out_dir, bookkeeping=BOOKKEEPING)
    joined = rank_zero_claim(out_dir)  # another rank of a multi-device run: rank 0 holds the folder
    if joined is not None:
        return folder, joined
    ckpt = resolve_checkpoint(run.ckpt_path, "ckpt_path") if run.ckpt_path else None
    start = folder.claim(run.raw, run.existing, ckpt, run.trainer.max_steps)
    if isinstance(start, Resume) and start.steps >= run.trainer.max_steps and run.existing == "continue":
        start = EvaluateOnly(start.ckpt, start.steps)
    hand_to_ranks(out_dir, start)
    return folder, start


def train_and_evaluate(run: RunConfig | dict, out_dir: str, logger=None, claimed=None) -> dict:
    """Train under a checked RunConfig, then evaluate past the training
    length; `claimed` is claim_train's answer when the caller claimed the
    folder already. Returns the results (or {"skipped": why})."""
    run = run if isinstance(run, RunConfig) else resolve_run(run)
    folder, start = claimed or claim_train(run, out_dir)
    if isinstance(start, Skip):
        return {"skipped": start.reason}
    earlier = (folder.read_results() or {}).get("training") or {}  # what an earlier sitting measured
    ckpt = start.ckpt
    resumed = check_resume(ckpt, run, out_dir) if ckpt else None  # model, corpus, tokenizer, steps
    data_cfg, corpus = (resumed["data_cfg"], resumed["corpus"]) if resumed else (run.data, None)
    init = load_init_from(run, out_dir) if run.init_from else None
    if init:  # a fine-tune runs the checkpoint's architecture (an imported model's own, for init_from=hf:)
        data_cfg = init["data_cfg"]
        settings = {"model": init["model"], "pos": init["pos"], "scaling": init["scaling"]}
        run = dataclasses.replace(run, **settings, raw={**run.raw, **settings})
    finish = f"To finish it: python train.py resume={out_dir} existing=continue"

    if isinstance(start, EvaluateOnly):  # trained already: the final checkpoint's model, every length again
        cache = prepare(data_cfg, run.source, expect_corpus=corpus)
        training = {
            "steps": start.steps,
            "checkpoint_dir": os.path.join(out_dir, "checkpoints"),
            "val_loss": earlier.get("val_loss"),
            "train_loss": earlier.get("train_loss"),
        }
        results = new_results(
            run.raw,
            cache.corpus,
            run.data.seq_len,
            scheme_label(run.pos, run.model),
            status=Status.COMPLETE,
            training=training,
            **_train_positions(run),
        )
        return evaluate_and_report(
            open_model(ckpt).model, cache, run.eval, [run.scaling], out_dir, results, wandb_run(logger), finish
        )

    state = {}

    def write_partial(trainer):
        write_views(_new_results(run, state["cache"], trainer, out_dir, Status.INTERRUPTED, earlier), out_dir)

    trainer = build_trainer(trainer_kwargs(run.trainer, out_dir, logger, on_stop=write_partial))
    cache = state["cache"] = prepare(data_cfg, run.source, expect_corpus=corpus)
    # The split must serve the evaluation protocol (enough tokens, or documents long enough) before training.
    eval_summary(run.eval, len(cache.tokens(run.eval.split)), cache.doc_starts(run.eval.split), data_cfg.seq_len)
    datamodule = LMDataModule(cache, data_cfg, run.seed, run.trainer.lightning.get("accumulate_grad_batches") or 1)
    hparams = dict(
        model=run.model,
        pos=run.pos,
        scaling=run.scaling,
        optim=run.optim,
        vocab_size=cache.vocab_size,
        train_len=data_cfg.seq_len,
        max_steps=run.trainer.max_steps,
        corpus=cache.corpus,
        data=run.raw.get("data") or {},
        compile=run.trainer.compile,
        skip_nonfinite=run.trainer.skip_nonfinite,
        train_pos=run.train_pos,
        seed=run.seed,
    )
    if init:
        init_from_hparams(init, hparams)
    if resumed:
        check_resumable(ckpt, hparams, resumed["hparams"])  # the vocabulary, now that the cache is built
        folder.record_settings(run.raw)  # e.g. the new trainer.max_steps, for the next resume

    import lightning as L

    L.seed_everything(run.seed, workers=True, verbose=False)
    lit = LitLM(**hparams)
    if init:
        apply_init_from(init, lit)
    with open(os.path.join(cache.dir, "tokenizer.json")) as f:
        lit.tokenizer_json = f.read()
    log.info(
        "Model: %.2fM parameters (%.2fM without embeddings), scheme %s, method %s",
        lit.model.num_params(False) / 1e6,
        lit.model.num_params() / 1e6,
        run.pos["name"],
        method_label(run.scaling),
    )
    if logger is not None:
        logger.log_hyperparams(run.raw)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt)
    except SIGTERMException as e:  # GracefulStop already saved the checkpoint and partial results
        raise SystemExit(e.code or 128 + signal.SIGTERM) from None

    # The final state, whatever the checkpoint interval: `resume=` can extend the run from here.
    final = os.path.join(out_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(final)
    results = _new_results(run, cache, trainer, out_dir, Status.COMPLETE, earlier)
    if trainer.is_global_zero:
        # Under DDP/FSDP the in-memory model may be sharded; evaluate the consolidated checkpoint alone.
        model = lit.model if trainer.world_size == 1 else open_model(final).model
        evaluate_and_report(model, cache, run.eval, [run.scaling], out_dir, results, wandb_run(logger), finish)
    return results


def _new_results(run: RunConfig, cache, trainer, out_dir: str, status: Status, earlier: dict) -> dict:
    """The results record of a training run. A metric this process did not
    measure (a resumed run that validated no more) keeps its earlier value."""
    training = {"steps": trainer.global_step, "checkpoint_dir": os.path.join(out_dir, "checkpoints")}
    for name, key in (("val_loss", "val/loss"), ("train_loss", "train/loss")):
        value = trainer.callback_metrics.get(key)
        training[name] = float(value) if value is not None else earlier.get(name)
    return new_results(
        run.raw,
        cache.corpus,
        run.data.seq_len,
        scheme_label(run.pos, run.model),
        status=status,
        training=training,
        **_train_positions(run),
    )


def _train_positions(run: RunConfig) -> dict:
    """The training-time position method as realized (e.g. the span of its ids), where there is one."""
    method = build_train_positions(run.train_pos)
    return {"train_positions": method.describe(run.data.seq_len)} if method.active else {}
