"""Print what a model writes after a prompt (or a file's text), greedy or
sampled, under any extrapolation method: a way to read a model past its
training length. Settings and examples: python scripts/generate.py --help
(conf/generate.yaml).

The text goes to standard output, one block per prompt: the prompt's end,
then what the model wrote and why it stopped; progress lines go to standard
error. With out=, the generations are also written as JSON.
"""

import hydra

from rope_lm.cli import hydra_task, log_to_stderr, script_settings


@hydra.main(config_path="../conf", config_name="generate", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.generate_run import GenerateSettings, generate_from

    log_to_stderr()
    generate_from(script_settings(cfg, GenerateSettings))


if __name__ == "__main__":
    main()
