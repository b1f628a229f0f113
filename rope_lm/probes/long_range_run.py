"""scripts/long_range_probes.py's work: two long-range probes any language model can be scored on
without training on a task format, written to a folder as each result comes.

* repeated_span (rope_lm.probes.repeated_span): the loss of a span's second copy with and without its
  first copy d tokens earlier, at distances below and past the training length L;
* key_tokens (rope_lm.probes.key_tokens): LongPPL, the perplexity on the tokens a fixed evaluator
  model needs long context for, beside the perplexity on every token.

What a continued run checks. long_range.json holds the settings every number depends on; with
`existing=continue` the run goes on only under the same ones, and the model (and the key-token
evaluator) is named by content, its weights' checksum and training step, not by the path it was
given: the same checkpoint by another path continues, another model under the same path is refused,
both shown. Each distance and each key-token length is written as soon as it is scored (the file is
replaced whole, never cut), and the evaluator's losses are kept in a file of their own as soon as they
are computed, so a stop (SIGTERM, Ctrl-C) loses at most the row in hand and says what is on disk and
the command that finishes the run.
"""

from dataclasses import dataclass, field
import datetime
import hashlib
import json
import logging
import math
import os
import tempfile

import numpy as np

from rope_lm.core.errors import ConfigError, Interrupted, OutputError
from rope_lm.core.files import atomic_write, from_here, write_json
from rope_lm.core.stops import rerun_command, signal_status, signals_stop
from rope_lm.core.tables import markdown_table
from rope_lm.core.typed import typed, typed_component, typed_dataclass
from rope_lm.data.special_tokens import mid_text_warning, text_prefix
from rope_lm.data.split import DATA_ANNOTATIONS
from rope_lm.eval.evaluation import token_losses
from rope_lm.eval.results import git_commit
from rope_lm.probes import diagnostics as D
from rope_lm.probes import key_tokens as K
from rope_lm.probes import repeated_span as RS
from rope_lm.probes.existing import check_existing
from rope_lm.runs.trained import checkpoint_token_cache, open_model
from rope_lm.scaling import METHODS

log = logging.getLogger("rope_lm")

PROBES = ("repeated_span", "key_tokens")
RESULTS = "long_range.json"
REPORT = "long_range.md"
SCRIPT = "long_range_probes.py"


@dataclass
class RepeatedSpanSettings:
    """repeated_span.*: the span, the distances between the copies' starts, the samples per distance."""

    span: int = 32
    distances: list[int] | None = None  # absolute; null: multipliers x the model's training length
    multipliers: list[float] = field(default_factory=lambda: [0.5, 1, 2, 4, 8])
    samples: int = 32

    def validate(self):
        if self.samples < 1:
            raise ConfigError(f"repeated_span.samples={self.samples} must be at least 1 (spans per distance).")
        _check_lengths(self.distances, self.multipliers, "repeated_span.distances", "repeated_span.multipliers")


