"""The bootstrap units of an evaluation's rows (rope_lm.eval.bootstrap.Units: per-window or per-document loss
sums), kept beside results.json as eval_units.npz, so that a later sitting pairs new rows with rows an
earlier one measured (a relative PPL's interval against the training length, a ratio to a control) without
scoring those windows again. results.json keeps the numbers; this file only what pairing them needs."""

import json
import logging
import os

import numpy as np

from rope_lm.core.files import replaced_atomically
from rope_lm.eval.bootstrap import Units

log = logging.getLogger("rope_lm")
UNITS_NPZ = "eval_units.npz"
_ARRAYS = ("keys", "loss", "count", "loss_beyond", "count_beyond", "ends")


def save_units(path: str, units: dict) -> None:
    """units: label -> length -> Units, written whole (replaced atomically)."""
    index, arrays = [], {}
    for label, by_length in units.items():
        for length, u in by_length.items():
            i = len(index)
            index.append({"label": label, "length": int(length), "kind": u.kind})
            for name in _ARRAYS:
                value = getattr(u, name)
                if value is not None:
                    arrays[f"{i}:{name}"] = np.asarray(value)
    with replaced_atomically(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, index=np.array(json.dumps(index)), **arrays)


def load_units(path: str) -> dict:
    """label -> length -> Units from a file save_units wrote; {} when there is none or it cannot be read (the
    windows are then scored again where a pair needs them)."""
    if not os.path.exists(path):
        return {}
    try:
        with np.load(path, allow_pickle=False) as f:
            out: dict = {}
            for i, entry in enumerate(json.loads(str(f["index"]))):
                parts = {name: f[f"{i}:{name}"].copy() for name in _ARRAYS if f"{i}:{name}" in f}
                parts.setdefault("ends", None)  # documents have none
                out.setdefault(entry["label"], {})[entry["length"]] = Units(entry["kind"], **parts)
            return out
    except (OSError, ValueError, KeyError) as e:
        log.warning("%s cannot be read (%s); the windows it held are scored again where needed.", path, e)
        return {}
