"""Train short, evaluate long: the whole run from a plain config dict.

train.py and scripts/ hand this module a resolved config (nothing here reads
Hydra). Every check that can fail on user input runs before the corpus is
tokenized or a step is trained.
"""

from dataclasses import fields
import datetime
import logging
import os
import signal

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from rope_lm.checkpointing import AtomicCheckpointIO, GracefulStop, check_resumable
from rope_lm.data import DataConfig, LMDataModule, prepare
from rope_lm.errors import ConfigError
from rope_lm.evaluation import EvalConfig, eval_summary, evaluate_lengths, scored_tokens
from rope_lm.lit import LitLM, TokensPerSecond
from rope_lm.model import build_model
from rope_lm.report import log_to_wandb, new_results, write_views

log = logging.getLogger("rope_lm")

# trainer.* settings rope-lm interprets itself; every other key goes to lightning.Trainer as is.
OWN_TRAINER_KEYS = {"val_every_n_steps", "ckpt_every_n_steps", "ckpt_every_minutes", "precision", "deterministic",
                    "compile", "skip_nonfinite"}


def _eval_config(options: dict) -> EvalConfig:
    known = {f.name for f in fields(EvalConfig)}
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"Unknown eval setting(s) {', '.join(sorted(unknown))}; valid `eval.*` settings are {', '.join(sorted(known))}.")
    cfg = EvalConfig(**options)
    cfg.validate()
    return cfg


def method_label(options: dict | None) -> str:
    from rope_lm.scaling import build_scaling

    return getattr(build_scaling(options), "label", (options or {}).get("name", "none"))


def check_writable(out_dir: str):
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"The output directory {out_dir} is not writable ({e.strerror}); set hydra.run.dir (or the script's out=) to a writable place.") from None


def trainer_kwargs(options: dict, out_dir: str, logger, max_steps: int, on_stop=None):
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    opts = dict(options)
    own = {k: opts.pop(k) for k in list(opts) if k in OWN_TRAINER_KEYS}
    cuda = torch.cuda.is_available() and opts.get("accelerator", "auto") in ("auto", "gpu", "cuda")
    precision = own.get("precision", "auto")
    if precision == "auto":
        precision = "bf16-mixed" if cuda and torch.cuda.is_bf16_supported() else "32-true"
    deterministic = own.get("deterministic", "auto")
    if deterministic == "auto":
        deterministic = not cuda
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    minutes = own.get("ckpt_every_minutes")
    callbacks = [
        ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/loss", mode="min", save_top_k=1,
                        enable_version_counter=False),
        ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, enable_version_counter=False,
                        every_n_train_steps=None if minutes else own.get("ckpt_every_n_steps", 200),
                        train_time_interval=datetime.timedelta(minutes=minutes) if minutes else None),
        TokensPerSecond(every=opts.get("log_every_n_steps", 10)),
        GracefulStop(ckpt_dir, on_stop),
    ]
    if logger is not None:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    kwargs = dict(
        # One endless "epoch" (see data.StepSampler); max_steps ends it.
        max_steps=max_steps, max_epochs=1, precision=precision, deterministic=deterministic, logger=logger if logger is not None else False,
        callbacks=callbacks, default_root_dir=out_dir, val_check_interval=own.get("val_every_n_steps", 200),
        check_val_every_n_epoch=None, use_distributed_sampler=False, num_sanity_val_steps=0,
        plugins=[AtomicCheckpointIO()],
    )
    kwargs.update(opts)
    import inspect

    valid = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    unknown = set(opts) - valid
    if unknown:
        raise ConfigError(
            f"Unknown trainer setting(s) {', '.join(sorted(unknown))}: `trainer.*` keys are rope-lm's own "
            f"({', '.join(sorted(OWN_TRAINER_KEYS))}) or arguments of lightning.Trainer (e.g. strategy, devices, "
            f"num_nodes, accumulate_grad_batches, gradient_clip_val)."
        )
    return kwargs, own


def resolve_ckpt(path: str | None) -> str | None:
    if not path:
        return None
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoints", "last.ckpt")
    if not os.path.isfile(path):
        raise ConfigError(f"ckpt_path={path!r} is not a checkpoint file (or a run directory with checkpoints/last.ckpt).")
    return path


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
            label = method_label(options)
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


def validate_before_work(cfg: dict):
    """Every check that needs no data: config values, scheme/method fit, lengths."""
    data_cfg, source = DataConfig.split(cfg["data"])
    data_cfg.validate()
    eval_cfg = _eval_config(cfg.get("eval") or {})
    lengths = eval_cfg.resolve_lengths(data_cfg.seq_len)
    if source.kind == "files":
        from rope_lm.corpus import _expand_path

        _expand_path(source.path)
    probe = build_model(cfg["model"], cfg["pos"], cfg.get("scaling"), vocab_size=data_cfg.vocab_size, train_len=data_cfg.seq_len)
    probe.validate_length(max(lengths))
    return data_cfg, source, eval_cfg


