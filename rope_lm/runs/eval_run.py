"""An evaluation into a results folder: a model's PPL at every length under
each extrapolation method, with results.json / results.md / the plot
rewritten after every length, for the final evaluation of a train run and
for scripts/eval_extrapolation.py (a trained checkpoint or an imported model).

Controls (`eval.controls`, CONTROLS): methods evaluated on the same model and
the same windows after its own, each method's PPL read against theirs with a
paired bootstrap interval (eval/bootstrap.paired_ratio), recorded per length."""

from dataclasses import dataclass, replace
import logging
import math
import os
import time

from rope_lm.core.errors import ConfigError, EvaluationNotFinite, Interrupted, OutputError
from rope_lm.core.files import fresh_dir
from rope_lm.core.stops import signal_status, signals_stop
from rope_lm.core.typed import typed, typed_component, typed_dataclass
from rope_lm.data.special_tokens import mid_text_warning
from rope_lm.data.split import DATA_ANNOTATIONS
from rope_lm.eval import bootstrap
from rope_lm.eval.cost import COST_KEYS
from rope_lm.eval.evaluation import RELATIVE_KEYS, EvalConfig, eval_summary, evaluate_lengths
from rope_lm.eval.report import log_to_wandb, write_views
from rope_lm.eval.results import RESULTS_JSON, new_results
from rope_lm.eval.units_file import UNITS_NPZ, load_units, save_units
from rope_lm.model.layout import scheme_label
from rope_lm.runs.run_folder import RunFolder, Status, check_writable, first_missing, refuse_taken
from rope_lm.runs.trained import checkpoint_token_cache, open_model, output_home
from rope_lm.scaling import METHODS, method_label

log = logging.getLogger("rope_lm")

# The controls a run can be read against (eval.controls), each valid for every scheme family.
CONTROLS = {
    "window": (
        "the window method at the training length L: attention cut to the last L keys, so the same model reads "
        "nothing past L (ALiBi cut to L, NoPE cut to L, ...)"
    ),
}


def check_controls(value) -> list[str]:
    """eval.controls as a list of known control names ([] for none)."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"eval.controls={value!r} must be a list of control names: eval.controls=[window] evaluates "
            f"{CONTROLS['window']}, after the run's own method(s); [] evaluates none."
        )
    unknown = [v for v in value if v not in CONTROLS]
    if unknown or len(set(value)) != len(value):
        what = f"{', '.join(unknown)} is not a control" if unknown else "a control is listed twice"
        raise ConfigError(
            f"eval.controls={list(value)!r}: {what}. The controls are: "
            + "; ".join(f"{k} ({v})" for k, v in CONTROLS.items())
            + ". E.g. eval.controls=[window]."
        )
    return list(value)


def eval_settings(options: dict | None) -> tuple[EvalConfig, list[str], int | None]:
    """The eval.* settings as the evaluation (EvalConfig), the controls
    (eval.controls) and the window control's width (eval.control_window), each
    checked; the controls are the runs' business, not the protocol's, so they
    are taken out before EvalConfig sees the rest."""
    options = dict(options or {})
    controls = check_controls(options.pop("controls", None))
    window = options.pop("control_window", None)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(
            f"eval.control_window={window!r} must be a positive whole number of tokens: the window control reads "
            f"the model cut to that many keys (null: the run's training length, a fine-tune's the length it was "
            f"tuned at)."
        )
    if window is not None and "window" not in controls:
        raise ConfigError(
            f"eval.control_window={window} sets the width of the window control, but eval.controls={controls} does "
            f"not ask for it: add it (eval.controls=[window]) or leave eval.control_window out."
        )
    return typed_dataclass(EvalConfig, options, "eval.", "eval"), controls, window


def control_options(name: str, train_len: int, model_train_len: int, window: int | None = None) -> dict:
    """The method a control evaluates. The window's "auto" is the model's own
    training length; a fine-tune's results record the length it was tuned at,
    the L its table reads, so there the window is that length, given as such.
    `window` (eval.control_window) sets the width instead, e.g. a model
    fine-tuned at 1,024 read against itself cut to its base's 64."""
    if name != "window":
        raise ValueError(f"unknown control {name!r}")
    width = train_len if window is None else window
    return {"name": "window", "window": "auto" if width == model_train_len else int(width)}


