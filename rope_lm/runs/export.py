"""A trained run exported as a transformers folder (scripts/export_hf.py):
the model opened through the one front door, then written by rope_lm.hf.export."""

from rope_lm.hf.export import export_hf, refuse_model_folder
from rope_lm.runs.run_folder import check_writable
from rope_lm.runs.trained import open_model


def export_checkpoint(ckpt: str, out_dir: str) -> dict:
    """export_hf for a rope-lm checkpoint (.ckpt or run directory), with the
    tokenizer stored in it; the folder is checked (no model in it, a place
    that can be written) before the model is read."""
    refuse_model_folder(out_dir)
    check_writable(out_dir, "out=")
    trained = open_model(ckpt, "cpu")
    return export_hf(trained.model, trained.tokenizer_json, out_dir)
