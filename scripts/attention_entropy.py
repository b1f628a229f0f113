"""Attention entropy per layer and head vs query position, inside and past the
training length, for a trained checkpoint. Settings and examples:
python scripts/attention_entropy.py --help (conf/attention_entropy.yaml).

Windows of `length` tokens come from the checkpoint's own corpus split
(tokenized with its tokenizer). Writes attention_entropy.png and .json to out=
(default: a new <run dir>/diagnostics/attention_entropy[_<scaling>]).
"""

import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task, log_to_stderr
from rope_lm.core.errors import ConfigError


@hydra.main(config_path="../conf", config_name="attention_entropy", version_base="1.3")
@hydra_task
def main(cfg):
    import torch

    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    log_to_stderr()
    a = OmegaConf.to_container(cfg, resolve=True)
    if a["windows"] < 1 or a["buckets"] < 1 or (a["length"] is not None and a["length"] < 2):
        raise ConfigError("windows= and buckets= must be positive and length= at least 2.")

    scaling = a.get("scaling")
    trained = open_model(a["ckpt"], a["device"], scaling)
    model, train_len = trained.model, trained.train_len
    T = a["length"] or 4 * train_len
    model.validate_length(T)
    D.output_dir(a["out"], trained.path, "attention_entropy", scaling)
    stream = D.checkpoint_tokens(trained, a["split"])
    n = a["windows"]
    need = n * T + 1
    if len(stream) < need:
        raise ConfigError(
            f"The {a['split']} split has {len(stream)} tokens, fewer than {n} windows of {T} need ({need}); lower windows= or length=."
        )
    windows = torch.from_numpy(stream[: n * T].astype("int64")).view(n, T)
    result = D.attention_entropy(model, windows, train_len, buckets=a["buckets"])
    method = getattr(model.scaling, "label", model.scaling.name)
    result.update(
        checkpoint=from_here(trained.path),
        source=trained.source,
        scheme=trained.scheme,
        method=method,
        split=a["split"],
    )
    out = D.make_output_dir(a["out"], trained.path, "attention_entropy", scaling)
    D.save_json(os.path.join(out, "attention_entropy.json"), result)
    D.plot_entropy(
        result,
        os.path.join(out, "attention_entropy.png"),
        f"Attention entropy vs query position — {trained.scheme} + {method}, trained at {train_len}, windows of {T}",
    )
    print(f"{'layer':>5} {'within L_train':>15} {'past L_train':>13} {'norm. within':>13} {'norm. past':>11}")
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for l in result["layers"]:
        print(
            f"{l['layer']:>5} {fmt(l['mean_within']):>15} {fmt(l['mean_beyond']):>13} "
            f"{fmt(l['normalized_within']):>13} {fmt(l['normalized_beyond']):>11}"
        )
    print(f"Attention entropy: {out}/ (attention_entropy.png, attention_entropy.json)")


if __name__ == "__main__":
    main()