@dataclass
class Control:
    name: str
    label: str  # its rows' method label in results.json
    options: dict | None  # None: it does not apply to this model (reason says why)
    listed: bool = False  # the evaluation lists this very method: its rows are the control's
    reason: str = ""

    def record(self) -> dict:
        if self.options is None:
            return {"label": self.label, "applies": False, "reason": self.reason}
        return {"label": self.label, "applies": True, "options": self.options, "about": CONTROLS[self.name]}


def plan_controls(
    model, controls: list[str], methods: list, train_len: int, longest: int, window: int | None = None
) -> list[Control]:
    """Each control as it applies to `model`, whose scaling is the method it
    was trained under: a model trained under a method other than none is not
    this model cut to L once the control replaces that method, so there the
    control does not apply (recorded with why). A control that does not fit
    the longest length, or a listed method that shares its label without
    being it, is refused before any work."""
    trained, out = model.scaling, []
    for name in controls:
        options = control_options(name, train_len, model.cfg.train_len, window)
        width = model.cfg.train_len if options["window"] == "auto" else options["window"]
        label = method_label(options)
        if trained.name != "none":
            reason = (
                f"the model was trained under scaling={trained.label}; the {name} control replaces the model's "
                f"method, so it would not read this model cut to L"
            )
            out.append(Control(name, label, None, reason=reason))
            continue
        listed = [m for m in methods if method_label(m) == label]
        if listed:
            given = listed[0].get("window", "auto")
            if (model.cfg.train_len if given == "auto" else given) != width:
                raise ConfigError(
                    f"scaling lists {label} with window={given}, which shares its label with the window control "
                    f"of eval.controls=[{name}] (window = {width}) without being it: list the window at {width} "
                    f"(it then serves as the control), or drop {name} from eval.controls."
                )
        try:
            model.set_scaling(options)
            model.validate_length(longest)
        finally:
            model.set_scaling(trained)
        out.append(Control(name, label, options, listed=bool(listed)))
    return out


