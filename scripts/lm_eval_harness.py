"""lm-evaluation-harness with rope-lm's model registered: lm-eval's own
command line (the same arguments as `lm_eval`), where `--model rope-lm`
evaluates a rope-lm checkpoint or an imported model under any extrapolation
method.

    python scripts/lm_eval_harness.py --model rope-lm --tasks <task> [--include_path <task folder>] \\
        --model_args ckpt=<run folder or hf:...>,scaling=yarn,scaling.factor=4,max_length=512

lm-eval 0.4 finds only the models of its own package, so a bare
`lm_eval --model rope-lm` cannot see this one: this script imports the model
(rope_lm/probes/lm_eval_model.py), gives it the scaling config group of conf/ for
`scaling=<method>` and `scaling.<key>=<value>`, and runs lm-eval's CLI.

A stop (SIGTERM, Ctrl-C) ends with exit status 143 or 130 and one paragraph:
lm-eval keeps no partial results (but what its --use_cache and
--cache_requests caches hold, which it names) and the command to run again.
"""

import re
import sys

from hydra import compose, initialize
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rope_lm.cli import group_config, group_options, log_to_stderr, user_errors
from rope_lm.core.errors import ConfigError
from rope_lm.core.stops import signals_stop

CONFIG = "lm_eval_harness"


def _override_value(value) -> str:
    """A model_args value (lm-eval has already read `4` as 4, `true` as True) as Hydra override text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[\w.+\-/:]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose_scaling(name: str, settings: dict) -> dict:
    """The options `scaling=<name> scaling.<key>=<value>...` select, composed
    from the scaling group as the other scripts compose them."""
    methods = group_options("scaling")
    if name not in methods:
        raise ConfigError(
            f"scaling={name!r} is not an extrapolation method of rope-lm; valid values are "
            f"{', '.join(methods)} (docs/methods.md)."
        )
    keys = [k for k in group_config("scaling", name) if k != "name"]
    unknown = sorted(set(settings) - set(keys))
    if unknown:
        raise ConfigError(
            f"scaling={name} has no setting {', '.join('scaling.' + k for k in unknown)}; it takes "
            f"{', '.join('scaling.' + k for k in keys) or 'no settings'}."
        )
    overrides = [f"scaling={name}"] + [f"scaling.{k}={_override_value(v)}" for k, v in settings.items()]
    try:
        cfg = compose(config_name=CONFIG, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"{' '.join(str(e).split())} (model_args {','.join(overrides)}).") from None
    return OmegaConf.to_container(cfg.scaling, resolve=True)


def main():
    from lm_eval.__main__ import cli_evaluate

    from rope_lm.probes.lm_eval_model import (  # first: without lm-eval, it says how to install it
        RopeLM,
        lm_eval_stopped,
    )

    log_to_stderr()
    with initialize(config_path="../conf", version_base="1.3", job_name=CONFIG):
        RopeLM.compose_scaling = staticmethod(compose_scaling)
        argv = sys.argv[1:]  # as given: lm-eval's command line rewrites sys.argv
        try:
            with signals_stop():
                cli_evaluate()
        except KeyboardInterrupt as e:
            raise lm_eval_stopped(argv, e) from None


if __name__ == "__main__":
    with user_errors():
        main()
