"""Train short, evaluate long: one train run from a checked RunConfig.

train.py hands this module a RunConfig (rope_lm.runs.config.resolve_run); a plain
settings dict is checked here by the same mechanism. The folder decides how
the run starts (run_folder.RunFolder.claim: start, resume, only evaluate, or
skip); every check that can fail on user input runs before the corpus is
tokenized or a step is trained. The model is built from the RunConfig's
resolved layer specs (RunConfig.layers), not resolved again.
"""

import dataclasses
import json
import logging
import os
import signal
import sys

from lightning.pytorch.utilities.exceptions import SIGTERMException

from rope_lm.core.errors import ConfigError, RopeLMError
from rope_lm.data.loaders import LMDataModule
from rope_lm.data.token_cache import prepare
from rope_lm.eval.evaluation import eval_summary
from rope_lm.eval.report import write_views
from rope_lm.eval.results import CONTROLS_SETTING, new_results
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
    as_record,
    check_writable,
    from_record,
    hand_to_ranks,
    rank_zero_claim,
)
from rope_lm.runs.run_settings import BOOKKEEPING, settings_differences
from rope_lm.runs.trained import open_model, weights_digest
from rope_lm.scaling import method_label
from rope_lm.train import distributed
from rope_lm.train.checkpointing import check_resumable, resolve_checkpoint
from rope_lm.train.lit import LitLM
from rope_lm.train.trainer import build_trainer, trainer_kwargs, wandb_run
from rope_lm.train_positions import build_train_positions

log = logging.getLogger("rope_lm")


def train_in_folder(config: dict, out_dir: str, where: str) -> dict | None:
    """train.py's work: the settings `config` (plain values, as composed)
    resolved once, the folder `out_dir` claimed, the run trained and
    evaluated there, and results.md printed. `where` names the folder in
    messages and the logger's run. A user error is recorded in the folder
    (run_folder.record_failure) and raised on. Returns {"skipped": why}
    where existing=continue finds nothing to do. In a job a launcher
    started (torchrun, srun: train/distributed.py) every process meets the
    others first, and only global rank 0 claims the folder and writes."""
    from rope_lm.core.errors import Interrupted, OutputError, RopeLMError
    from rope_lm.eval.results import RESULTS_MD
    from rope_lm.runs.run_folder import describe, record_failure
    from rope_lm.train.loggers import build_logger, finish

    folder = None
    job = distributed.launched_job()
    other = distributed.is_other_rank(job)  # writes nothing of the run's own: rank 0 does
    try:
        run = _resolve_in_job(config, out_dir, job)  # every setting checked once, before any work
        folder, start = claim_train(run, out_dir, job)  # the folder is this run's before anything is written there
        if run.existing == "continue" and not other:
            print(f"rope-lm: {where}: {describe(start)} (existing=continue).", file=sys.stderr)
        if isinstance(start, Skip):
            return {"skipped": start.reason}
        logger = build_logger(run.logger, out_dir, run.run_name or where, config=config)
        try:
            train_and_evaluate(run, out_dir, logger, claimed=(folder, start))
        finally:
            finish(logger)
    except Interrupted:
        raise  # what was kept, and how to finish, is the message; the folder says "evaluating"
    except RopeLMError as e:
        distributed.owe(job, e)  # the job's other processes, waiting for this one, stop with its paragraph
        if not other:
            record_failure(out_dir, config, e, folder)
        if isinstance(e, OutputError):  # a full or unwritable disk: how to go on depends on what was kept
            raise _after_write_failure(e, out_dir) from None
        raise
    except BaseException as e:
        distributed.owe(job, e)
        raise
    finally:
        if folder is not None:  # a multirun's next job goes on in this process: its folder is free again
            folder.release()
    md = os.path.join(out_dir, RESULTS_MD)
    if os.path.exists(md) and not other:
        print("\n" + open(md).read())
        print(f"Results: {out_dir}/ (results.json, results.md, ppl_vs_length.png, checkpoints/)")
    return None


def _after_write_failure(error, out_dir: str):
    """A failed write in a run folder ends with the way back: resume= where a checkpoint was kept,
    else the same command, which starts the run anew in the folder."""
    if os.path.isfile(os.path.join(out_dir, "checkpoints", "last.ckpt")):
        # existing=continue: trained to the end already, the run is only evaluated (resume= alone would refuse).
        then = (
            f"resume the run from its last checkpoint: python train.py resume={out_dir} existing=continue "
            f"(or resume=<its new place>)"
        )
        return error.reworded(then=then, elsewhere="move the run folder to a disk that has room (or is writable)")
    path = os.path.abspath((error.failure or {}).get("path") or "")
    inside = path.startswith(os.path.abspath(out_dir) + os.sep)
    setting = {"setting": "hydra.run.dir (hydra.sweep.dir in a sweep)"} if inside else {}
    then = (
        f"run the same command again: no checkpoint had been written in {out_dir}, so there is nothing to resume, "
        f"and the run starts anew"
    )
    return error.reworded(then=then, **setting)