def evaluate_and_report(
    model,
    cache,
    eval_cfg: EvalConfig,
    methods: list[dict | None],
    out_dir: str,
    results: dict,
    wandb_run=None,
    finish: str = "",
    controls: list[str] = (),
    control_window: int | None = None,
    rescore_units: dict[str, list[int]] | None = None,
) -> dict:
    """ppl@L for each extrapolation method in turn, then for each control
    (`controls`, names of CONTROLS) on the same model and windows; the results
    files are rewritten after every length so a stop keeps what was measured.
    `model` comes as trained: its scaling is the method it was trained under
    (which decides whether a control applies). Methods whose rows `results`
    already holds in full (an evaluation finished with existing=continue, or a
    control added to a complete run) are kept, not measured again. Each row of
    a method that is not a control gets its PPL over each control's at that
    length with a paired bootstrap interval over the windows both were scored
    on (rows kept from an earlier sitting are scored once more for their
    per-window losses, which results.json does not hold). A stop (SIGTERM,
    Ctrl-C) raises Interrupted saying what was kept and, with `finish`, how to
    finish. `rescore_units` (method label -> lengths, checked by
    check_rescore_units) scores those kept rows' windows again for their
    per-window losses alone, kept in eval_units.npz for compare.py to pair
    with another evaluation of the same model (ppl_pairs); the rows stay."""
    original = model.scaling
    stream = cache.tokens(eval_cfg.split)
    lengths = eval_cfg.resolve_lengths(results["train_len"])
    doc_starts = cache.doc_starts(eval_cfg.split)
    corpus = results.get("corpus") or {}
    scored = (corpus.get("files") or {}).get(eval_cfg.split)
    if scored:  # the texts behind the numbers, by name (a files corpus; results.json keeps them under corpus.files)
        log.info(
            "Scoring the %s split of %s: %d file(s): %s",
            eval_cfg.split,
            corpus.get("where"),
            len(scored),
            ", ".join(scored),
        )
    results["eval"] = eval_summary(eval_cfg, len(stream), doc_starts, results["train_len"])
    planned = plan_controls(model, list(controls), methods, results["train_len"], max(lengths), control_window)
    applied = [c for c in planned if c.options is not None]
    everything = list(methods) + [c.options for c in applied if not c.listed]
    if planned:
        results["controls"] = {c.name: c.record() for c in planned}
    expected = len(results["eval"]["lengths"]) - len(results["eval"].get("skipped_lengths") or [])
    kept = {label for label in results["methods"] if sum(r["method"] == label for r in results["results"]) >= expected}
    # A method stopped part-way keeps the lengths it finished: they come back through evaluate_lengths (`kept`).
    partial = {}
    for r in results["results"]:
        if r["method"] not in kept and r["method"] in results["methods"]:
            partial.setdefault(r["method"], {})[r["length"]] = r
    options_of = {k: v.get("options") for k, v in results["methods"].items()}  # a part-way method's too
    results["methods"] = {k: v for k, v in results["methods"].items() if k in kept}
    results["results"] = [r for r in results["results"] if r["method"] in kept]
    pairing = _Pairing(results, applied, eval_cfg)
    units_path = os.path.join(out_dir, UNITS_NPZ)
    # The windows of the rows kept from an earlier sitting, where it kept them: paired again without scoring.
    held = load_units(units_path)
    for row in results["results"] + [r for rows in partial.values() for r in rows.values()]:
        u = held.get(row["method"], {}).get(row["length"])
        if u is not None:
            pairing.units.setdefault(row["method"], {})[row["length"]] = u
    still = {c.name for c in applied if c.label in kept}
    for row in results["results"]:  # a control measured anew is paired anew
        if row.get("controls"):
            row["controls"] = {k: v for k, v in row["controls"].items() if k in still}
        if "controls" in row and not row["controls"]:
            del row["controls"]
    # "complete" only once every method and length is in: a stop part-way leaves "evaluating".
    results["status"] = Status.EVALUATING
    label = None
    try:
        with signals_stop():
            # Asked for, so first: kept rows' windows scored again, for compare.py to pair with another evaluation.
            for label, wanted in (rescore_units or {}).items():  # `label`: a stop here names it
                todo = sorted(L for L in wanted if L not in pairing.units.get(label, {}))
                if not todo:
                    log.info("[%s] its per-window losses at %s are kept already (%s)", label, wanted, UNITS_NPZ)
                    continue
                log.info(
                    "[%s] scoring its windows at %s again for their per-window losses (rescore_units)", label, todo
                )
                model.set_scaling(options_of[label])
                got = pairing.rescore(model, stream, results["train_len"], doc_starts, label, only=todo)
                pairing.units.setdefault(label, {}).update(got)
                save_units(units_path, pairing.units)
            for i, options in enumerate(everything):
                model.set_scaling(options)
                label = model.scaling.label
                if label in kept:
                    log.info("[%s] kept from the earlier evaluation in %s", label, out_dir)
                    continue
                results["methods"][label] = {"options": options, **model.describe_scaling(max(lengths))}
                if label in pairing.control_labels:
                    results["methods"][label]["control"] = pairing.control_labels[label]
                units = pairing.units.setdefault(label, {})

                def on_result(row, label=label):
                    row = {"method": label, **row}
                    results["results"].append(row)
                    pairing.pair(label, row["length"])
                    write_views(results, out_dir, draw=False)
                    # After results.json (the numbers first, on a filling disk); a row whose windows a stop
                    # kept from this file has them scored again where a pair needs them.
                    save_units(units_path, pairing.units)
                    extra = f", beyond L_train {row['ppl_beyond']:.3f}" if row["ppl_beyond"] else ""
                    log.info("ppl@%d [%s] = %.3f%s", row["length"], label, row["ppl"], extra)

                started = time.perf_counter()
                if label in partial:
                    log.info(
                        "[%s] lengths %s kept from the earlier evaluation in %s", label, sorted(partial[label]), out_dir
                    )
                same = _plain_rows(model, results, label, lengths, label in pairing.control_labels)
                if same:
                    log.info(
                        "[%s] at %s the method changes nothing (TransformerLM.plain_at): the rows of %s taken",
                        label,
                        ", ".join(map(str, sorted(same))),
                        model.plain_label,
                    )
                plain_units = pairing.units.get(model.plain_label, {})
                mine = {L: u for L, u in units.items() if L in partial.get(label, {})}
                evaluate_lengths(
                    model,
                    stream,
                    eval_cfg,
                    results["train_len"],
                    on_result,
                    doc_starts=doc_starts,
                    units_out=units,
                    kept={**same, **partial.get(label, {})},
                    kept_units={**{L: plain_units[L] for L in same if L in plain_units}, **mine},
                )
                for L in same:  # scored again here (its units were not held): the plain method's too
                    if L in units and L not in plain_units:
                        pairing.units.setdefault(model.plain_label, {})[L] = units[L]
                # Wall time of the method's whole evaluation (all lengths), on this machine as it was loaded.
                results["methods"][label]["seconds"] = round(time.perf_counter() - started, 2)
                if i < len(everything) - 1:
                    write_views(results, out_dir)
            for label in pairing.unpaired():  # rows kept from an earlier sitting: their windows scored again
                log.info("[%s] scoring its windows again for the paired ratios to its controls", label)
                model.set_scaling(results["methods"][label]["options"])
                pairing.units[label] = pairing.rescore(model, stream, results["train_len"], doc_starts, label)
                for L in lengths:
                    pairing.pair(label, L)
                save_units(units_path, pairing.units)
            broken = _not_finite(results)
            if broken:
                results["status"] = Status.FAILED
                results["error"] = broken
            else:
                results["status"] = Status.COMPLETE
            write_views(results, out_dir)
            if broken:
                raise EvaluationNotFinite(broken)
    except KeyboardInterrupt as e:
        raise Interrupted(
            _stopped(results, label, expected, len(everything), out_dir, finish), signal_status(e)
        ) from None
    finally:
        model.set_scaling(original)
    if wandb_run is not None:
        log_to_wandb(wandb_run, results, out_dir)
    return results


