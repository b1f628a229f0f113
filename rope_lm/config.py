"""The run configuration: typed, checked once at the entry, then passed down.

``resolve_run(dict) -> RunConfig`` is the one place where a run's settings are
checked: unknown keys and values of the wrong type (one mechanism, ``typed``,
driven by the annotations of the dataclasses below, of each positional
scheme's and extrapolation method's constructor, and of lightning.Trainer),
ranges (each section's ``validate``), the scheme/method fit and the
evaluation lengths. It reads no file and builds no model: everything after it
receives objects that are known to be valid.
"""

from dataclasses import dataclass, field, fields
import inspect
import math
import types
import typing

from rope_lm.corpus import SourceConfig
from rope_lm.data import DataConfig
from rope_lm.errors import ConfigError
from rope_lm.evaluation import EvalConfig
from rope_lm.lit import OptimConfig, check_train_positions
from rope_lm.loggers import check_options as check_logger
from rope_lm.model import ModelConfig, check_fit
from rope_lm.positional import SCHEMES
from rope_lm.scaling import METHODS
from rope_lm.train_positions import TRAIN_POSITIONS

# ModelConfig fields the run fills in itself (from the tokenizer and data.seq_len).
DERIVED_MODEL_KEYS = ("vocab_size", "train_len", "tuned_len")


@dataclass
class TrainerConfig:
    """trainer.*: rope-lm's own keys; every other key goes to lightning.Trainer."""

    max_steps: int = 1200
    val_every_n_steps: int = 200
    ckpt_every_n_steps: int = 200
    ckpt_every_minutes: float | None = None
    precision: str = "auto"
    deterministic: bool | str = "auto"
    compile: bool = False
    skip_nonfinite: int = 0
    sharded: bool = False  # FSDP2 per block over the devices (rope_lm/sharding.py; the trainer=fsdp preset)
    lightning: dict = field(default_factory=dict)

    def validate(self):
        for key in ("max_steps", "val_every_n_steps", "ckpt_every_n_steps"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"trainer.{key}={getattr(self, key)} must be a positive integer.")
        if self.skip_nonfinite < 0:
            raise ConfigError(f"trainer.skip_nonfinite={self.skip_nonfinite} must be 0 or more.")
        if self.ckpt_every_minutes is not None and self.ckpt_every_minutes <= 0:
            raise ConfigError(f"trainer.ckpt_every_minutes={self.ckpt_every_minutes} must be positive (or null).")
        if self.deterministic not in (True, False, "auto", "warn"):
            raise ConfigError(f"trainer.deterministic={self.deterministic!r} must be true, false, auto or warn.")


# refuse: a folder that holds another run's files is never written to. continue: a study run
# again with the same command finishes what is missing (rope_lm.run_folder.RunFolder.claim).
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
    raw: dict = field(default_factory=dict)  # the settings as given (for results.json and the checkpoint)

    @property
    def train_len(self) -> int:
        return self.data.seq_len

    def model_config(self, vocab_size: int, train_len: int | None = None, tuned_len: int | None = None) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, train_len=train_len or self.train_len, tuned_len=tuned_len,
                           **{k: v for k, v in self.model.items() if k != "name"})


TOP_LEVEL = {f.name for f in fields(RunConfig)} - {"source", "lengths", "raw"}


# --- one mechanism for keys and types -------------------------------------------

def _describe(annotation) -> str:
    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return "any value"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (list, tuple):
        (item, *_) = typing.get_args(annotation) or (typing.Any,)
        if item is typing.Any:
            return "a list"
        return f"a list of {_describe(item).removeprefix('an ').removeprefix('a ')}s"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
            type(None): "null"}.get(annotation, getattr(annotation, "__name__", str(annotation)))


class _Mismatch(Exception):
    pass


def _coerce(value, annotation):
    """value as the annotation's type, or _Mismatch; ints stand for floats,
    never the other way round, and booleans are never numbers."""
    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return value
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if value in typing.get_args(annotation):
            return value
        raise _Mismatch
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        (item, *_) = typing.get_args(annotation) or (typing.Any,)
        return [_coerce(v, item) for v in value]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        return value
    if annotation is type(None):
        if value is None:
            return None
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e6 in YAML is a float
            return int(value)
        raise _Mismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise _Mismatch
    return value  # an annotation this checker does not model (e.g. a Protocol): the consumer checks it