def claim_train(run: RunConfig, out_dir: str, job=None):
    """(the run's folder, what the run does there): the folder is this run's
    (or its resume's) before anything is written in it. With existing=continue
    a finished checkpoint only needs its evaluation. `job`: the launched job
    this process is one of (distributed.launched_job), whose rank 0 alone
    claims the folder and tells the others."""
    if job is not None and job.store is not None:
        return _claim_in_job(run, out_dir, job)
    check_writable(out_dir)
    # Controls add rows on the final weights and change none: a run given more of them is the same run.
    folder = RunFolder(out_dir, bookkeeping=BOOKKEEPING | {CONTROLS_SETTING})
    joined = rank_zero_claim(out_dir)  # another rank of a multi-device run: rank 0 holds the folder
    if joined is not None:
        folder.joined = True
        return folder, joined
    ckpt = resolve_checkpoint(run.ckpt_path, "ckpt_path") if run.ckpt_path else None
    start = folder.claim(run.raw, run.existing, ckpt, run.trainer.max_steps)
    if isinstance(start, Resume) and start.steps >= run.trainer.max_steps and run.existing == "continue":
        start = EvaluateOnly(start.ckpt, start.steps)
    if isinstance(start, Skip) and run.existing == "continue":
        start = _missing_controls(run, folder, start)
    hand_to_ranks(out_dir, start)
    return folder, start


def _resolve_in_job(config: dict, out_dir: str, job) -> RunConfig:
    """resolve_run; in a launched job, once every process has met the others and all agree on the
    settings and the folder (train/distributed.py: a process's refusal stops every process)."""
    trainer = config.get("trainer") or {}
    if job is None:
        distributed.check_launch(None, trainer)
        return resolve_run(config)
    timeout = distributed.rendezvous_seconds(trainer)
    distributed.connect(job, timeout)
    distributed.begin(job)
    if job.rank != 0:
        distributed.quiet_file_logs(out_dir)
    run, error = None, None
    try:
        distributed.check_launch(job, trainer)
        run = resolve_run(config)
    except RopeLMError as e:
        error = e
    try:
        distributed.meet(job, config, out_dir, error, timeout, settings_differences)
    except ConfigError:
        if job.rank != 0:
            _drop_hydra_only(out_dir)  # refused before any work: a folder Hydra made for this process alone
        raise
    return run


def _drop_hydra_only(out_dir: str) -> None:
    """The folder Hydra made for a process other than rank 0, when it holds only what Hydra wrote at
    start (.hydra/, its log) and is not the run's (each process got its own default folder)."""
    import shutil

    try:
        names = set(os.listdir(out_dir))
    except OSError:
        return
    if names and names <= {".hydra", "train.log"}:
        shutil.rmtree(out_dir, ignore_errors=True)


def _claim_in_job(run: RunConfig, out_dir: str, job):
    """claim_train in a launched job: global rank 0 claims the folder and shares its decision; the
    others take it (an evaluation of the final checkpoint is rank 0's alone)."""
    timeout = distributed.rendezvous_seconds(run.raw.get("trainer") or {})
    folder = RunFolder(out_dir, bookkeeping=BOOKKEEPING | {CONTROLS_SETTING})
    if job.rank != 0:
        folder.joined = True
        start = from_record(distributed.share(job, None, None, timeout))
        if isinstance(start, EvaluateOnly):
            return folder, Skip("global rank 0 evaluates the final checkpoint")
        if isinstance(start, Resume) and not os.path.isfile(start.ckpt):
            raise ConfigError(
                f"{job.where} cannot read the checkpoint that rank 0 resumes from, {start.ckpt}: every node of "
                f"a job must see its run folder (hydra.run.dir on a file system all nodes share)."
            )
        return folder, start
    try:
        folder, start = claim_train(run, out_dir)  # as a process on its own claims it
    except RopeLMError as e:
        distributed.share(job, None, e, timeout)  # raises e, once the others know
    distributed.share(job, as_record(start), None, timeout)
    return folder, start