def _plain_rows(model, results: dict, label: str, lengths: list[int], control: bool = False) -> dict:
    """length -> the plain method's row under this method's label, at the lengths where the model under
    the method computes exactly what it computes with none (TransformerLM.plain_at) and none's row is
    in: the same numbers, so not scored again. The row says so (`same_as`) and carries no cost of its
    own."""
    plain = model.plain_label
    if label == plain:
        return {}
    rows = {r["length"]: r for r in results["results"] if r["method"] == plain}
    out = {}
    was = model.training
    model.eval()  # judged as evaluated: a method acting only at evaluation is plain in training
    try:
        for L in lengths:
            if L in rows and model.plain_at(L):
                # A control's row holds no ratio to the controls (itself among them); and none's PPL relative to
                # L is over none's at L, while this method's is over its own there (they differ where the method
                # is plain below L only: a control narrower than L), so evaluate_lengths computes it again.
                row = {
                    k: v
                    for k, v in rows[L].items()
                    if k not in COST_KEYS and k not in RELATIVE_KEYS and not (control and k == "controls")
                }
                out[L] = {**row, "method": label, "same_as": plain}
    finally:
        model.train(was)
    return out


class _Pairing:
    """Each method's rows against each control's at the same length: the PPL
    ratio with its paired bootstrap interval, from both evaluations' units
    (per-window loss sums) held for this sitting."""

    def __init__(self, results: dict, controls: list[Control], eval_cfg: EvalConfig):
        self.results, self.eval_cfg = results, eval_cfg
        self.control_labels = {c.label: c.name for c in controls}
        self.units: dict = {}  # label -> length -> bootstrap.Units

    def _row(self, label: str, length: int) -> dict | None:
        return next((r for r in self.results["results"] if r["method"] == label and r["length"] == length), None)

    def pair(self, label: str, length: int) -> None:
        """Record every pair the new row of `label` at `length` completes."""
        if label in self.control_labels:
            pairs = [(m, label) for m in self.results["methods"] if m not in self.control_labels]
        else:
            pairs = [(label, c) for c in self.control_labels]
        for method, control in pairs:
            row, ref = self._row(method, length), self._row(control, length)
            a, b = self.units.get(method, {}).get(length), self.units.get(control, {}).get(length)
            if row is None or ref is None or a is None or b is None:
                continue
            cfg = self.eval_cfg
            ratio = bootstrap.paired_ratio(a, b, row["ppl"], ref["ppl"], cfg.bootstrap, cfg.seed, length)
            row.setdefault("controls", {})[self.control_labels[control]] = ratio

    def unpaired(self) -> list[str]:
        """Methods or controls kept from an earlier sitting whose rows still lack a pair (so whose units at
        that length are not held): the ones to score again."""
        missing = set()
        for method in self.results["methods"]:
            if method in self.control_labels:
                continue
            for control, name in self.control_labels.items():
                for row in self.results["results"]:
                    if row["method"] == method and name not in (row.get("controls") or {}):
                        length = row["length"]
                        if self._row(control, length) is None:
                            continue
                        # By length: a method stopped part-way holds units only for the lengths scored now.
                        missing |= {x for x in (method, control) if length not in self.units.get(x, {})}
        return sorted(missing, key=list(self.results["methods"]).index)

    def rescore(self, model, stream, train_len: int, doc_starts, label: str, only: list[int] | None = None) -> dict:
        """The units of `label`'s evaluation, scored again (no intervals, no extra sliding pass), at every length
        or at the lengths `only` (the others passed over as kept, so the documents chosen stay those of the whole
        evaluation); its kept rows stay as they were, and a PPL that differs from them is said."""
        units: dict = {}
        cfg = self.eval_cfg
        quick = replace(cfg, bootstrap=0, sliding_stride=None if cfg.protocol == "stream" else cfg.sliding_stride)
        skip = {} if only is None else {r["length"]: r for r in self.results["results"] if r["method"] == label}
        skip = {L: r for L, r in skip.items() if L not in (only or ())}
        rows = evaluate_lengths(model, stream, quick, train_len, doc_starts=doc_starts, units_out=units, kept=skip)
        units = {L: u for L, u in units.items() if L not in skip}
        for row in rows:
            kept = self._row(label, row["length"])
            if kept is not None and not math.isclose(kept["ppl"], row["ppl"], rel_tol=1e-3):
                log.warning(
                    "[%s] ppl@%d scored again is %.4f where the kept row has %.4f: the paired ratio's interval "
                    "comes from the new scoring",
                    label,
                    row["length"],
                    row["ppl"],
                    kept["ppl"],
                )
        return units