def train_and_evaluate(cfg: dict, out_dir: str, logger=None) -> dict:
    data_cfg, source, eval_cfg = validate_before_work(cfg)
    check_writable(out_dir)
    init = load_init_from(cfg, data_cfg, eval_cfg, out_dir)
    if init:
        data_cfg = init["data_cfg"]
    ckpt_path = resolve_ckpt(cfg.get("ckpt_path"))
    max_steps = cfg["trainer"]["max_steps"]
    state = {}

    def write_partial(trainer):
        results = _new_results(cfg, state["cache"], data_cfg, trainer, out_dir, status="interrupted")
        write_views(results, out_dir)

    kwargs, own = trainer_kwargs(cfg["trainer"], out_dir, logger, max_steps, on_stop=write_partial)

    cache = state["cache"] = prepare(data_cfg, source)
    lengths = eval_cfg.resolve_lengths(data_cfg.seq_len)
    scored_tokens(len(cache.tokens(eval_cfg.split)), lengths, eval_cfg.token_budget, eval_cfg.split)
    datamodule = LMDataModule(cache, data_cfg, cfg["seed"], kwargs.get("accumulate_grad_batches", 1))
    hparams = dict(model=cfg["model"], pos=cfg["pos"], scaling=cfg.get("scaling"), optim=cfg["optim"],
                   vocab_size=cache.vocab_size, train_len=data_cfg.seq_len, max_steps=max_steps,
                   corpus=cache.corpus, data=cfg["data"], compile=own.get("compile", False),
                   skip_nonfinite=own.get("skip_nonfinite", 0))
    if init:
        init_from_hparams(init, hparams)
    if ckpt_path:
        check_resumable(ckpt_path, hparams)

    import lightning as L

    L.seed_everything(cfg["seed"], workers=True, verbose=False)
    lit = LitLM(**hparams)
    if init:
        apply_init_from(init, lit)
    with open(os.path.join(cache.dir, "tokenizer.json")) as f:
        lit.tokenizer_json = f.read()
    log.info("Model: %.2fM parameters (%.2fM without embeddings), scheme %s, method %s",
             lit.model.num_params(False) / 1e6, lit.model.num_params() / 1e6, cfg["pos"]["name"],
             method_label(cfg.get("scaling")))
    if logger is not None:
        logger.log_hyperparams(cfg)
    trainer = L.Trainer(**kwargs)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException as e:  # GracefulStop already saved the checkpoint and partial results
        raise SystemExit(e.code or 128 + signal.SIGTERM) from None

    # The final state, whatever the checkpoint interval: `resume=` can extend the run from here.
    final = os.path.join(out_dir, "checkpoints", "last.ckpt")
    trainer.save_checkpoint(final)
    results = _new_results(cfg, cache, data_cfg, trainer, out_dir, status="complete")
    if trainer.is_global_zero:
        model = lit.model
        if trainer.world_size > 1:
            # Under DDP/FSDP the in-memory model may be sharded; evaluate the
            # consolidated checkpoint on this process alone.
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = LitLM.load_from_checkpoint(final, map_location=device).model.to(device)
        run = getattr(logger, "experiment", None) if logger is not None and logger.__class__.__name__ == "WandbLogger" else None
        evaluate_and_report(model, cache, eval_cfg, [cfg.get("scaling")], out_dir, results, run)
    return results


def _new_results(cfg, cache, data_cfg, trainer, out_dir, status):
    return new_results(cfg, cache.corpus, data_cfg.seq_len, cfg["pos"]["name"], status=status,
                       training={"steps": trainer.global_step, "val_loss": _metric(trainer, "val/loss"),
                                 "train_loss": _metric(trainer, "train/loss"),
                                 "checkpoint_dir": os.path.join(out_dir, "checkpoints")})


def _metric(trainer, key):
    v = trainer.callback_metrics.get(key)
    return None if v is None else float(v)