@dataclass
class KeyTokenSettings:
    """key_tokens.*: the evaluator that chooses the key tokens, the text and the selection's thresholds."""

    evaluator: str | None = None  # a checkpoint, a run folder or hf:<model>; this or evaluator_losses is required
    evaluator_losses: str | None = None  # in its place: a folder of the losses an evaluator kept (key_tokens-*.npz)
    evaluator_scaling: dict | None = None  # the evaluator's method (null: its own)
    lengths: list[int] | None = None  # window lengths T; null: multipliers x the evaluator's training length
    multipliers: list[float] = field(default_factory=lambda: [2, 4, 8])
    short: int | None = None  # K; null: the evaluator's training length
    stride: int | None = None  # S; null: K // 4
    alpha: float = K.ALPHA
    beta: float = K.BETA
    token_budget: int = 32_768  # targets per length (at least one window)
    cache: str | None = None  # folder of the evaluator's losses; null: out=

    def validate(self):
        if self.evaluator and self.evaluator_losses:
            raise ConfigError(
                f"key_tokens.evaluator={self.evaluator} and key_tokens.evaluator_losses={self.evaluator_losses} are "
                f"both given: the key tokens are chosen by one evaluator, either the model itself or the losses it "
                f"kept in a folder (which stand in for it where the model is not at hand). Give one of the two."
            )
        if self.evaluator_losses and (self.evaluator_scaling or self.cache):
            raise ConfigError(
                f"key_tokens.evaluator_losses={self.evaluator_losses} reads the losses an evaluator kept, under the "
                f"method it ran and from that folder, so key_tokens.evaluator_scaling= and key_tokens.cache= have "
                f"nothing to act on: leave them out (the files record the evaluator's method)."
            )
        if not self.evaluator and not self.evaluator_losses:
            raise ConfigError(
                "key_tokens.evaluator= is required for the key_tokens probe: the fixed model that chooses the key "
                "tokens (a .ckpt file, a run folder or hf:<model>), named by the user so that every model compared "
                "is scored on the same tokens; there is no default, and the model under test itself is accepted "
                "only when named. Give key_tokens.evaluator=<model>, or key_tokens.evaluator_losses=<folder> (the "
                "losses an evaluator kept, in its place), or leave the probe out with probes=[repeated_span]."
            )
        _check_lengths(self.lengths, self.multipliers, "key_tokens.lengths", "key_tokens.multipliers")
        if self.token_budget < 1:
            raise ConfigError(f"key_tokens.token_budget={self.token_budget} must be a positive number of tokens.")


@dataclass
class LongRangeSettings:
    """conf/long_range_probes.yaml's settings, as plain values."""

    ckpt: str | None = None
    scaling: dict | None = None
    probes: list = field(default_factory=lambda: list(PROBES))
    repeated_span: dict = field(default_factory=dict)
    key_tokens: dict = field(default_factory=dict)
    split: str = "test"
    data: dict = field(default_factory=dict)
    seed: int = 0
    bootstrap: int = 1000
    batch_tokens: int = 16_384
    device: str = "auto"
    out: str | None = None
    existing: str = "refuse"


def _check_lengths(lengths, multipliers, lengths_key: str, multipliers_key: str) -> None:
    values = lengths if lengths else multipliers
    key = lengths_key if lengths else multipliers_key
    if not values:
        raise ConfigError(f"{key} is empty: give at least one, e.g. {multipliers_key}=[1,2,4].")
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad:
        shown = "[" + ", ".join(f"{v:g}" for v in values) + "]"
        raise ConfigError(f"{key}={shown}: {bad[0]:g} is not a positive number of tokens or a positive multiple of L.")


def _resolve(train_len: int, lengths, multipliers) -> list[int]:
    return sorted({int(v) for v in lengths} if lengths else {max(1, int(round(m * train_len))) for m in multipliers})


def check(s: LongRangeSettings) -> tuple[list[str], RepeatedSpanSettings, KeyTokenSettings]:
    """Every setting that needs no model, checked before one is read."""
    probes = list(s.probes or [])
    unknown = [p for p in probes if p not in PROBES]
    if not probes or unknown or len(set(probes)) != len(probes):
        raise ConfigError(
            f"probes={probes}: give one or both of {', '.join(PROBES)}, each once (repeated_span: the loss of a "
            f"span's second copy with and without its first; key_tokens: LongPPL, the PPL on the tokens a fixed "
            f"evaluator needs long context for)."
        )
    rs = typed_dataclass(RepeatedSpanSettings, s.repeated_span or {}, "repeated_span.", "repeated_span")
    kt = KeyTokenSettings()
    if "key_tokens" in probes:
        kt = typed_dataclass(KeyTokenSettings, s.key_tokens or {}, "key_tokens.", "key_tokens")
        if kt.evaluator_scaling:
            kt.evaluator_scaling = typed_component(METHODS, kt.evaluator_scaling, "key_tokens.evaluator_scaling")
        K.check(kt.short, kt.stride, kt.alpha, kt.beta, kt.lengths)
    if s.split not in ("train", "valid", "test"):
        raise ConfigError(f"split={s.split!r} is not a split; use train, valid or test (evaluation's is test).")
    typed(s.data or {}, DATA_ANNOTATIONS, "data.", "data")
    if not isinstance(s.bootstrap, int) or isinstance(s.bootstrap, bool) or s.bootstrap < 0:
        raise ConfigError(f"bootstrap={s.bootstrap!r} must be a whole number of resamples (1000; 0: no intervals).")
    if s.batch_tokens < 1:
        raise ConfigError(f"batch_tokens={s.batch_tokens} must be a positive number of tokens per forward pass.")
    check_existing(s.existing, s.out, "results", "the distances and lengths an earlier run of the same settings scored")
    held = _earlier_files(s.out) if s.existing == "refuse" and s.out else []
    if held:
        raise ConfigError(
            f"out={s.out} holds the results of an earlier long-range run ({', '.join(held[:3])}); a run never "
            f"writes over them. Add existing=continue to finish or extend that run with the same settings, or give "
            f"a new out= folder."
        )
    return probes, rs, kt


