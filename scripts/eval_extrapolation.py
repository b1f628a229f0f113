"""Evaluate a trained checkpoint past its training length, under one or more
extrapolation methods, into one table and one plot.

    python scripts/eval_extrapolation.py ckpt=outputs/.../checkpoints/last.ckpt
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,pi,ntk,yarn eval.multipliers=[1,2,4,8]
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=yarn scaling.factor=4 out=outputs/eval/yarn4
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,ntk,ntk+logn,rerope scaling.rerope.window=32
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,<search folder>/best.yaml   # a searched config
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,yarn eval.controls=[window]   # + the window-L control
    python scripts/eval_extrapolation.py hf=HuggingFaceTB/SmolLM-135M scaling=none,yarn data.path=<texts>

Settings use the same names as train.py: `scaling=a,b` names options of the
conf/scaling group (docs/methods.md) or YAML files of the same form (scripts/search.py's
best.yaml), all in one table; `name+logn` adds
log-n logit scaling to a method (label `name+logn`). `scaling.<key>=v` sets
<key> for every listed method whose config has it, `scaling.<name>.<key>=v`
for that method only. `eval.*` overrides conf/eval/default.yaml, `data.*` the
checkpoint's own data settings (e.g. data.test_fraction), `device=cpu|cuda|auto`,
`out=` the output folder (default: a new folder inside the checkpoint's run).
`eval.controls=[window]` also evaluates the model cut to its training length
(the window-L control) on the same windows, and records each method's PPL over
the control's with a paired interval; with `out=<a finished evaluation>
existing=continue` it evaluates only the control.
`out=<a finished evaluation> existing=continue 'rescore_units={yarn: [65536]}'`
scores those kept rows' windows again for their per-window losses alone (an
evaluation made before they were kept lacks them), so compare.py pairs them
with another evaluation of the same model on the same windows.
`data=<name>` evaluates on a conf/data corpus instead (e.g. data=pg19, with
data.path= for a local copy).

The command line is Hydra's override syntax, but this is not a @hydra.main
app: there, `scaling=a,b` would mean a sweep of separate runs, while here it
lists the rows of one table. The script composes conf/eval_extrapolation.yaml
with Hydra's compose API and reads the methods from the scaling group.
"""

import logging
import sys

from hydra import compose, initialize
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rope_lm.cli import group_config, user_errors
from rope_lm.core.errors import ConfigError

CONFIG = "eval_extrapolation"


def split_overrides(argv: list[str]) -> tuple[list[str], dict, dict, list[str]]:
    """(method names, scaling.* settings, data.* settings, the other overrides);
    data=<name> (a conf/data corpus, as train.py takes it) comes back as
    data.* settings under the key "data", which data.* settings refine."""
    try:
        overrides = OverridesParser.create().parse_overrides(argv)
    except HydraException as e:
        raise ConfigError(" ".join(str(e).split())) from None
    names, scaling, data, rest = ["none"], {}, {}, []
    for o in overrides:
        key = o.key_or_group
        if key == "scaling":
            names = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        elif key.startswith("scaling."):
            scaling[key.split(".", 1)[1]] = o.value()
        elif key == "data":
            if o.is_sweep_override():
                raise ConfigError(f"{o.input_line}: one corpus per evaluation; run the command once per corpus.")
            data = {**group_config("data", o.get_value_element_as_str()), **data}
        elif key.startswith("data."):
            data[key.split(".", 1)[1]] = o.value()
        elif o.is_sweep_override():
            raise ConfigError(f"{o.input_line}: only scaling= takes a list of values (the rows of the table).")
        else:
            rest.append(o.input_line)
    return names, scaling, data, rest


