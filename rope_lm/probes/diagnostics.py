"""Looking inside a model: attention entropy, RoPE's long-range decay, and the
similarity structure of absolute position encodings.

Attention probabilities are recomputed here, outside attention.py, by the
same steps as attention.explicit_attention (scheme rotation, ReRoPE-style
second pass, log-n query scale, bias, content terms, mask, softmax), from the
exact inputs each attention layer receives in a normal forward (captured with
a forward pre-hook). Every kernel must agree with the explicit path, so these
are the probabilities the model uses whichever kernel it runs;
tests/test_diagnostics.py checks that they reproduce each layer's output.
"""

import contextlib
import inspect
import math
import os
import tempfile

import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.files import fresh_dir, save_figure, write_json
from rope_lm.kernels.attention import attention_probs, match_heads
from rope_lm.positional.frequencies import inverse_frequencies
from rope_lm.runs.run_folder import check_writable
from rope_lm.runs.trained import Trained, checkpoint_token_cache, output_home

# --- the output folder and the checkpoint's data ----------------------------------


def lengths_for(train_len: int, lengths: list[int] | None, multipliers: list[float]) -> list[int]:
    """The diagnostic's context lengths: `lengths` as given, else each
    multiplier times the training length."""
    return lengths or sorted({int(round(m * train_len)) for m in multipliers})


def _folder_name(name: str, scaling: dict | None) -> str:
    return name + (f"_{scaling['name']}" if scaling else "")


def _default_base(ckpt: str | None, name: str) -> str:
    """<run dir>/diagnostics/<name> for a checkpoint (trained.output_home);
    outputs/diagnostics/<name> without one."""
    home = output_home(ckpt, "diagnostics") if ckpt else os.path.join("outputs", "diagnostics")
    return os.path.join(home, name)


def default_out_dir(ckpt: str | None, name: str) -> str:
    """The default output folder, never one that exists already (-2, -3, ...)."""
    return fresh_dir(_default_base(ckpt, name))


def output_dir(out: str | None, ckpt: str | None, name: str, scaling: dict | None = None) -> str:
    """Where the results will go: out=, or a new <run dir>/diagnostics/<name>[_<method>];
    checked creatable, not created (make_output_dir does that once the
    inputs are checked, so a refused run leaves no empty folder)."""
    out_dir = out or default_out_dir(ckpt, _folder_name(name, scaling))
    check_out_dir(out_dir, given=bool(out))
    return out_dir


def make_output_dir(out: str | None, ckpt: str | None, name: str, scaling: dict | None = None) -> str:
    """Create the output folder, right before the first result is written:
    out= as given, or the default folder's first free number at this moment
    (a concurrent run may have taken the one output_dir saw)."""
    if out:
        _mkdir(out, exist_ok=True)
        return out
    base = _default_base(ckpt, _folder_name(name, scaling))
    while True:
        path = fresh_dir(base)
        try:
            _mkdir(path, exist_ok=False)
            return path
        except FileExistsError:
            continue