def typed(options: dict, annotations: dict, prefix: str, what: str, free: set = frozenset()) -> dict:
    """options checked against {key: annotation}: unknown keys and values of the
    wrong type are refused, naming the key, the value and what is valid."""
    if not isinstance(options, dict):
        raise ConfigError(f"`{prefix.rstrip('.')}` must be a mapping of settings, not {options!r}.")
    unknown = sorted(set(options) - set(annotations) - set(free))
    if unknown:
        raise ConfigError(
            f"Unknown {what} setting(s) {', '.join(prefix + k for k in unknown)}; valid `{prefix}*` settings are "
            f"{', '.join(sorted(set(annotations) | set(free)))}."
        )
    out = {}
    for key, value in options.items():
        if key in free:
            out[key] = value
            continue
        try:
            out[key] = _coerce(value, annotations[key])
        except _Mismatch:
            shown = f"{value!r} ({type(value).__name__})" if not isinstance(value, str) else repr(value)
            raise ConfigError(f"{prefix}{key}={shown} has the wrong type: it must be {_describe(annotations[key])}.") from None
        if not _finite(out[key]):
            # No rope-lm or Lightning setting means anything by nan or inf: a learning rate, a clip
            # value or a ratio that is not finite only fails later, inside the optimizer or at step 1.
            raise ConfigError(f"{prefix}{key}={value!r} is not finite: it must be {_describe(annotations[key])}, "
                              f"and nan or inf is never a valid setting.")
    return out


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def dataclass_annotations(cls, exclude=()) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.name not in exclude}


