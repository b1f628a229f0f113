"""Study finetune_extension: PI vs NTK vs YaRN, each given a short fine-tune at
4 x L_train from the same RoPE checkpoint, next to the same methods zero-shot;
`none` is fine-tuned the same way as the control.

    python scripts/study_finetune_extension.py                            # base model + everything (~6 min, idle 2-core CPU)
    python scripts/study_finetune_extension.py --base outputs/studies/rope_scaling/<time>/train
    python scripts/study_finetune_extension.py --steps 300 --methods pi yarn
    python scripts/study_finetune_extension.py data=wikitext2 data.path=../shared/data/wikitext-2

Steps (each printed as the command it runs), under --out (default
outputs/studies/finetune_extension/<time>):
  base/       train.py +experiment=rope_scaling           (skipped with --base)
  zero_shot/  eval_extrapolation.py over none + the methods at 1-16 x L_train
  finetune/   train.py -m +experiment=finetune_extension init_from=<base> scaling=<methods>
  compare/    compare.py --group zero_shot finetune       (two groups: the fine-tuned runs record
              the fine-tuning length as their training length)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study_common import (  # noqa: E402
    check_overrides, checkpoint, compare_and_report, evaluate, run_step, study_dir, token_budget, train)

from rope_lm.cli import user_errors  # noqa: E402
from rope_lm.errors import ConfigError  # noqa: E402

METHODS = ("pi", "ntk", "yarn")


def main(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="train.py overrides for both training stages (e.g. data=...)")
    p.add_argument("--base", help="an existing RoPE run directory (or .ckpt) to start from instead of training one")
    p.add_argument("--methods", nargs="+", default=list(METHODS), help="conf/scaling methods to fine-tune with (default pi ntk yarn)")
    p.add_argument("--factor", type=int, default=4, help="fine-tuning length as a multiple of the base's L (default 4)")
    p.add_argument("--steps", type=int, help="fine-tuning steps (default: the preset's 150)")
    p.add_argument("--out", help="study directory (default outputs/studies/finetune_extension/<time>)")
    p.add_argument("--wandb", action="store_true", help="log the comparison as one wandb summary run")
    args = p.parse_args(argv)
    check_overrides(args.overrides)
    if args.factor < 2:
        raise ConfigError(f"--factor={args.factor}: the fine-tune must be longer than the base's training length (>= 2).")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps={args.steps} must be at least 1.")
    out = study_dir("finetune_extension", args.out)
    os.makedirs(out, exist_ok=True)
    base = args.base or train(os.path.join(out, "base"), "rope_scaling", args.overrides)

    lit, ckpt = checkpoint(base)
    L = lit.model.cfg.train_len
    if lit.model.pos_scheme.family != "rotary":
        raise ConfigError(f"{base} holds a {lit.model.pos_scheme.name!r} model; this study fine-tunes RoPE scaling methods.")
    lengths = f"[{','.join(str(L * m) for m in (1, 2, 4, 8, 16))}]"
    # `none` fine-tuned too: the control that separates what a method adds from what more training at the
    # longer length alone does.
    runs = list(dict.fromkeys(["none", *args.methods]))
    budget = token_budget(base)
    evaluate(ckpt, runs, os.path.join(out, "zero_shot"),
             [f"eval.lengths={lengths}", f"eval.token_budget={budget}", "eval.position_buckets=128"])
    # The base's model and position settings are the preset's unless overridden; init_from refuses a mismatch.
    run_step(f"fine-tune at {args.factor * L} ({', '.join(runs)})",
             ["train.py", "-m", "+experiment=finetune_extension", f"init_from={os.path.abspath(ckpt)}",
              f"scaling={','.join(runs)}", f"data.seq_len={args.factor * L}", f"eval.lengths={lengths}",
              f"eval.token_budget={budget}", f"hydra.sweep.dir={os.path.abspath(os.path.join(out, 'finetune'))}",
              *([f"trainer.max_steps={args.steps}"] if args.steps else []), *args.overrides])
    data_name = (lit.hparams.get("data") or {}).get("name", "data")
    compare_and_report([os.path.join(out, "zero_shot"), os.path.join(out, "finetune")], os.path.join(out, "compare"),
                       f"finetune_extension: {', '.join(args.methods)} zero-shot vs fine-tuned at {args.factor * L} (base L={L})",
                       group=True, wandb=args.wandb, wandb_group=f"finetune_extension-{data_name}-L{args.factor * L}")
    print(f"Study: {out}/ (zero_shot/, finetune/, compare/)  —  reproduce the comparison with:  python scripts/compare.py "
          f"{os.path.join(out, 'zero_shot')} {os.path.join(out, 'finetune')} --group --out {os.path.join(out, 'compare')}")


if __name__ == "__main__":
    with user_errors():
        main(sys.argv[1:])