def evaluate_checkpoint(ckpt_path: str, methods: list[dict], eval_options: dict, data_overrides: dict,
                        out_dir: str, device: str = "auto") -> dict:
    """Re-use a trained checkpoint: ppl@L under each extrapolation method, one
    table and one plot. The corpus defaults to the checkpoint's own, tokenized
    with the tokenizer stored in the checkpoint."""
    ckpt_path = resolve_ckpt(ckpt_path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    eval_cfg = _eval_config(eval_options)
    check_writable(out_dir)
    try:
        lit = LitLM.load_from_checkpoint(ckpt_path, map_location=device)
    except (RuntimeError, KeyError, TypeError) as e:
        raise ConfigError(f"Could not load checkpoint {ckpt_path} as a rope-lm model ({type(e).__name__}: {str(e).splitlines()[0]}).") from None
    hp = lit.hparams
    model = lit.model.to(device)
    lengths = eval_cfg.resolve_lengths(model.cfg.train_len)
    for options in methods:  # refuse a method that does not fit before any work
        model.set_scaling(options)
        model.validate_length(max(lengths))
    cache, data_options = checkpoint_cache(lit, data_overrides, out_dir)
    config = {"ckpt_path": os.path.abspath(ckpt_path), "model": hp["model"], "pos": hp["pos"],
              "trained_scaling": hp.get("scaling"), "data": data_options, "eval": eval_options,
              "methods": methods}
    results = new_results(config, cache.corpus, model.cfg.train_len, hp["pos"]["name"])
    return evaluate_and_report(model, cache, eval_cfg, methods, out_dir, results)


def checkpoint_cache(lit, data_overrides: dict | None, work_dir: str):
    """(token cache, data options) of a checkpoint's own corpus (or its
    settings with overrides), tokenized with the tokenizer the checkpoint
    carries, so the model sees exactly the ids it was trained on."""
    data_options = {**(lit.hparams.get("data") or {}), **(data_overrides or {})}
    if lit.tokenizer_json:
        os.makedirs(work_dir, exist_ok=True)
        tok_path = os.path.join(work_dir, "tokenizer.json")
        with open(tok_path, "w") as f:
            f.write(lit.tokenizer_json)
        data_options["tokenizer_file"] = tok_path
    data_cfg, source = DataConfig.split(data_options)
    cache = prepare(data_cfg, source)
    if cache.vocab_size > lit.model.cfg.vocab_size:
        raise ConfigError(f"The evaluation tokenizer has {cache.vocab_size} tokens but the model only "
                          f"{lit.model.cfg.vocab_size}; evaluate with the checkpoint's own tokenizer.")
    return cache, data_options


# --- Fine-tuning from a checkpoint (`init_from`) ------------------------------

# Model settings that do not change what the weights mean; a fine-tune may set them anew.
FINETUNE_FREE_MODEL_KEYS = {"name", "dropout", "attention"}


def load_init_from(cfg: dict, data_cfg: DataConfig, eval_cfg: EvalConfig, out_dir: str) -> dict | None:
    """`init_from=<ckpt or run dir>`: start from a trained model's weights.

    The new model keeps the checkpoint's training length (so a method with
    `factor: auto` trains at s = data.seq_len / L_original, and is evaluated
    at that s on shorter sequences, PosContext.tuned_len) and its vocabulary, and
    the corpus is tokenized with the checkpoint's tokenizer. model.* and pos.*
    must equal the checkpoint's; a difference is refused here, before any data
    or training work. Returns None without init_from, else what
    `apply_init_from` needs, with data_cfg switched to that tokenizer."""
    given = cfg.get("init_from")
    if not given:
        return None
    try:
        path = resolve_ckpt(given)
    except ConfigError:
        raise ConfigError(f"init_from={given!r} is not a checkpoint file (or a run directory with checkpoints/last.ckpt).") from None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
        hp = dict(saved["hyper_parameters"])
        weights = {k[len("model."):]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    except Exception as e:
        raise ConfigError(f"init_from={given!r} could not be read as a rope-lm checkpoint ({type(e).__name__}: {e}).") from None
    diffs = [f"pos.{k}: checkpoint {hp['pos'].get(k)!r}, this run {cfg['pos'].get(k)!r}"
             for k in sorted(set(hp["pos"]) | set(cfg["pos"])) if hp["pos"].get(k) != cfg["pos"].get(k)]
    diffs += [f"model.{k}: checkpoint {hp['model'].get(k)!r}, this run {cfg['model'].get(k)!r}"
              for k in sorted(set(hp["model"]) | set(cfg["model"]) - FINETUNE_FREE_MODEL_KEYS)
              if hp["model"].get(k) != cfg["model"].get(k)]
    if diffs:
        raise ConfigError(
            f"init_from={given!r} was trained with different model/positional settings ({'; '.join(diffs)}). "
            f"A fine-tune keeps the checkpoint's architecture: set these to the checkpoint's values (its run's "
            f".hydra/config.yaml lists them all)."
        )
    train_len, vocab_size = int(hp["train_len"]), int(hp["vocab_size"])
    # The model must run at the new length with the checkpoint's L (e.g. a learned table of L rows).
    probe = build_model(cfg["model"], cfg["pos"], cfg.get("scaling"), vocab_size=vocab_size, train_len=train_len)
    probe.validate_length(max(eval_cfg.resolve_lengths(data_cfg.seq_len) + [data_cfg.seq_len]))
    if saved.get("tokenizer_json") and not data_cfg.tokenizer_file:
        import dataclasses

        check_writable(out_dir)
        tok_path = os.path.join(out_dir, "init_from_tokenizer.json")
        with open(tok_path, "w") as f:
            f.write(saved["tokenizer_json"])
        data_cfg = dataclasses.replace(data_cfg, tokenizer_file=tok_path)
    log.info("Fine-tuning %s (trained at L=%d) at data.seq_len=%d", path, train_len, data_cfg.seq_len)
    tuned_len = max(data_cfg.seq_len, int(hp.get("tuned_len") or 0))
    return {"path": path, "train_len": train_len, "tuned_len": tuned_len, "vocab_size": vocab_size, "weights": weights,
            "data_cfg": data_cfg}


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
