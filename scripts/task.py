"""Train a model from scratch on a synthetic task and measure exact match past
the training sizes. Settings and examples: python scripts/task.py --help
(conf/task_run.yaml; tasks in conf/task/, schemes in conf/pos/).

A sweep (-m, e.g. +experiment=length_generalization) ends with one table of
accuracy inside and past the training sizes per task and scheme, also written
to <sweep dir>/tasks.md.

A stop (SIGTERM, Ctrl-C) says what is kept (nothing of the results, which
are written together at the end) and the command that finishes the run: the
same one with existing=continue in the same folder.
"""

import atexit
import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr

log = logging.getLogger("rope_lm")
_SWEEPS: set = set()


def summarize(sweep_dir: str):
    from rope_lm.compare.task_compare import task_summary

    table = task_summary(sweep_dir)
    if table:
        print("\n" + table)


@hydra.main(config_path="../conf", config_name="task_run", version_base="1.3")
@hydra_task
def main(cfg):
    from hydra.types import RunMode

    from rope_lm.probes.task_run import task_in_folder

    log_to_stderr()
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    if hc.mode == RunMode.MULTIRUN and hc.sweep.dir not in _SWEEPS:
        # Hydra re-raises a failed job after the last one and skips code after main(); exit handlers still run.
        _SWEEPS.add(hc.sweep.dir)
        atexit.register(summarize, hc.sweep.dir)
    return task_in_folder(
        OmegaConf.to_container(cfg, resolve=True), out_dir, os.path.relpath(out_dir, hc.runtime.cwd), sys.argv[1:]
    )


if __name__ == "__main__":
    main()
