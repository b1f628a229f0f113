"""RoPE's long-range decay (RoFormer, section 3.4.3): the relative upper bound
(1/(d/2)) sum_j |S_j|, S_j = sum_{k<j} exp(i m theta_k), vs relative distance m.
Settings and examples: python scripts/rope_decay.py --help (conf/rope_decay.yaml).

With ckpt=, the checkpoint's own frequencies are added (under its method, or
scaling=, at length=). Writes rope_decay.png and .json to out= (default: a new
outputs/diagnostics/rope_decay, or <run dir>/diagnostics/rope_decay).
"""

import hydra

from rope_lm.cli import hydra_task, script_settings


@hydra.main(config_path="../conf", config_name="rope_decay", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.probes.diagnostic_runs import RopeDecaySettings, rope_decay

    rope_decay(script_settings(cfg, RopeDecaySettings))


if __name__ == "__main__":
    main()