def signature_annotations(fn, skip: int = 0) -> tuple[dict, bool]:
    """{parameter: annotation} of a callable (after `skip` positional ones),
    and whether it also takes **kwargs."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # string annotations that do not resolve: fall back to the raw ones
        hints = {}
    named = {p.name: hints.get(p.name, p.annotation) for p in params
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


# data.*: the loader (DataConfig) and source (SourceConfig) settings under one prefix.
DATA_ANNOTATIONS = {**dataclass_annotations(DataConfig), **dataclass_annotations(SourceConfig)}


def typed_dataclass(cls, options: dict, prefix: str, what: str, exclude=()):
    obj = cls(**typed(options, dataclass_annotations(cls, exclude), prefix, what))
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def split_data(options: dict) -> tuple[DataConfig, SourceConfig]:
    """data.* settings, checked, as loader (DataConfig) and source (SourceConfig) settings."""
    typed(options, DATA_ANNOTATIONS, "data.", "data")
    source_keys = {f.name for f in fields(SourceConfig)}
    return (typed_dataclass(DataConfig, {k: v for k, v in options.items() if k not in source_keys}, "data.", "data"),
            typed_dataclass(SourceConfig, {k: v for k, v in options.items() if k in source_keys}, "data.", "data"))


def _component_annotations(cls, skip: int) -> dict:
    """Constructor settings of a scheme or method, following **common up the MRO."""
    out = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        named, more = signature_annotations(init, skip=skip)
        for k, v in named.items():
            out.setdefault(k, v)
        if not more:
            break
    return out


def typed_component(registry, options: dict, group: str) -> dict:
    """pos.* or scaling.*: the name must be registered, and every other key a
    typed constructor argument of that class."""
    if not isinstance(options, dict):
        raise ConfigError(f"`{group}` must be a mapping of settings with a name, not {options!r}.")
    cls = registry.get(options.get("name"))
    skip = 2 if group == "pos" else 1  # self (and dims for a scheme)
    annotations = _component_annotations(cls, skip)
    settings = {k: v for k, v in options.items() if k != "name"}
    unknown = sorted(set(settings) - set(annotations))
    if unknown:
        name = options["name"]
        valid = ", ".join(f"{group}.{k}" for k in sorted(annotations))
        others = [_component_annotations(registry.get(n), skip) for n in registry.names() if n != name]
        # Keys that another scheme takes: the name was changed alone (pos.name=alibi), keeping the
        # settings of the scheme it replaced, which `pos=alibi` would have swapped for its own.
        leftover = all(any(k in o for o in others) for k in unknown)
        raise ConfigError(
            f"Unknown {group} {name!r} setting(s) {', '.join(group + '.' + k for k in unknown)}; "
            + (f"{name!r} takes {valid}." if valid else f"{name!r} takes no settings besides its name.")
            + (f" Choose a {'scheme' if group == 'pos' else 'method'} with {group}={name}, which loads "
               f"conf/{group}/{name}.yaml with its own settings; {group}.name={name} alone keeps the settings of "
               f"the one it replaces." if leftover else "")
        )
    checked = typed(settings, annotations, f"{group}.", f"{group} {options.get('name')!r}")
    return {"name": options["name"], **checked}


def _lightning_annotations() -> dict:
    import lightning as L

    named, _ = signature_annotations(L.Trainer.__init__, skip=1)
    return named


def trainer_config(options: dict) -> TrainerConfig:
    """trainer.* checked: rope-lm's own keys typed by TrainerConfig, every
    other key by lightning.Trainer's signature (into TrainerConfig.lightning)."""
    trainer_opts = dict(options)
    own_keys = {f.name for f in fields(TrainerConfig)} - {"lightning"}
    lightning_opts = {k: trainer_opts.pop(k) for k in list(trainer_opts) if k not in own_keys}
    lightning_ann = _lightning_annotations()
    unknown = sorted(set(lightning_opts) - set(lightning_ann))
    if unknown:
        raise ConfigError(
            f"Unknown trainer setting(s) {', '.join('trainer.' + k for k in unknown)}: `trainer.*` keys are rope-lm's "
            f"own ({', '.join(sorted(own_keys))}) or arguments of lightning.Trainer (e.g. strategy, devices, "
            f"num_nodes, accumulate_grad_batches, gradient_clip_val)."
        )
    taken = {"max_steps", "max_epochs", "callbacks", "logger", "plugins", "default_root_dir", "val_check_interval"}
    clash = sorted(set(lightning_opts) & taken)
    if clash:
        raise ConfigError(f"trainer.{clash[0]} is set by rope-lm itself (from trainer.max_steps, the run directory "
                          f"and trainer.val_every_n_steps); remove it.")
    lightning = typed(lightning_opts, lightning_ann, "trainer.", "trainer")
    trainer = typed_dataclass(TrainerConfig, trainer_opts, "trainer.", "trainer")
    trainer.lightning = lightning
    return trainer


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
    top = typed({k: cfg[k] for k in ("seed", "ckpt_path", "init_from", "run_name", "study", "existing") if k in cfg},
                {"seed": int, "ckpt_path": str | None, "init_from": str | None, "run_name": str | None, "study": dict,
                 "existing": typing.Literal[EXISTING]}, "", "run")

    data, source = split_data(cfg.get("data") or {})

    trainer = trainer_config(cfg.get("trainer") or {})

    eval_cfg = typed_dataclass(EvalConfig, cfg.get("eval") or {}, "eval.", "eval")
    optim = typed_dataclass(OptimConfig, cfg.get("optim") or {}, "optim.", "optim")
    model = typed(cfg.get("model") or {}, dataclass_annotations(ModelConfig, DERIVED_MODEL_KEYS), "model.", "model",
                  free={"name"})
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

    run = RunConfig(model=model, pos=pos, scaling=scaling, data=data, source=source, trainer=trainer,
                    eval=eval_cfg, optim=optim, logger=logger, train_pos=train_pos, raw=cfg, **top)
    run.lengths = eval_cfg.resolve_lengths(data.seq_len)
    # Model shape, scheme/method fit and the longest length: no weights are built.
    mcfg = run.model_config(vocab_size=data.vocab_size)
    mcfg.validate()
    if not run.init_from:  # a fine-tune runs at the checkpoint's L: load_init_from checks it with that
        check_fit(mcfg, pos, scaling, max(run.lengths + [data.seq_len]))
        check_train_positions(mcfg, pos, train_pos, data.seq_len)
    if trainer.sharded:
        from rope_lm.sharding import check_shardable

        check_shardable(mcfg, pos, scaling)
    return run
