"""Compare finished runs: a PPL table (markdown + CSV) and plots across them.
Settings and examples: python scripts/compare.py --help (conf/compare.yaml).

Run directories are searched recursively for results.json (train.py runs and
scripts/eval_extrapolation.py outputs alike) and task_results.json
(scripts/task.py runs: exact match per size bucket across runs, written to
compare_tasks.md, compare_tasks.csv and accuracy_vs_length_<task>.png) and
retrieval.json (scripts/retrieval.py runs: each task's effective length per
checkpoint and method, written to compare_retrieval.md and
compare_retrieval.csv). A committed compare.csv (or `compare.csv:label,label`
for some of its rows) stands for runs whose folders are gone, so a new run can
join an old table; references= names runs trained longer (the train-long
upper bound), shown as reference rows in each table of their corpus.
Runs that differ in corpus,
tokenizer or training length are refused unless group=true. Writes
compare.md, compare.csv, ppl_vs_length*.png and per_position*.png to out=
(default: <the one directory given>/compare).
"""

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr
from rope_lm.core.errors import ConfigError


@hydra.main(config_path="../conf", config_name="compare", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.ppl import compare, default_out
    from rope_lm.compare.ppl_runs import has_results
    from rope_lm.compare.ppl_wandb import log_to_wandb
    from rope_lm.compare.retrieval_compare import compare_retrieval, find_retrieval_results
    from rope_lm.compare.task_compare import compare_tasks, find_task_results

    log_to_stderr()
    a = OmegaConf.to_container(cfg, resolve=True)
    paths = ([a["path"]] if a["path"] else []) + list(a["paths"])
    if not paths:
        raise ConfigError("Give the runs to compare: path=<dir or results.json>, or paths=[a,b,...].")
    others, out = False, a["out"] or default_out(paths)
    if find_task_results(paths):  # scripts/task.py runs: accuracy vs instance size across runs
        tasks = compare_tasks(paths, out, title=a["title"])
        print(open(tasks["files"]["markdown"]).read())
        print(f"Task comparison: {tasks['out_dir']}/ (compare_tasks.md, compare_tasks.csv, accuracy_vs_length_*.png)")
        others = True
    # scripts/retrieval.py runs: effective length per task and method (old ones without it refused only
    # when there is nothing else to compare)
    found = find_retrieval_results(paths) and compare_retrieval(paths, out, a["title"], required=not has_results(paths))
    if found:
        print(open(found["files"]["markdown"]).read())
        print(f"Retrieval comparison: {found['out_dir']}/ (compare_retrieval.md, compare_retrieval.csv)")
        others = True
    if others and not has_results(paths):
        return
    # Folders of task or retrieval runs given beside the perplexity runs are theirs, not missing results.
    ppl_paths = [p for p in paths if has_results([p])] if others else paths
    summary = compare(ppl_paths, a["out"], group=a["group"], title=a["title"], references=a["references"])
    print(open(summary["files"]["markdown"]).read())
    print(f"Comparison: {summary['out_dir']}/ (compare.md, compare.csv, ppl_vs_length*.png, per_position*.png)")
    if a["wandb"]:
        offline = log_to_wandb(summary, project=a["project"], group=a["wandb_group"])
        if offline:
            print(f"wandb ran offline; upload the summary run with:  wandb sync {offline}")


if __name__ == "__main__":
    main()
