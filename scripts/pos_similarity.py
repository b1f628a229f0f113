"""Cosine similarity between the position vectors of an absolute encoding, as
a heatmap: a checkpoint's learned table (or its sinusoidal encoding), or the
sinusoidal formula on its own. Settings and examples:
python scripts/pos_similarity.py --help (conf/pos_similarity.yaml).

With ckpt=, the vectors are what the scheme's embed hook adds at each
position (a learned table's rows; past the training length they were never
trained), next to the sinusoidal formula at the model's width. Writes
pos_similarity.png and .json to out= (default: a new
outputs/diagnostics/pos_similarity, or <run dir>/diagnostics/pos_similarity).
"""

import os

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task
from rope_lm.core.errors import ConfigError

MAX_JSON_SIDE = 256  # the JSON keeps the matrix subsampled to at most this many rows and columns


@hydra.main(config_path="../conf", config_name="pos_similarity", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    args = OmegaConf.to_container(cfg, resolve=True)
    if args["positions"] is not None and args["positions"] < 2:
        raise ConfigError(f"positions={args['positions']} must be at least 2.")
    if args.get("scaling") and not args["ckpt"]:
        raise ConfigError("scaling= applies to a checkpoint's encoding; give ckpt= too.")
    panels, summary, ckpt = [], {}, None
    if args["ckpt"]:
        trained = open_model(args["ckpt"], "cpu", args.get("scaling"))
        model, train_len, ckpt = trained.model, trained.train_len, trained.path
        n = args["positions"] or 4 * train_len
        sim = D.cosine_similarity_matrix(D.checkpoint_position_table(model, n))
        method = getattr(model.scaling, "label", model.scaling.name)
        title = f"{trained.scheme} ({method}), trained at {train_len}"
        panels.append({"title": title, "matrix": sim, "train_len": train_len})
        summary["checkpoint"] = {
            "path": from_here(trained.path),
            "source": trained.source,
            "scheme": trained.scheme,
            "method": method,
            "train_len": train_len,
            **_summary(D, sim, train_len),
        }
        dim = model.cfg.d_model
    else:
        n, dim, train_len = args["positions"] or 512, args["dim"], None
    sin = D.cosine_similarity_matrix(D.sinusoidal_table(n, dim, args["base"]))
    panels.append(
        {"title": f"sinusoidal formula, d={dim}, base {args['base']:g}", "matrix": sin, "train_len": train_len}
    )
    summary["sinusoidal"] = {"dim": dim, "base": args["base"], **_summary(D, sin, train_len)}
    D.output_dir(args["out"], ckpt, "pos_similarity")
    out = D.make_output_dir(args["out"], ckpt, "pos_similarity")
    D.plot_similarity(panels, os.path.join(out, "pos_similarity.png"))
    D.save_json(os.path.join(out, "pos_similarity.json"), {"positions": n, **summary})
    for name, s in summary.items():
        print(
            f"{name:<12} mean cos-sim at offset 1: {s['by_offset'][1]:.3f}, offset {n // 2}: {s['by_offset'][n // 2]:.3f}"
        )
    print(f"Position similarity: {out}/ (pos_similarity.png, pos_similarity.json)")


def _summary(D, sim, train_len):
    n = sim.shape[0]
    stride = max(1, -(-n // MAX_JSON_SIDE))
    out = {"by_offset": D.similarity_by_offset(sim), "stride": stride, "matrix": sim[::stride, ::stride].tolist()}
    if train_len and train_len < n:
        off = ~__import__("torch").eye(n, dtype=bool)
        inside = sim[:train_len, :train_len][off[:train_len, :train_len]]
        outside = sim[train_len:, train_len:][off[train_len:, train_len:]]
        out["mean_offdiag_within_train_len"] = float(inside.mean())
        out["mean_offdiag_past_train_len"] = float(outside.mean()) if outside.numel() else None
    return out


if __name__ == "__main__":
    main()