def _not_finite(results: dict) -> str | None:
    """What of the evaluation is not a number (NaN or infinite perplexity), or None: such a run is
    never complete, whatever its other lengths measured."""
    bad = [r for r in results["results"] if not (isinstance(r.get("ppl"), (int, float)) and math.isfinite(r["ppl"]))]
    if not bad:
        return None
    where = "; ".join(f"{r['method']} at {r['length']:,} tokens ({r.get('ppl')})" for r in bad[:6])
    return (
        f"The evaluation gave a perplexity that is not a number for {len(bad)} of {len(results['results'])} "
        f"(method, length) rows: {where}{' ...' if len(bad) > 6 else ''}. The weights were finite when they were "
        f"saved, so the forward pass overflowed at those lengths (attention logits or a position table past "
        f"what the scheme or method serves). The other rows are kept in results.json (status failed); plots "
        f"and comparisons show these as missing."
    )


def _stopped(results: dict, label: str | None, expected: int, n_methods: int, out_dir: str, finish: str) -> str:
    rows = [r for r in results["results"] if r["method"] == label]
    train_len = results["train_len"]
    at = ""
    if rows:
        done = max(r["length"] for r in rows)
        at = f" after {done:,} tokens ({done / train_len:g} x L)"
    whole = len({r["method"] for r in results["results"]}) - (1 if rows and len(rows) < expected else 0)
    return (
        f"Stopped by a signal during the evaluation of method {label or '?'}{at}: {len(rows)} of {expected} "
        f"lengths of it kept, and {whole} of {n_methods} method(s) complete, in {os.path.join(out_dir, RESULTS_JSON)} "
        f"(status evaluating). {finish}"
    ).strip()