# --- the results file, and what a continued run must match -----------------------------------------


def _earlier_files(out: str) -> list[str]:
    """What a long-range run leaves in its folder: its results, and the evaluator's losses it keeps."""
    if not os.path.isdir(out):
        return []
    return sorted(n for n in os.listdir(out) if n == RESULTS or (n.startswith("key_tokens-") and n.endswith(".npz")))


def _read_record(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"existing=continue: {path} cannot be read as the results of a long-range run ({e}); give a new out= "
            f"folder."
        ) from None


def _short(value, width: int = 100) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _check_same(path: str, section: str, before: dict | None, now: dict) -> None:
    if before is None:
        return
    before, now = json.loads(json.dumps(before, default=str)), json.loads(json.dumps(now, default=str))
    differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if differ:
        shown = "; ".join(f"{k}: {_short(before.get(k))} before, {_short(now.get(k))} now" for k in differ)
        raise ConfigError(
            f"existing=continue: {path} holds {section} results scored with other settings ({shown}), so they are "
            f"not continued with these. Give the settings of that run, or a new out= folder."
        )


def _check_model(path: str, kept: dict | None, identity: dict, source: str, setting: str, kept_source) -> None:
    if kept is not None and kept != identity:
        raise ConfigError(
            f"existing=continue: {path} holds results scored with another model: weights {kept.get('weights')} at "
            f"step {kept.get('step')} ({setting}={kept_source}), where {setting}={source} has weights "
            f"{identity.get('weights')} at step {identity.get('step')}. Continue with the model those results were "
            f"scored with, or give a new out= folder."
        )


def _split_tokens(trained, split: str, data: dict | None) -> tuple[np.ndarray, dict]:
    """The model's own corpus split (or the data.* settings given), tokenized with its own tokenizer."""
    with tempfile.TemporaryDirectory(prefix="rope-lm-tokenizer-") as work:
        cache, _ = checkpoint_token_cache(trained.lit, data or None, work, trained.path)
        corpus = cache.corpus or {}
        return cache.tokens(split), {"where": corpus.get("where"), "fingerprint": corpus.get("fingerprint")}


