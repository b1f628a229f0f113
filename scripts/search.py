"""Search an extrapolation method's settings for a checkpoint and a target
length: the settings that minimise PPL on the validation split (the test
split only scores the winner). Settings and examples:
python scripts/search.py --help (conf/search.yaml).

Writes to out= (default: a new <run dir>/search/<method>_x<ratio>):
best.yaml (a scaling config: scripts/eval_extrapolation.py scaling=<it>, or
conf_name= to install it as conf/scaling/<name>.yaml), trials.json and
trials.png (every trial's validation PPL), search.json and search.md (the
test-split PPL of the winner, the method's defaults and plain positions,
with 95% intervals).

A stopped search (SIGTERM, Ctrl-C) says how many trials trials.json keeps and
the command that finishes it: the same one with out=<its folder>
existing=continue (the same model, by content, and the same settings).
"""

import functools
import logging
import os
import sys

import hydra

from rope_lm.cli import group_config, hydra_task, script_settings
from rope_lm.probes.search_run import SearchSettings, search_checkpoint
from rope_lm.probes.search_run import search_table as _table  # noqa: F401  (the table, as tests read it)

CONF_SCALING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "scaling")


@hydra.main(config_path="../conf", config_name="search", version_base="1.3")
@hydra_task
def main(cfg):
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    search_checkpoint(
        script_settings(cfg, SearchSettings), functools.partial(group_config, "scaling"), CONF_SCALING, sys.argv[1:]
    )


if __name__ == "__main__":
    main()
