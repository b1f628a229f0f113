"""The diagnostics of a trained model as commands: settings in, a folder of
plots and JSON and a printed summary out (scripts/passkey.py,
scripts/attention_entropy.py, scripts/pos_similarity.py and
scripts/rope_decay.py are their command lines; the measurements are
rope_lm/probes/diagnostics.py's and rope_lm/probes/passkey.py's).
"""

from dataclasses import dataclass, field
import logging
import os

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import written_together

log = logging.getLogger("rope_lm")

MAX_JSON_SIDE = 256  # pos_similarity's JSON keeps the matrix subsampled to at most this many rows and columns


# --- passkey -----------------------------------------------------------------------


@dataclass
class PasskeySettings:
    """conf/passkey.yaml's settings, as plain values."""

    ckpt: str | None = None
    scaling: dict | None = None
    lengths: list[int] | None = None
    multipliers: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    samples: int = 10
    seed: int = 0
    instructions: bool = False
    batch_size: int = 8
    device: str = "cpu"
    out: str | None = None


def passkey(s: PasskeySettings) -> dict:
    """Passkey accuracy by context length x key depth into passkey.json and
    passkey.png, and the table printed; returns the result."""
    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.probes import passkey as P
    from rope_lm.runs.trained import open_model

    if s.batch_size < 1:
        raise ConfigError(f"batch_size={s.batch_size} must be at least 1.")

    trained = open_model(s.ckpt, s.device, s.scaling)
    model, train_len = trained.model, trained.train_len
    lengths = D.lengths_for(train_len, s.lengths, s.multipliers)
    tokenizer = trained.tokenizer()
    shortest = P.min_length(tokenizer, s.instructions)
    if min(lengths) < shortest:
        raise ConfigError(
            f"Passkey length {min(lengths)} is shorter than the template needs ({shortest} tokens with this "
            f"tokenizer{', instructions included' if s.instructions else ''}); give longer lengths= or multipliers=."
        )
    D.output_dir(s.out, trained.path, "passkey", s.scaling)

    def report(cell):
        log.info(
            "passkey length %d depth %g: accuracy %.0f%% (token accuracy %.0f%%)",
            cell["length"],
            cell["depth"],
            100 * cell["accuracy"],
            100 * cell["token_accuracy"],
        )

    result = P.evaluate_passkey(
        model,
        tokenizer,
        lengths,
        s.depths,
        s.samples,
        s.seed,
        s.instructions,
        s.batch_size,
        on_cell=report,
    )
    method = getattr(model.scaling, "label", model.scaling.name)
    result.update(
        checkpoint=from_here(trained.path),
        model=trained.identity,  # the weights read and their training step (a model still training says so)
        source=trained.source,
        scheme=trained.scheme,
        method=method,
        train_len=train_len,
    )
    new = not (s.out and os.path.isdir(s.out))
    out = D.make_output_dir(s.out, trained.path, "passkey", s.scaling)
    with written_together(out, "out=", "passkey run", new):  # both files or neither (a full disk)
        D.save_json(os.path.join(out, "passkey.json"), result)
        P.plot_passkey(
            result,
            os.path.join(out, "passkey.png"),
            train_len,
            f"Passkey accuracy — {trained.scheme} + {method}, trained at {train_len} ({s.samples} per cell)",
        )
    print("depth \\ length " + " ".join(f"{L:>7}" for L in lengths))
    for j, d in enumerate(s.depths):
        print(f"{d:>14g} " + " ".join(f"{result['accuracy'][i][j]:>7.0%}" for i in range(len(lengths))))
    print(f"Passkey: {out}/ (passkey.png, passkey.json)")
    return result


# --- attention entropy -------------------------------------------------------------


@dataclass
class AttentionEntropySettings:
    """conf/attention_entropy.yaml's settings, as plain values."""

    ckpt: str | None = None
    scaling: dict | None = None
    length: int | None = None
    windows: int = 8
    split: str = "test"
    buckets: int = 64
    device: str = "cpu"
    out: str | None = None


