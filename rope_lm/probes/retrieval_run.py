"""scripts/retrieval.py's work: the retrieval battery for one trained model,
accuracy by context length x needle depth and each task's effective length,
written to a folder cell by cell so that a stopped run can be finished.

What a resumed battery checks. The cells file (cells.jsonl) starts with the
settings every verdict depends on; `existing=continue` goes on only under the
same ones, and the model is named by content (its weights' checksum and
training step), not by the path it was given: the same checkpoint by another
path continues, another model under the same path is refused, both shown.
A last line cut by a kill is repaired, with a warning naming the file, before
anything is appended. A stop (SIGTERM, Ctrl-C) says how many cells are on
disk and the command that finishes the battery.
"""

from dataclasses import dataclass, field
import json
import logging
import os

from rope_lm.core.errors import ConfigError, Interrupted, OutputError, write_failure
from rope_lm.core.files import atomic_write, from_here
from rope_lm.core.stops import rerun_command, signal_status, signals_stop
from rope_lm.probes import diagnostics as D
from rope_lm.probes import passkey as P
from rope_lm.probes import retrieval as R
from rope_lm.probes.existing import check_existing
from rope_lm.runs.trained import open_model

log = logging.getLogger("rope_lm")


@dataclass
class RetrievalSettings:
    """conf/retrieval.yaml's settings, as plain values."""

    ckpt: str | None = None
    scaling: dict | None = None
    tasks: list = field(default_factory=lambda: list(R.task_names()))
    needles: int = 4
    lengths: list | None = None
    multipliers: list = field(default_factory=lambda: [1, 2, 4, 8, 16])
    depths: list = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    samples: int = 10
    scoring: str = "teacher"
    haystack: str = "corpus"
    split: str = "test"
    data: dict = field(default_factory=dict)
    seed: int = 0
    bootstrap: int = 1000
    effective: dict = field(default_factory=dict)
    batch_size: int = 8
    device: str = "cpu"
    out: str | None = None
    existing: str = "refuse"


def check(s: RetrievalSettings) -> tuple[dict, float, bool]:
    """Every setting checked before the model is read: (tasks, threshold, relative)."""
    tasks = R.build_tasks(list(s.tasks or []), s.needles)
    if s.scoring not in R.SCORING:
        raise ConfigError(f"scoring={s.scoring!r} must be one of {', '.join(R.SCORING)}.")
    if s.haystack not in R.HAYSTACKS:
        raise ConfigError(
            f"haystack={s.haystack!r} must be corpus (the checkpoint's own evaluation text) or "
            f"filler (the passkey papers' repeated sentences)."
        )
    check_existing(s.existing, s.out, "files", "the cells an earlier run with the same settings scored")
    if s.existing == "refuse" and s.out and os.path.exists(os.path.join(s.out, R.CELLS)):
        raise ConfigError(
            f"out={s.out} holds the cells of an earlier retrieval run ({R.CELLS}); a run never writes over "
            f"them. Add existing=continue to finish or extend that run with the same settings, or give a new "
            f"out= folder."
        )
    if s.batch_size < 1 or s.samples < 1:
        raise ConfigError(f"batch_size={s.batch_size} and samples={s.samples} must be at least 1.")
    effective = s.effective or {}
    if not isinstance(effective, dict) or set(effective) - {"threshold", "relative"}:
        raise ConfigError(
            f"effective={effective!r}: give effective.threshold= (an accuracy in [0, 1), default "
            f"{R.THRESHOLD}, or with effective.relative=true a fraction in (0, 1) of each task's own "
            f"accuracy at the training length) and effective.relative= (true or false)."
        )
    threshold, relative = effective.get("threshold", R.THRESHOLD), effective.get("relative", False)
    R.check_threshold(threshold, relative)
    return tasks, threshold, relative


def verdict_settings(s: RetrievalSettings) -> dict:
    """What a cell's verdicts depend on, the model aside (it is checked by content once read)."""
    return {
        "scaling": s.scaling,
        "needles": s.needles,
        "samples": s.samples,
        "seed": s.seed,
        "scoring": s.scoring,
        "haystack": s.haystack,
        "split": s.split,
        "data": s.data or None,
    }


def finish_command(command: list[str] | None, s: RetrievalSettings, out: str) -> str:
    """The command that finishes a stopped battery: the arguments it was given (from Python, the
    checkpoint alone), out= its folder, existing=continue."""
    command = command if command is not None else [f"ckpt={s.ckpt}"]
    return rerun_command("retrieval.py", command, ("out", "existing"), [f"out={out}", "existing=continue"])


