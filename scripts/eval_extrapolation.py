"""Evaluate a trained checkpoint past its training length, under one or more
extrapolation methods, into one table and one plot.

    python scripts/eval_extrapolation.py ckpt=outputs/.../checkpoints/last.ckpt
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,pi,ntk,yarn eval.multipliers=[1,2,4,8]
    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=yarn scaling.factor=4 out=outputs/eval/yarn4

    python scripts/eval_extrapolation.py ckpt=<run dir> scaling=none,ntk,ntk+logn,rerope scaling.rerope.window=32

Settings use the same names as train.py: `scaling=a,b` names files of
conf/scaling/ (docs/methods.md); `name+logn` adds log-n logit scaling to a
method (label `name+logn`). `scaling.<key>=v` sets <key> for every listed
method whose config has it, `scaling.<name>.<key>=v` for that method only.
`eval.*` overrides conf/eval/default.yaml, `data.*` the checkpoint's own data
settings (e.g. data.test_fraction), `device=cpu|cuda|auto`, `out=` the output
folder.
"""

import logging
import os
import sys

from omegaconf import OmegaConf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rope_lm.cli import user_errors  # noqa: E402
from rope_lm.errors import ConfigError  # noqa: E402

CONF = os.path.join(ROOT, "conf")


def load_group(group: str, name: str) -> dict:
    path = os.path.join(CONF, group, f"{name}.yaml")
    if not os.path.exists(path):
        options = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, group)) if f.endswith(".yaml"))
        raise ConfigError(f"{group}={name!r} is not a config in conf/{group}/; valid options are {', '.join(options)}.")
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    cfg.pop("defaults", None)
    return cfg


def parse(argv: list[str]) -> dict:
    args = {"hf": None, "ckpt": None, "scaling": ["none"], "scaling_opts": {}, "eval": {}, "data": {}, "out": None, "device": "auto"}
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(f"Argument {arg!r} is not of the form key=value; see the usage at the top of scripts/eval_extrapolation.py.")
        key, value = arg.split("=", 1)
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
        if key == "scaling":
            args["scaling"] = [v.strip() for v in str(value).split(",") if v.strip()]
        elif key.startswith("scaling."):
            args["scaling_opts"][key.split(".", 1)[1]] = parsed
        elif key.startswith(("eval.", "data.")):
            group, sub = key.split(".", 1)
            args[group][sub] = parsed
        elif key in ("ckpt", "out", "device", "hf"):
            args[key] = value
        else:
            raise ConfigError(f"Unknown setting {key!r}; use ckpt=, scaling=, scaling.<key>=, eval.<key>=, data.<key>=, out= or device=.")
    if not args["ckpt"] and not args["hf"]:
        raise ConfigError("ckpt= is required: a .ckpt file or a run directory with checkpoints/last.ckpt.")
    return args


def scaling_methods(names: list[str], opts: dict) -> list[dict]:
    """One options dict per listed method, with the command line's scaling.* settings applied."""
    methods, bases = [], []
    for entry in names:
        base, plus, extra = entry.partition("+")
        if plus and extra != "logn":
            raise ConfigError(f"scaling entry {entry!r}: only `+logn` can be added to a method (e.g. ntk+logn).")
        options = load_group("scaling", base)
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
    from rope_lm.pipeline import method_label

    labels = [method_label(m) for m in methods]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ConfigError(f"scaling lists {', '.join(twice)} more than once; each method appears once in the table.")
    return methods


def main(argv: list[str]):
    from rope_lm.pipeline import evaluate_checkpoint
    from rope_lm.report import RESULTS_MD

    args = parse(argv)
    methods = scaling_methods(args["scaling"], args["scaling_opts"])
    eval_options = {**load_group("eval", "default"), **args["eval"]}
    results = evaluate_checkpoint(args["ckpt"], methods, eval_options, args["data"], args["out"], args["device"],
                                  hf=args["hf"])
    out = results["out_dir"]
    print("\n" + open(os.path.join(out, RESULTS_MD)).read())
    print(f"Results: {out}/ (results.json, results.md, ppl_vs_length.png)")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    with user_errors():
        main(sys.argv[1:])