def evaluate_checkpoint(
    ckpt_path: str | None,
    methods: list[dict],
    eval_options: dict,
    data_overrides: dict,
    out_dir: str | None = None,
    device: str = "auto",
    hf: str | None = None,
    existing: str = "refuse",
    scaled_layers=None,
    sliding_window: str = "auto",
    rescore_units: dict | None = None,
) -> dict:
    """Re-use a trained checkpoint (or, with hf=, a transformers Llama-family
    model by local folder or hub name): ppl@L under each extrapolation method,
    one table and one plot, in a new folder (default: <run>/eval/<methods>/,
    or outputs/eval/<model>/<methods>/ for hf=, numbered if taken); a folder
    that holds results already is refused, unless existing=continue and it
    holds a part-way evaluation of the same settings, which is finished. The
    corpus defaults to the checkpoint's own (data.* for an imported model),
    tokenized with the tokenizer the model carries. Every setting is checked
    before a folder is made. `rescore_units` (with existing=continue): kept
    rows whose per-window losses are scored again (check_rescore_units)."""
    eval_cfg, controls, control_window = eval_settings(eval_options)
    rescore_units = rescore_shape(rescore_units, existing)
    data_overrides = typed(data_overrides or {}, DATA_ANNOTATIONS, "data.", "data")
    methods = [typed_component(METHODS, m or {"name": "none"}, "scaling") for m in methods]
    if scaled_layers is not None and not hf:
        raise ConfigError(
            f"scaled_layers={scaled_layers!r} chooses the layers a method acts on in a model imported with hf=; a "
            f"rope-lm checkpoint's layers take a method as its model.layout says (a layer's `scaling: false` keeps "
            f"it off), fixed when it was trained. Leave scaled_layers out for ckpt=, or evaluate an hf= model."
        )
    if sliding_window not in ("auto", "ignore") or (sliding_window == "ignore" and not hf):
        raise ConfigError(
            f"sliding_window={sliding_window!r}: auto keeps an imported model's sliding-window layers as its config "
            f"makes them; ignore gives them full attention (the same keys up to the window, every key past it), for "
            f"a model imported with hf=. A rope-lm checkpoint's windows are its model.layout's; leave it at auto."
        )
    trained = open_model(
        f"hf:{hf}" if hf else ckpt_path, device, scaled_layers=scaled_layers, sliding_window=sliding_window
    )
    if hf:  # each method on the layers it acts on, refused before any work where it cannot act there
        from rope_lm.hf.load import check_windowed_layers

        own = trained.model.scaling
        for options in methods:
            trained.model.set_scaling(options)
            check_windowed_layers(trained.model)
        trained.model.set_scaling(own)
    hp, model = trained.hparams, trained.model
    if eval_cfg.protocol != "documents" and trained.tokenizer_json:
        warning = mid_text_warning(trained.tokenizer(), f"eval.protocol={eval_cfg.protocol}")
        if warning:
            log.warning(warning)
    lengths = eval_cfg.resolve_lengths(model.cfg.train_len)
    as_trained = model.scaling  # the method the model was trained under: decides whether a control applies
    for options in methods:  # refuse a method that does not fit before any work
        model.set_scaling(options)
        model.validate_length(max(lengths))
    model.set_scaling(as_trained)
    plan_controls(model, controls, methods, model.cfg.train_len, max(lengths), control_window)  # the controls too
    labels = [method_label(m) for m in methods]
    imported = trained.path[len("hf:") :] if trained.path.startswith("hf:") else None  # hf= or ckpt=hf:...
    config = {
        "ckpt_path": trained.path if imported else os.path.abspath(trained.path),
        # The model by content: a continue is checked against it, not the path; the step says when
        # a model still training was read.
        "model_identity": trained.identity,
        "model": hp["model"],
        "pos": hp["pos"],
        "trained_scaling": hp.get("scaling"),
        "seed": hp.get("seed"),  # the training seed: its evaluations pair with other runs by seed
        "data": None,
        "eval": eval_options,
        "methods": methods,
    }
    if hf:  # the layers the methods act on as the user named them (None: the model's own), for labels
        config["scaled_layers"] = scaled_layers
        if sliding_window != "auto":  # recorded only when set, so evaluations made before it stay the same
            config["sliding_window"] = sliding_window
    if imported:  # a GGUF file names its quantisation (None for a transformers folder)
        from rope_lm.hf.gguf import source_of

        config["gguf"] = source_of(imported)
    if out_dir is None:
        out_dir = fresh_dir(os.path.join(output_home(trained.path, "eval"), "-".join(labels)[:80] or "none"))
    folder = RunFolder(out_dir, setting="out=")
    finishing = (
        existing == "continue" and folder.read_results() is not None and not os.path.exists(folder.file("checkpoints"))
    )
    if not finishing:
        refuse_taken(out_dir)
    check_writable(out_dir, "out=")
    made = first_missing(out_dir)
    if not folder.lock():  # held while this process lives: one process evaluates in a folder
        raise ConfigError(
            f"Another rope-lm process is evaluating in {out_dir} right now; give this evaluation "
            f"another out= folder, or wait for that one to finish."
        )
    earlier = folder.read_results() if finishing else None
    try:
        cache, data_options = checkpoint_token_cache(trained.lit, data_overrides, out_dir, trained.path)
    except BaseException as e:
        if made:  # a refused corpus leaves no folder holding only the tokenizer behind
            _remove_if_only(out_dir, made, {"tokenizer.json"})
        if isinstance(e, OutputError):  # a full disk
            raise e.reworded(setting="out=") from None
        raise
    config["data"] = data_options
    trained_on = (hp.get("corpus") or {}).get("fingerprint")
    if trained.lit.tokenizer_json and trained_on and trained_on != cache.corpus.get("fingerprint"):
        # A BPE trained on another split (or corpus) cuts this text into other tokens than the models trained
        # on this one, so per-token PPL is not comparable with theirs: compare.tokenizer_id tells them apart.
        config["tokenizer_trained_on"] = trained_on
    if rescore_units and earlier is None:
        raise ConfigError(
            f"rescore_units={rescore_units} scores again the windows of rows an earlier evaluation kept, but "
            f"out={out_dir} holds no evaluation to continue. Give the folder of that evaluation as out=, or leave "
            f"rescore_units out."
        )
    if earlier is not None:
        _check_same_evaluation(earlier, config, out_dir)
        check_rescore_units(rescore_units, earlier, out_dir)
        results = earlier
    else:
        results = new_results(config, cache.corpus, model.cfg.train_len, scheme_label(hp["pos"], hp.get("model")))
    results["out_dir"] = out_dir
    finish = (
        f"To finish it, run the same command again with out={out_dir} existing=continue "
        f"(the complete methods are kept)."
    )
    try:
        return evaluate_and_report(
            model,
            cache,
            eval_cfg,
            methods,
            out_dir,
            results,
            finish=finish,
            controls=controls,
            control_window=control_window,
            rescore_units=rescore_units,
        )
    except OutputError as e:  # a full disk part-way: results.json keeps what it could record before
        if not os.path.exists(folder.file(RESULTS_JSON)):
            raise e.reworded(setting="out=") from None
        raise e.reworded(
            elsewhere="move that folder to a disk with more room (and give its new place as out=)",
            then=f"finish it: run the same command again with out={out_dir} existing=continue (the complete "
            f"methods in its results.json are kept)",
        ) from None


