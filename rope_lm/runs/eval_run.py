"""An evaluation into a results folder: a model's PPL at every length under
each extrapolation method, with results.json / results.md / the plot
rewritten after every length, for the final evaluation of a train run and
for scripts/eval_extrapolation.py (a trained checkpoint or an imported model)."""

import logging
import math
import os
import time

from rope_lm.core.errors import ConfigError, EvaluationNotFinite, Interrupted, OutputError
from rope_lm.core.files import fresh_dir
from rope_lm.core.stops import signal_status, signals_stop
from rope_lm.core.typed import typed, typed_component, typed_dataclass
from rope_lm.data.split import DATA_ANNOTATIONS
from rope_lm.eval.evaluation import EvalConfig, eval_summary, evaluate_lengths
from rope_lm.eval.report import log_to_wandb, write_views
from rope_lm.eval.results import RESULTS_JSON, new_results
from rope_lm.model.layout import scheme_label
from rope_lm.runs.run_folder import RunFolder, Status, check_writable, first_missing, refuse_taken
from rope_lm.runs.trained import checkpoint_token_cache, open_model, output_home
from rope_lm.scaling import METHODS, method_label

log = logging.getLogger("rope_lm")


def evaluate_and_report(
    model,
    cache,
    eval_cfg: EvalConfig,
    methods: list[dict | None],
    out_dir: str,
    results: dict,
    wandb_run=None,
    finish: str = "",
) -> dict:
    """ppl@L for each extrapolation method in turn; the results files are
    rewritten after every length so a stop keeps what was measured. Methods
    whose rows `results` already holds in full (an evaluation finished with
    existing=continue) are kept, not measured again. A stop (SIGTERM, Ctrl-C)
    raises Interrupted saying what was kept and, with `finish`, how to finish."""
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
    expected = len(results["eval"]["lengths"]) - len(results["eval"].get("skipped_lengths") or [])
    kept = {label for label in results["methods"] if sum(r["method"] == label for r in results["results"]) >= expected}
    results["methods"] = {k: v for k, v in results["methods"].items() if k in kept}
    results["results"] = [r for r in results["results"] if r["method"] in kept]
    # "complete" only once every method and length is in: a stop part-way leaves "evaluating".
    results["status"] = Status.EVALUATING
    label = None
    try:
        with signals_stop():
            for i, options in enumerate(methods):
                model.set_scaling(options)
                label = model.scaling.label
                if label in kept:
                    log.info("[%s] kept from the earlier evaluation in %s", label, out_dir)
                    continue
                results["methods"][label] = {"options": options, **model.describe_scaling(max(lengths))}

                def on_result(row, label=label):
                    row = {"method": label, **row}
                    results["results"].append(row)
                    write_views(results, out_dir, draw=False)
                    extra = f", beyond L_train {row['ppl_beyond']:.3f}" if row["ppl_beyond"] else ""
                    log.info("ppl@%d [%s] = %.3f%s", row["length"], label, row["ppl"], extra)

                started = time.perf_counter()
                evaluate_lengths(model, stream, eval_cfg, results["train_len"], on_result, doc_starts=doc_starts)
                # Wall time of the method's whole evaluation (all lengths), on this machine as it was loaded.
                results["methods"][label]["seconds"] = round(time.perf_counter() - started, 2)
                if i < len(methods) - 1:
                    write_views(results, out_dir)
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
        raise Interrupted(_stopped(results, label, expected, len(methods), out_dir, finish), signal_status(e)) from None
    finally:
        model.set_scaling(original)
    if wandb_run is not None:
        log_to_wandb(wandb_run, results, out_dir)
    return results


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
) -> dict:
    """Re-use a trained checkpoint (or, with hf=, a transformers Llama-family
    model by local folder or hub name): ppl@L under each extrapolation method,
    one table and one plot, in a new folder (default: <run>/eval/<methods>/,
    or outputs/eval/<model>/<methods>/ for hf=, numbered if taken); a folder
    that holds results already is refused, unless existing=continue and it
    holds a part-way evaluation of the same settings, which is finished. The
    corpus defaults to the checkpoint's own (data.* for an imported model),
    tokenized with the tokenizer the model carries. Every setting is checked
    before a folder is made."""
    eval_cfg = typed_dataclass(EvalConfig, eval_options, "eval.", "eval")
    data_overrides = typed(data_overrides or {}, DATA_ANNOTATIONS, "data.", "data")
    methods = [typed_component(METHODS, m or {"name": "none"}, "scaling") for m in methods]
    trained = open_model(f"hf:{hf}" if hf else ckpt_path, device)
    hp, model = trained.hparams, trained.model
    lengths = eval_cfg.resolve_lengths(model.cfg.train_len)
    for options in methods:  # refuse a method that does not fit before any work
        model.set_scaling(options)
        model.validate_length(max(lengths))
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
        "data": None,
        "eval": eval_options,
        "methods": methods,
    }
    if imported:  # a GGUF file names its quantisation (None for a transformers folder)
        from rope_lm.hf.gguf import source_of

        config["gguf"] = source_of(imported)
    if out_dir is None:
        out_dir = fresh_dir(os.path.join(output_home(trained.path, "eval"), "-".join(labels)[:80] or "none"))
    folder = RunFolder(out_dir)
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
    if earlier is not None:
        _check_same_evaluation(earlier, config, out_dir)
        results = earlier
    else:
        results = new_results(config, cache.corpus, model.cfg.train_len, scheme_label(hp["pos"], hp.get("model")))
    results["out_dir"] = out_dir
    finish = (
        f"To finish it, run the same command again with out={out_dir} existing=continue "
        f"(the complete methods are kept)."
    )
    try:
        return evaluate_and_report(model, cache, eval_cfg, methods, out_dir, results, finish=finish)
    except OutputError as e:  # a full disk part-way: results.json keeps what it could record before
        if not os.path.exists(folder.file(RESULTS_JSON)):
            raise e.reworded(setting="out=") from None
        raise e.reworded(
            elsewhere="move that folder to a disk with more room (and give its new place as out=)",
            then=f"finish it: run the same command again with out={out_dir} existing=continue (the complete "
            f"methods in its results.json are kept)",
        ) from None


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