def run_retrieval(s: RetrievalSettings, command: list[str] | None = None) -> dict:
    """The battery for s.ckpt into its folder; returns what retrieval.json holds. `command`: the
    arguments it was given on the command line, for the command a stop prints to finish it."""
    tasks, threshold, relative = check(s)
    settings = verdict_settings(s)
    cells_path = os.path.join(s.out, R.CELLS) if s.out else None
    done = R.read_cells(cells_path, settings) if s.existing == "continue" else {}
    trained = open_model(s.ckpt, s.device, s.scaling)
    settings["model"], settings["checkpoint"] = trained.identity, s.ckpt  # the path only shown, never compared
    if s.existing == "continue":
        R.check_same_model(cells_path, trained.identity, trained.path)
    if done:
        log.info("Continuing in %s: %d cell(s) scored before", s.out, len(done))
    model, train_len = trained.model, trained.train_len
    lengths = D.lengths_for(train_len, s.lengths, s.multipliers)
    if s.existing == "continue":
        D.check_writable(s.out, "out=")
    else:
        D.output_dir(s.out, trained.path, "retrieval", s.scaling)
    tokenizer = trained.tokenizer()
    stream = (
        R.filler_stream(tokenizer, max(lengths) + 1)
        if s.haystack == "filler"
        else D.checkpoint_tokens(trained, s.split, s.data or None)
    )

    folder = []  # made at the first scored cell, so a refused run leaves no folder
    folder_ours = []

    def report(task, length, depth, verdicts):
        if not folder:
            ours = not (s.out and os.path.isdir(s.out))  # a folder of the user's stays, even empty
            folder.append(D.make_output_dir(s.out, trained.path, "retrieval", s.scaling))
            folder_ours.append(ours)
        try:
            R.append_cell(os.path.join(folder[0], R.CELLS), settings, task, length, depth, verdicts)
        except OSError as e:  # a full disk: the cells scored before stay (a line cut short is cut off on continue)
            _drop_if_empty(os.path.join(folder[0], R.CELLS), folder_ours[0])
            raise write_failure(os.path.join(folder[0], R.CELLS), e) from None
        log.info(
            "%s length %d depth %g: accuracy %.0f%%",
            task,
            length,
            depth,
            100 * sum(v[0] for v in verdicts) / len(verdicts),
        )

    total = len(tasks) * len(lengths) * len(s.depths)
    try:
        with signals_stop():
            results = R.evaluate(
                model,
                tokenizer,
                stream,
                tasks,
                lengths,
                s.depths,
                s.samples,
                s.seed,
                s.scoring,
                s.batch_size,
                s.bootstrap,
                on_cell=report,
                done=done,
            )
            return write_report(s, trained, results, threshold, relative, train_len, folder)
    except KeyboardInterrupt as e:
        raise _stopped(e, s, folder, settings, total, command) from None
    except OutputError as e:
        raise _cells_kept(e, s, folder, settings, command) from None


def _stopped(
    e: KeyboardInterrupt, s: RetrievalSettings, folder: list, settings: dict, total: int, command: list[str] | None
) -> Interrupted:
    out = folder[0] if folder else s.out
    cells = os.path.join(out, R.CELLS) if out else None
    if cells is None or not os.path.exists(cells):
        return Interrupted(
            f"Stopped by a signal before the first of {total} cells was scored: nothing was written.",
            signal_status(e),
        )
    kept = len(R.read_cells(cells, settings))
    return Interrupted(
        f"Stopped by a signal: {kept} of {total} cells of the battery are kept in {cells} (every cell is "
        f"written as soon as it is scored; the report once all are). Finish it with: {finish_command(command, s, out)}",
        signal_status(e),
    )


def _drop_if_empty(cells: str, folder_too: bool) -> None:
    """A cells file whose first line the disk refused holds nothing: it goes (with the folder made for it)."""
    try:
        with open(cells, "rb") as f:
            if b"\n" in f.read():
                return
        os.remove(cells)
        if folder_too:
            os.rmdir(os.path.dirname(cells))
    except OSError:
        pass


def _cells_kept(error, s: RetrievalSettings, folder: list, settings: dict, command: list[str] | None):
    """A failed write (a full disk) names out= and, where cells were scored, how to finish from them."""
    cells = os.path.join(folder[0], R.CELLS) if folder else None
    try:
        kept = len(R.read_cells(cells, settings)) if cells and os.path.exists(cells) else 0
    except (ConfigError, ValueError):
        kept = 0
    if not kept:
        return error.reworded(setting="out=")
    return error.reworded(
        kept=f"The {kept} cell(s) scored so far are kept in {cells}.",
        elsewhere="move that folder to a disk with more room (and give its new place as out=)",
        then=f"finish the battery from them: {finish_command(command, s, folder[0])}",
    )


def write_report(s, trained, results, threshold, relative, train_len, folder) -> dict:
    summary = R.add_effective(results, threshold, relative, train_len)
    model = trained.model
    method = getattr(model.scaling, "label", model.scaling.name)
    scheme = trained.scheme
    out = folder[0] if folder else D.make_output_dir(s.out, trained.path, "retrieval", s.scaling)
    for name, r in results.items():
        P.plot_passkey(
            r,
            os.path.join(out, f"retrieval_{name}.png"),
            train_len,
            f"{name} ({s.scoring}) — {scheme} + {method}, trained at {train_len} ({s.samples} per "
            f"cell); effective length {R.effective_label(r['effective'])}",
        )
    table = R.summary_table(results, train_len, summary)
    head = (
        f"# Retrieval battery — {scheme} + {method}, trained at {train_len}\n\n"
        f"Checkpoint {from_here(trained.path)}"
        + (f" (step {trained.step})" if trained.step is not None else "")
        + f"; haystack {s.haystack}; scoring {s.scoring}; {s.samples} samples per length x depth cell, "
        f"depths {s.depths}; accuracy over all depths, 95% bootstrap interval over samples.\n\n"
    )
    atomic_write(os.path.join(out, "retrieval.md"), head + table + "\n\n" + R.threshold_note(summary) + "\n")
    record = {
        "checkpoint": from_here(trained.path),
        "source": trained.source,
        "model": trained.identity,
        "scheme": scheme,
        "train_pos": trained.train_positions,
        "method": method,
        "train_len": train_len,
        "haystack": s.haystack,
        "scoring": s.scoring,
        "needles": s.needles,
        "seed": s.seed,
        "split": s.split,
        "config": trained.settings,
        "effective": summary,
        "tasks": results,
    }
    D.save_json(os.path.join(out, "retrieval.json"), record)
    print("\n" + table)
    print(f"Retrieval: {out}/ (retrieval.md, retrieval.json, retrieval_<task>.png)")
    return json.loads(json.dumps(record, default=str))