def _mkdir(path: str, exist_ok: bool):
    try:
        os.makedirs(path, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok:
            raise
        raise ConfigError(f"The output directory {path} is a file, not a folder; pass out= a new folder.") from None
    except OSError as e:
        raise ConfigError(
            f"Cannot create the output directory {path} ({e.strerror}); pass out= a writable place."
        ) from None


def check_out_dir(path: str, given: bool = False):
    """Refuse, before any work, an output folder that could not be made or
    written, and (out= given) one that holds results already: a diagnostic
    never writes over earlier files."""
    check_writable(path, "out=")
    if given and os.path.isdir(path):
        held = sorted(n for n in os.listdir(path) if not n.startswith("."))
        if held:
            raise ConfigError(
                f"out={path} already holds files ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}); "
                f"a diagnostic never writes over earlier results. Give a new folder, or leave out= "
                f"unset (a new numbered folder beside the checkpoint's run)."
            )


def checkpoint_tokens(trained: Trained, split: str, data_overrides: dict | None = None) -> np.ndarray:
    """The checkpoint's own corpus split, tokenized with its own tokenizer
    (written to a temporary folder for the cache: the cache keeps its own copy)."""
    if split not in ("train", "valid", "test"):
        raise ConfigError(f"split={split!r} is not a split; use train, valid or test.")
    with tempfile.TemporaryDirectory(prefix="rope-lm-tokenizer-") as work:
        return checkpoint_token_cache(trained.lit, data_overrides, work, trained.path)[0].tokens(split)


# --- attention probabilities ------------------------------------------------------


def layer_inputs(attn, args, kwargs) -> dict:
    """The arguments of Attention.forward by name (x, scheme, pos, plan, ctx)."""
    bound = inspect.signature(attn.forward).bind(*args, **kwargs)
    return dict(bound.arguments)


def layer_attention(attn, x, scheme, pos, plan, ctx):
    """(probabilities (B, H, T, T), the layer's output (B, T, C)) recomputed
    from an attention layer's inputs."""
    q, k, v = attn.split_qkv(x)
    q, plan = attn.tune_softmax(q, pos, plan)
    terms = scheme.token_terms(attn.layer, x, ctx) if scheme.reads_input else None
    probs = attention_probs(q, k, scheme, attn.layer, pos, plan, ctx, terms)
    (v,) = match_heads(q, v)  # grouped-query models: each query head reads its key/value head
    p = probs.to(v.dtype)
    y = p @ v
    value = None if scheme.owns_attention else scheme.value_term(attn.layer, p, pos, pos, ctx)
    if value is not None:
        y = y + value
    B, H, T, D = y.shape
    return probs, attn.drop(attn.proj(y.transpose(1, 2).reshape(B, T, H * D)))


@contextlib.contextmanager
def on_attention(model, fn):
    """While active, every attention layer's forward first calls
    fn(layer_index, probs (B, H, T, T), output (B, T, C))."""

    def hook(module, args, kwargs):
        inputs = layer_inputs(module, args, kwargs)
        with torch.no_grad():
            probs, out = layer_attention(
                module, inputs["x"], inputs["scheme"], inputs["pos"], inputs["plan"], inputs["ctx"]
            )
        fn(module.layer, probs, out)

    handles = [block.attn.register_forward_pre_hook(hook, with_kwargs=True) for block in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of probabilities over the last axis; 0 log 0 = 0."""
    return torch.special.entr(probs.double()).sum(-1).to(torch.float32)


def _buckets(T: int, n: int) -> list[tuple[int, int]]:
    width = max(1, math.ceil(T / n))
    return [(s, min(T, s + width)) for s in range(0, T, width)]


@torch.no_grad()
def attention_entropy(model, windows: torch.Tensor, train_len: int, buckets: int = 64, batch_size: int = 1) -> dict:
    """Mean attention entropy per layer and head at every query position over
    the given token windows (N, T), summarized inside and past train_len.
    Entropy grows like ln(n) with the n keys a query sees, so normalized
    entropy H / ln(n) (1 = uniform) is reported next to it."""
    model.eval()
    N, T = windows.shape
    L, H = model.cfg.n_layer, model.cfg.n_head
    total = torch.zeros(L, H, T, dtype=torch.float64)

    def collect(layer, probs, out):
        total[layer] += entropy(probs).double().sum(0).cpu()

    device = next(model.parameters()).device
    with on_attention(model, collect):
        for s in range(0, N, batch_size):
            model(windows[s : s + batch_size].to(device))
    mean = (total / N).float()  # (L, H, T)
    n_keys = torch.arange(1, T + 1, dtype=torch.float32)  # keys in view of each query
    plan = model.scaling.attention_plan(torch.arange(T), model.context(T))
    if plan.window:
        n_keys = n_keys.clamp(max=plan.window + plan.sink_tokens)
    uniform = n_keys.log()
    normalized = torch.where(uniform > 0, mean / uniform.clamp(min=1e-9), torch.full_like(mean, float("nan")))
    spans = _buckets(T, buckets)
    within = slice(0, min(T, train_len))
    beyond = slice(train_len, T) if T > train_len else None

    def region(x, sl):  # NaN-aware: position 0 has no normalized entropy (one key, ln 1 = 0)
        return None if sl is None else float(torch.nanmean(x[..., sl]))

    layers = []
    for l in range(L):
        heads = [
            {
                "head": h,
                "mean_within": region(mean[l, h], within),
                "mean_beyond": region(mean[l, h], beyond),
                "normalized_within": region(normalized[l, h], within),
                "normalized_beyond": region(normalized[l, h], beyond),
            }
            for h in range(H)
        ]
        layers.append(
            {
                "layer": l,
                "mean_within": region(mean[l], within),
                "mean_beyond": region(mean[l], beyond),
                "normalized_within": region(normalized[l], within),
                "normalized_beyond": region(normalized[l], beyond),
                "heads": heads,
            }
        )

    def bucketed(x):  # (..., T) -> nested lists (..., n_buckets), NaN-aware
        return torch.stack([torch.nanmean(x[..., a:b], dim=-1) for a, b in spans], dim=-1).tolist()

    return {
        "length": T,
        "train_len": train_len,
        "windows": N,
        "n_layer": L,
        "n_head": H,
        "buckets": {"start": [a for a, _ in spans], "end": [b for _, b in spans]},
        "layers": layers,
        "entropy": bucketed(mean),
        "normalized_entropy": bucketed(normalized),
        "uniform_entropy": bucketed(uniform),
    }


def plot_entropy(result: dict, path: str, title: str = ""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, H = result["n_layer"], result["n_head"]
    xs = [(a + b - 1) / 2 + 1 for a, b in zip(result["buckets"]["start"], result["buckets"]["end"])]
    cols = min(L, 4)
    rows = math.ceil(L / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for l in range(L):
        ax = axes[l // cols][l % cols]
        ent = np.asarray(result["entropy"][l], dtype=float)
        for h in range(H):
            ax.plot(xs, ent[h], linewidth=0.9, alpha=0.7, label=f"head {h}")
        ax.plot(xs, np.nanmean(ent, axis=0), color="black", linewidth=2, label="mean of heads")
        ax.plot(xs, result["uniform_entropy"], color="grey", linestyle=":", linewidth=1.2, label="uniform: ln(keys)")
        ax.axvline(
            result["train_len"], color="red", linestyle="--", linewidth=1, label=f"L_train = {result['train_len']}"
        )
        ax.set_xscale("log", base=2)
        ax.set_title(f"layer {l}", fontsize=10)
        ax.set_xlabel("query position + 1 (log scale)")
        if l % cols == 0:
            ax.set_ylabel("attention entropy (nats)")
        ax.grid(True, alpha=0.3)
    for l in range(L, rows * cols):
        axes[l // cols][l % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(
        title or f"Attention entropy vs query position (length {result['length']}, {result['windows']} windows)"
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_figure(fig, path)
    plt.close(fig)


# --- RoPE long-range decay (RoFormer, section 3.4.3) -------------------------------


def rope_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """theta_k = base^(-2k/d), k = 0 .. d/2 - 1, in float64."""
    if head_dim < 2 or head_dim % 2:
        raise ConfigError(f"head dim {head_dim} must be an even number of at least 2 (RoPE rotates channel pairs).")
    if base <= 1:
        raise ConfigError(f"RoPE base {base} must be greater than 1.")
    return inverse_frequencies(head_dim, base)


def rope_decay_bound(inv_freq: torch.Tensor, distances) -> torch.Tensor:
    """RoFormer's relative upper bound (1/(d/2)) sum_{j=1}^{d/2} |S_j|, with
    S_j = sum_{k<j} exp(i m theta_k), for each relative distance m. At m = 0,
    S_j = j, so the bound is (d/2 + 1) / 2."""
    theta = inv_freq.to(torch.float64)
    m = torch.as_tensor(distances, dtype=torch.float64)
    angles = m[:, None] * theta[None, :]
    S = torch.cumsum(torch.polar(torch.ones_like(angles), angles), dim=1)
    return S.abs().mean(dim=1)


def plot_rope_decay(curves: list[dict], path: str, train_len: int | None = None, linear_upto: int = 256):
    """curves: [{"label", "distances", "bound"}]. Left: RoFormer's figure
    (linear distance); right: the whole range on a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4))
    for c in curves:
        d, b = np.asarray(c["distances"]), np.asarray(c["bound"])
        near = d <= linear_upto
        a1.plot(d[near], b[near], linewidth=1.2, label=c["label"])
        a2.plot(np.maximum(d, 0.5), b, linewidth=1.0, label=c["label"])
    for a in (a1, a2):
        a.set_xlabel("relative distance m (tokens)")
        a.set_ylabel("relative upper bound (1/(d/2)) Σ_j |S_j|")
        a.grid(True, alpha=0.3)
        if train_len:
            a.axvline(train_len, color="grey", linestyle="--", linewidth=1, label=f"L_train = {train_len}")
    a1.set_title(f"RoPE long-range decay, distance ≤ {linear_upto} (RoFormer fig. 2)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_title("whole range (log-log)")
    a2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def checkpoint_rope_frequencies(model, length: int) -> tuple[torch.Tensor, float, str]:
    """(inverse frequencies, attention factor, description) of a RoPE model's
    scheme under its current extrapolation method at the given length: the
    scheme of the layers the method acts on (a layout's scaled ones)."""
    scheme = model.method_scheme
    if scheme.rotary is None:
        raise ConfigError(
            f"The checkpoint's scheme {scheme.name!r} is not RoPE-like (family {scheme.family!r}); "
            f"the decay curve is defined for rotary schemes. Leave out the checkpoint to plot bases and head dims."
        )
    spec = scheme.rotary
    inv_freq, factor = scheme.frequencies(model.context(length))
    label = getattr(model.scaling, "label", model.scaling.name)
    return (
        inv_freq.to(torch.float64),
        float(factor),
        f"checkpoint: d={spec.rot_dim}, base {spec.base:g}, {label} at {length}",
    )


# --- position-encoding similarity ---------------------------------------------------


def sinusoidal_table(n: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al.'s encoding: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(...)."""
    if dim < 2 or dim % 2:
        raise ConfigError(f"The sinusoidal encoding needs an even dimension of at least 2, not {dim}.")
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    inv = inverse_frequencies(dim, base)
    table = torch.zeros(n, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table


def checkpoint_position_table(model, n: int) -> torch.Tensor:
    """The vectors an absolute scheme adds at positions 0..n-1: its embed hook
    applied to zero token embeddings (a learned table's rows, the sinusoidal
    formula, under the model's extrapolation method)."""
    scheme = model.pos_scheme
    model.validate_length(n)
    ctx = model.context(n)
    pos = model.scaling.map_positions(torch.arange(n), scheme, ctx)
    p = next(model.parameters())
    with torch.no_grad():
        table = scheme.embed(torch.zeros(1, n, model.cfg.d_model, dtype=p.dtype, device=p.device), pos, ctx)[0]
    if not torch.count_nonzero(table):
        raise ConfigError(
            f"The checkpoint's scheme {scheme.name!r} adds no position vectors to the token embeddings "
            f"(family {scheme.family!r}); the similarity heatmap is for absolute encodings such as "
            f"learned and sinusoidal. Leave out the checkpoint for the sinusoidal formula."
        )
    return table.double().cpu()


def cosine_similarity_matrix(table: torch.Tensor) -> torch.Tensor:
    t = table.double()
    t = t / t.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return t @ t.T


def similarity_by_offset(sim: torch.Tensor) -> list[float]:
    """Mean cosine similarity of positions k apart, for k = 0 .. n-1."""
    n = sim.shape[0]
    return [float(torch.diagonal(sim, offset=k).mean()) for k in range(n)]


def plot_similarity(panels: list[dict], path: str):
    """panels: [{"title", "matrix" (n x n), "train_len" or None}] side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.8), squeeze=False)
    for ax, p in zip(axes[0], panels):
        m = np.asarray(p["matrix"])
        im = ax.imshow(m, cmap="RdBu_r", vmin=-1, vmax=1, origin="upper", interpolation="nearest")
        ax.set_title(p["title"], fontsize=10)
        ax.set_xlabel("position j")
        ax.set_ylabel("position i")
        if p.get("train_len") and p["train_len"] < m.shape[0]:
            for f in (ax.axvline, ax.axhline):
                f(p["train_len"] - 0.5, color="black", linestyle="--", linewidth=1)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="cosine similarity")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


# --- shared -------------------------------------------------------------------------


def json_safe(x):
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def save_json(path: str, obj):
    write_json(path, json_safe(obj))