def rescore_shape(value, existing: str) -> dict[str, list[int]] | None:
    """rescore_units as {method label: [lengths]}, checked for its form before any work."""
    if value in (None, {}):
        return None

    def lengths_ok(v) -> bool:
        return (
            isinstance(v, (list, tuple))
            and bool(v)
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
        )

    if not isinstance(value, dict) or not all(isinstance(k, str) and lengths_ok(v) for k, v in value.items()):
        raise ConfigError(
            f"rescore_units={value!r} must map a method's label to the lengths whose windows are scored again, "
            f"e.g. 'rescore_units={{yarn: [65536]}}': the rows stay as they are, and their per-window losses are kept "
            f"in {UNITS_NPZ} so that compare.py can pair them with another evaluation of the same model."
        )
    if existing != "continue":
        raise ConfigError(
            f"rescore_units={value} scores again rows an earlier evaluation kept: give that evaluation's folder as "
            f"out= with existing=continue (now existing={existing})."
        )
    return {k: sorted(set(v)) for k, v in value.items()}


def check_rescore_units(value: dict | None, earlier: dict, out_dir: str) -> None:
    """Each label of rescore_units names a method out_dir evaluated, at lengths it holds rows for."""
    for label, wanted in (value or {}).items():
        held = sorted(r["length"] for r in earlier.get("results", []) if r["method"] == label)
        if not held:
            raise ConfigError(
                f"rescore_units names {label!r}, which out={out_dir} has no rows of (its methods: "
                f"{', '.join(earlier.get('methods') or {}) or 'none'}). Name a method as its results label it."
            )
        ev = earlier.get("eval") or {}
        expected = [L for L in ev.get("lengths") or [] if L not in (ev.get("skipped_lengths") or [])]
        if any(L not in held for L in expected):
            raise ConfigError(
                f"rescore_units names {label}, which out={out_dir} evaluated part-way (rows at {held} of "
                f"{expected}): finish it first with existing=continue alone, which keeps the windows of every row it "
                f"adds, then score the earlier rows again."
            )
        missing = [L for L in wanted if L not in held]
        if missing:
            raise ConfigError(
                f"rescore_units asks for {label} at {missing}, where out={out_dir} holds its rows at {held} only: "
                f"rows not yet evaluated are evaluated by existing=continue itself, their windows kept."
            )