def _digest(tokens) -> str:
    """The split's tokens by content: what every number of a run is read from."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


# --- the run -----------------------------------------------------------------------------------------


def finish_command(command: list[str] | None, s: LongRangeSettings, out: str) -> str:
    command = command if command is not None else [f"ckpt={s.ckpt}"]
    return rerun_command(SCRIPT, command, ("out", "existing"), [f"out={out}", "existing=continue"])


def run_long_range(s: LongRangeSettings, command: list[str] | None = None) -> dict:
    """The probes for s.ckpt into their folder; returns what long_range.json holds. `command`: the
    arguments given on the command line, for the command a stop prints to finish the run."""
    probes, rs, kt = check(s)
    record_path = os.path.join(s.out, RESULTS) if s.out else None
    earlier = _read_record(record_path) if s.existing == "continue" else None
    common = {"scaling": s.scaling, "split": s.split, "data": s.data or None, "seed": s.seed, "bootstrap": s.bootstrap}
    if earlier is not None:
        _check_same(record_path, "its", earlier.get("settings", {}).get("common"), common)

    trained = open_model(s.ckpt, s.device, s.scaling)
    if earlier is not None:
        _check_model(record_path, earlier.get("model"), trained.identity, s.ckpt, "ckpt", earlier.get("source"))
    model, train_len = trained.model, trained.train_len
    settings = {"common": common}
    distances = lengths = evaluator = None
    tokenizer = trained.tokenizer() if trained.tokenizer_json else None
    prefix = text_prefix(tokenizer) if tokenizer else []
    if "repeated_span" in probes:
        distances = _resolve(train_len, rs.distances, rs.multipliers)
        RS.check(rs.span, distances)
        model.validate_length(len(prefix) + max(distances) + rs.span - 1)
        settings["repeated_span"] = {"span": rs.span, "samples": rs.samples}
        if prefix:  # recorded where there is one, so that records made before it was read still continue
            settings["repeated_span"]["prefix"] = prefix
    if "key_tokens" in probes:
        same = kt.evaluator == s.ckpt and (kt.evaluator_scaling or None) == (s.scaling or None)
        if kt.evaluator_losses:
            evaluator = K.read_kept(kt.evaluator_losses)
            if evaluator.tokenizer is None or evaluator.tokenizer != K.tokenizer_digest(trained.tokenizer_json):
                raise ConfigError(_other_tokenizer(s.ckpt, kt.evaluator_losses, trained, None, evaluator))
        else:
            evaluator = (
                trained if same else open_model(kt.evaluator, s.device, kt.evaluator_scaling, "key_tokens.evaluator")
            )
            if not K.same_tokenizer(trained.tokenizer_json, evaluator.tokenizer_json):
                raise ConfigError(_other_tokenizer(s.ckpt, kt.evaluator, trained, evaluator))
        if prefix:
            log.warning(mid_text_warning(tokenizer, "The key-token probe"))
        lengths = _resolve(evaluator.train_len, kt.lengths, kt.multipliers)
        if kt.evaluator_losses:  # lengths, K and S default to the kept losses' own (K and S where the files agree)
            if not kt.lengths:
                lengths = sorted({T for _, T in evaluator.shapes.values()})
            held = {(k["short"], k["stride"]) for k in evaluator.keys.values()}
            if len(held) == 1:
                ((short, stride),) = held
                if kt.short in (None, short):
                    kt.short, kt.stride = short, kt.stride or stride
        kt.short = kt.short or evaluator.train_len
        kt.stride = kt.stride or max(1, kt.short // 4)
        K.check(kt.short, kt.stride, kt.alpha, kt.beta, lengths)
        if not kt.evaluator_losses:
            evaluator.model.validate_length(max(lengths))
        model.validate_length(max(lengths))
        if evaluator.identity == trained.identity:
            # Same weights: the tokens are chosen by the model under test, as run or under another scaling; either
            # way another model's key-token PPL compares with this one only under this same evaluator.
            log.warning(
                "The key-token evaluator has the weights of the model under test (%s): its key-token PPL is comparable "
                "with another model's only when that one is scored with this same evaluator (key_tokens.evaluator=%s "
                "under method %s).",
                "the same model, as run"
                if same or _evaluator_method(evaluator) == _method(model)
                else f"under method {_evaluator_method(evaluator)} where the model under test runs {_method(model)}",
                kt.evaluator or kt.evaluator_losses,
                _evaluator_method(evaluator),
            )
        settings["key_tokens"] = {
            "evaluator_scaling": kt.evaluator_scaling,
            "short": kt.short,
            "stride": kt.stride,
            "alpha": kt.alpha,
            "beta": kt.beta,
            "token_budget": kt.token_budget,
        }
    if earlier is not None:
        for section in ("repeated_span", "key_tokens"):
            if section in settings:
                _check_same(record_path, f"its {section}", earlier.get("settings", {}).get(section), settings[section])
        if evaluator is not None:
            kept = (earlier.get("key_tokens") or {}).get("evaluator") or {}
            _check_model(
                record_path,
                kept.get("identity"),
                evaluator.identity,
                kt.evaluator or kt.evaluator_losses,
                "key_tokens.evaluator" if kt.evaluator else "key_tokens.evaluator_losses",
                kept.get("source"),
            )
    if s.existing == "continue":
        D.check_writable(s.out, "out=")
    else:
        D.output_dir(s.out, trained.path, "long_range", s.scaling)
    if kt.cache:
        D.check_writable(kt.cache, "key_tokens.cache=")

    tokens, corpus = _split_tokens(trained, s.split, s.data)
    if distances:
        RS.check(rs.span, distances, len(tokens), s.split)
    if lengths and len(tokens) < max(lengths) + 1:
        raise ConfigError(
            f"The {s.split} split has {len(tokens)} tokens, too few for one key-token window of {max(lengths)} (it "
            f"needs {max(lengths) + 1}). Use shorter key_tokens.lengths / key_tokens.multipliers or a larger corpus."
        )

    if isinstance(evaluator, K.KeptEvaluator):
        _check_kept(evaluator, kt, tokens, lengths)

    text = {"split": s.split, "tokens": int(len(tokens)), "digest": _digest(tokens), **corpus}
    if earlier is not None and (earlier.get("text") or {}).get("digest") not in (None, text["digest"]):
        raise ConfigError(
            f"existing=continue: {record_path} holds results scored on other text: the {s.split} split had "
            f"{earlier['text'].get('tokens')} tokens with checksum {earlier['text'].get('digest')}, and now has "
            f"{text['tokens']} with checksum {text['digest']} (the corpus changed, or other data.* settings read "
            f"another). Give the corpus that run read, or a new out= folder."
        )
    record = earlier or _new_record(s, trained)
    record["settings"] = {**record.get("settings", {}), **settings}
    record["text"] = text
    record["status"] = "running"
    if evaluator is not None:
        record.setdefault("key_tokens", {"rows": []})["evaluator"] = _describe_evaluator(evaluator, kt)
    if distances:
        record.setdefault("repeated_span", {"rows": []})

    folder = [s.out] if s.out and os.path.isdir(s.out) else []
    progress = {
        "repeated_span": [len(distances or []), 0],
        "key_tokens": [len(lengths or []), 0],
        "evaluator_files": [],
    }

    def out_dir() -> str:
        if not folder:
            folder.append(D.make_output_dir(s.out, trained.path, "long_range", s.scaling))
        return folder[0]

    def save() -> None:
        where = out_dir()
        write_json(os.path.join(where, RESULTS), record)
        atomic_write(os.path.join(where, REPORT), report(record))

    try:
        with signals_stop():
            if distances:
                _repeated_span(s, rs, trained, tokens, distances, record, save, progress["repeated_span"])
            if lengths:
                _key_tokens(s, kt, trained, evaluator, tokens, lengths, record, save, out_dir, progress)
            record["status"] = "complete"
            save()
    except KeyboardInterrupt as e:
        raise _stopped(e, s, folder, progress, command) from None
    except OutputError as e:
        where = folder[0] if folder else s.out
        if not where or not os.path.exists(os.path.join(where, RESULTS)):
            raise e.reworded(setting="out=") from None
        raise e.reworded(
            kept=f"The results scored so far are kept in {os.path.join(where, RESULTS)}.",
            elsewhere="move that folder to a disk with more room (and give its new place as out=)",
            then=f"finish the run from them: {finish_command(command, s, where)}",
        ) from None
    print("\n" + report(record, head=False))
    print(f"Long-range probes: {folder[0]}/ ({RESULTS}, {REPORT})")
    return json.loads(json.dumps(record, default=str))


def _key(evaluator, kt: KeyTokenSettings, digest: str) -> dict:
    """The kept losses' key for windows of text `digest`: the evaluator (by weights and method), the text, K, S."""
    scaling = evaluator.scaling if isinstance(evaluator, K.KeptEvaluator) else kt.evaluator_scaling
    return K.cache_key({"identity": evaluator.identity, "scaling": scaling}, digest, kt.short, kt.stride)


