"""A search of an extrapolation method's settings for a trained model and a
target length, into a folder (scripts/search.py is its command line): the
settings that minimise PPL on the validation split, then the test-split PPL
of the winner, the method's defaults, plain positions and the model cut to
its training length (the window-L control), with 95% intervals. The spaces and the searches are rope_lm/eval/search.py's.

Writes to out= (default: a new <run dir>/search/<method>_x<ratio>):
best.yaml, trials.json and trials.png, search.json and search.md.

A stopped search continues. search.json is written first, with status
"searching", the model by content (its weights' checksum and training step)
and the settings the trials depend on; trials.json after every trial. A stop
(SIGTERM, Ctrl-C) says how many trials are kept and the command that finishes
the search: the same one with out=<its folder> existing=continue, which goes
on only with the same model (any path to the same weights is accepted) and
the same settings, both values named otherwise. Optuna's study is given the
recorded trials (a refused one as pruned) and runs the trials left;
LongRoPE's evolution is replayed with the recorded candidates' PPLs, which
meets them again in the same order without evaluating them, and goes on as
the uninterrupted search would have. A complete search from before the
window-L test row gets it the same way: its trials kept, its test rows scored
again.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
import json
import logging
import os
import time

from rope_lm.core.errors import ConfigError, Interrupted, OutputError
from rope_lm.core.stops import rerun_command, signal_status, signals_stop
from rope_lm.probes.existing import check_existing

log = logging.getLogger("rope_lm")


@dataclass
class SearchSettings:
    """conf/search.yaml's settings, as plain values."""

    ckpt: str | None = None
    hf: str | None = None
    method: str = "yarn"
    target: int | None = None
    multiplier: float = 8
    trials: int = 30
    longrope: dict | None = None
    val_tokens: int = 8192
    test_tokens: int = 32768
    batch_tokens: int = 16384
    bootstrap: int = 1000
    seed: int = 0
    data: dict = field(default_factory=dict)
    device: str = "auto"
    out: str | None = None
    conf_name: str | None = None
    existing: str = "refuse"


SEARCHING, COMPLETE = "searching", "complete"
# The test row of the model cut to its training length (scaling=window): what the methods must beat to
# show they read the text past L at all, not only that they beat plain positions.
WINDOW = "window (L)"