def _missing_controls(run: RunConfig, folder: RunFolder, skip: Skip):
    """A complete run whose results lack a control this run asks for (eval.controls added to a study after
    it ran) is evaluated for it from its final checkpoint (EvaluateOnly; its own rows are kept), not
    skipped; without its checkpoints (only the light files kept) it stays skipped, saying so."""
    results = folder.read_results() or {}
    steps = (results.get("training") or {}).get("steps")
    if folder.state()["state"] != Status.COMPLETE or steps is None:
        return skip  # another process holds it, or not this kind of folder
    missing = [c for c in run.controls if c not in (results.get("controls") or {})]
    if not missing:
        return skip
    if not os.path.isfile(folder.last_checkpoint):
        return Skip(f"{skip.reason}; its control(s) {', '.join(missing)} cannot be added: its checkpoints are gone")
    if not folder.lock():
        return Skip("another process is running it")
    folder.record_settings(run.raw)  # run.yaml now names the controls, as the results will
    return EvaluateOnly(folder.last_checkpoint, int(steps))


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
        run = dataclasses.replace(run, **settings, layers=init["layers"], raw={**run.raw, **settings})
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
        _keep_rows_of(results, folder.read_results(), start.steps, cache, run)
        return _evaluate_run(open_model(ckpt, layers=run.layers).model, run, cache, out_dir, results, logger, finish)

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
    lit = LitLM(**hparams, layers=run.layers)
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
    job = distributed.launched_job()
    if job is not None and job.store is not None:
        distributed.ready(job, None, trainer)  # every process prepared; the process group Lightning uses
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt)
    except SIGTERMException as e:  # GracefulStop already saved the checkpoint and partial results
        raise SystemExit(e.code or 128 + signal.SIGTERM) from None
    except RuntimeError as e:  # another process of the job died (killed, its node lost): one paragraph
        lost = distributed.lost_peer(job, e)
        if lost is None:
            raise
        raise lost from None

    # The final state, whatever the checkpoint interval: `resume=` can extend the run from here.
    final = os.path.join(out_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(final)
    results = _new_results(run, cache, trainer, out_dir, Status.COMPLETE, earlier)
    if trainer.is_global_zero:
        # Under DDP/FSDP the in-memory model may be sharded; evaluate the consolidated checkpoint alone.
        model = lit.model if trainer.world_size == 1 else open_model(final, layers=run.layers).model
        _evaluate_run(model, run, cache, out_dir, results, logger, finish)
    return results


def _evaluate_run(model, run: RunConfig, cache, out_dir: str, results: dict, logger, finish: str) -> dict:
    """A run's own evaluation (after training, or of its final checkpoint): its method and its controls, as
    its settings give them. The weights' checksum goes beside them, as an evaluation of a checkpoint records
    it, so that compare.py pairs the run with a later evaluation of its checkpoint on the same windows."""
    results["model_identity"] = {"weights": weights_digest(model), "step": results["training"]["steps"]}
    return evaluate_and_report(
        model,
        cache,
        run.eval,
        [run.scaling],
        out_dir,
        results,
        wandb_run(logger),
        finish,
        controls=run.controls,
        control_window=run.control_window,
    )


def _keep_rows_of(results: dict, earlier: dict | None, steps: int, cache, run: RunConfig) -> None:
    """An evaluation of the final checkpoint that an earlier sitting began or finished (stopped part-way, or
    complete and now given a control): its rows are this checkpoint's when they were measured at the same step
    under the same evaluation, and evaluate_and_report keeps the methods they complete."""
    if not earlier or (earlier.get("training") or {}).get("steps") != steps:
        return
    split = run.eval.split
    now = eval_summary(run.eval, len(cache.tokens(split)), cache.doc_starts(split), run.data.seq_len)
    if earlier.get("eval") != json.loads(json.dumps(now)):  # as results.json holds it
        return
    results["created"] = earlier.get("created", results["created"])
    results["methods"] = dict(earlier.get("methods") or {})
    results["results"] = list(earlier.get("results") or [])


def plan_memory(config: dict) -> str:
    """scripts/plan_memory.py's work: what one device holds during a training
    step of the run `config` describes (its settings resolved and its trainer
    built as train.py resolves and builds them, so it refuses what train.py
    refuses, with the same message; `device_gb`, when given, the memory the
    longest data.seq_len must fit), as train/memory_plan.format_plan writes it."""
    import tempfile

    from rope_lm.core.errors import ConfigError
    from rope_lm.train.memory_plan import format_plan, length_limit, plan, setup_of

    config = dict(config)
    device_gb = config.pop("device_gb", None)
    if device_gb is not None and (
        isinstance(device_gb, bool) or not isinstance(device_gb, (int, float)) or not device_gb > 0
    ):
        raise ConfigError(f"device_gb={device_gb!r} must be a positive number of GiB (e.g. device_gb=80), or null.")
    run = resolve_run(config)
    quiet = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:
            q.setLevel(logging.WARNING)
        with tempfile.TemporaryDirectory() as nowhere:  # the trainer is built, never run: it writes nothing
            setup = setup_of(build_trainer(trainer_kwargs(run.trainer, nowhere, None)))
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    result = plan(
        run.model,
        run.pos,
        run.scaling,
        run.data.vocab_size,
        run.data.seq_len,
        run.data.batch_size,
        setup,
        run.optim,
        device_gb,
        run.layers,
        limit=length_limit(run.model, run.pos, run.scaling, run.data.vocab_size, run.layers),
    )
    return format_plan(result, device_gb)


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