def _check_kept(evaluator: K.KeptEvaluator, kt: KeyTokenSettings, tokens, lengths: list[int]) -> None:
    """Every length's losses are in the folder, for this text, K and S, before any model reads a token."""
    for T in lengths:
        x, y = K.windows(tokens, T, K.window_count(len(tokens), T, kt.token_budget))
        digest = K.text_digest(x, y)
        if evaluator.file_for(_key(evaluator, kt, digest)) is None:
            raise ConfigError(
                f"key_tokens.evaluator_losses={evaluator.path} holds no losses for {x.shape[0]} windows of {T} tokens "
                f"of this text (checksum {digest}) with K = {kt.short} and S = {kt.stride}; it holds "
                f"{evaluator.held()}. Kept losses are read, never computed: give the lengths, token_budget, short and "
                f"stride they were written with, the corpus and split they read, or the evaluator itself "
                f"(key_tokens.evaluator=) to score the rest."
            )


def _evaluator_method(evaluator) -> str:
    return evaluator.method if isinstance(evaluator, K.KeptEvaluator) else _method(evaluator.model)


def _other_tokenizer(ckpt: str, source: str, trained, evaluator, kept: K.KeptEvaluator | None = None) -> str:
    if kept is not None:
        missing = [] if trained.tokenizer_json else ["ckpt"]
        missing += [] if kept.tokenizer else ["key_tokens.evaluator_losses"]
        setting = "key_tokens.evaluator_losses"
    else:
        missing = [n for n, t in (("ckpt", trained), ("key_tokens.evaluator", evaluator)) if not t.tokenizer_json]
        setting = "key_tokens.evaluator"
    why = (
        f"{' and '.join(missing)} carries no tokenizer"
        if missing
        else f"ckpt={ckpt} and {setting}={source} carry different tokenizers"
    )
    return (
        f"{why}, so the evaluator cannot read the tokens the model under test reads. Key tokens are positions in "
        f"one token sequence, chosen by the evaluator and then scored on the model under test: the evaluator must "
        f"cut the text into the same tokens (a run trained on the same corpus with the same data.vocab_size, or a "
        f"model of the same family that shares the tokenizer). The paper's code maps key tokens across tokenizers "
        f"by character offsets; this probe does not."
    )


