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

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="compare", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.compare.compare_run import CompareSettings, compare_folders

    log_to_stderr()
    compare_folders(script_settings(cfg, CompareSettings))


if __name__ == "__main__":
    main()
