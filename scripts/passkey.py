"""Passkey retrieval accuracy by context length x key depth for a checkpoint.
Settings and examples: python scripts/passkey.py --help (conf/passkey.yaml).

A deterministic prompt per (seed, length, depth, sample): filler text with a
5-digit key at the depth, then "What is the pass key?"; greedy decoding, the
first digits of the answer must equal the key. Train with data=passkey for a
model that can do it at all. Writes passkey.png and passkey.json to out=
(default: a new <run dir>/diagnostics/passkey[_<scaling>], made once the
settings and the model are checked).
"""

import logging
import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr
from rope_lm.core.errors import ConfigError

log = logging.getLogger("rope_lm")


@hydra.main(config_path="../conf", config_name="passkey", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.probes import passkey as P
    from rope_lm.runs.trained import open_model

    log_to_stderr()
    a = OmegaConf.to_container(cfg, resolve=True)
    if a["batch_size"] < 1:
        raise ConfigError(f"batch_size={a['batch_size']} must be at least 1.")

    scaling = a.get("scaling")
    trained = open_model(a["ckpt"], a["device"], scaling)
    model, train_len = trained.model, trained.train_len
    lengths = D.lengths_for(train_len, a["lengths"], a["multipliers"])
    tokenizer = trained.tokenizer()
    shortest = P.min_length(tokenizer, a["instructions"])
    if min(lengths) < shortest:
        raise ConfigError(
            f"Passkey length {min(lengths)} is shorter than the template needs ({shortest} tokens with this "
            f"tokenizer{', instructions included' if a['instructions'] else ''}); give longer lengths= or multipliers=."
        )
    D.output_dir(a["out"], trained.path, "passkey", scaling)

    def report(cell):
        log.info(
            "passkey length %d depth %g: accuracy %.0f%% (token accuracy %.0f%%)",
            cell["length"],
            cell["depth"],
            100 * cell["accuracy"],
            100 * cell["token_accuracy"],
        )

    result = P.evaluate_passkey(
        model,
        tokenizer,
        lengths,
        a["depths"],
        a["samples"],
        a["seed"],
        a["instructions"],
        a["batch_size"],
        on_cell=report,
    )
    method = getattr(model.scaling, "label", model.scaling.name)
    result.update(
        checkpoint=from_here(trained.path),
        source=trained.source,
        scheme=trained.scheme,
        method=method,
        train_len=train_len,
    )
    out = D.make_output_dir(a["out"], trained.path, "passkey", scaling)
    D.save_json(os.path.join(out, "passkey.json"), result)
    P.plot_passkey(
        result,
        os.path.join(out, "passkey.png"),
        train_len,
        f"Passkey accuracy — {trained.scheme} + {method}, trained at {train_len} ({a['samples']} per cell)",
    )
    print("depth \\ length " + " ".join(f"{L:>7}" for L in lengths))
    for j, d in enumerate(a["depths"]):
        print(f"{d:>14g} " + " ".join(f"{result['accuracy'][i][j]:>7.0%}" for i in range(len(lengths))))
    print(f"Passkey: {out}/ (passkey.png, passkey.json)")


if __name__ == "__main__":
    main()