def _check_same_evaluation(earlier: dict, config: dict, out_dir: str) -> None:
    """A continued evaluation reads the same model (by its weights and step where the folder records
    them: any path to those weights is accepted; by path for a folder from before) under the same
    settings; what differs is named with both values."""
    import json

    before = json.loads(json.dumps(earlier.get("config") or {}, default=str))
    now = json.loads(json.dumps(config, default=str))
    by_content = "model_identity" in before
    if by_content and before["model_identity"] != now["model_identity"]:
        b, n = before["model_identity"], now["model_identity"]
        raise ConfigError(
            f"existing=continue: out={out_dir} holds an evaluation of another model: weights {b.get('weights')} "
            f"at step {b.get('step')} (ckpt {before.get('ckpt_path')}), where this one has weights "
            f"{n.get('weights')} at step {n.get('step')} (ckpt {now.get('ckpt_path')}). Give a new out= folder, or "
            f"the checkpoint that evaluation read."
        )
    skip = {"model_identity", "ckpt_path"} if by_content else {"model_identity"}
    for side in (before, now):  # controls add rows on the same model: one added to a finished evaluation is evaluated
        if isinstance(side.get("eval"), dict):
            # An option added since (absent there, None here, e.g. control_window) is the same evaluation.
            side["eval"] = {k: v for k, v in side["eval"].items() if k != "controls" and v is not None}
    if by_content:  # the corpus's name is made from the model's path (a label): the corpus itself must match
        for side in (before, now):
            if isinstance(side.get("data"), dict):
                side["data"] = {k: v for k, v in side["data"].items() if k != "name"}
    differ = sorted(k for k in (set(before) | set(now)) - skip if before.get(k) != now.get(k))
    if differ:
        shown = "; ".join(f"{k}: {_short(before.get(k))} before, {_short(now.get(k))} now" for k in differ)
        raise ConfigError(
            f"existing=continue: out={out_dir} holds an evaluation with other settings ({shown}), so it is not "
            f"finished with these. Give a new out= folder, or the command that started that evaluation."
        )


def _short(value, width: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _remove_if_only(folder: str, made: str, names: set) -> None:
    """Remove folder when it holds nothing but `names`, and the empty folders
    above it up to `made`, the outermost this run created."""
    import shutil

    try:
        if set(os.listdir(folder)) <= names | {".run.lock"}:
            shutil.rmtree(folder)
        here = os.path.dirname(os.path.abspath(folder))
        while len(here) >= len(made) and os.path.isdir(here) and not os.listdir(here):
            os.rmdir(here)
            here = os.path.dirname(here)
    except OSError:
        pass
