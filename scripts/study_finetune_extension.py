"""Study finetune_extension: PI vs NTK vs YaRN, each given a short fine-tune at
4 x L_train from the same RoPE checkpoint, next to the same methods zero-shot;
`none` is fine-tuned the same way as the control.

Settings and examples: python scripts/study_finetune_extension.py --help
(conf/study_finetune_extension.yaml).

Steps (each printed as the command it runs), under out= (default
outputs/studies/finetune_extension/<time>):
  base/       train.py +experiment=rope_scaling           (skipped with base=)
  zero_shot/  eval_extrapolation.py over none + the methods at 1-16 x L_train
  finetune/   train.py -m +experiment=finetune_extension init_from=<base> scaling=<methods>
  compare/    compare.py group=true over zero_shot and finetune (two groups: the fine-tuned runs record
              the fine-tuning length as their training length)
"""

from dataclasses import dataclass, field
import os

import hydra
from study_common import (
    check_overrides,
    compare_and_report,
    compare_command,
    evaluate,
    run_step,
    study_dir,
    token_budget,
    train,
)

from rope_lm.cli import hydra_task, script_settings
from rope_lm.core.errors import ConfigError


@dataclass
class FinetuneExtensionStudy:
    """conf/study_finetune_extension.yaml's settings, as plain values."""

    train: list = field(default_factory=list)
    base: str | None = None
    methods: list = field(default_factory=lambda: ["pi", "ntk", "yarn"])
    factor: int = 4
    steps: int | None = None
    out: str | None = None
    wandb: bool = False


@hydra.main(config_path="../conf", config_name="study_finetune_extension", version_base="1.3")
@hydra_task
def main(cfg):
    finetune_extension_study(script_settings(cfg, FinetuneExtensionStudy))


def finetune_extension_study(s: FinetuneExtensionStudy):
    """The study from its settings: each step runs an entry point (train.py, eval_extrapolation.py,
    compare.py) as the command it prints, so every step is resumable on its own and the study
    is what a user could have typed; callable from Python as well as from the command line."""
    from rope_lm.runs.trained import open_model

    check_overrides(s.train)
    if s.factor < 2:
        raise ConfigError(f"factor={s.factor}: the fine-tune must be longer than the base's training length (>= 2).")
    if s.steps is not None and s.steps < 1:
        raise ConfigError(f"steps={s.steps} must be at least 1.")
    out = study_dir("finetune_extension", s.out)
    base = s.base or train(os.path.join(out, "base"), "rope_scaling", s.train)

    opened = open_model(base, "cpu", setting="base")
    lit, ckpt = opened.lit, opened.path
    L, factor = lit.model.cfg.train_len, s.factor
    if lit.model.pos_scheme.family != "rotary":
        raise ConfigError(
            f"{base} holds a {lit.model.pos_scheme.name!r} model; this study fine-tunes RoPE scaling methods."
        )
    lengths = f"[{','.join(str(L * m) for m in (1, 2, 4, 8, 16))}]"
    # `none` fine-tuned too: the control that separates what a method adds from what more training at the
    # longer length alone does.
    runs = list(dict.fromkeys(["none", *s.methods]))
    budget = token_budget(base)
    evaluate(
        ckpt,
        runs,
        os.path.join(out, "zero_shot"),
        [f"eval.lengths={lengths}", f"eval.token_budget={budget}", "eval.position_buckets=128"],
    )
    # The base's model and position settings are the preset's unless overridden; init_from refuses a mismatch.
    run_step(
        f"fine-tune at {factor * L} ({', '.join(runs)})",
        [
            "train.py",
            "-m",
            "+experiment=finetune_extension",
            f"init_from={os.path.abspath(ckpt)}",
            f"scaling={','.join(runs)}",
            f"data.seq_len={factor * L}",
            f"eval.lengths={lengths}",
            f"eval.token_budget={budget}",
            f"hydra.sweep.dir={os.path.abspath(os.path.join(out, 'finetune'))}",
            *([f"trainer.max_steps={s.steps}"] if s.steps else []),
            *s.train,
        ],
    )
    data_name = (lit.hparams.get("data") or {}).get("name", "data")
    paths = [os.path.join(out, "zero_shot"), os.path.join(out, "finetune")]
    compare_and_report(
        paths,
        os.path.join(out, "compare"),
        f"finetune_extension: {', '.join(s.methods)} zero-shot vs fine-tuned at {factor * L} (base L={L})",
        group=True,
        wandb=s.wandb,
        wandb_group=f"finetune_extension-{data_name}-L{factor * L}",
    )
    print(
        f"Study: {out}/ (zero_shot/, finetune/, compare/)  —  reproduce the comparison with:  "
        f"{compare_command(paths, os.path.join(out, 'compare'), group=True)}"
    )


if __name__ == "__main__":
    main()
