"""Study rope_scaling: train one RoPE model at a short context, evaluate every
extrapolation method that applies to it zero-shot at 1-16 x L_train, compare.
Settings and examples: python scripts/study_rope_scaling.py --help
(conf/study_rope_scaling.yaml).

Layout under out= (default outputs/studies/rope_scaling/<time>): train/ (the
train.py run, conf/experiment/rope_scaling.yaml), zero_shot/ (and
zero_shot_logn/) from scripts/eval_extrapolation.py, compare/ as
scripts/compare.py writes it. Every step prints the command it runs.
"""

from dataclasses import dataclass, field
import os

import hydra
from study_common import (
    applicable,
    check_overrides,
    compare_and_report,
    compare_command,
    evaluate,
    study_dir,
    token_budget,
    train,
)

from rope_lm.cli import group_options, hydra_task, script_settings
from rope_lm.core.errors import ConfigError


@dataclass
class RopeScalingStudy:
    """conf/study_rope_scaling.yaml's settings, as plain values."""

    train: list = field(default_factory=list)
    run: str | None = None
    methods: list | None = None
    logn: bool = False
    multipliers: list = field(default_factory=lambda: [1, 2, 4, 8, 16])
    out: str | None = None
    wandb: bool = False


@hydra.main(config_path="../conf", config_name="study_rope_scaling", version_base="1.3")
@hydra_task
def main(cfg):
    rope_scaling_study(script_settings(cfg, RopeScalingStudy))


def rope_scaling_study(s: RopeScalingStudy):
    """The study from its settings: each step runs an entry point (train.py, eval_extrapolation.py,
    compare.py) as the command it prints, so every step is resumable on its own and the study
    is what a user could have typed; callable from Python as well as from the command line."""
    from rope_lm.runs.trained import open_model

    check_overrides(s.train)
    if s.run and s.train:
        raise ConfigError("Training overrides do nothing with run= (the model is already trained); leave train= out.")
    out = study_dir("rope_scaling", s.out)
    run = s.run or train(os.path.join(out, "train"), "rope_scaling", s.train)

    opened = open_model(run, "cpu", setting="run")
    lit, ckpt = opened.lit, opened.path
    scheme = lit.model.pos_scheme
    if scheme.family != "rotary":
        raise ConfigError(
            f"{run} holds a {scheme.name!r} model (family {scheme.family!r}); this study is about RoPE scaling methods."
        )
    asked = s.methods or group_options("scaling")
    methods, skipped = applicable(scheme, sorted(asked, key=lambda n: n != "none"))  # the baseline first
    for note in skipped:
        print(f"skipping {note}")
    if not methods:
        raise ConfigError(f"None of the methods {', '.join(asked)} applies to {scheme.name!r}.")
    multipliers = f"[{','.join(str(m) for m in s.multipliers)}]"
    settings = [
        f"eval.multipliers={multipliers}",
        f"eval.token_budget={token_budget(run)}",
        "eval.position_buckets=128",
    ]
    evaluate(ckpt, methods, os.path.join(out, "zero_shot"), settings)
    paths = [os.path.join(out, "zero_shot")]
    with_logn = [m for m in methods if m not in ("none", "logn")]
    if s.logn and with_logn:
        evaluate(ckpt, with_logn, os.path.join(out, "zero_shot_logn"), settings + ["scaling.logn=true"])
        paths.append(os.path.join(out, "zero_shot_logn"))
    L = lit.model.cfg.train_len
    group = f"rope_scaling-{(lit.hparams.get('data') or {}).get('name', 'data')}-L{L}"
    compare_and_report(
        paths,
        os.path.join(out, "compare"),
        f"rope_scaling: zero-shot methods on {scheme.name}, L_train={L}",
        group=False,
        wandb=s.wandb,
        wandb_group=group,
    )
    print(
        f"Study: {out}/ (train/, zero_shot/, compare/)  —  reproduce the comparison with:  "
        f"{compare_command(paths, os.path.join(out, 'compare'), group=False)}"
    )


if __name__ == "__main__":
    main()