def attention_entropy(s: AttentionEntropySettings) -> dict:
    """Attention entropy per layer and head vs query position, into
    attention_entropy.json and .png, and the table printed; returns the result."""
    import torch

    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    if s.windows < 1 or s.buckets < 1 or (s.length is not None and s.length < 2):
        raise ConfigError("windows= and buckets= must be positive and length= at least 2.")

    trained = open_model(s.ckpt, s.device, s.scaling)
    model, train_len = trained.model, trained.train_len
    T = s.length or 4 * train_len
    model.validate_length(T)
    D.output_dir(s.out, trained.path, "attention_entropy", s.scaling)
    stream = D.checkpoint_tokens(trained, s.split)
    n = s.windows
    need = n * T + 1
    if len(stream) < need:
        raise ConfigError(
            f"The {s.split} split has {len(stream)} tokens, fewer than {n} windows of {T} need ({need}); lower windows= or length=."
        )
    windows = torch.from_numpy(stream[: n * T].astype("int64")).view(n, T)
    result = D.attention_entropy(model, windows, train_len, buckets=s.buckets)
    method = getattr(model.scaling, "label", model.scaling.name)
    result.update(
        checkpoint=from_here(trained.path),
        model=trained.identity,  # the weights read and their training step (a model still training says so)
        source=trained.source,
        scheme=trained.scheme,
        method=method,
        split=s.split,
    )
    new = not (s.out and os.path.isdir(s.out))
    out = D.make_output_dir(s.out, trained.path, "attention_entropy", s.scaling)
    with written_together(out, "out=", "attention-entropy run", new):  # both files or neither (a full disk)
        D.save_json(os.path.join(out, "attention_entropy.json"), result)
        D.plot_entropy(
            result,
            os.path.join(out, "attention_entropy.png"),
            f"Attention entropy vs query position — {trained.scheme} + {method}, trained at {train_len}, "
            f"windows of {T}",
        )
    print(f"{'layer':>5} {'within L_train':>15} {'past L_train':>13} {'norm. within':>13} {'norm. past':>11}")
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for l in result["layers"]:
        print(
            f"{l['layer']:>5} {fmt(l['mean_within']):>15} {fmt(l['mean_beyond']):>13} "
            f"{fmt(l['normalized_within']):>13} {fmt(l['normalized_beyond']):>11}"
        )
    print(f"Attention entropy: {out}/ (attention_entropy.png, attention_entropy.json)")
    return result


# --- position similarity -----------------------------------------------------------


@dataclass
class PosSimilaritySettings:
    """conf/pos_similarity.yaml's settings, as plain values."""

    ckpt: str | None = None
    scaling: dict | None = None
    positions: int | None = None
    dim: int = 192
    base: float = 10000.0
    out: str | None = None


def pos_similarity(s: PosSimilaritySettings) -> dict:
    """Cosine similarity between position vectors (a checkpoint's and the
    sinusoidal formula's) into pos_similarity.json and .png, and a line per
    panel printed; returns the summary."""
    from rope_lm.core.files import from_here
    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    if s.positions is not None and s.positions < 2:
        raise ConfigError(f"positions={s.positions} must be at least 2.")
    if s.scaling and not s.ckpt:
        raise ConfigError("scaling= applies to a checkpoint's encoding; give ckpt= too.")
    panels, summary, ckpt = [], {}, None
    if s.ckpt:
        trained = open_model(s.ckpt, "cpu", s.scaling)
        model, train_len, ckpt = trained.model, trained.train_len, trained.path
        n = s.positions or 4 * train_len
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
        n, dim, train_len = s.positions or 512, s.dim, None
    sin = D.cosine_similarity_matrix(D.sinusoidal_table(n, dim, s.base))
    panels.append({"title": f"sinusoidal formula, d={dim}, base {s.base:g}", "matrix": sin, "train_len": train_len})
    summary["sinusoidal"] = {"dim": dim, "base": s.base, **_summary(D, sin, train_len)}
    D.output_dir(s.out, ckpt, "pos_similarity")
    new = not (s.out and os.path.isdir(s.out))
    out = D.make_output_dir(s.out, ckpt, "pos_similarity")
    with written_together(out, "out=", "position-similarity run", new):  # both files or neither (a full disk)
        D.plot_similarity(panels, os.path.join(out, "pos_similarity.png"))
        D.save_json(os.path.join(out, "pos_similarity.json"), {"positions": n, **summary})
    for name, row in summary.items():
        print(
            f"{name:<12} mean cos-sim at offset 1: {row['by_offset'][1]:.3f}, offset {n // 2}: {row['by_offset'][n // 2]:.3f}"
        )
    print(f"Position similarity: {out}/ (pos_similarity.png, pos_similarity.json)")
    return summary


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


