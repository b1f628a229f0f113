"""Train short, evaluate long: the whole run from a checked RunConfig.

train.py hands this module a RunConfig (rope_lm.config.resolve_run), scripts
hand it plain settings that it checks with the same mechanism. Every check
that can fail on user input runs before the corpus is tokenized or a step is
trained.
"""

import dataclasses
import datetime
import json
import logging
import os
import signal

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from rope_lm.checkpointing import AtomicCheckpointIO, GracefulStop, check_resumable, load_checkpoint, read_checkpoint, resolve_checkpoint
from rope_lm.allocator import KeepFreedMemory
from rope_lm.config import (DATA_ANNOTATIONS, RunConfig, TrainerConfig, resolve_run, split_data, typed, typed_component,
                            typed_dataclass)
from rope_lm.data import LMDataModule, prepare
from rope_lm.errors import ConfigError, RopeLMError
from rope_lm.evaluation import EvalConfig, eval_summary, evaluate_lengths
from rope_lm.lit import LitLM, ProgressLog, TokensPerSecond
from rope_lm.model import check_fit
from rope_lm.report import RESULTS_JSON, atomic_write, log_to_wandb, new_results, write_json, write_views
from rope_lm.run_settings import BOOKKEEPING, settings_differences
from rope_lm.scaling import METHODS, method_label

log = logging.getLogger("rope_lm")

def check_writable(out_dir: str):
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"The output directory {out_dir} is not writable ({e.strerror}); set hydra.run.dir (or the script's out=) to a writable place.") from None


def trainer_kwargs(tc: TrainerConfig, out_dir: str, logger, on_stop=None) -> dict:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    lightning = dict(tc.lightning)
    cuda = torch.cuda.is_available() and lightning.get("accelerator", "auto") in ("auto", "gpu", "cuda")
    precision = tc.precision
    if precision == "auto":
        precision = "bf16-mixed" if cuda and torch.cuda.is_bf16_supported() else "32-true"
    deterministic = (not cuda) if tc.deterministic == "auto" else tc.deterministic
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    minutes = tc.ckpt_every_minutes
    callbacks = [
        ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                        enable_version_counter=False),
        ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, enable_version_counter=False,
                        every_n_train_steps=None if minutes else tc.ckpt_every_n_steps,
                        train_time_interval=datetime.timedelta(minutes=minutes) if minutes else None),
        TokensPerSecond(every=lightning.get("log_every_n_steps") or 10),
        ProgressLog(),
        GracefulStop(ckpt_dir, on_stop),
        KeepFreedMemory(),
    ]
    if logger is not None:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    kwargs = dict(
        # Training is one endless "epoch" (data.StepSampler) that max_steps ends; max_epochs=-1 lets a
        # finished run be extended (with max_epochs=1 Lightning would call the epoch done on resume).
        max_steps=tc.max_steps, max_epochs=-1, precision=precision, deterministic=deterministic,
        logger=logger if logger is not None else False, callbacks=callbacks, default_root_dir=out_dir,
        val_check_interval=tc.val_every_n_steps, check_val_every_n_epoch=None, use_distributed_sampler=False,
        num_sanity_val_steps=0, plugins=[AtomicCheckpointIO()],
    )
    kwargs.update(lightning)
    return kwargs


def build_trainer(kwargs: dict):
    """lightning.Trainer, with a value Lightning refuses (trainer.devices=3 on
    a 2-core CPU, an unknown strategy) reported as a configuration error
    before any data or model work."""
    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        return L.Trainer(**kwargs)
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"lightning.Trainer refused the trainer settings ({first}). Check the `trainer.*` "
                          f"values against Lightning's documentation.") from None


