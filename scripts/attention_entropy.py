"""Attention entropy per layer and head vs query position, inside and past the
training length, for a trained checkpoint. Settings and examples:
python scripts/attention_entropy.py --help (conf/attention_entropy.yaml).

Windows of `length` tokens come from the checkpoint's own corpus split
(tokenized with its tokenizer). Writes attention_entropy.png and .json to out=
(default: a new <run dir>/diagnostics/attention_entropy[_<scaling>]).
"""

import hydra

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="attention_entropy", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.diagnostic_runs import AttentionEntropySettings, attention_entropy

    log_to_stderr()
    attention_entropy(script_settings(cfg, AttentionEntropySettings))


if __name__ == "__main__":
    main()