def _new_record(s: LongRangeSettings, trained) -> dict:
    model = trained.model
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "checkpoint": from_here(trained.path),
        "source": s.ckpt,
        "model": trained.identity,
        "scheme": trained.scheme,
        "train_pos": trained.train_positions,
        "method": _method(model),
        "train_len": trained.train_len,
        "config": trained.settings,
    }


def _describe_evaluator(evaluator, kt: KeyTokenSettings) -> dict:
    kept = isinstance(evaluator, K.KeptEvaluator)
    return {
        "source": kt.evaluator_losses if kept else kt.evaluator,
        "checkpoint": evaluator.checkpoint if kept else from_here(evaluator.path),
        "identity": evaluator.identity,
        "scheme": evaluator.scheme,
        "method": _evaluator_method(evaluator),
        "scaling": evaluator.scaling if kept else kt.evaluator_scaling,
        "train_len": evaluator.train_len,
        "short": kt.short,
        "stride": kt.stride,
        "alpha": kt.alpha,
        "beta": kt.beta,
    }


def _kept_about(evaluator, kt: KeyTokenSettings) -> dict:
    """What a probe that reads the kept losses in the evaluator's place needs to know of it."""
    described = _describe_evaluator(evaluator, kt)
    about = {k: described[k] for k in ("source", "checkpoint", "scheme", "method", "train_len")}
    return {**about, "tokenizer": K.tokenizer_digest(evaluator.tokenizer_json)}


def _repeated_span(s, rs: RepeatedSpanSettings, trained, tokens, distances, record, save, progress) -> None:
    rows = {r["distance"]: r for r in record["repeated_span"]["rows"]}
    longest = max(distances)
    draws = RS.draw(len(tokens), rs.span, longest, rs.samples, s.seed)
    prefix = record["settings"]["repeated_span"].get("prefix", [])  # the tokenizer's own first tokens
    model = trained.model
    model.eval()
    for d in distances:
        if d in rows and rows[d].get("longest") == longest:
            log.info("repeated span, distance %d: kept from the earlier run", d)
            progress[1] += 1
            continue
        if d in rows:  # its fillers were drawn for another longest distance: not the draws of this run
            log.info("repeated span, distance %d: scored again (the earlier run's longest distance differs)", d)
        row = RS.score_distance(
            model, tokens, draws, rs.span, longest, d, trained.train_len, s.batch_tokens, s.bootstrap, s.seed, prefix
        )
        row["longest"] = longest  # the fillers are drawn for the longest distance: a row is of that draw
        rows[d] = row
        record["repeated_span"]["rows"] = [rows[k] for k in sorted(rows)]
        save()
        progress[1] += 1
        log.info(
            "repeated span, distance %d (%gx L): loss %.3f with the copy, %.3f without, drop %.3f",
            d,
            row["ratio"],
            row["copy"]["loss"],
            row["nocopy"]["loss"],
            row["drop"]["loss"],
        )