def evaluate_and_report(model, cache, eval_cfg: EvalConfig, methods: list[dict | None], out_dir: str,
                        results: dict, wandb_run=None) -> dict:
    """ppl@L for each extrapolation method in turn; the results files are
    rewritten after every length so a crash keeps what was measured."""
    original = model.scaling
    stream = cache.tokens(eval_cfg.split)
    lengths = eval_cfg.resolve_lengths(results["train_len"])
    doc_starts = cache.doc_starts(eval_cfg.split)
    results["eval"] = eval_summary(eval_cfg, len(stream), doc_starts, results["train_len"])
    # "complete" only once every method and length is in: a crash part-way leaves "evaluating".
    done, results["status"] = results.get("status", "complete"), "evaluating"
    try:
        for i, options in enumerate(methods):
            model.set_scaling(options)
            label = model.scaling.label
            results["methods"][label] = {"options": options,
                                         **model.scaling.describe(model.pos_scheme, model.context(max(lengths)))}

            def on_result(row, label=label):
                row = {"method": label, **row}
                results["results"].append(row)
                write_views(results, out_dir, draw=False)
                extra = f", beyond L_train {row['ppl_beyond']:.3f}" if row["ppl_beyond"] else ""
                log.info("ppl@%d [%s] = %.3f%s", row["length"], label, row["ppl"], extra)

            evaluate_lengths(model, stream, eval_cfg, results["train_len"], on_result, doc_starts=doc_starts)
            results["status"] = done if i == len(methods) - 1 else "evaluating"
            write_views(results, out_dir)
    finally:
        model.set_scaling(original)
    if wandb_run is not None:
        log_to_wandb(wandb_run, results, out_dir)
    return results


