"""A perplexity comparison drawn (matplotlib, PNG): per group, PPL against the
evaluation length with its intervals, and the per-position loss at each
series' longest length; colours and dashes keep a method's variants and a
setting's seeds together."""

from rope_lm.compare.ppl_series import Group, Series
from rope_lm.core.files import save_figure
from rope_lm.eval.report import log_binned, positive


def _styles(series: list[Series]):
    """A colour per series, except that a method's variants (`ntk` and
    `ntk+logn`) share one and differ in dash, so they read as a pair, and
    seed replicas (the same setting, another seed) share one and differ in
    dash, so a scheme's seeds read as one colour. Past ten colours, a new dash
    pattern keeps colours apart."""
    dashes = ["-", "--", ":", "-."]
    colours, variants, replicas, out = {}, {}, {}, []
    for s in series:
        modifiers = s.method.partition("+")[2]
        base = s.label[: -len(modifiers) - 1] if modifiers and s.label.endswith("+" + modifiers) else s.label
        key = ("seeds", s.setting) if s.seed is not None and s.setting and s.trained_at is None else base
        replica = replicas[key] = replicas.get(key, -1) + 1  # 0 for a key's first series
        c = colours.setdefault(key, len(colours))
        v = variants.setdefault(modifiers, len(variants))
        out.append((f"C{c % 10}", dashes[(c // 10 + v + replica) % len(dashes)]))
    return out


def _group_plot(g: Group, path: str, heading: str, xlabel: str, ylabel: str, draw, ylog: bool = False):
    """One figure for a group: draw(ax, series, colour, dash) per series, then
    the L_train line, log-2 x axis, labels, legend outside, and the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 5))
    try:
        for s, (color, dash) in zip(g.series, _styles(g.series)):
            draw(ax, s, color, dash)
        drawn = any(len(line.get_xdata()) for line in ax.get_lines())
        ax.axvline(g.key.train_len, color="grey", linestyle="--", linewidth=1, label=f"L_train = {g.key.train_len}")
        ax.set_xscale("log", base=2)
        if ylog and drawn:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{heading} — {g.key.describe()}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        save_figure(fig, path, palette=True)
    finally:
        plt.close(fig)


def plot_ppl(g: Group, path: str, title: str):
    def draw(ax, s, color, dash):
        # None, NaN and inf (a diverged run) are missing points: the plot never dies on them.
        Ls = sorted(L for L in s.rows if positive(s.ppl(L)))
        ax.plot(Ls, [s.ppl(L) for L in Ls], marker="o", markersize=4, color=color, linestyle=dash, label=s.label)
        band = [L for L in Ls if s.noise(L) and positive(s.noise(L)[0]) and positive(s.noise(L)[1])]
        if band:
            ax.fill_between(
                band, [s.noise(L)[0] for L in band], [s.noise(L)[1] for L in band], color=color, alpha=0.15, linewidth=0
            )

    _group_plot(
        g,
        path,
        f"{title}\nPPL vs evaluation length (bands: 95% interval)",
        "evaluation length (tokens, log scale)",
        "perplexity (log scale)",
        draw,
        ylog=True,
    )


def plot_per_position(g: Group, path: str, title: str):
    """Mean token loss by position in the window, at each series' longest
    evaluated length: where (not only how much) a model breaks."""

    def draw(ax, s, color, dash):
        L = max(s.rows)
        pp = s.rows[L].get("per_position")
        if pp:
            ax.plot(*log_binned(pp, L), marker=".", color=color, linestyle=dash, label=f"{s.label} (L={L})")

    _group_plot(
        g,
        path,
        f"{title}\nper-position loss at the longest length",
        "position in the evaluation window (tokens, log scale; 4 bins per doubling)",
        "mean token loss (nats)",
        draw,
    )
