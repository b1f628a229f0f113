"""Retrieval battery for a checkpoint: lookups (passkey, multi-key,
multi-value, multi-query, variable tracking) and reasoning tasks (BABILong
qa1 / qa2, common and frequent words extraction, QA over inserted facts) in
haystacks of the checkpoint's own evaluation text, accuracy by context
length x needle depth, and each task's effective length.
Settings and examples: python scripts/retrieval.py --help (conf/retrieval.yaml).

Writes retrieval_<task>.png (heatmap per task), retrieval.md (accuracy per
task and length, 95% interval over samples, effective lengths) and
retrieval.json to out=
(default: a new <run dir>/diagnostics/retrieval[_<scaling>], made once the
settings, the model and the prompts are checked), and cells.jsonl, each
length x depth cell's verdicts as soon as it is scored: existing=continue
with the same out= goes on from there after an interruption, or adds
lengths, depths or tasks to a finished run.
"""

import logging
import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr
from rope_lm.core.errors import ConfigError

log = logging.getLogger("rope_lm")


@hydra.main(config_path="../conf", config_name="retrieval", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.core.files import atomic_write, from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.probes import passkey as P
    from rope_lm.probes import retrieval as R
    from rope_lm.runs.trained import open_model

    log_to_stderr()
    a = OmegaConf.to_container(cfg, resolve=True)
    tasks = R.build_tasks(list(a["tasks"] or []), a["needles"])  # names checked before the model is loaded
    if a["scoring"] not in R.SCORING:
        raise ConfigError(f"scoring={a['scoring']!r} must be one of {', '.join(R.SCORING)}.")
    if a["haystack"] not in R.HAYSTACKS:
        raise ConfigError(
            f"haystack={a['haystack']!r} must be corpus (the checkpoint's own evaluation text) or "
            f"filler (the passkey papers' repeated sentences)."
        )
    if a["existing"] not in ("refuse", "continue"):
        raise ConfigError(
            f"existing={a['existing']!r} is not an option; use refuse (an out= folder holding files is "
            f"refused) or continue (go on with the cells an earlier run with the same settings scored "
            f"in out=; needs out=)."
        )
    if a["existing"] == "continue" and not a["out"]:
        raise ConfigError("existing=continue goes on in the out= folder of an earlier run: give that folder as out=.")
    if a["batch_size"] < 1 or a["samples"] < 1:
        raise ConfigError(f"batch_size={a['batch_size']} and samples={a['samples']} must be at least 1.")
    effective = a.get("effective") or {}
    if not isinstance(effective, dict) or set(effective) - {"threshold", "relative"}:
        raise ConfigError(
            f"effective={effective!r}: give effective.threshold= (an accuracy in [0, 1), default "
            f"{R.THRESHOLD}, or with effective.relative=true a fraction in (0, 1) of each task's own "
            f"accuracy at the training length) and effective.relative= (true or false)."
        )
    threshold, relative = effective.get("threshold", R.THRESHOLD), effective.get("relative", False)
    R.check_threshold(threshold, relative)
    scaling = a.get("scaling")
    # What a cell's verdicts depend on: a resumed run must match them (lengths, depths and tasks may grow).
    settings = {
        "checkpoint": a["ckpt"],
        "scaling": scaling,
        "needles": a["needles"],
        "samples": a["samples"],
        "seed": a["seed"],
        "scoring": a["scoring"],
        "haystack": a["haystack"],
        "split": a["split"],
        "data": a["data"] or None,
    }
    done = R.read_cells(os.path.join(a["out"], R.CELLS), settings) if a["existing"] == "continue" else {}
    if done:
        log.info("Continuing in %s: %d cell(s) scored before", a["out"], len(done))
    trained = open_model(a["ckpt"], a["device"], scaling)
    model, train_len = trained.model, trained.train_len
    lengths = D.lengths_for(train_len, a["lengths"], a["multipliers"])
    if a["existing"] == "continue":
        D.check_writable(a["out"], "out=")
    else:
        D.output_dir(a["out"], trained.path, "retrieval", scaling)
    tokenizer = trained.tokenizer()
    stream = (
        R.filler_stream(tokenizer, max(lengths) + 1)
        if a["haystack"] == "filler"
        else D.checkpoint_tokens(trained, a["split"], a["data"] or None)
    )

    folder = []  # made at the first scored cell, so a refused run leaves no folder

    def report(task, length, depth, verdicts):
        if not folder:
            folder.append(D.make_output_dir(a["out"], trained.path, "retrieval", scaling))
        R.append_cell(os.path.join(folder[0], R.CELLS), settings, task, length, depth, verdicts)
        log.info(
            "%s length %d depth %g: accuracy %.0f%%",
            task,
            length,
            depth,
            100 * sum(v[0] for v in verdicts) / len(verdicts),
        )

    results = R.evaluate(
        model,
        tokenizer,
        stream,
        tasks,
        lengths,
        a["depths"],
        a["samples"],
        a["seed"],
        a["scoring"],
        a["batch_size"],
        a["bootstrap"],
        on_cell=report,
        done=done,
    )
    summary = R.add_effective(results, threshold, relative, train_len)
    method = getattr(model.scaling, "label", model.scaling.name)
    scheme = trained.scheme
    out = folder[0] if folder else D.make_output_dir(a["out"], trained.path, "retrieval", scaling)
    for name, r in results.items():
        P.plot_passkey(
            r,
            os.path.join(out, f"retrieval_{name}.png"),
            train_len,
            f"{name} ({a['scoring']}) — {scheme} + {method}, trained at {train_len} ({a['samples']} per "
            f"cell); effective length {R.effective_label(r['effective'])}",
        )
    table = R.summary_table(results, train_len, summary)
    head = (
        f"# Retrieval battery — {scheme} + {method}, trained at {train_len}\n\n"
        f"Checkpoint {from_here(trained.path)}; haystack {a['haystack']}; scoring {a['scoring']}; {a['samples']} samples "
        f"per length x depth cell, "
        f"depths {a['depths']}; accuracy over all depths, 95% bootstrap interval over samples.\n\n"
    )
    atomic_write(os.path.join(out, "retrieval.md"), head + table + "\n\n" + R.threshold_note(summary) + "\n")
    D.save_json(
        os.path.join(out, "retrieval.json"),
        {
            "checkpoint": from_here(trained.path),
            "source": trained.source,
            "scheme": scheme,
            "train_pos": trained.train_positions,
            "method": method,
            "train_len": train_len,
            "haystack": a["haystack"],
            "scoring": a["scoring"],
            "needles": a["needles"],
            "seed": a["seed"],
            "split": a["split"],
            "config": trained.settings,
            "effective": summary,
            "tasks": results,
        },
    )
    print("\n" + table)
    print(f"Retrieval: {out}/ (retrieval.md, retrieval.json, retrieval_<task>.png)")


if __name__ == "__main__":
    main()
