"""Passkey retrieval accuracy by context length x key depth for a checkpoint.
Settings and examples: python scripts/passkey.py --help (conf/passkey.yaml).

A deterministic prompt per (seed, length, depth, sample): filler text with a
5-digit key at the depth, then "What is the pass key?"; greedy decoding, the
first digits of the answer must equal the key. Train with data=passkey for a
model that can do it at all. Writes passkey.png and passkey.json to out=
(default: a new <run dir>/diagnostics/passkey[_<scaling>], made once the
settings and the model are checked).
"""

import hydra

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="passkey", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.diagnostic_runs import PasskeySettings, passkey

    log_to_stderr()
    passkey(script_settings(cfg, PasskeySettings))


if __name__ == "__main__":
    main()
