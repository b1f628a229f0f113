"""Train a decoder-only LM at a short context, then evaluate it far past it.

    python train.py                          # defaults: RoPE, tiny model, stdlib corpus
    python train.py pos=alibi data.seq_len=256
    python train.py -m pos=rope,alibi        # a sweep (Hydra multirun)
    python train.py resume=outputs/<run>     # continue a stopped run from its last checkpoint
    python train.py resume=outputs/<run> trainer.max_steps=5000   # ... or train a finished one longer

Configuration lives in conf/; see README.md.
"""

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, register_resolvers, user_errors


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.runs.pipeline import train_in_folder

    hc = HydraConfig.get()
    out_dir = hc.runtime.output_dir
    return train_in_folder(OmegaConf.to_container(cfg, resolve=True), out_dir, os.path.relpath(out_dir, hc.runtime.cwd))


def resume_args(argv: list[str]) -> list[str]:
    """`resume=<run dir>` -> that run's saved config, its last checkpoint and
    its directory; other overrides (e.g. trainer.max_steps=...) still apply."""
    runs = [a.split("=", 1)[1] for a in argv if a.startswith("resume=")]
    if not runs:
        return argv
    run = os.path.abspath(runs[-1])
    from rope_lm.runs.run_folder import RUN_CONFIG

    saved = os.path.join(run, RUN_CONFIG)
    if not os.path.isfile(saved):  # a run stopped before its end, or one from an older version
        saved = os.path.join(run, ".hydra", "config.yaml")
    if not os.path.isfile(saved):
        with user_errors():
            from rope_lm.core.errors import ConfigError

            raise ConfigError(
                f"resume={runs[-1]!r} is not a run directory: {saved} does not exist. Give the folder a "
                f"train.py run wrote (it holds .hydra/ and checkpoints/)."
            )
    _check_readable(saved, runs[-1])
    rest = [a for a in argv if not a.startswith("resume=")]
    with user_errors():
        _refuse_group_choices(rest, runs[-1], saved)
    # ckpt_path= given too picks another checkpoint of the run (e.g. checkpoints/best.ckpt when last.ckpt is damaged).
    ckpt = [] if any(a.startswith("ckpt_path=") for a in rest) else [f"ckpt_path={run}"]
    return [
        "--config-path",
        os.path.dirname(saved),
        "--config-name",
        os.path.basename(saved)[: -len(".yaml")],
        *rest,
        *ckpt,
        f"hydra.run.dir={run}",
    ]


def _check_readable(saved: str, given: str) -> None:
    """A run.yaml that is not a YAML mapping (edited by hand, or cut short) is named here, before Hydra
    reads it and fails with a traceback."""
    import yaml

    try:
        with open(saved) as f:
            ok = isinstance(yaml.safe_load(f), dict)
        problem = "it does not hold a mapping of settings"
    except (OSError, yaml.YAMLError) as e:
        ok, problem = False, (str(e).splitlines() or [type(e).__name__])[0]
    if not ok:
        with user_errors():
            from rope_lm.core.errors import ConfigError

            raise ConfigError(
                f"resume={given!r}: the run's recorded settings {saved} cannot be read ({problem}). "
                f"Restore the file (the run's .hydra/config.yaml holds the settings it started with)."
            )


def _refuse_group_choices(overrides: list[str], given: str, saved: str):
    """A resumed run is composed from its saved settings, where `pos`, `model`,
    ... hold values, not a choice of conf/<group>/: `pos=alibi` cannot apply
    there, and a run's scheme and architecture are fixed by its weights."""
    from rope_lm.core.errors import ConfigError

    groups = {
        d
        for d in os.listdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf"))
        if os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf", d))
    }
    for arg in overrides:
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        group = key.split(".")[0]
        if not value or (key not in groups and key not in ("pos.name", "model.name")) or group == "hydra":
            continue
        if group in ("pos", "model"):
            what = "positional scheme" if group == "pos" else "model architecture"
            raise ConfigError(
                f"resume={given!r} continues a run with the {what} it was trained with ({saved} records it), so "
                f"{arg} cannot apply. To train with it, start a new run (python train.py {group}={value} ...); a "
                f"fine-tune from this run's weights (init_from={given}) also keeps its {what}."
            )
        raise ConfigError(
            f"resume={given!r} composes the run from its saved settings ({saved}), where `{key}` is a set of "
            f"settings, not a choice of conf/{key}/, so {arg} cannot apply. Change single settings instead "
            f"(e.g. {key}.<setting>=...), or start a new run with {arg}."
        )


def other_rank_args(argv: list[str]) -> list[str]:
    """A process other than global rank 0 of a torchrun or srun job shares rank 0's run folder
    (rope_lm/train/distributed.py) and leaves Hydra's copy of the settings (.hydra/) to rank 0, as
    Lightning does for the processes it starts itself."""
    rank = os.environ.get("RANK") if os.environ.get("TORCHELASTIC_RUN_ID") else os.environ.get("SLURM_PROCID")
    return [*argv, "hydra.output_subdir=null"] if rank not in (None, "", "0") else argv


if __name__ == "__main__":
    register_resolvers()
    sys.argv[1:] = other_rank_args(resume_args(sys.argv[1:]))
    main()
