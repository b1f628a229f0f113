"""The run configuration: typed, checked once at the entry, then passed down.

``resolve_run(dict) -> RunConfig`` is the one place where a run's settings are
checked: unknown keys and values of the wrong type (one mechanism, ``typed``,
driven by the annotations of the dataclasses below, of each positional
scheme's and extrapolation method's constructor, and of lightning.Trainer),
ranges (each section's ``validate``), the scheme/method fit and the
evaluation lengths. It reads no file and builds no model: everything after it
receives objects that are known to be valid, and what it worked out on the
way (the evaluation lengths, the model's layer specs) rides on the RunConfig,
so nothing after it works it out again.
"""

from dataclasses import dataclass, field, fields
import typing

from rope_lm.core.errors import ConfigError
from rope_lm.core.typed import dataclass_annotations, typed, typed_component, typed_dataclass
from rope_lm.data.corpus import SourceConfig
from rope_lm.data.split import split_data
from rope_lm.data.token_cache import DataConfig
from rope_lm.eval.evaluation import EvalConfig
from rope_lm.model.layout import UNRESOLVED, LayerSpec
from rope_lm.model.transformer import ModelConfig, check_fit
from rope_lm.positional import SCHEMES
from rope_lm.runs.eval_run import control_options, eval_settings
from rope_lm.scaling import METHODS
from rope_lm.train.lit import OptimConfig, check_train_positions
from rope_lm.train.loggers import check_options as check_logger
from rope_lm.train.trainer import TrainerConfig, trainer_config
from rope_lm.train_positions import TRAIN_POSITIONS

# ModelConfig fields the run fills in itself (from the tokenizer and data.seq_len).
DERIVED_MODEL_KEYS = ("vocab_size", "train_len", "tuned_len")


# refuse: a folder that holds another run's files is never written to. continue: a study run
# again with the same command finishes what is missing (rope_lm.runs.run_folder.RunFolder.claim).
EXISTING = ("refuse", "continue")


@dataclass
class RunConfig:
    model: dict
    pos: dict
    scaling: dict
    data: DataConfig
    source: SourceConfig
    trainer: TrainerConfig
    eval: EvalConfig
    optim: OptimConfig
    logger: dict
    train_pos: dict = field(default_factory=lambda: {"name": "none"})  # training-time position ids (train_positions/)
    seed: int = 1337
    ckpt_path: str | None = None
    init_from: str | None = None
    run_name: str | None = None
    study: dict = field(default_factory=dict)
    existing: str = "refuse"  # what a run does with a folder that holds a run already (EXISTING)
    lengths: list[int] = field(default_factory=list)  # evaluation lengths, resolved once
    # eval.controls, checked (runs.eval_run.CONTROLS): evaluated on the final weights after the run's own method.
    controls: list[str] = field(default_factory=list)
    control_window: int | None = None  # eval.control_window: the window control's width (None: the training length)
    # model.layout under `pos`, one spec per layer (None: no layout), resolved once (ModelConfig.resolve): what
    # builds the model (LitLM, open_model, the memory plan) and checks it takes, instead of resolving it again.
    # UNRESOLVED only in a RunConfig made without resolve_run: then what builds the model resolves it.
    layers: list[LayerSpec] | None = UNRESOLVED
    raw: dict = field(default_factory=dict)  # the settings as given (for results.json and the checkpoint)

    @property
    def train_len(self) -> int:
        return self.data.seq_len

    def model_config(self, vocab_size: int, train_len: int | None = None, tuned_len: int | None = None) -> ModelConfig:
        return ModelConfig(
            vocab_size=vocab_size,
            train_len=train_len or self.train_len,
            tuned_len=tuned_len,
            **{k: v for k, v in self.model.items() if k != "name"},
        )


TOP_LEVEL = {f.name for f in fields(RunConfig)} - {"source", "lengths", "layers", "raw", "controls", "control_window"}


# --- the run --------------------------------------------------------------------


def resolve_run(cfg: dict) -> RunConfig:
    """The whole run's settings, typed and checked, before any work."""
    cfg = dict(cfg)
    unknown = sorted(set(cfg) - TOP_LEVEL)
    if unknown:
        raise ConfigError(
            f"Unknown top-level setting(s) {', '.join(unknown)}; valid ones are {', '.join(sorted(TOP_LEVEL))} "
            f"(put a study's own variables under `study.`)."
        )
    top = typed(
        {k: cfg[k] for k in ("seed", "ckpt_path", "init_from", "run_name", "study", "existing") if k in cfg},
        {
            "seed": int,
            "ckpt_path": str | None,
            "init_from": str | None,
            "run_name": str | None,
            "study": dict,
            "existing": typing.Literal[EXISTING],
        },
        "",
        "run",
    )

    data, source = split_data(cfg.get("data") or {})

    trainer = trainer_config(cfg.get("trainer") or {})

    eval_cfg, controls, control_window = eval_settings(cfg.get("eval"))
    optim = typed_dataclass(OptimConfig, cfg.get("optim") or {}, "optim.", "optim")
    model = typed(
        cfg.get("model") or {}, dataclass_annotations(ModelConfig, DERIVED_MODEL_KEYS), "model.", "model", free={"name"}
    )
    pos = typed_component(SCHEMES, cfg.get("pos") or {}, "pos")
    scaling = typed_component(METHODS, cfg.get("scaling") or {"name": "none"}, "scaling")
    train_pos = typed_component(TRAIN_POSITIONS, cfg.get("train_pos") or {"name": "none"}, "train_pos")
    if train_pos == {"name": "none"}:
        # Plain positions, what every run did before train_pos existed, are recorded as no setting, so a
        # run's recorded settings stay those of its earlier sittings (a study continued with existing=continue).
        cfg.pop("train_pos", None)
    logger = cfg.get("logger") or {"name": "none"}
    if not isinstance(logger, dict):
        raise ConfigError(f"`logger` must be a mapping of settings with a name, not {logger!r}.")
    check_logger(logger)

    run = RunConfig(
        model=model,
        pos=pos,
        scaling=scaling,
        data=data,
        source=source,
        trainer=trainer,
        eval=eval_cfg,
        optim=optim,
        logger=logger,
        train_pos=train_pos,
        raw=cfg,
        controls=controls,
        control_window=control_window,
        **top,
    )
    run.lengths = eval_cfg.resolve_lengths(data.seq_len)
    # Model shape and layer specs, scheme/method fit and the longest length: no weights are built.
    mcfg = run.model_config(vocab_size=data.vocab_size)
    run.layers = mcfg.resolve(pos)
    if not run.init_from:  # a fine-tune runs at the checkpoint's L: load_init_from checks it with that
        check_fit(mcfg, pos, scaling, max(run.lengths + [data.seq_len]), run.layers)
        if scaling["name"] == "none":  # a control applies to a model trained under no method (eval_run.plan_controls)
            for name in controls:
                control = control_options(name, data.seq_len, data.seq_len, control_window)
                check_fit(mcfg, pos, control, max(run.lengths + [data.seq_len]), run.layers)
        check_train_positions(mcfg, pos, train_pos, data.seq_len, run.layers)
    if trainer.sharded:
        from rope_lm.train.sharding import check_shardable

        check_shardable(mcfg, pos, scaling, run.layers)
    if trainer.context_parallel != 1:
        from rope_lm.train import context_parallel

        context_parallel.check_settings(
            trainer.context_parallel, data.seq_len, trainer.compile, trainer.lightning.get("strategy")
        )
        context_parallel.check_served(mcfg, pos, scaling, run.layers)
    return run
