"""A trained run exported as a transformers folder (scripts/export_hf.py):
the model opened through the one front door, then written by rope_lm.hf.export.

A stop (SIGTERM, Ctrl-C) leaves out= as it was: a new folder is built aside
and renamed into place, and in a folder of the user's the files written
before the stop are removed (rope_lm.hf.export); it says so, with the
command to run again (exit status 143 or 130)."""

import os

from rope_lm.core.errors import Interrupted
from rope_lm.core.stops import signal_status, signals_stop
from rope_lm.hf.export import export_hf, refuse_model_folder
from rope_lm.runs.run_folder import check_writable
from rope_lm.runs.trained import open_model


def export_checkpoint(ckpt: str, out_dir: str) -> dict:
    """export_hf for a rope-lm checkpoint (.ckpt or run directory), with the
    tokenizer stored in it; the folder is checked (no model in it, a place
    that can be written) before the model is read."""
    refuse_model_folder(out_dir)
    check_writable(out_dir, "out=")
    existed = os.path.isdir(out_dir)
    try:
        with signals_stop():
            trained = open_model(ckpt, "cpu")
            return export_hf(trained.model, trained.tokenizer_json, out_dir)
    except KeyboardInterrupt as e:
        raise Interrupted(_stopped(out_dir, existed), signal_status(e)) from None


def _stopped(out_dir: str, existed: bool) -> str:
    if os.path.exists(os.path.join(out_dir, "config.json")):  # config.json is written last: the export is whole
        return f"Stopped by a signal just after the export was written whole to {out_dir}: nothing is left to do."
    if existed:
        where = f"the files it had written in {out_dir} were removed, and that folder is as it was"
    else:
        where = f"{out_dir} was not made (a new folder is built aside and renamed into place whole)"
    return f"Stopped by a signal: nothing of this export was written: {where}. Run the same command again."
