"""Train a model from scratch on a synthetic task and measure exact match past
the training sizes. Settings and examples: python scripts/task.py --help
(conf/task_run.yaml; tasks in conf/task/, schemes in conf/pos/).

A sweep (-m, e.g. +experiment=length_generalization) ends with one table of
accuracy inside and past the training sizes per task and scheme, also written
to <sweep dir>/tasks.md.
"""

import atexit
import logging
import os

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

    from rope_lm.probes.task_run import claim, markdown, resolve_task_run, run_task
    from rope_lm.runs.run_folder import Skip, check_writable, describe
    from rope_lm.train.loggers import build_logger, finish

    log_to_stderr()
    config = OmegaConf.to_container(cfg, resolve=True)
    run = resolve_task_run(config)  # every setting, and the scheme at the longest test, before any work
    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    if hc.mode == RunMode.MULTIRUN and hc.sweep.dir not in _SWEEPS:
        # Hydra re-raises a failed job after the last one and skips code after main(); exit handlers still run.
        _SWEEPS.add(hc.sweep.dir)
        atexit.register(summarize, hc.sweep.dir)
    where = os.path.relpath(out_dir, hc.runtime.cwd)
    check_writable(out_dir)
    folder, start = claim(run, out_dir)  # two shells or machines sharing a study train each run once
    if isinstance(start, Skip):
        print(f"rope-lm: {where}: {describe(start)} (existing=continue).")
        return {"skipped": start.reason}
    try:
        logger = build_logger(run.logger, out_dir, run.run_name or where, config={**config, "data": {}})
        try:
            results = run_task(run, out_dir, logger)
        finally:
            if logger is not None and hasattr(logger, "save"):
                logger.save()
            finish(logger)
    finally:
        folder.release()
    print("\n" + markdown(results))
    print(f"Task results: {out_dir}/ (task_results.json, task_results.md, accuracy_vs_length.png, model.pt)")


if __name__ == "__main__":
    main()