def scaling_methods(names: list[str], opts: dict) -> list[dict]:
    """One options dict per listed method, with the command line's scaling.* settings applied."""
    methods, bases = [], []
    for entry in names:
        base, plus, extra = entry.partition("+")
        if plus and extra != "logn":
            raise ConfigError(f"scaling entry {entry!r}: only `+logn` can be added to a method (e.g. ntk+logn).")
        options = _config_file(base) if base.endswith((".yaml", ".yml")) else group_config("scaling", base)
        if plus:
            options["logn"] = True
        methods.append(options)
        bases.append(base)
    for key, value in opts.items():
        head, dot, rest = key.partition(".")
        if dot and head in bases:  # scaling.<name>.<key>=v
            targets = [m for m, b in zip(methods, bases) if b == head]
            key = rest
        else:
            targets = [m for m in methods if key in m]
            if not targets:
                raise ConfigError(
                    f"scaling.{key}: none of the listed methods ({', '.join(names)}) has a setting {key!r}; "
                    f"see conf/scaling/<name>.yaml, or write scaling.<name>.{key}= for one method."
                )
        for m in targets:
            m[key] = value
    from rope_lm.scaling import method_label

    labels = [method_label(m) for m in methods]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"scaling lists {', '.join(twice)} more than once; each method appears once in the table.")
    return methods


def _config_file(path: str) -> dict:
    """A scaling config written outside conf/scaling/ (scripts/search.py's best.yaml)."""
    import yaml

    try:
        with open(path) as f:
            options = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"scaling={path}: the file cannot be read as YAML ({' '.join(str(e).split())}).") from None
    if not isinstance(options, dict) or "name" not in options:
        raise ConfigError(
            f"scaling={path} holds no scaling config: it needs a mapping with the method's `name` and "
            f"its settings, as conf/scaling/<name>.yaml has."
        )
    return options


def settings(rest: list[str]) -> dict:
    try:
        return OmegaConf.to_container(compose(config_name=CONFIG, overrides=rest), resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"{' '.join(str(e).split())} (see python scripts/eval_extrapolation.py --help).") from None


def main(argv: list[str]):
    from rope_lm.eval.report import markdown_table
    from rope_lm.runs.eval_run import evaluate_checkpoint

    with initialize(config_path="../conf", version_base="1.3", job_name=CONFIG):
        if "--help" in argv or "-h" in argv:
            print(__doc__.split("\n\nThe command line")[0])
            print("\n== Settings (defaults) ==\n\n" + OmegaConf.to_yaml(compose(config_name=CONFIG)))
            return
        names, scaling, data, rest = split_overrides(argv)
        cfg = settings(rest)
        if not cfg["ckpt"] and not cfg["hf"]:
            raise ConfigError(
                "ckpt= (a .ckpt file or a run directory with checkpoints/last.ckpt) or hf= (a "
                "transformers model folder or hub name) is required."
            )
        if cfg["ckpt"] and cfg["hf"]:
            raise ConfigError(
                f"ckpt={cfg['ckpt']!r} and hf={cfg['hf']!r} are both set; give one: ckpt= for a rope-lm "
                f"checkpoint or run folder, hf= for a transformers model (or ckpt=hf:<folder>)."
            )
        methods = scaling_methods(names, scaling)
    if cfg["existing"] not in ("refuse", "continue"):
        raise ConfigError(
            f"existing={cfg['existing']!r} is not an option; use refuse (an out= folder holding results "
            f"is refused) or continue (finish a part-way evaluation in out=)."
        )
    results = evaluate_checkpoint(
        cfg["ckpt"],
        methods,
        cfg["eval"],
        data,
        cfg["out"],
        cfg["device"],
        hf=cfg["hf"],
        existing=cfg["existing"],
        scaled_layers=cfg["scaled_layers"],
        sliding_window=cfg["sliding_window"],
        rescore_units=cfg["rescore_units"],
    )
    print("\n" + markdown_table(results))
    print(f"Results: {results['out_dir']}/ (results.json, results.md, ppl_vs_length.png)")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    with user_errors():
        main(sys.argv[1:])
