"""RoPE's long-range decay (RoFormer, section 3.4.3): the relative upper bound
(1/(d/2)) sum_j |S_j|, S_j = sum_{k<j} exp(i m theta_k), vs relative distance m.
Settings and examples: python scripts/rope_decay.py --help (conf/rope_decay.yaml).

With ckpt=, the checkpoint's own frequencies are added (under its method, or
scaling=, at length=). Writes rope_decay.png and .json to out= (default: a new
outputs/diagnostics/rope_decay, or <run dir>/diagnostics/rope_decay).
"""

import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task
from rope_lm.core.errors import ConfigError


@hydra.main(config_path="../conf", config_name="rope_decay", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    a = OmegaConf.to_container(cfg, resolve=True)
    max_distance = a["max_distance"]
    if max_distance < 1:
        raise ConfigError(f"max_distance={max_distance} must be at least 1.")
    if (a.get("scaling") or a["length"]) and not a["ckpt"]:
        raise ConfigError("scaling= and length= apply to a checkpoint's frequencies; give ckpt= too.")
    distances = torch.arange(max_distance + 1)
    curves, train_len = [], None
    for base in a["bases"]:
        for d in a["head_dims"]:
            bound = D.rope_decay_bound(D.rope_inv_freq(d, base), distances)
            curves.append(
                {
                    "label": f"base {base:g}, d={d}",
                    "base": base,
                    "head_dim": d,
                    "bound_at_0": float(bound[0]),
                    "distances": distances.tolist(),
                    "bound": bound.tolist(),
                }
            )
    ckpt = None
    if a["ckpt"]:
        trained = open_model(a["ckpt"], "cpu", a.get("scaling"))
        model, train_len, ckpt = trained.model, trained.train_len, trained.path
        inv_freq, factor, label = D.checkpoint_rope_frequencies(model, a["length"] or max_distance)
        # cos and sin carry the attention factor, so the score (and its bound) scales by factor^2
        bound = D.rope_decay_bound(inv_freq, distances) * factor**2
        curves.append(
            {
                "label": label,
                "head_dim": 2 * inv_freq.numel(),
                "attention_factor": factor,
                "bound_at_0": float(bound[0]),
                "distances": distances.tolist(),
                "bound": bound.tolist(),
            }
        )
    if not curves:
        raise ConfigError("Nothing to plot: give bases= and head_dims=, or ckpt=.")
    D.output_dir(a["out"], ckpt, "rope_decay")
    out = D.make_output_dir(a["out"], ckpt, "rope_decay")
    D.save_json(
        os.path.join(out, "rope_decay.json"), {"max_distance": max_distance, "train_len": train_len, "curves": curves}
    )
    D.plot_rope_decay(curves, os.path.join(out, "rope_decay.png"), train_len)
    near = min(256, max_distance)
    for c in curves:
        b = c["bound"]
        print(f"{c['label']:<50} m=0: {b[0]:.2f}  m={near}: {b[near]:.2f}  m={max_distance}: {b[-1]:.2f}")
    print(f"RoPE decay: {out}/ (rope_decay.png, rope_decay.json)")


if __name__ == "__main__":
    main()