# --- RoPE's long-range decay -------------------------------------------------------


@dataclass
class RopeDecaySettings:
    """conf/rope_decay.yaml's settings, as plain values."""

    bases: list[float] = field(default_factory=lambda: [10000.0, 500000.0])
    head_dims: list[int] = field(default_factory=lambda: [64, 128])
    max_distance: int = 4096
    ckpt: str | None = None
    scaling: dict | None = None
    length: int | None = None
    out: str | None = None


def rope_decay(s: RopeDecaySettings) -> list[dict]:
    """RoPE's relative upper bound vs distance (and a checkpoint's own
    frequencies') into rope_decay.json and .png, and a line per curve
    printed; returns the curves."""
    import torch

    from rope_lm.probes import diagnostics as D
    from rope_lm.runs.trained import open_model

    max_distance = s.max_distance
    if max_distance < 1:
        raise ConfigError(f"max_distance={max_distance} must be at least 1.")
    if (s.scaling or s.length) and not s.ckpt:
        raise ConfigError("scaling= and length= apply to a checkpoint's frequencies; give ckpt= too.")
    distances = torch.arange(max_distance + 1)
    curves, train_len = [], None
    for base in s.bases:
        for d in s.head_dims:
            bound = D.rope_decay_bound(D.rope_inv_freq(d, base), distances)
            curves.append(
                {
                    "label": f"base {base:g}, d={d}",
                    "base": base,
                    "head_dim": d,
                    "bound_at_0": float(bound[0]),
                    "distances": distances.tolist(),
                    "bound": bound.tolist(),
                }
            )
    ckpt = None
    if s.ckpt:
        trained = open_model(s.ckpt, "cpu", s.scaling)
        model, train_len, ckpt = trained.model, trained.train_len, trained.path
        inv_freq, factor, label = D.checkpoint_rope_frequencies(model, s.length or max_distance)
        # cos and sin carry the attention factor, so the score (and its bound) scales by factor^2
        bound = D.rope_decay_bound(inv_freq, distances) * factor**2
        curves.append(
            {
                "label": label,
                "head_dim": 2 * inv_freq.numel(),
                "attention_factor": factor,
                "bound_at_0": float(bound[0]),
                "distances": distances.tolist(),
                "bound": bound.tolist(),
            }
        )
    if not curves:
        raise ConfigError("Nothing to plot: give bases= and head_dims=, or ckpt=.")
    D.output_dir(s.out, ckpt, "rope_decay")
    new = not (s.out and os.path.isdir(s.out))
    out = D.make_output_dir(s.out, ckpt, "rope_decay")
    with written_together(out, "out=", "RoPE-decay run", new):  # both files or neither (a full disk)
        D.save_json(
            os.path.join(out, "rope_decay.json"),
            {"max_distance": max_distance, "train_len": train_len, "curves": curves},
        )
        D.plot_rope_decay(curves, os.path.join(out, "rope_decay.png"), train_len)
    near = min(256, max_distance)
    for c in curves:
        b = c["bound"]
        print(f"{c['label']:<50} m=0: {b[0]:.2f}  m={near}: {b[near]:.2f}  m={max_distance}: {b[-1]:.2f}")
    print(f"RoPE decay: {out}/ (rope_decay.png, rope_decay.json)")
    return curves
