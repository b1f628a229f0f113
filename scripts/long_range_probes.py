"""Long-range probes for a checkpoint that need no task format: the repeated-span probe (the loss of
a span's second copy with and without its first copy d tokens earlier, at distances below and past
the training length) and key-token perplexity (LongPPL: the PPL on the tokens a fixed evaluator
model needs long context for, beside the PPL on every token).
Settings and examples: python scripts/long_range_probes.py --help (conf/long_range_probes.yaml).

Writes long_range.json (every number, with the settings and the model by its weights) and
long_range.md (the tables) to out= (default: a new <run dir>/diagnostics/long_range[_<scaling>]),
rewritten as each distance and each key-token length is scored, and the key-token evaluator's losses
(key_tokens-<key>.npz, to key_tokens.cache= or out=; key_tokens.evaluator_losses= reads such a folder in
the evaluator's place). existing=continue with the same out= goes on
from there after an interruption, or adds distances and lengths to a finished run. The work is
rope_lm.probes.long_range_run.run_long_range.
"""

import sys

import hydra

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="long_range_probes", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.long_range_run import LongRangeSettings, run_long_range

    log_to_stderr()
    run_long_range(script_settings(cfg, LongRangeSettings), sys.argv[1:])


if __name__ == "__main__":
    main()
