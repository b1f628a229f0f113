"""Command line of the benchmark (benchmarks/throughput.py): settings from
conf/bench.yaml, the train.py defaults it shares (data sizes, optimizer,
trainer) composed from conf/ through Hydra. Usage: python benchmarks/bench.py --help.
"""

import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import group_config, group_options, hydra_task
from rope_lm.core.errors import ConfigError

CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")


def _preset(group: str, name: str, required: bool) -> dict:
    """A conf/<group> option or a YAML file; a name with neither is a scheme
    known to the registry only (e.g. one an `imports` module adds)."""
    if name.endswith((".yaml", ".yml")):
        if not os.path.isfile(name):
            raise ConfigError(
                f"{name} does not exist; give a {group} name ({', '.join(group_options(group))}) or a YAML file."
            )
        return OmegaConf.to_container(OmegaConf.load(name), resolve=True)
    if required or name in group_options(group):
        return group_config(group, name)
    return {"name": name}


def _layouts(names: list[str], schemes: dict[str, dict]) -> dict[str, dict]:
    """Per conf/layout preset (or YAML file), a row `<rope scheme>+<layout>`:
    the run's plain RoPE settings with that model.layout, timed beside them."""
    from bench_analysis import plain_rope

    rope = next((cfg for cfg in schemes.values() if plain_rope(cfg)), None)
    if names and rope is None:
        raise ConfigError(f"layouts={names} are timed against a RoPE row; add rope to schemes.")
    rows = {}
    for name in names:
        path = name if name.endswith((".yaml", ".yml")) else os.path.join(CONF, "layout", f"{name}.yaml")
        if not os.path.isfile(path):
            raise ConfigError(
                f"layouts: {name!r} is neither a conf/layout preset "
                f"({', '.join(sorted(f[:-5] for f in os.listdir(os.path.join(CONF, 'layout'))))}) "
                f"nor a YAML file."
            )
        rows[f"rope+{_label(name)}"] = {**rope, "layout": OmegaConf.to_container(OmegaConf.load(path), resolve=True)}
    return rows


def _label(name: str) -> str:
    return os.path.splitext(os.path.basename(name))[0]


@hydra.main(config_path="../conf", config_name="bench", version_base="1.3")
@hydra_task
def main(cfg):
    from bench_analysis import targets_text
    from throughput import BenchSettings, run
    import torch

    a = OmegaConf.to_container(cfg, resolve=True)
    train = OmegaConf.to_container(hydra.compose(config_name="config"), resolve=True)
    data = train["data"]
    device = ("cuda" if torch.cuda.is_available() else "cpu") if a["device"] == "auto" else a["device"]
    schemes = {_label(n): _preset("pos", n, False) for n in a["schemes"]}
    schemes.update(_layouts(list(a["layouts"]), schemes))
    settings = BenchSettings(
        models={_label(n): _preset("model", n, True) for n in a["models"]},
        schemes=schemes,
        optim=train["optim"],
        trainer=train["trainer"],
        vocab_size=a["vocab_size"] or data["vocab_size"],
        seq_len=a["seq_len"] or data["seq_len"],
        batch_size=a["batch_size"] or data["batch_size"],
        warmup=a["warmup"],
        steps=a["steps"],
        repeats=a["repeats"],
        eval_lengths=list(a["eval_lengths"]),
        eval_batch=a["eval_batch"],
        eval_repeats=a["eval_repeats"],
        eval_rounds=a["eval_rounds"],
        spread_limit=a["spread_limit"],
        peers=list(a["peers"]),
        hf_mlp=a["hf_mlp"],
        compile=a["compile"],
        device=device,
        threads=a["threads"],
        peak_tflops=a["peak_tflops"],
        seed=a["seed"],
        imports=list(a["imports"]),
    )
    results = run(settings, out=a["out"])
    m = results["machine"]
    print(
        f"\n{m['cpu']} ({m['nproc']} CPUs, {m['threads']} threads){' / ' + m['gpu'] if 'gpu' in m else ''}, "
        f"torch {m['torch']}, transformers {m['transformers']}, lightning {m['lightning']}; "
        f"load average before {results['load_average']['before']}, after {results['load_average']['after']}\n"
    )
    print(results["table"])
    print(
        f"\nComparisons ({settings.repeats} training and {settings.eval_rounds} evaluation round(s), alternated; "
        f"median (min-max, spread) of each side, then the ratio of medians, read only where both spreads are "
        f"within {100 * settings.spread_limit:.0f}%):\n"
    )
    print("\n".join(r["line"] for r in results["ratios"]))
    print("\nTargets ([?]: spread too wide to read a ratio):\n" + targets_text(results["targets"]))
    if a["out"]:
        print(f"\nwrote {a['out']}")


if __name__ == "__main__":
    main()