def search_checkpoint(
    s: SearchSettings, scaling_options: Callable[[str], dict], conf_scaling: str, command: list[str] | None = None
) -> dict:
    """Search s.method's settings for the model at s.ckpt (or s.hf) and write
    the folder; returns search.json's summary. `scaling_options(name)`: a
    method's settings as its conf/scaling file gives them; `conf_scaling`:
    the folder a conf_name= copy of best.yaml goes into; `command`: the
    command line's arguments, which a stop's finishing command repeats."""
    from rope_lm.core.typed import typed_dataclass
    from rope_lm.eval import search as S
    from rope_lm.eval.longrope_search import Evolution
    from rope_lm.runs.trained import open_model

    method = s.method
    S.check_method(method)
    evolution = typed_dataclass(Evolution, s.longrope or {}, "longrope.", "longrope")
    for key in ("trials", "val_tokens", "test_tokens", "batch_tokens"):
        value = getattr(s, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a positive integer.")
    if bool(s.ckpt) == bool(s.hf):
        raise ConfigError(
            "Give one model: ckpt= (a .ckpt file or a run directory) or hf= (a transformers model folder or hub name)."
        )
    check_existing(
        s.existing,
        s.out,
        "files",
        "the trials a stopped search of the same model and settings kept",
        "a stopped search",
    )
    if s.out:  # before the model is opened, not at the first file
        from rope_lm.runs.run_folder import check_writable

        check_writable(s.out, "out=")
    installed = None
    if s.conf_name:
        installed = os.path.join(conf_scaling, f"{s.conf_name}.yaml")
        if os.path.exists(installed):
            raise ConfigError(
                f"conf_name={s.conf_name!r}: {installed} exists already and is never overwritten; choose another name."
            )
    reference = scaling_options(S.reference_of(method))
    earlier = _earlier_search(s.out) if s.existing == "continue" else None
    trained = open_model(f"hf:{s.hf}" if s.hf else s.ckpt, s.device)
    model, train_len = trained.model, trained.train_len
    target = s.target or int(round(s.multiplier * train_len))
    if target <= train_len:
        raise ConfigError(
            f"The target length {target} must exceed the model's training length {train_len}: below "
            f"it every method is plain positions. Raise target= or multiplier=."
        )
    model.set_scaling(reference)  # a method the scheme does not take is refused here, before any work
    model.validate_length(target)
    head = _head(s, trained, method, target, evolution)
    if earlier is not None:
        _check_same_search(earlier, head, s.out)
        if earlier.get("status") == COMPLETE and WINDOW in (earlier.get("test") or {}):
            print(f"rope-lm: out={s.out} holds a complete search (search.json); nothing to continue.")
            return earlier
        if earlier.get("status") == COMPLETE:  # a search from before the window row: its trials kept, the test redone
            log.info(
                "The search in %s predates its window-L test row: its trials kept, its test rows scored again.", s.out
            )
    out = s.out if earlier is not None else _output_dir(s.out, trained.path, method, target / train_len)
    trials_json = os.path.join(out, "trials.json")
    done = _recorded_trials(trials_json) if earlier is not None else []
    if earlier is not None:
        log.info("Continuing the search in %s: %d trial(s) kept", out, len(done))
    expected = evolution.population * (evolution.generations + 1) if method == "longrope" else s.trials
    progress = {"done": list(done), "searched": False}
    try:
        with signals_stop() as stop:
            try:
                return _search(
                    s,
                    scaling_options,
                    trained,
                    method,
                    target,
                    evolution,
                    reference,
                    installed,
                    head,
                    out,
                    done,
                    progress,
                )
            except Exception:
                stop.reraise_if_stopped()  # Optuna, stopped inside its own bookkeeping, raises an error of its own
                raise
    except KeyboardInterrupt as e:
        raise _stopped(e, s, method, out, progress, expected, command) from None


def _search(s, scaling_options, trained, method, target, evolution, reference, installed, head, out, done, progress):
    from rope_lm.core.files import atomic_write, from_here, written_together
    from rope_lm.eval import search as S
    from rope_lm.eval.evaluation import evaluate_lengths
    from rope_lm.probes.diagnostics import save_json
    from rope_lm.runs.trained import checkpoint_token_cache

    model, train_len = trained.model, trained.train_len
    try:
        save_json(os.path.join(out, "search.json"), head)  # first: what a continue checks
    except OutputError as e:
        raise e.reworded(setting="out=") from None
    cache, _ = checkpoint_token_cache(trained.lit, s.data, out)
    obj = S.objective(model, cache.tokens("valid"), target, s.val_tokens, s.batch_tokens)
    started = time.perf_counter()
    history = _run(method, obj, s, evolution, os.path.join(out, "trials.json"), done, progress["done"])
    progress["searched"] = True
    best = S.best_of(history)
    seconds = time.perf_counter() - started
    chosen = _options(scaling_options(method), method, best, obj)

    final = S.final_config(obj.eval_cfg, s.test_tokens, s.bootstrap, s.seed)
    rows, units = {}, {}
    for label, options in (
        ("none", {"name": "none"}),
        (WINDOW, {"name": "window"}),  # the model cut to L (window auto = its training length): the control
        (f"{reference['name']} defaults", reference),
        (f"{method} searched", chosen),
    ):
        model.set_scaling(options)
        got = {}
        rows[label] = evaluate_lengths(model, cache.tokens("test"), final, train_len, units_out=got)[0]
        units[label] = got[target]
        log.info("test ppl@%d [%s] = %.3f", target, label, rows[label]["ppl"])
    paired = S.paired_ratios(rows, units, final.bootstrap, final.seed, target)
    text = _yaml(chosen, from_here(trained.path), target, best, len(history))
    summary = {
        "checkpoint": from_here(trained.path),
        "method": method,
        "target": target,
        "train_len": train_len,
        "seed": s.seed,
        "trials": len(history),
        "search_seconds": seconds,
        "validation": {
            "tokens": obj.eval_cfg.token_budget,
            "best_ppl": best["ppl"],
            "defaults_ppl": _defaults_ppl(history),
        },
        "best": chosen,
        "test": {k: {key: v.get(key) for key in ("ppl", "ppl_lo", "ppl_hi", "tokens")} for k, v in rows.items()},
        "paired": paired,
        "settings": {k: getattr(s, k) for k in ("trials", "longrope", "val_tokens", "test_tokens", "bootstrap")},
        "installed": installed,
        "status": COMPLETE,
        "model": head["model"],
        "compared": head["compared"],
    }
    table = search_table(summary)
    # One set: a full disk leaves the folder as a stopped search left it (search.json still
    # "searching", so existing=continue redoes only the scoring), never a best.yaml without its tables.
    with written_together(out, "out=", "search's results"):
        atomic_write(os.path.join(out, "best.yaml"), text)
        save_json(os.path.join(out, "trials.json"), history)
        _plot(history, os.path.join(out, "trials.png"), method, target, train_len)
        save_json(os.path.join(out, "search.json"), summary)
        atomic_write(os.path.join(out, "search.md"), table)
    if installed:
        atomic_write(installed, text)
    print("\n" + table)
    print(
        f"Search: {out}/ (best.yaml, trials.json, trials.png, search.json, search.md)"
        + (f"; installed as scaling={s.conf_name}" if installed else "")
    )
    return summary


def compared_settings(s: SearchSettings, method: str, target: int, evolution) -> dict:
    """What the trials' PPLs depend on, the model aside (checked by content): a continue needs the same."""
    out = {
        "method": method,
        "target": target,
        "seed": s.seed,
        "val_tokens": s.val_tokens,
        "batch_tokens": s.batch_tokens,
        "test_tokens": s.test_tokens,
        "bootstrap": s.bootstrap,
        # where the token cache lives changes no token
        "data": {k: v for k, v in s.data.items() if k != "cache_dir"} or None if s.data else None,
    }
    if method == "longrope":
        out["longrope"] = asdict(evolution)
    else:
        out["trials"] = s.trials
    return out


def _head(s: SearchSettings, trained, method: str, target: int, evolution) -> dict:
    from rope_lm.core.files import from_here

    return {
        "status": SEARCHING,
        "checkpoint": from_here(trained.path),  # shown, never compared: the model is checked by content
        "model": trained.identity,
        "method": method,
        "target": target,
        "train_len": trained.train_len,
        "compared": json.loads(json.dumps(compared_settings(s, method, target, evolution), default=str)),
    }


def _earlier_search(out: str) -> dict | None:
    """The head (or summary) of the search in out=, None where out= is empty or missing (a continue there
    starts the search); a folder holding other files is refused."""
    path = os.path.join(out, "search.json")
    if not os.path.exists(path):
        if os.path.isdir(out) and os.listdir(out):
            raise ConfigError(
                f"existing=continue: out={out} holds files but no search.json, so it holds no search this one "
                f"could continue (a search from before searches could be continued, or another kind of output); "
                f"give a new out= folder."
            )
        return None
    with open(path) as f:
        earlier = json.load(f)
    if "model" not in earlier or "compared" not in earlier:
        raise ConfigError(
            f"existing=continue: {path} records neither the model nor the settings of its search (a search from "
            f"before searches could be continued), so it cannot be continued; give a new out= folder."
        )
    return earlier


def _check_same_search(earlier: dict, head: dict, out: str) -> None:
    """A continued search reads the same model (by its weights and step: any path to them is accepted)
    under the same settings; what differs is named with both values."""
    before, now = earlier["model"], head["model"]
    if before != now:
        raise ConfigError(
            f"existing=continue: out={out} holds a search of another model: weights {before.get('weights')} at step "
            f"{before.get('step')} (ckpt {earlier.get('checkpoint')}), where this one has weights {now.get('weights')} "
            f"at step {now.get('step')} (ckpt {head.get('checkpoint')}). Continue with the checkpoint that search "
            f"read, or give a new out= folder."
        )
    a, b = earlier["compared"], head["compared"]
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if differ:
        shown = "; ".join(f"{k}: {a.get(k)!r} before, {b.get(k)!r} now" for k in differ)
        raise ConfigError(
            f"existing=continue: out={out} holds a search with other settings ({shown}), so it is not continued "
            f"with these. Run the command that started it with out={out} existing=continue, or give a new out= folder."
        )


def _recorded_trials(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def finish_command(command: list[str] | None, s: SearchSettings, out: str) -> str:
    """The command that finishes a stopped search: the same arguments, out= its folder, existing=continue."""
    if command is None:
        command = [f"ckpt={s.ckpt}" if s.ckpt else f"hf={s.hf}", f"method={s.method}"]
    return rerun_command("search.py", command, ("out", "existing"), [f"out={out}", "existing=continue"])


def _stopped(e, s: SearchSettings, method: str, out: str, progress: dict, expected: int, command) -> Interrupted:
    # What is on disk, not in memory: a stop between a trial's measurement and its save keeps one fewer.
    try:
        with open(os.path.join(out, "trials.json")) as f:
            done = json.load(f)
    except (OSError, ValueError):
        done = []
    what = "candidates" if method == "longrope" else "trials"
    scored = [r for r in done if r.get("ppl") is not None]
    best = min(scored, key=lambda r: r["ppl"]) if scored else None
    so_far = f"best so far: validation PPL {best['ppl']:.4f} at trial #{best['number']}" if best else "none scored yet"
    of = f"at most {expected}" if method == "longrope" else f"{expected}"
    if progress["searched"]:
        state = (
            f"all {len(done)} {what} of the search are kept in {os.path.join(out, 'trials.json')} ({so_far}); "
            f"the test-split scoring of the winner was not finished, and search.json still says searching."
        )
    else:
        state = f"{len(done)} of {of} {what} kept in {os.path.join(out, 'trials.json')} ({so_far})."
    return Interrupted(
        f"Stopped by a signal: {state} Finish it with: {finish_command(command, s, out)}", signal_status(e)
    )


def _run(method, obj, s: SearchSettings, evolution, trials_json, done: list, kept: list):
    """The trials left after `done` (a continued search's), each appended to `kept` and trials.json
    as soon as it is measured."""
    from rope_lm.eval import search as S
    from rope_lm.probes.diagnostics import save_json

    def report(r):
        shown = f"{r['ppl']:.3f}" if r["ppl"] is not None else "refused"
        log.info("trial %d (%s): validation ppl@%d = %s", r["number"], r.get("origin", ""), obj.target, shown)
        kept.append(r)
        save_json(trials_json, kept)  # after every trial: a stopped search keeps what it measured

    if method != "longrope":
        return S.optuna_search(method, obj, s.trials, s.seed, report, done=done)
    from rope_lm.eval.longrope_search import evolve

    def evaluate(factors):
        return obj({"name": "longrope", "factor": obj.ratio, "long_factor": factors})

    # The seeds (PI, NTK, YaRN) take the base of the layers the factors act on: a layout's scaled layers.
    spec = obj.model.scaled_rotary()

    return evolve(evaluate, spec.rot_dim, spec.base, obj.train_len, obj.target, evolution, s.seed, report, done=done)


def _options(base: dict, method, best, obj) -> dict:
    """The winner as a complete scaling config (the method's own file's keys, `base`, the searched values set)."""
    if method == "longrope":
        return {**base, "factor": obj.ratio, "long_factor": best["factors"]}
    return {**base, **best["options"]}


def _defaults_ppl(history):
    first = [r for r in history if r.get("origin") in ("defaults", "yarn")]
    return first[0]["ppl"] if first else None


def _output_dir(out, path, method, ratio) -> str:
    from rope_lm.core.files import fresh_dir
    from rope_lm.runs.trained import output_home

    if out:
        if os.path.isdir(out) and os.listdir(out):
            stopped = os.path.exists(os.path.join(out, "search.json"))
            raise ConfigError(
                f"out={out} holds files already, which a search never overwrites; give a new folder "
                f"(or leave out= unset for a fresh one)"
                + (", or add existing=continue to finish the search it holds." if stopped else ".")
            )
        os.makedirs(out, exist_ok=True)
        return out
    folder = fresh_dir(os.path.join(output_home(path, "search"), f"{method}_x{ratio:g}"))
    os.makedirs(folder)
    return folder


def _yaml(options, source, target, best, n) -> str:
    import yaml

    head = (
        f"# Searched by scripts/search.py for {source} at {target} tokens: validation PPL "
        f"{best['ppl']:.4f}, the best of {n} trials.\n# Load with scaling=<this file> "
        f"(scripts/eval_extrapolation.py) or copy into conf/scaling/.\n"
    )
    return head + yaml.safe_dump(options, sort_keys=False)


def _plot(history, path, method, target, train_len):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rope_lm.core.files import save_figure

    done = [r for r in history if r["ppl"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([r["number"] for r in done], [r["ppl"] for r in done], s=14, label="trial")
    best, line = float("inf"), []
    for r in history:
        if r["ppl"] is not None:
            best = min(best, r["ppl"])
        line.append(best)
    ax.step(range(len(history)), line, where="post", color="black", label="best so far")
    if _defaults_ppl(history) is not None:
        ax.axhline(
            _defaults_ppl(history),
            color="grey",
            linestyle="--",
            label="defaults" if method != "longrope" else "YaRN's factors",
        )
    ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"validation PPL at {target} tokens")
    ax.set_title(f"{method} search, trained at L={train_len}")
    ax.legend()
    save_figure(fig, path)


def search_table(s: dict) -> str:
    from rope_lm.core.tables import markdown_table

    def cell(r):
        ci = f" [{r['ppl_lo']:.2f}, {r['ppl_hi']:.2f}]" if r.get("ppl_lo") is not None else ""
        return f"{r['ppl']:.2f}{ci}"

    rows = [[label, cell(r)] for label, r in s["test"].items()]
    tokens = max(r.get("tokens") or 0 for r in s["test"].values())
    ratios = [
        f"* {pair}: {r['ratio']:.3f}" + (f" [{r['lo']:.3f}, {r['hi']:.3f}]" if r.get("lo") is not None else "")
        for pair, r in (s.get("paired") or {}).items()
    ]
    ci = (
        "95% bootstrap interval over windows"
        if any(r.get("ppl_lo") is not None for r in s["test"].values())
        else f"no interval: {tokens} test tokens make {tokens // s['target']} window of {s['target']} "
        f"(test_tokens= of at least twice the target gives one)"
    )
    return (
        f"# {s['method']} settings searched at {s['target']} tokens ({s['target'] / s['train_len']:g} x L)\n\n"
        f"Checkpoint {s['checkpoint']}. {s['trials']} trials, each scoring {s['validation']['tokens']} validation "
        f"tokens; best validation PPL {s['validation']['best_ppl']:.3f}. Test-split PPL at the target, {ci}:\n\n"
        + markdown_table(["settings", f"test PPL @ {s['target']}"], rows)
        + "\n"
        + (
            "\nTest PPL ratios on the same windows, with the 95% interval of the paired bootstrap (each resample "
            "draws the same windows for both settings, so the interval holds the noise of the difference, not of "
            "each PPL; below 1 beyond the interval: the first is better):\n\n" + "\n".join(ratios) + "\n"
            if ratios
            else ""
        )
    )