def _key_tokens(s, kt: KeyTokenSettings, trained, evaluator, tokens, lengths, record, save, out_dir, progress) -> None:
    done = progress["key_tokens"]
    section = record["key_tokens"]
    rows = {r["length"]: r for r in section["rows"]}
    kept_only = isinstance(evaluator, K.KeptEvaluator)
    model = trained.model
    model.eval()
    for T in lengths:
        if T in rows:
            log.info("key tokens, length %d: kept from the earlier run", T)
            done[1] += 1
            continue
        count = K.window_count(len(tokens), T, kt.token_budget)
        x, y = K.windows(tokens, T, count)
        digest = K.text_digest(x, y)
        key = _key(evaluator, kt, digest)
        path = evaluator.file_for(key) if kept_only else K.cache_file(kt.cache or out_dir(), key)
        kept = K.kept_losses(path) if kept_only else K.read_cached(path, key)
        if kept is None:
            long, short = K.evaluator_losses(evaluator.model, x, y, kt.short, kt.stride, s.batch_tokens)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            K.write_cached(path, key, long, short, _kept_about(evaluator, kt))
            progress["evaluator_files"].append(path)
        else:
            log.info("key tokens, length %d: the evaluator's losses read from %s", T, path)
            long, short = kept
        chosen = K.select(long, short, kt.short, kt.alpha, kt.beta)
        losses = token_losses(model, x, y, s.batch_tokens)
        row = {
            "length": T,
            "ratio": T / trained.train_len,
            "evaluator_ratio": T / evaluator.train_len,
            "text": digest,
            "selection": K.selection_id(digest, chosen),
            "candidates": int(count * (T - kt.short)),
            **K.score(losses, chosen, s.bootstrap, s.seed, T),
            "evaluator_key_ppl": K.score(long, chosen, 0, s.seed, T)["key_ppl"],
            "evaluator_losses": from_here(path),
        }
        rows[T] = row
        section["rows"] = [rows[k] for k in sorted(rows)]
        save()
        done[1] += 1
        log.info(
            "key tokens, length %d: %d key tokens of %d; PPL %.3f, key-token PPL %s",
            T,
            row["key_tokens"],
            row["tokens"],
            row["ppl"],
            f"{row['key_ppl']:.3f}" if row["key_ppl"] is not None else "none (no key token)",
        )


def _stopped(e: KeyboardInterrupt, s: LongRangeSettings, folder: list, progress: dict, command) -> Interrupted:
    out = folder[0] if folder else s.out
    path = os.path.join(out, RESULTS) if out else None
    scored = path is not None and os.path.exists(path)
    parts = [
        f"{done if scored else 0} of {total} {what}"
        for (total, done), what in (
            (progress["repeated_span"], "repeated-span distances"),
            (progress["key_tokens"], "key-token lengths"),
        )
        if total
    ]
    losses = progress["evaluator_files"]
    kept = (
        f" The key-token evaluator's losses are kept in {', '.join(losses)} and read back, not computed again."
        if losses
        else ""
    )
    if not scored and not losses:
        return Interrupted(
            "Stopped by a signal before the first result was scored: nothing was written.", signal_status(e)
        )
    where = (
        f"{' and '.join(parts)} are kept in {path} (each is written as soon as it is scored)"
        if scored
        else "no distance or length was finished"
    )
    return Interrupted(
        f"Stopped by a signal: {where}.{kept} Finish the run with: {finish_command(command, s, out)}",
        signal_status(e),
    )


# --- the report ------------------------------------------------------------------------------------


def _ci(lo, hi, fmt: str = "{:.3f}") -> str:
    return f" [{fmt.format(lo)}, {fmt.format(hi)}]" if lo is not None and hi is not None else ""