def train_and_evaluate(run: RunConfig | dict, out_dir: str, logger=None) -> dict:
    """Train under a checked RunConfig (a plain settings dict is checked here
    by rope_lm.config.resolve_run), then evaluate past the training length.
    Every check that can fail on user input or on the files given runs before
    the corpus is tokenized."""
    run = run if isinstance(run, RunConfig) else resolve_run(run)
    ckpt_path = start_run(run, out_dir)
    resumed = check_resume(ckpt_path, run, out_dir) if ckpt_path else None
    if resumed and resumed["steps"] >= run.trainer.max_steps:  # existing=continue: only the evaluation is left
        return finish_evaluation(run, ckpt_path, out_dir, resumed, logger)
    data_cfg = run.data
    init = load_init_from(run, out_dir) if run.init_from else None
    if init:
        data_cfg = init["data_cfg"]
    state = {}

    def write_partial(trainer):
        write_views(_new_results(run, state["cache"], trainer, out_dir, status="interrupted"), out_dir)

    trainer = build_trainer(trainer_kwargs(run.trainer, out_dir, logger, on_stop=write_partial))
    expected = None
    if resumed:
        data_cfg, expected = resumed["data_cfg"], resumed["corpus"]
    cache = state["cache"] = prepare(data_cfg, run.source, expect_corpus=expected)
    # The split must serve the evaluation protocol (enough tokens, or documents long enough) before training.
    eval_summary(run.eval, len(cache.tokens(run.eval.split)), cache.doc_starts(run.eval.split), data_cfg.seq_len)
    datamodule = LMDataModule(cache, data_cfg, run.seed, run.trainer.lightning.get("accumulate_grad_batches") or 1)
    if init:  # a fine-tune runs the checkpoint's architecture (an imported model's own, for init_from=hf:)
        settings = {"model": init["model"], "pos": init["pos"], "scaling": init["scaling"]}
        run = dataclasses.replace(run, **settings, raw={**run.raw, **settings})
    hparams = dict(model=run.model, pos=run.pos, scaling=run.scaling, optim=run.raw.get("optim") or {},
                   vocab_size=cache.vocab_size, train_len=data_cfg.seq_len, max_steps=run.trainer.max_steps,
                   corpus=cache.corpus, data=run.raw.get("data") or {}, compile=run.trainer.compile,
                   skip_nonfinite=run.trainer.skip_nonfinite)
    if init:
        init_from_hparams(init, hparams)
    if ckpt_path:
        check_resumable(ckpt_path, hparams, resumed["hparams"])  # the vocabulary, now that the cache is built
        write_run_config(run, out_dir)  # e.g. the new trainer.max_steps, for the next resume

    import lightning as L

    L.seed_everything(run.seed, workers=True, verbose=False)
    lit = LitLM(**hparams)
    if init:
        apply_init_from(init, lit)
    with open(os.path.join(cache.dir, "tokenizer.json")) as f:
        lit.tokenizer_json = f.read()
    log.info("Model: %.2fM parameters (%.2fM without embeddings), scheme %s, method %s",
             lit.model.num_params(False) / 1e6, lit.model.num_params() / 1e6, run.pos["name"],
             method_label(run.scaling))
    if logger is not None:
        logger.log_hyperparams(run.raw)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException as e:  # GracefulStop already saved the checkpoint and partial results
        raise SystemExit(e.code or 128 + signal.SIGTERM) from None

    # The final state, whatever the checkpoint interval: `resume=` can extend the run from here.
    final = os.path.join(out_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(final)
    results = _new_results(run, cache, trainer, out_dir, status="complete")
    if trainer.is_global_zero:
        model = lit.model
        if trainer.world_size > 1:
            # Under DDP/FSDP the in-memory model may be sharded; evaluate the
            # consolidated checkpoint on this process alone.
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = load_checkpoint(final, device)[0].model
        run_obj = getattr(logger, "experiment", None) if logger is not None and logger.__class__.__name__ == "WandbLogger" else None
        evaluate_and_report(model, cache, run.eval, [run.scaling], out_dir, results, run_obj)
    return results


# --- one run, one folder ------------------------------------------------------

RUN_CONFIG = "run.yaml"  # the run's settings as it (re)started; `resume=` reads them
_claimed: dict = {}  # run folder -> (its lock, held until the process exits; whether it was new)


def start_run(run: RunConfig, out_dir: str) -> str | None:
    """Claim the run folder (claim_run_dir) and record the settings there;
    returns the checkpoint to resume from, if any. Idempotent in a process."""
    check_writable(out_dir)
    ckpt_path = resolve_checkpoint(run.ckpt_path, "ckpt_path") if run.ckpt_path else None
    if os.path.abspath(out_dir) not in _claimed:
        claim_run_dir(out_dir, ckpt_path)
        if _claimed[os.path.abspath(out_dir)][1]:  # a new run; a resume records its settings once checked
            write_run_config(run, out_dir)
    return ckpt_path


def write_run_config(run: RunConfig, out_dir: str) -> None:
    import yaml

    atomic_write(os.path.join(out_dir, RUN_CONFIG), yaml.safe_dump(run.raw, sort_keys=False))


def lock_run_dir(out_dir: str):
    """The run folder's lock, taken without waiting and held while a run (a
    training or a task) works there; None when another process holds it."""
    from filelock import FileLock, Timeout

    os.makedirs(out_dir, exist_ok=True)
    lock = FileLock(os.path.join(out_dir, ".run.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def claim_run_dir(out_dir: str, ckpt_path: str | None) -> None:
    """Refuse a folder that another run is using or has used: a run's files
    are never overwritten by accident. Its own resume (a checkpoint inside
    the folder) is the one way back in."""
    lock = lock_run_dir(out_dir)
    if lock is None:
        raise ConfigError(
            f"Another rope-lm process is running in {out_dir} right now. Give this run its own folder "
            f"(leave hydra.run.dir at its default, which is unique per run, or choose another)."
        )
    resuming = ckpt_path is not None and os.path.abspath(ckpt_path).startswith(os.path.abspath(out_dir) + os.sep)
    if resuming:
        _claimed[os.path.abspath(out_dir)] = (lock, False)
        return
    taken = [name for name in (RESULTS_JSON, "checkpoints/last.ckpt", "checkpoints/best.ckpt")
             if os.path.exists(os.path.join(out_dir, name))]
    if taken:
        raise ConfigError(
            f"The run folder {out_dir} already holds another run's files ({', '.join(taken)}); this run would "
            f"overwrite them, so it was not started. To continue that run: python train.py resume={out_dir} "
            f"(with trainer.max_steps=N to train longer); for a new run, leave hydra.run.dir at its default "
            f"(unique per run) or choose an empty folder."
        )
    _claimed[os.path.abspath(out_dir)] = (lock, True)


def continue_run(run: RunConfig, out_dir: str) -> tuple[RunConfig | None, str]:
    """existing=continue: what is left to do in this run folder, so that a
    study's command run again (in another sitting, or on another machine
    sharing the folder) finishes it with the files one uninterrupted run
    would have written. Returns (the run to start, with ckpt_path set for a
    resume; or None when nothing is left for this process, and why).

    The folder is claimed first: a folder another process holds is skipped,
    so two machines running one study never train the same run. A folder
    whose run.yaml records other settings is refused: continuing would mix
    two experiments under one name."""
    from rope_lm.sweep import job_state

    lock = lock_run_dir(out_dir)
    if lock is None:
        return None, "another process is running it"
    try:
        _check_same_settings(run, out_dir)
        if os.path.exists(os.path.join(out_dir, RESULTS_JSON)) and job_state(out_dir)["state"] == "complete":
            lock.release()
            return None, "its results are complete"
        last = os.path.join(out_dir, "checkpoints", "last.ckpt")
        if os.path.isfile(last):
            done = int(read_checkpoint(last).get("global_step") or 0)
            _claimed[os.path.abspath(out_dir)] = (lock, False)
            what = "evaluating its final checkpoint" if done >= run.trainer.max_steps else f"resuming from step {done}"
            return dataclasses.replace(run, ckpt_path=last), what
        # Stopped before its first checkpoint: nothing to keep but the record of how it stopped.
        stale = os.path.join(out_dir, RESULTS_JSON)
        if os.path.exists(stale):
            os.remove(stale)
        _claimed[os.path.abspath(out_dir)] = (lock, True)
        write_run_config(run, out_dir)
        return run, "starting"
    except BaseException:
        _claimed.pop(os.path.abspath(out_dir), None)
        lock.release()
        raise


def _check_same_settings(run: RunConfig, out_dir: str) -> None:
    import yaml

    path = os.path.join(out_dir, RUN_CONFIG)
    if not os.path.isfile(path):
        return
    with open(path) as f:
        saved = yaml.safe_load(f) or {}
    differ = settings_differences(saved, run.raw, BOOKKEEPING)
    if differ:
        shown = "; ".join(f"{key}: {a!r} there, {b!r} now" for key, a, b in differ[:4])
        raise ConfigError(
            f"existing=continue: the run folder {out_dir} holds a run with other settings ({shown}"
            f"{'; ...' if len(differ) > 4 else ''}), so it is neither skipped nor continued. Run the study's "
            f"original command to finish it, or give these settings their own folder (another hydra.sweep.dir)."
        )


def finish_evaluation(run: RunConfig, ckpt_path: str, out_dir: str, resumed: dict, logger=None) -> dict:
    """The evaluation of a run whose training is done (its final checkpoint
    is in the folder) but whose results are not complete: the checkpoint's
    model, on the corpus it was trained on (check_resume), every length again."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lit, _ = load_checkpoint(ckpt_path, device)
    cache = prepare(resumed["data_cfg"], run.source, expect_corpus=resumed["corpus"])
    previous = {}
    try:
        with open(os.path.join(out_dir, RESULTS_JSON)) as f:
            previous = json.load(f).get("training") or {}
    except (OSError, ValueError):
        pass
    training = {"steps": resumed["steps"],
                "checkpoint_dir": os.path.join(out_dir, "checkpoints"),
                "val_loss": previous.get("val_loss"), "train_loss": previous.get("train_loss")}
    results = new_results(run.raw, cache.corpus, run.data.seq_len, run.pos["name"], status="complete", training=training)
    run_obj = getattr(logger, "experiment", None) if logger is not None and logger.__class__.__name__ == "WandbLogger" else None
    return evaluate_and_report(lit.model, cache, run.eval, [run.scaling], out_dir, results, run_obj)


def mark_failed(out_dir: str, config: dict, error: Exception) -> None:
    """results.json of a run that stopped on an error says so (status
    'failed' and the message), so a sweep's comparison lists it. Only in a
    folder this run started anew: another run's or a resumed run's results
    are never touched."""
    path = os.path.join(out_dir, RESULTS_JSON)
    claim = _claimed.get(os.path.abspath(out_dir))
    if claim is not None and not claim[1]:
        return  # a resume: the run's results stay as they were
    if claim is None and any(os.path.exists(os.path.join(out_dir, n)) for n in (RESULTS_JSON, "checkpoints")):
        return  # not ours
    results = {"status": "failed", "config": config, "methods": {}, "results": []}
    if claim is not None and os.path.exists(path):
        try:
            with open(path) as f:
                results = json.load(f)
        except (OSError, ValueError):
            pass
    results.update(status="failed", error=str(error))
    try:
        write_json(path, results)
    except (OSError, RopeLMError):
        pass  # the error being reported is likely this very disk

def check_resume(ckpt_path: str, run: RunConfig, out_dir: str) -> dict:
    """Before any work: the resumed run trains at least one more step (with
    existing=continue a finished checkpoint is allowed: only its evaluation is
    left), on the corpus its checkpoint was trained on, with the checkpoint's
    tokenizer. Returns the data settings to use, the corpus fingerprint to
    expect and the steps the checkpoint has trained."""
    saved = read_checkpoint(ckpt_path)
    hp = saved["hyper_parameters"]
    check_resumable(ckpt_path, {"model": run.model, "pos": run.pos, "train_len": run.data.seq_len,
                                "vocab_size": hp.get("vocab_size")}, hp)
    done = int(saved.get("global_step") or 0)
    if run.trainer.max_steps <= done and run.existing != "continue":
        raise ConfigError(
            f"The checkpoint {ckpt_path} has already trained {done} steps, and trainer.max_steps="
            f"{run.trainer.max_steps} asks for no more. To train longer give a larger total, e.g. "
            f"trainer.max_steps={done * 2}; to evaluate it again without training, use "
            f"scripts/eval_extrapolation.py ckpt={ckpt_path}."
        )
    data_cfg = run.data
    tokenizer_json = saved.get("tokenizer_json")
    if tokenizer_json:
        given = data_cfg.tokenizer_file
        if given and _read(given) != tokenizer_json:
            raise ConfigError(
                f"data.tokenizer_file={given!r} is not the tokenizer the checkpoint {ckpt_path} was trained with; "
                f"a resumed run keeps its own tokenizer: leave data.tokenizer_file unset."
            )
        data_cfg = dataclasses.replace(data_cfg, tokenizer_file=write_tokenizer(tokenizer_json, out_dir))
    corpus = (hp.get("corpus") or {}).get("fingerprint")
    return {"data_cfg": data_cfg, "corpus": (corpus, f"the checkpoint {ckpt_path}") if corpus else None,
            "hparams": hp, "steps": done}


def write_tokenizer(tokenizer_json: str, directory: str) -> str:
    """The checkpoint's tokenizer as <directory>/tokenizer.json."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path) or _read(path) != tokenizer_json:
        atomic_write(path, tokenizer_json)
    return path


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror}).") from None


def _new_results(run: RunConfig, cache, trainer, out_dir: str, status: str) -> dict:
    """The results record of a training run. A metric this process did not
    measure (a resumed run that validated no more) keeps its earlier value."""
    previous = {}
    path = os.path.join(out_dir, RESULTS_JSON)
    if os.path.exists(path):
        try:
            with open(path) as f:
                previous = json.load(f).get("training") or {}
        except (OSError, ValueError):
            previous = {}
    training = {"steps": trainer.global_step, "checkpoint_dir": os.path.join(out_dir, "checkpoints")}
    for name, key in (("val_loss", "val/loss"), ("train_loss", "train/loss")):
        value = _metric(trainer, key)
        training[name] = value if value is not None else previous.get(name)
    return new_results(run.raw, cache.corpus, run.data.seq_len, run.pos["name"], status=status, training=training)


def _metric(trainer, key):
    v = trainer.callback_metrics.get(key)
    return None if v is None else float(v)


# --- evaluating a checkpoint ------------------------------------------------------

def evaluate_checkpoint(ckpt_path: str | None, methods: list[dict], eval_options: dict, data_overrides: dict,
                        out_dir: str | None = None, device: str = "auto", hf: str | None = None) -> dict:
    """Re-use a trained checkpoint (or, with hf=, a transformers Llama-family
    model by local folder or hub name): ppl@L under each extrapolation method,
    one table and one plot, in a new folder (default: <run>/eval/<methods>/,
    or outputs/eval/<model>/<methods>/ for hf=, numbered if taken); a folder
    that holds results already is refused. The corpus defaults to the
    checkpoint's own (data.* for an imported model), tokenized with the
    tokenizer the model carries."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    eval_cfg = typed_dataclass(EvalConfig, eval_options, "eval.", "eval")
    data_overrides = typed(data_overrides or {}, DATA_ANNOTATIONS, "data.", "data")
    methods = [typed_component(METHODS, m or {"name": "none"}, "scaling") for m in methods]
    if hf:
        from rope_lm.hf import hf_lit

        lit, ckpt_path = hf_lit(hf).to(device).eval(), f"hf:{hf}"
    else:
        lit, ckpt_path = load_checkpoint(ckpt_path, device)
    hp = lit.hparams
    model = lit.model
    lengths = eval_cfg.resolve_lengths(model.cfg.train_len)
    for options in methods:  # refuse a method that does not fit before any work
        model.set_scaling(options)
        model.validate_length(max(lengths))
    labels = [method_label(m) for m in methods]
    if out_dir is None:
        home = os.path.join("outputs", "eval", hf.strip("/").replace("/", "--")) if hf else None
        out_dir = evaluation_dir(ckpt_path, labels, home)
    else:
        out_dir = refuse_taken(out_dir)
    check_writable(out_dir)
    cache, data_options = checkpoint_cache(lit, data_overrides, out_dir)
    config = {"ckpt_path": ckpt_path if hf else os.path.abspath(ckpt_path), "model": hp["model"], "pos": hp["pos"],
              "trained_scaling": hp.get("scaling"), "data": data_options, "eval": eval_options,
              "methods": methods}
    results = new_results(config, cache.corpus, model.cfg.train_len, hp["pos"]["name"])
    results["out_dir"] = out_dir
    return evaluate_and_report(model, cache, eval_cfg, methods, out_dir, results)


def evaluation_dir(ckpt_path: str, labels: list[str], home: str | None = None) -> str:
    """<run>/eval/<labels>[-N] (or <home>/<labels>[-N]): a new folder beside the run's own files."""
    if home is None:
        ckpt_dir = os.path.dirname(os.path.abspath(ckpt_path))
        run = os.path.dirname(ckpt_dir) if os.path.basename(ckpt_dir) == "checkpoints" else ckpt_dir
        home = os.path.join(run, "eval")
    base = os.path.join(home, "-".join(labels)[:80] or "none")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def refuse_taken(out_dir: str) -> str:
    taken = [name for name in (RESULTS_JSON, "checkpoints") if os.path.exists(os.path.join(out_dir, name))]
    if taken:
        raise ConfigError(
            f"out={out_dir} already holds results ({', '.join(taken)}); an evaluation never overwrites another "
            f"run's or evaluation's files. Leave out= unset (a new folder inside the run: <run>/eval/<methods>/) "
            f"or give a new folder."
        )
    return out_dir


def checkpoint_cache(lit, data_overrides: dict | None, work_dir: str):
    """(token cache, data options) of a checkpoint's own corpus (or its
    settings with overrides), tokenized with the tokenizer the checkpoint
    carries, so the model sees exactly the ids it was trained on."""
    data_options = {**(lit.hparams.get("data") or {}), **(data_overrides or {})}
    if lit.tokenizer_json:
        os.makedirs(work_dir, exist_ok=True)
        data_options["tokenizer_file"] = write_tokenizer(lit.tokenizer_json, work_dir)
    data_cfg, source = split_data(data_options)
    cache = prepare(data_cfg, source)
    if cache.vocab_size > lit.model.cfg.vocab_size:
        raise ConfigError(f"The evaluation tokenizer has {cache.vocab_size} tokens but the model only "
                          f"{lit.model.cfg.vocab_size}; evaluate with the checkpoint's own tokenizer.")
    return cache, data_options


# --- Fine-tuning from a checkpoint (`init_from`) ------------------------------

# Model settings that do not change what the weights mean; a fine-tune may set them anew.
FINETUNE_FREE_MODEL_KEYS = {"name", "dropout", "attention"}


def load_init_from(run: RunConfig, out_dir: str) -> dict:
    """`init_from=<ckpt or run dir>`: start from a trained model's weights.

    The new model keeps the checkpoint's training length (so a method with
    `factor: auto` trains at s = data.seq_len / L_original, and is evaluated
    at that s on shorter sequences, PosContext.tuned_len) and its vocabulary, and
    the corpus is tokenized with the checkpoint's tokenizer (a different
    data.tokenizer_file is refused). The corpus may differ from the
    checkpoint's: fine-tuning on new text is what init_from is for. model.*
    and pos.* must equal the checkpoint's; a difference is refused here,
    before any data or training work. Returns what `apply_init_from` needs,
    with data_cfg switched to that tokenizer."""
    given = run.init_from
    if given.startswith("hf:"):
        run, path, saved = _hf_start(run, given[len("hf:"):])
    else:
        path = resolve_checkpoint(given, "init_from")
        saved = read_checkpoint(path)
    hp = dict(saved["hyper_parameters"])
    weights = {k[len("model."):]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    diffs = [f"pos.{k}: checkpoint {hp['pos'].get(k)!r}, this run {run.pos.get(k)!r}"
             for k in sorted(set(hp["pos"]) | set(run.pos)) if hp["pos"].get(k) != run.pos.get(k)]
    diffs += [f"model.{k}: checkpoint {hp['model'].get(k)!r}, this run {run.model.get(k)!r}"
              for k in sorted(set(hp["model"]) | set(run.model) - FINETUNE_FREE_MODEL_KEYS)
              if hp["model"].get(k) != run.model.get(k)]
    if diffs:
        raise ConfigError(
            f"init_from={given!r} was trained with different model/positional settings ({'; '.join(diffs)}). "
            f"A fine-tune keeps the checkpoint's architecture: set these to the checkpoint's values (its run's "
            f".hydra/config.yaml lists them all)."
        )
    train_len, vocab_size = int(hp["train_len"]), int(hp["vocab_size"])
    data_cfg = run.data
    # The model must run at the new length with the checkpoint's L (e.g. a learned table of L rows).
    mcfg = run.model_config(vocab_size=vocab_size, train_len=train_len)
    check_fit(mcfg, run.pos, run.scaling, max(run.lengths + [data_cfg.seq_len]))
    if saved.get("tokenizer_json"):
        if data_cfg.tokenizer_file and _read(data_cfg.tokenizer_file) != saved["tokenizer_json"]:
            raise ConfigError(
                f"data.tokenizer_file={data_cfg.tokenizer_file!r} is not the tokenizer init_from={given!r} was "
                f"trained with; a fine-tune must read the token ids its weights were trained on: leave "
                f"data.tokenizer_file unset and the checkpoint's own tokenizer is used."
            )
        tok_path = write_tokenizer(saved["tokenizer_json"], out_dir)
        data_cfg = dataclasses.replace(data_cfg, tokenizer_file=tok_path)
    log.info("Fine-tuning %s (trained at L=%d) at data.seq_len=%d", path, train_len, data_cfg.seq_len)
    tuned_len = max(data_cfg.seq_len, int(hp.get("tuned_len") or 0))
    return {"path": path, "train_len": train_len, "tuned_len": tuned_len, "vocab_size": vocab_size, "weights": weights,
            "data_cfg": data_cfg, "model": run.model, "pos": run.pos, "scaling": run.scaling}


def _hf_start(run: RunConfig, name: str):
    """init_from=hf:<dir or hub name>: a transformers Llama/Mistral/Qwen2 model as
    a start. Its architecture and RoPE come from its config.json (model.* and
    pos.* of this run do not apply); scaling= chooses the method, and the
    default `none` keeps the model's own rope_scaling."""
    from rope_lm.hf import hf_checkpoint

    saved = hf_checkpoint(name)
    hp = saved["hyper_parameters"]
    scaling = hp.get("scaling") if run.scaling.get("name") == "none" and not run.scaling.get("logn") else run.scaling
    run = dataclasses.replace(run, model=hp["model"], pos=hp["pos"], scaling=scaling or {"name": "none"})
    return run, f"hf:{name}", saved


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
