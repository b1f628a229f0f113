"""scripts/compare.py's work: whatever the given folders hold, compared side
by side. Task runs (task_results.json) go to compare_tasks.*, retrieval runs
(retrieval.json) to compare_retrieval.*, long-range probe runs (long_range.json)
to compare_long_range.*, perplexity runs (results.json, or a committed
compare.csv standing for them) to compare.*; a folder may hold several kinds.

Each kind's files are written as one set (rope_lm.core.files.written_together):
a stop (SIGTERM, Ctrl-C) leaves that set as it was before, and says so, with
the command to run again (exit status 143 or 130).
"""

from dataclasses import dataclass, field
import os

from rope_lm.compare.long_range_compare import compare_long_range, find_long_range_results
from rope_lm.compare.ppl import compare, default_out
from rope_lm.compare.ppl_runs import has_results
from rope_lm.compare.ppl_wandb import log_to_wandb
from rope_lm.compare.retrieval_compare import compare_retrieval, find_retrieval_results
from rope_lm.compare.task_compare import compare_tasks, find_task_results
from rope_lm.core.errors import ConfigError, Interrupted
from rope_lm.core.stops import signal_status, signals_stop


@dataclass
class CompareSettings:
    """conf/compare.yaml's settings, as plain values."""

    path: str | None = None
    paths: list = field(default_factory=list)
    references: list = field(default_factory=list)
    out: str | None = None
    group: bool = False
    title: str | None = None
    wandb: bool = False
    project: str | None = None
    wandb_group: str | None = None


def compare_folders(s: CompareSettings) -> dict:
    """Every comparison the folders allow, printed and written; returns {kind: what it wrote}. A stop
    raises Interrupted saying which sets were written and that the one being written is as it was."""
    paths = ([s.path] if s.path else []) + list(s.paths)
    if not paths:
        raise ConfigError("Give the runs to compare: path=<dir or results.json>, or paths=[a,b,...].")
    written: dict = {}
    try:
        with signals_stop():
            return _compare(s, paths, written)
    except KeyboardInterrupt as e:
        one = len(paths) == 1 and os.path.isdir(paths[0])  # else the default folder is named by the time
        raise Interrupted(_stopped(written, s.out or (default_out(paths) if one else None)), signal_status(e)) from None


KINDS = {
    "tasks": "task comparison",
    "retrieval": "retrieval comparison",
    "long_range": "long-range probe comparison",
    "ppl": "perplexity comparison",
}


def _stopped(written: dict, out: str | None) -> str:
    done = [f"the {KINDS[k]} ({v['out_dir']})" for k, v in written.items()]
    if not done:
        where = out or "the output folder"
        return (
            f"Stopped by a signal: nothing of this comparison was written (its files are written as one set, so "
            f"{where} is as it was before). Run the same command again."
        )
    return (
        f"Stopped by a signal after writing {' and '.join(done)}: nothing of the comparison it was writing next "
        f"was written (each is written as one set, and the files there before are as they were). Run the same "
        f"command again."
    )


def _compare(s: CompareSettings, paths: list, written: dict) -> dict:
    out = s.out or default_out(paths)
    if find_task_results(paths):  # scripts/task.py runs: accuracy vs instance size across runs
        tasks = compare_tasks(paths, out, title=s.title)
        print(open(tasks["files"]["markdown"]).read())
        print(f"Task comparison: {tasks['out_dir']}/ (compare_tasks.md, compare_tasks.csv, accuracy_vs_length_*.png)")
        written["tasks"] = tasks
    # scripts/retrieval.py runs: effective length per task and method (old ones without it refused only
    # when there is nothing else to compare)
    found = find_retrieval_results(paths) and compare_retrieval(paths, out, s.title, required=not has_results(paths))
    if found:
        print(open(found["files"]["markdown"]).read())
        print(f"Retrieval comparison: {found['out_dir']}/ (compare_retrieval.md, compare_retrieval.csv)")
        written["retrieval"] = found
    # scripts/long_range_probes.py runs: the repeated span's drop and key-token PPL per model over its seeds
    # (files with nothing scored refused only when there is nothing else to compare)
    required = not written and not has_results(paths)
    found = find_long_range_results(paths) and compare_long_range(paths, out, s.title, required=required)
    if found:
        print(open(found["files"]["markdown"]).read())
        print(f"Long-range probe comparison: {found['out_dir']}/ (compare_long_range.md, compare_long_range.csv)")
        written["long_range"] = found
    if written and not has_results(paths):
        return written
    # Folders of task, retrieval or long-range runs given beside the perplexity runs are theirs, not missing results.
    ppl_paths = [p for p in paths if has_results([p])] if written else paths
    summary = compare(ppl_paths, s.out, group=s.group, title=s.title, references=s.references)
    print(open(summary["files"]["markdown"]).read())
    print(f"Comparison: {summary['out_dir']}/ (compare.md, compare.csv, ppl_vs_length*.png, per_position*.png)")
    if s.wandb:
        offline = log_to_wandb(summary, project=s.project, group=s.wandb_group)
        if offline:
            print(f"wandb ran offline; upload the summary run with:  wandb sync {offline}")
    written["ppl"] = summary
    return written
