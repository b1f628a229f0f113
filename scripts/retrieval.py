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
lengths, depths or tasks to a finished run. The work is
rope_lm.probes.retrieval_run.run_retrieval.
"""

import sys

import hydra

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="retrieval", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.retrieval_run import RetrievalSettings, run_retrieval

    log_to_stderr()
    run_retrieval(script_settings(cfg, RetrievalSettings), sys.argv[1:])


if __name__ == "__main__":
    main()