def report(record: dict, head: bool = True) -> str:
    """long_range.md: what was measured, in words and tables."""
    parts = []
    if head:
        step = record["model"].get("step")
        parts.append(
            f"# Long-range probes — {record['scheme']} + {record['method']}, trained at {record['train_len']}\n\n"
            f"Checkpoint {record['checkpoint']}" + (f" (step {step})" if step is not None else "") + f", weights "
            f"{record['model'].get('weights')}; text: the {record['text']['split']} split of "
            f"{record['text'].get('where')} ({record['text']['tokens']:,} tokens); seed "
            f"{record['settings']['common']['seed']}; 95% bootstrap intervals "
            f"({record['settings']['common']['bootstrap']} resamples). Status: {record['status']}."
        )
    span = record.get("repeated_span")
    if span and span["rows"]:
        first = span["rows"][0]
        rows = [
            [
                f"{r['distance']:,}",
                f"{r['ratio']:g}",
                f"{r['sequence'] - 1:,}",
                f"{r['copy']['loss']:.3f}" + _ci(r["copy"]["loss_lo"], r["copy"]["loss_hi"]),
                f"{r['nocopy']['loss']:.3f}" + _ci(r["nocopy"]["loss_lo"], r["nocopy"]["loss_hi"]),
                f"{r['drop']['loss']:.3f}" + _ci(r["drop"]["loss_lo"], r["drop"]["loss_hi"]),
                f"{r['copy']['ppl']:.2f}",
                f"{r['nocopy']['ppl']:.2f}",
            ]
            for r in span["rows"]
        ]
        parts.append(
            "## Repeated span\n\n"
            f"A span of {first['span']} held-out tokens, filler, and the span again, its second copy starting at "
            f"the distance after the first; {first['samples']} samples per distance. Loss: the second copy's mean "
            f"NLL per token (nats), with its first copy and with the first copy replaced by other text of the same "
            f"length; drop: without - with, paired per sample (a model that reads that far back copies the span: "
            f"the drop is well above 0; one that does not: about 0).\n\n"
            + markdown_table(
                ["distance", "× L", "tokens read", "loss with copy", "loss without", "drop", "PPL with", "PPL without"],
                rows,
                "rrrrrrrr",
            )
        )
    keys = record.get("key_tokens")
    if keys and keys["rows"]:
        ev = keys["evaluator"]
        rows = [
            [
                f"{r['length']:,}",
                f"{r['ratio']:g}",
                f"{r['windows']}",
                f"{r['tokens']:,}",
                f"{r['key_tokens']:,} ({r['key_share']:.1%})",
                f"{r['ppl']:.3f}" + _ci(r["ppl_lo"], r["ppl_hi"]),
                (f"{r['key_ppl']:.3f}" + _ci(r["key_ppl_lo"], r["key_ppl_hi"])) if r["key_ppl"] is not None else "—",
                r["selection"],
            ]
            for r in keys["rows"]
        ]
        parts.append(
            "## Key-token perplexity (LongPPL)\n\n"
            f"Evaluator {ev['source']} (weights {ev['identity'].get('weights')}"
            + (f", step {ev['identity']['step']}" if ev["identity"].get("step") is not None else "")
            + f"; {ev['scheme']} + {ev['method']}, trained at {ev['train_len']}). Key tokens: targets with more than "
            f"K = {ev['short']} tokens of context whose evaluator loss drops by more than alpha = {ev['alpha']:g} "
            f"nats from a short context (K - S + 1 to K tokens, S = {ev['stride']}) to the whole window, and whose "
            f"long-context log-likelihood is above beta = {ev['beta']:g}. PPL over every target of the windows, "
            f"key-token PPL over the key tokens only; intervals over windows. Two models' key-token PPLs are "
            f"comparable where the selection is the same.\n\n"
            + markdown_table(
                ["length", "× L", "windows", "tokens", "key tokens", "PPL", "key-token PPL", "selection"],
                rows,
                "rrrrrrrl",
            )
        )
    return "\n\n".join(parts) + "\n"


def _method(model) -> str:
    """The extrapolation method a model runs, as its results name it."""
    return getattr(model.scaling, "label", model.scaling.name)
