"""The rules that check a published claim against a study's rows
(compare/published.py reads the rows, runs the rules and writes the table).

A rule is a pure function (claim, rows) -> Verdict, registered in RULES by
the @rule(...) line above it, which names the claim fields it needs, the rows
it reads and its wording made from those fields, so the text printed next to
a verdict is the check that made it.

A verdict is one of VERDICTS:

* "matched": the claim holds beyond the noise: an order with every pair
  apart beyond their intervals; a threshold or band with the whole interval
  inside it (the point alone is no evidence);
* "not matched": it fails beyond the noise (an order reversed beyond the
  intervals, an interval wholly outside the band);
* "not robust": a ranking claim that holds under some readings of the same
  results and fails under others (task_mrr's aggregations): it is not a
  finding of the data but of the aggregation chosen;
* "tied": noise decides: the order holds or fails only within the
  intervals, or an interval straddles an end of the band;
* "not comparable": the study was not run, or lacks a length, a scheme, a
  control, or the intervals (or seeds) a rule needs to tell a result from
  noise.

Intervals are each run's 95% interval where the study has one and, across
seeds, their spread too (the lowest low to the highest high).
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
import functools
import math
import random

from rope_lm.compare.noise import WINDOW_CONTROL, seed_interval
from rope_lm.compare.ppl_pairs import PAIRED_COLUMN, inverted, read_paired_cell
from rope_lm.core.errors import ConfigError

MATCHED, NOT_MATCHED, NOT_ROBUST, TIED, NOT_COMPARABLE = (
    "matched",
    "not matched",
    "not robust",
    "tied",
    "not comparable",
)
VERDICTS = (MATCHED, NOT_MATCHED, NOT_ROBUST, TIED, NOT_COMPARABLE)  # also the precedence of a claim's folders


@dataclass
class Verdict:
    ours: str
    verdict: str
    detail: list | None = None  # task_mrr: the claim under every reading of the results (the sensitivity table)


def _series_rows(rows: list[dict], name: str) -> list[dict]:
    if "(" in name:  # a comparison's row label, e.g. "rope (pos.base=500.0)": runs told apart by a setting
        # Seed replicas of that setting carry their seed after it ("rope (pos.p_rope=0.75) (seed=1)").
        return [r for r in rows if r.get("label") == name or str(r.get("label")).startswith(f"{name} (seed=")]

    # A scheme's own name may hold a "+" (a layout or softmax option: rope+nope_every_4), so each row's
    # series name is built and compared whole rather than the name split.
    def series(r):
        positions = r.get("train_pos") or "none"
        return (
            r["scheme"]
            + ("" if r["method"] == "none" else f"+{r['method']}")
            + ("" if positions == "none" else f"@{positions}")
        )

    return [r for r in rows if series(r) == name]


def _series(rows: list[dict], name: str, train_len: str = "min") -> dict[float, dict]:
    """multiplier -> {ppl, ppl_rel} of one series ('scheme' or 'scheme+method',
    e.g. rope+yarn, with '@<training positions>' for runs trained on other
    position ids, e.g. rope@pose-x16, or a row label with the setting that
    tells it apart, e.g. 'rope (pos.base=500.0)'), averaged over seeds; the
    group trained at the shortest (min) or longest (max: a fine-tune) length."""
    mine = _series_rows(rows, name)
    if not mine:
        return {}
    pick = (min if train_len == "min" else max)(r["train_len"] for r in mine)
    seeds = {}
    for r in mine:
        if r["train_len"] == pick:
            seeds.setdefault(r.get("label") or r.get("run_dir"), r.get("seed"))
    if len(set(seeds.values())) < len(seeds):  # not seed replicas: runs of other settings (a budget sweep)
        raise Ambiguous(f"{len(seeds)} {name} runs that are not seed replicas ({', '.join(map(str, seeds))})")
    by = {}
    for r in mine:
        if r["train_len"] == pick and r.get("ppl") is not None:
            by.setdefault(round(r["ratio"], 6), []).append(r)
    out = {}
    for k, v in by.items():
        out[k] = {c: sum(r[c] for r in v) / len(v) for c in ("ppl", "ppl_rel") if all(r.get(c) is not None for r in v)}
        for c in ("ppl", "ppl_rel"):
            # The noise band: each run's interval where the study has one, and across seeds
            # their spread too (the lowest low to the highest high).
            lows = [r.get(f"{c}_lo") for r in v]
            highs = [r.get(f"{c}_hi") for r in v]
            if c in out[k] and (len(v) > 1 or all(isinstance(x, float) for x in lows + highs)):
                out[k][f"{c}_band"] = (
                    min(x if isinstance(x, float) else r[c] for x, r in zip(lows, v)),
                    max(x if isinstance(x, float) else r[c] for x, r in zip(highs, v)),
                )
        if len(v) == 1:  # one model: its PPL against the others of that model on the same windows (ppl_pairs)
            out[k]["label"] = v[0].get("label")
            out[k]["paired"] = read_paired_cell(v[0].get(PAIRED_COLUMN))
    return out


def _window_pair(a: dict, b: dict) -> dict | None:
    """PPL of point a over point b's, paired on the same windows of one model: {ratio, lo, hi, units}; None
    where they are not two series of one model that kept their windows."""
    mine = (a.get("paired") or {}).get(b.get("label"))
    if mine is not None:
        return mine
    theirs = (b.get("paired") or {}).get(a.get("label"))
    if theirs is None:
        return None
    return inverted(theirs)


class Ambiguous(Exception):
    """A series names several runs that differ in more than their seed."""


# --- rules: (claim, evidence) -> Verdict ----------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rule: its check, the claim fields it needs, the rows it reads
    (a key of compare/published.READERS) and the rule in words, made from the claim's own fields so that
    text and check never drift."""

    check: Callable[[dict, object], Verdict]
    parameters: tuple[str, ...]
    says: Callable[[dict], str]
    rows: str = "ppl"

    def __call__(self, claim: dict, rows) -> Verdict:
        return self.check(claim, rows)


RULES: dict[str, Rule] = {}


def rule(parameters: tuple[str, ...], says: Callable[[dict], str], rows: str = "ppl"):
    """Registers the decorated check under its function name."""

    def register(check):
        RULES[check.__name__] = Rule(check, parameters, says, rows)
        return check

    return register


def _bounds(c: dict) -> str:
    lo, hi = c.get("min"), c.get("max")
    return f"in [{lo}, {hi}]" if lo is not None and hi is not None else f">= {lo}" if lo is not None else f"<= {hi}"


def in_band(interval: tuple[float, float], lo: float = -math.inf, hi: float = math.inf) -> str:
    """A threshold read on an interval, not on its point: matched where the
    whole interval lies in [lo, hi], not matched where it lies wholly outside,
    tied where it straddles an end (noise decides which side the value is on)."""
    if lo <= interval[0] and interval[1] <= hi:
        return MATCHED
    if interval[1] < lo or interval[0] > hi:
        return NOT_MATCHED
    return TIED


NO_INTERVALS = "no intervals or seeds in this study to tell it from noise"


@rule(
    ("series", "multiplier"),
    lambda c: f"{c['series']}: PPL({c['multiplier']} x L) / PPL(L) {_bounds(c)}, its whole interval",
)
def ratio_between(claim: dict, rows: list[dict]) -> Verdict:
    """The series' PPL at the multiplier relative to its PPL at L lies in
    [min, max], its whole interval (or seed spread) inside the band."""
    s, k = _series(rows, claim["series"]), float(claim["multiplier"])
    p = s.get(k) or {}
    if p.get("ppl_rel") is None:
        return Verdict(f"no {claim['series']} result at {k:g} x L", NOT_COMPARABLE)
    band = p.get("ppl_rel_band")
    shown = f"{p['ppl_rel']:.2f}" + (f" [{band[0]:.2f}, {band[1]:.2f}]" if band else "") + f" at {k:g} x L"
    if band is None:
        return Verdict(f"{shown}; {NO_INTERVALS}", NOT_COMPARABLE)
    verdict = in_band(band, claim.get("min", -math.inf), claim.get("max", math.inf))
    return Verdict(shown + ("; the interval straddles an end of the band" if verdict == TIED else ""), verdict)


@rule(
    ("series", "from_multiplier", "max"),
    lambda c: (
        f"{c['series']}: PPL(k x L) / PPL(L) <= {c['max']} for every k >= {c['from_multiplier']}, each whole interval"
    ),
)
def ratio_at_most(claim: dict, rows: list[dict]) -> Verdict:
    """The series' relative PPL is at most `max` at every multiplier from
    `from_multiplier` on, each whole interval below it."""
    s = _series(rows, claim["series"])
    past = {k: v for k, v in s.items() if k >= float(claim["from_multiplier"]) and "ppl_rel" in v}
    if not past:
        return Verdict(f"no {claim['series']} result at {claim['from_multiplier']} x L or beyond", NOT_COMPARABLE)
    worst = max(past, key=lambda k: past[k]["ppl_rel"])
    band = past[worst].get("ppl_rel_band")
    shown = (
        f"{min(v['ppl_rel'] for v in past.values()):.2f}-{past[worst]['ppl_rel']:.2f} over "
        f"{min(past):g}-{max(past):g} x L (highest at {worst:g} x L"
        + (f", [{band[0]:.2f}, {band[1]:.2f}]" if band else "")
        + ")"
    )
    if not all("ppl_rel_band" in v for v in past.values()):
        return Verdict(f"{shown}; {NO_INTERVALS}", NOT_COMPARABLE)
    verdicts = {k: in_band(v["ppl_rel_band"], hi=claim["max"]) for k, v in past.items()}
    for verdict, why in ((NOT_MATCHED, "above"), (TIED, "straddling")):
        ks = [f"{k:g}" for k, v in verdicts.items() if v == verdict]
        if ks:
            return Verdict(f"{shown}; interval {why} {claim['max']} at {', '.join(ks)} x L", verdict)
    return Verdict(shown, MATCHED)


def _fmt(v: float, metric: str) -> str:
    return f"{v:.{3 if metric == 'ppl_rel' else 1}f}"


def _shown(name: str, point: dict, metric: str) -> str:
    band = point.get(f"{metric}_band")
    return f"{name} {_fmt(point[metric], metric)}" + (
        f" [{_fmt(band[0], metric)}, {_fmt(band[1], metric)}]" if band else ""
    )


def _separated(better: dict, worse: dict, metric: str) -> bool | None:
    """True: `better` is lower beyond both bands; False: higher beyond them;
    None: the bands overlap (noise decides). Two series of one model scored
    on the same windows are read on the paired interval of their PPL ratio
    instead (below 1, above 1, or holding 1): the text's difficulty is no
    noise between them."""
    pair = _pair(better, worse, metric)
    if pair is not None:
        return None if pair["lo"] <= 1 <= pair["hi"] else pair["hi"] < 1
    b, w = better[f"{metric}_band"], worse[f"{metric}_band"]
    if b[1] >= w[0] and w[1] >= b[0]:
        return None
    return better[metric] < worse[metric]


def _ordered(points: dict[str, dict], order: list[str], metric: str) -> tuple[str, str]:
    """(verdict, what decided it) for the claim that `order` runs from the lowest
    `metric` up: every neighbour pair must be separated beyond its bands."""
    tied, reversed_, paired = [], [], []
    for a, b in zip(order, order[1:]):
        sep = _separated(points[a], points[b], metric)
        pair = _pair(points[a], points[b], metric)
        if pair is not None:
            paired.append(f"{a} / {b} {_paired_text(pair)}")
        if sep is None:
            tied.append(f"{a} ~ {b}")
        elif not sep:
            reversed_.append(f"{b} < {a}")
    why = "; ".join(
        ([f"paired on the same windows: {', '.join(paired)}"] if paired else [])
        + ([f"reversed beyond the intervals: {', '.join(reversed_)}"] if reversed_ else [])
        + ([f"within the intervals: {', '.join(tied)}"] if tied else [])
    )
    return (NOT_MATCHED if reversed_ else TIED if tied else MATCHED), why


def _pair(a: dict, b: dict, metric: str = "ppl") -> dict | None:
    return _window_pair(a, b) if metric == "ppl" else None


def _decidable(a: dict, b: dict, metric: str) -> bool:
    """Both have intervals (or seeds), or they are one model's two series paired on the same windows."""
    return _pair(a, b, metric) is not None or (f"{metric}_band" in a and f"{metric}_band" in b)


def _paired_text(pair: dict) -> str:
    unit = f"{pair['unit']}s" if pair.get("unit") else "windows or documents"
    return f"{pair['ratio']:.3f} [{pair['lo']:.3f}, {pair['hi']:.3f}] over {pair['units']} {unit}"


@rule(
    ("multiplier", "order"),
    lambda c: (
        f"{c.get('metric', 'ppl')} at {c['multiplier']} x L"
        f"{', in the fine-tuned runs' if c.get('train_len') == 'max' else ''}: "
        f"{' < '.join(c['order'])}, each pair apart beyond the intervals (for two series of one model, the "
        f"paired interval of their ratio on the same windows)"
    ),
)
def ppl_order(claim: dict, rows: list[dict]) -> Verdict:
    """The series in claim['order'] (best first) have increasing `metric`
    (ppl or ppl_rel) at the multiplier, in the group trained at `train_len`;
    each neighbour pair apart by more than its intervals (or seed spread)."""
    k, metric = float(claim["multiplier"]), claim.get("metric", "ppl")
    points = {}
    for name in claim["order"]:
        p = _series(rows, name, claim.get("train_len", "min")).get(k) or {}
        if p.get(metric) is None:
            return Verdict(f"no {name} result at {k:g} x L", NOT_COMPARABLE)
        points[name] = p
    ours = sorted(points, key=lambda n: points[n][metric])
    shown = " < ".join(_shown(n, points[n], metric) for n in ours)
    order = list(claim["order"])
    if not all(_decidable(points[a], points[b], metric) for a, b in zip(order, order[1:])):
        # One seed and no intervals: nothing tells the order from noise.
        return Verdict(
            f"{shown} ({metric} at {k:g} x L); no intervals or seeds in this study to tell the order from noise",
            NOT_COMPARABLE,
        )
    verdict, why = _ordered(points, list(claim["order"]), metric)
    return Verdict(f"{shown} ({metric} at {k:g} x L)" + (f"; {why}" if why else ""), verdict)


def _below_control(series: str, control: str, rows: list[dict], ks: list[float], lead: str) -> Verdict:
    """The series below its window-L control at every multiplier of `ks`, read on the paired ratio
    PPL(series) / PPL(control) where the study has one: over seeds (the t-interval of the per-seed log ratio,
    training noise included) where both ran two or more common seeds, else one model's paired bootstrap on
    the same windows; only a study that kept neither is read on the two unpaired intervals. At L the two
    are one model scoring the same windows, so the ratio of PPLs past L is the ratio of relative PPLs.
    `lead`: what was shown before."""
    s, w = _series(rows, series), _series(rows, control)
    if not w:
        return Verdict(f"{lead}control missing: no {control} (window-L) run in this study", NOT_COMPARABLE)
    missing = [k for k in ks if "ppl_rel" not in w.get(k, {})]
    if missing:
        return Verdict(
            f"{lead}control missing: no {control} result at {', '.join(f'{k:g}' for k in missing)} x L",
            NOT_COMPARABLE,
        )
    a, b = _per_seed(rows, series), _per_seed(rows, control)
    if all(len((set(a.get(k, {})) & set(b.get(k, {}))) - {None}) >= 2 for k in ks):
        verdict, why = _paired_against({"series": series, "from_multiplier": ks[0]}, rows, control)
        return Verdict(f"{lead}{why}", verdict)
    pairs = {k: _pair(s[k], w[k]) for k in ks}
    if all(p is not None for p in pairs.values()):
        sep = {k: _separated(s[k], w[k], "ppl") for k in ks}
        shown = f"{lead}{series} / {control}, paired on the same windows: " + "; ".join(
            f"{k:g} x L {_paired_text(p)}" for k, p in pairs.items()
        )
    elif all("ppl_rel_band" in s[k] and "ppl_rel_band" in w[k] for k in ks):
        sep = {k: _separated(s[k], w[k], "ppl_rel") for k in ks}
        far = ks[-1]
        shown = (
            f"{lead}at {far:g} x L {_shown(series, s[far], 'ppl_rel')} vs {_shown(control, w[far], 'ppl_rel')} "
            f"(unpaired intervals)"
        )
    else:
        return Verdict(
            f"{lead}no intervals or seeds in this study to tell it from the {control} control", NOT_COMPARABLE
        )
    worse = [f"{k:g}" for k, v in sep.items() if v is False]
    if worse:
        return Verdict(f"{shown}; above the control beyond the intervals at {', '.join(worse)} x L", NOT_MATCHED)
    tied = [f"{k:g}" for k, v in sep.items() if v is None]
    if tied:
        return Verdict(f"{shown}; within the intervals of the control at {', '.join(tied)} x L", TIED)
    return Verdict(shown, MATCHED)


@rule(
    ("series", "from_multiplier"),
    lambda c: (
        f"{c['series']}: PPL(k x L) / PPL(L) below {c['series']}+{WINDOW_CONTROL}'s (the same model, attention "
        f"cut to its last L keys), for every k >= {c['from_multiplier']}: the paired ratio's interval below 1 "
        f"(over seeds, else on the same windows)"
    ),
)
def beats_own_window(claim: dict, rows: list[dict]) -> Verdict:
    """The series reads context past L: at every multiplier from
    `from_multiplier` on, its PPL relative to its PPL at L is below that of
    the same model evaluated with attention cut to its last L keys (the
    series `<series>+window`), read on their paired ratio (_below_control:
    over seeds, else on the same windows). Only the model's own
    window-L control says this: another model cut to L differs in more than
    the context it reads, so a study without `<series>+window` runs is not
    comparable. The series is a scheme (the window is its method)."""
    s = _series(rows, claim["series"])
    ks = sorted(k for k in s if k >= float(claim["from_multiplier"]) and "ppl_rel" in s[k])
    if not ks:
        return Verdict(f"no {claim['series']} result at {claim['from_multiplier']} x L or beyond", NOT_COMPARABLE)
    lead = (
        f"{min(s[k]['ppl_rel'] for k in ks):.2f}-{max(s[k]['ppl_rel'] for k in ks):.2f} over {ks[0]:g}-{ks[-1]:g} x L; "
    )
    return _below_control(claim["series"], f"{claim['series']}+{WINDOW_CONTROL}", rows, ks, lead)


# --- task rankings: mean reciprocal rank, read several ways -------------------------------

WILSON_Z = 1.959963984540054  # the two-sided 95% normal quantile
LEARNED_MARGIN = 0.05  # a task is learned where a run's whole interval is this far above chance at least
CHANCE_DRAWS = 2000  # instances drawn per size bucket to find a task's most frequent answer


def wilson(hits: float, n: float) -> tuple[float, float]:
    """The 95% Wilson score interval of the proportion hits / n (Wilson,
    1927): inside [0, 1], and not of zero width at 0 or n hits, where a
    bootstrap over instances is (0 of 64 right is [0, 5.7%], not [0, 0])."""
    p, z2 = hits / n, WILSON_Z**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = WILSON_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@functools.lru_cache(maxsize=None)
def chance_rate(task: str, sizes: tuple[tuple[int, int], ...]) -> float:
    """What a model that answers without reading the prompt scores at best on
    the task's size buckets `sizes` ((lo, hi) each): the rate of its most
    frequent answer, drawn CHANCE_DRAWS times a bucket with the task's default
    settings, averaged over the buckets (parity 0.5, a copy of 7 digits
    about 0). 0 for a task this checkout does not register or cannot build
    with its defaults."""
    from rope_lm.core.errors import ConfigError
    from rope_lm.tasks.synthetic.base import SYNTHETIC_TASKS

    try:
        task_ = SYNTHETIC_TASKS.get(task)()
    except (ConfigError, TypeError):
        return 0.0
    rng = random.Random(0)
    rates = []
    for lo, hi in sizes:
        answers = Counter(tuple(task_.instance(rng, rng.randint(lo, hi))[1]) for _ in range(CHANCE_DRAWS))
        rates.append(max(answers.values()) / CHANCE_DRAWS)
    return sum(rates) / len(rates) if rates else 0.0


def _point(runs: list[tuple[float, float]]) -> dict:
    """One scheme in one ranking unit from its runs' (accuracy, n), one a
    seed: the mean accuracy over seeds, and the band that tells it from
    noise: each seed's Wilson interval, widened by the seeds' spread (the
    lowest low to the highest high); None where a run has no count."""
    bands = [wilson(a * n, n) for a, n in runs if n]
    return {
        "accuracy": round(sum(a for a, _ in runs) / len(runs), 12),  # rounded: equal accuracies compare equal
        "band": (min(b[0] for b in bands), max(b[1] for b in bands)) if len(bands) == len(runs) else None,
    }


def _ranks_shared(points: dict[str, dict]) -> dict[str, float]:
    """1 + the number of schemes above: equal accuracies share the better rank."""
    return {s: 1 + sum(q["accuracy"] > p["accuracy"] for q in points.values()) for s, p in points.items()}


def _ranks_averaged(points: dict[str, dict]) -> dict[str, float]:
    """Equal accuracies share the mean of the ranks they span (two tied for
    first both rank 1.5)."""
    out = {}
    for s, p in points.items():
        above = sum(q["accuracy"] > p["accuracy"] for q in points.values())
        level = sum(q["accuracy"] == p["accuracy"] for q in points.values())
        out[s] = above + (level + 1) / 2
    return out


def _ranks_by_intervals(points: dict[str, dict]) -> dict[str, float]:
    """1 + the number of schemes above beyond both intervals: schemes whose
    intervals overlap are tied, and share the better rank."""
    return {s: 1 + sum(q["band"][0] > p["band"][1] for q in points.values()) for s, p in points.items()}


# (reading, its units, its ranking): the claim is read under each; the last is this rule's own.
READINGS = (
    ("per task, ties share the better rank (the earlier rule)", "tasks", _ranks_shared),
    ("per task, tied ranks averaged", "tasks", _ranks_averaged),
    ("per task x size bucket", "buckets", _ranks_shared),
    ("learned tasks only", "learned", _ranks_shared),
    ("ties by 95% interval overlap", "tasks", _ranks_by_intervals),
    ("learned tasks, ties by 95% interval overlap (this rule's)", "learned", _ranks_by_intervals),
)


def _units(rows: list[dict], present: list[str], tasks: set) -> tuple[dict, dict]:
    """The ranking units: per task, and per task and size bucket past the
    training sizes (the buckets every present scheme was scored on), each
    {unit: {scheme: point}}."""
    per_task, per_bucket = {}, {}
    for r in rows:
        if r["method"] == "none" and r["scheme"] in present and r["task"] in tasks:
            per_task.setdefault(r["task"], {}).setdefault(r["scheme"], []).append((r["accuracy"], r.get("n")))
            for b in r.get("buckets") or []:
                unit = per_bucket.setdefault((r["task"], b["label"]), {})
                unit.setdefault(r["scheme"], []).append((b["accuracy"], b.get("n")))
    points = lambda units: {
        u: {s: _point(v) for s, v in by.items()} for u, by in units.items() if len(by) == len(present)
    }
    return points(per_task), points(per_bucket)


def _learned(rows: list[dict], present: list[str], task: str) -> bool:
    """At least one run of the task (any scheme ranked, any seed) has its
    whole 95% Wilson interval of exact match past the training sizes above
    the task's chance rate by LEARNED_MARGIN: where none has, every scheme is
    at chance (or 0) and the task cannot rank them."""
    runs = [r for r in rows if r["task"] == task and r["method"] == "none" and r["scheme"] in present]
    sizes = tuple(sorted({tuple(b["sizes"]) for r in runs for b in r.get("buckets") or []}))
    floor = chance_rate(task, sizes) + LEARNED_MARGIN
    return any(r.get("n") and wilson(r["accuracy"] * r["n"], r["n"])[0] > floor for r in runs)


def _mrr(units: dict, rank) -> dict[str, float]:
    total = {}
    for points in units.values():
        for s, r in rank(points).items():
            total[s] = total.get(s, 0.0) + 1 / r
    return {s: v / len(units) for s, v in total.items()}


@rule(
    ("above", "below"),
    lambda c: (
        f"mean reciprocal rank over the learned tasks, exact match past the training sizes, ties by 95% "
        f"interval overlap: each of {', '.join(c['above'])} > each of {', '.join(c['below'])}, under every "
        f"reading of the sensitivity table (under some only: not robust)"
        + (f" ({', '.join(c['extra'])} ranked too, not in the claim)" if c.get("extra") else "")
    ),
    rows="task",
)
def task_mrr(claim: dict, rows: list[dict]) -> Verdict:
    """Mean reciprocal rank over tasks, the aggregation of Kazemnejad et al.
    (2023): section 4 reports the mean ranking of the encodings compared
    against each other over all tasks, after HELM (Liang et al., 2022), and
    Figure 1 plots it as the mean reciprocal rank over their 10 tasks; the
    authors' code (McGill-NLP/length-generalization,
    notebooks/plot_aggregate_final.ipynb: get_mrr_df and
    compute_mean_reciprocal_rank) ranks the encodings by test exact match in
    each (dataset, length split, seed), breaking equal accuracies by row
    order (pandas rank(method="first")), and averages 1 / rank.

    Here a unit is a task (its seeds' mean exact match past the training
    sizes); equal accuracies cannot be broken by row order, and at this
    scale many are equal (every scheme at 0), so the claim is read under
    every reading of READINGS: ties shared or averaged, tasks or task x size
    buckets as units, every task or only the learned ones (`_learned`:
    tasks no scheme learned are not comparable, they rank nothing), ties by
    accuracy or by interval overlap (each run's 95% Wilson interval, widened
    by the seed spread). The rule's own reading is the last: learned tasks,
    ties by intervals. The claim, every scheme in `above` with a higher MRR
    than every scheme in `below` (`extra` schemes ranked and shown, not in
    the claim), is matched where it holds under every reading, not matched
    where under none, and not robust where under some."""
    names = list(claim["above"]) + list(claim["below"])
    ranked = names + [n for n in claim.get("extra", []) if n not in names]
    run = lambda n: {r["task"] for r in rows if r["scheme"] == n and r["method"] == "none"}
    absent = [n for n in names if not run(n)]
    if not rows or len(absent) == len(names):
        return Verdict("no task sweep with any of " + ", ".join(names), NOT_COMPARABLE)
    present = [n for n in ranked if run(n)]
    tasks = set.intersection(*[run(n) for n in present])
    if not tasks:
        return Verdict("no task that every one of " + ", ".join(present) + " was run on", NOT_COMPARABLE)
    per_task, per_bucket = _units(rows, present, tasks)
    learned = {t: p for t, p in per_task.items() if _learned(rows, present, t)}
    unlearned = sorted(set(per_task) - set(learned))
    units = {"tasks": per_task, "buckets": per_bucket, "learned": learned}
    lacking = [t for t, by in per_task.items() if any(p["band"] is None for p in by.values())]
    if lacking or not per_bucket or not learned:
        why = (
            f"no counts to make intervals of for {', '.join(sorted(lacking))}"
            if lacking
            else "no size buckets to rank"
            if not per_bucket
            else f"no scheme learned any of the {len(per_task)} tasks past the training sizes"
        )
        return Verdict(f"not comparable: {why}", NOT_COMPARABLE)
    sensitivity = []
    for reading, unit, rank in READINGS:
        mrr = _mrr(units[unit], rank)
        high, low = [mrr[n] for n in claim["above"] if n in mrr], [mrr[n] for n in claim["below"] if n in mrr]
        holds = bool(high and low) and min(high) > max(low)
        sensitivity.append({"reading": reading, "units": len(units[unit]), "mrr": mrr, "holds": holds})
    own = sensitivity[-1]["mrr"]
    order = sorted(present, key=own.get, reverse=True)
    for s in sensitivity:
        s["mrr"] = {n: s["mrr"][n] for n in order}
    held = [s["reading"] for s in sensitivity if s["holds"]]
    shown = (
        " > ".join(f"{n} {own[n]:.2f}" for n in order)
        + f" (mean reciprocal rank over the {len(learned)} learned task{'s' * (len(learned) != 1)} of {len(per_task)}, "
        + "ties by 95% intervals"
        + (f"; not comparable, no scheme learned them: {', '.join(unlearned)}" if unlearned else "")
        + f"); the claim holds under {len(held)} of {len(READINGS)} readings"
        + (f" ({'; '.join(held)})" if 0 < len(held) < len(READINGS) else "")
    )
    if absent:
        return Verdict(f"not comparable: no {', '.join(absent)} run; {shown}", NOT_COMPARABLE)
    verdict = MATCHED if len(held) == len(READINGS) else NOT_MATCHED if not held else NOT_ROBUST
    return Verdict(shown, verdict, sensitivity)


@rule(
    ("series", "reference"),
    lambda c: (
        f"PPL of {c['series']} above {c['reference']}'s at every evaluated length, beyond the intervals (for two "
        f"series of one model, the paired interval of their ratio on the same windows)"
    ),
)
def worse_everywhere(claim: dict, rows: list[dict]) -> Verdict:
    """The series has a higher PPL than the reference at every length both were
    evaluated at, each beyond the intervals."""
    s, ref = _series(rows, claim["series"]), _series(rows, claim["reference"])
    ks = sorted(k for k in s if k in ref and "ppl" in s[k] and "ppl" in ref[k])
    if not ks:
        return Verdict(f"no length with both {claim['series']} and {claim['reference']}", NOT_COMPARABLE)
    shown = "; ".join(
        f"{k:g} x L: {_shown(claim['series'], s[k], 'ppl')} vs {_shown(claim['reference'], ref[k], 'ppl')}"
        + (f" (ratio {_paired_text(p)}, paired)" if (p := _pair(s[k], ref[k])) else "")
        for k in ks
    )
    if not all(_decidable(s[k], ref[k], "ppl") for k in ks):
        return Verdict(f"{shown}; no intervals or seeds in this study to tell them from noise", NOT_COMPARABLE)
    sep = {k: _separated(ref[k], s[k], "ppl") for k in ks}
    better = [f"{k:g}" for k, v in sep.items() if v is False]
    tied = [f"{k:g}" for k, v in sep.items() if v is None]
    if better:
        return Verdict(
            f"{shown}; lower than {claim['reference']} beyond the intervals at {', '.join(better)} x L", NOT_MATCHED
        )
    if tied:
        return Verdict(f"{shown}; within the intervals at {', '.join(tied)} x L", TIED)
    return Verdict(shown, MATCHED)


def _at_length(rows: list[dict], name: str, length: int) -> dict:
    """A series' point at an absolute length (runs fine-tuned at different
    lengths record different training lengths, so multipliers do not line up)."""
    lens = [r["train_len"] for r in _series_rows(rows, name) if r.get("length") == length]
    if not lens:
        return {}
    return _series(rows, name).get(round(length / min(lens), 6)) or {}


@rule(
    ("series", "references", "length", "max_ratio"),
    lambda c: (
        f"PPL of {c['series']} at {c['length']} tokens at most {c['max_ratio']} x the best of "
        f"{', '.join(c['references'])}'s, the ratio's whole interval"
    ),
)
def close_to(claim: dict, rows: list[dict]) -> Verdict:
    """The series' PPL at `length` tokens is at most max_ratio times the best
    of the references' (the lowest PPL there), read on the ratio's interval:
    from the ends of the two intervals (lowest over highest, highest over
    lowest), as the two are not paired: wide intervals are no evidence of
    closeness, and no evidence against it either (tied)."""
    length = int(claim["length"])
    s = _at_length(rows, claim["series"], length)
    refs = {n: _at_length(rows, n, length) for n in claim["references"]}
    missing = [n for n, p in [(claim["series"], s), *refs.items()] if p.get("ppl") is None]
    if missing:
        return Verdict(f"no {', '.join(missing)} result at {length} tokens", NOT_COMPARABLE)
    best = min(refs, key=lambda n: refs[n]["ppl"])
    ratio = s["ppl"] / refs[best]["ppl"]
    shown = f"{_shown(claim['series'], s, 'ppl')} vs {_shown(best, refs[best], 'ppl')} (ratio {ratio:.2f}"
    if "ppl_band" not in s or "ppl_band" not in refs[best]:
        return Verdict(f"{shown}) at {length} tokens; {NO_INTERVALS}", NOT_COMPARABLE)
    band = (s["ppl_band"][0] / refs[best]["ppl_band"][1], s["ppl_band"][1] / refs[best]["ppl_band"][0])
    shown += f" [{band[0]:.2f}, {band[1]:.2f}]) at {length} tokens"
    verdict = in_band(band, hi=claim["max_ratio"])
    if verdict == TIED:
        return Verdict(f"{shown}; the ratio's interval straddles {claim['max_ratio']}", TIED)
    return Verdict(shown, verdict)


@rule(
    ("method", "better", "worse"),
    lambda c: (
        f"test PPL of {c['better']} below {c['worse']}'s at every target of the {c['method']} search, "
        f"beyond the paired interval of their ratio (else both intervals)"
    ),
    rows="search",
)
def search_beats(claim: dict, rows: list[dict]) -> Verdict:
    """In every search of `method`, the test PPL of the row `better` (e.g.
    "longrope searched") is below that of `worse` (e.g. "yarn defaults")
    beyond the noise, at every target searched: the paired interval of their
    ratio (same windows) below 1 where the search reports it, else both
    intervals apart."""
    mine = [r for r in rows if r["method"] == claim["method"]]
    targets = sorted({r["target"] for r in mine})
    if not targets:
        return Verdict(f"no {claim['method']} search", NOT_COMPARABLE)
    parts, verdicts = [], []
    for t in targets:
        at = {r["label"]: r for r in mine if r["target"] == t}
        b, w = at.get(claim["better"]), at.get(claim["worse"])
        if not b or not w or b.get("ppl") is None or w.get("ppl") is None:
            return Verdict(
                f"the {claim['method']} search at {t} lacks {claim['better']} or {claim['worse']}", NOT_COMPARABLE
            )
        pts = {
            n: {"ppl": r["ppl"], **({"ppl_band": (r["ppl_lo"], r["ppl_hi"])} if r.get("ppl_lo") is not None else {})}
            for n, r in ((claim["better"], b), (claim["worse"], w))
        }
        parts.append(f"{t} ({t / b['train_len']:g} x L): " + " vs ".join(_shown(n, p, "ppl") for n, p in pts.items()))
        pair = b.get("paired", {}).get(f"{claim['better']} / {claim['worse']}") or {}
        if pair.get("lo") is not None and pair.get("hi") is not None:
            parts[-1] += f", ratio {pair['ratio']:.3f} [{pair['lo']:.3f}, {pair['hi']:.3f}] paired"
            verdicts.append(MATCHED if pair["hi"] < 1 else NOT_MATCHED if pair["lo"] > 1 else TIED)
            continue
        if not all("ppl_band" in p for p in pts.values()):
            verdicts.append(NOT_COMPARABLE)
            continue
        sep = _separated(pts[claim["better"]], pts[claim["worse"]], "ppl")
        verdicts.append(TIED if sep is None else MATCHED if sep else NOT_MATCHED)
    verdict = next(v for v in (NOT_MATCHED, NOT_COMPARABLE, TIED, MATCHED) if v in verdicts)
    return Verdict("; ".join(parts), verdict)


def _accuracy_series(rows: list[dict], name: str, task: str) -> dict[int, dict]:
    return {r["length"]: r for r in _series_rows(rows, name) if r["task"] == task}


@rule(
    ("better", "worse", "multiplier"),
    lambda c: (
        f"{c.get('metric', 'ppl')} at {c['multiplier']} x L: each of {', '.join(c['better'])} below "
        f"{c['worse']}, beyond the intervals (for two series of one model, the paired interval of their ratio on "
        f"the same windows)"
    ),
)
def each_below(claim: dict, rows: list[dict]) -> Verdict:
    """Every series in `better` has a lower `metric` (ppl or ppl_rel) at the
    multiplier than `worse`, beyond the intervals."""
    k, metric = float(claim["multiplier"]), claim.get("metric", "ppl")
    points = {n: _series(rows, n).get(k) or {} for n in [*claim["better"], claim["worse"]]}
    missing = [n for n, p in points.items() if p.get(metric) is None]
    if missing:
        return Verdict(f"no {', '.join(missing)} result at {k:g} x L", NOT_COMPARABLE)
    worse = points[claim["worse"]]
    shown = (
        ", ".join(_shown(n, points[n], metric) for n in claim["better"])
        + f" vs {_shown(claim['worse'], worse, metric)} ({metric} at {k:g} x L)"
    )
    if not all(_decidable(points[n], worse, metric) for n in claim["better"]):
        return Verdict(f"{shown}; no intervals or seeds to tell them from noise", NOT_COMPARABLE)
    sep = {n: _separated(points[n], worse, metric) for n in claim["better"]}
    paired = [f"{n} / {claim['worse']} {_paired_text(p)}" for n in claim["better"] if (p := _pair(points[n], worse))]
    if paired:
        shown += "; paired on the same windows: " + ", ".join(paired)
    if any(v is False for v in sep.values()):
        return Verdict(
            shown + "; above it beyond the intervals: " + ", ".join(n for n, v in sep.items() if v is False),
            NOT_MATCHED,
        )
    if any(v is None for v in sep.values()):
        return Verdict(shown + "; within the intervals: " + ", ".join(n for n, v in sep.items() if v is None), TIED)
    return Verdict(shown, MATCHED)


def _pct(r: dict) -> str:
    return f"{r['accuracy']:.0%}" + (
        f" [{r['accuracy_lo']:.0%}, {r['accuracy_hi']:.0%}]" if r.get("accuracy_lo") is not None else ""
    )


def _has_interval(r: dict) -> bool:
    return r.get("accuracy_lo") is not None and r.get("accuracy_hi") is not None


@rule(
    ("series", "task", "multiplier", "max_ppl_rel", "min_at_l", "max_accuracy"),
    lambda c: (
        f"{c['series']}: PPL({c['multiplier']} x L) / PPL(L) <= {c['max_ppl_rel']} while its {c['task']} "
        f"accuracy, >= {c['min_at_l']:.0%} at L, is <= {c['max_accuracy']:.0%} at {c['multiplier']} x L, "
        f"each whole interval"
    ),
    rows="ppl+retrieval",
)
def ppl_kept_retrieval_lost(claim: dict, rows: dict) -> Verdict:
    """The series keeps its PPL at k x L within `max_ppl_rel` of its PPL at L
    while the task's accuracy, at least `min_at_l` at L, is at most
    `max_accuracy` at k x L: low perplexity that is no evidence of reading the
    context. Every threshold is read on the whole interval; a model not shown
    to retrieve at L (its interval reaching below `min_at_l`) cannot lose
    retrieval past it (not comparable)."""
    k = float(claim["multiplier"])
    p = _series(rows["ppl"], claim["series"]).get(k) or {}
    acc = _accuracy_series(rows["retrieval"], claim["series"], claim["task"])
    if p.get("ppl_rel") is None or not acc:
        return Verdict(
            f"no {claim['series']} {'PPL' if p.get('ppl_rel') is None else claim['task']} result at {k:g} x L",
            NOT_COMPARABLE,
        )
    L0 = next(iter(acc.values()))["train_len"]
    at_l, far = acc.get(L0), acc.get(int(round(k * L0)))
    if at_l is None or far is None:
        return Verdict(f"no {claim['task']} accuracy of {claim['series']} at L and at {k:g} x L", NOT_COMPARABLE)
    band = p.get("ppl_rel_band")
    shown = (
        f"PPL {p['ppl_rel']:.2f}" + (f" [{band[0]:.2f}, {band[1]:.2f}]" if band else "") + f" x its PPL at L at "
        f"{k:g} x L; {claim['task']} {_pct(at_l)} at L, {_pct(far)} at {k:g} x L"
    )
    if band is None or not _has_interval(at_l) or not _has_interval(far):
        return Verdict(f"{shown}; {NO_INTERVALS}", NOT_COMPARABLE)
    if at_l["accuracy_lo"] < claim["min_at_l"]:
        how = "does not retrieve" if at_l["accuracy_hi"] < claim["min_at_l"] else "is not shown to retrieve"
        return Verdict(f"{shown}; it {how} at L ({claim['min_at_l']:.0%} needed)", NOT_COMPARABLE)
    parts = {
        "PPL": in_band(band, hi=claim["max_ppl_rel"]),
        claim["task"]: in_band((far["accuracy_lo"], far["accuracy_hi"]), hi=claim["max_accuracy"]),
    }
    for verdict, why in ((NOT_MATCHED, "above its bound"), (TIED, "straddling its bound")):
        named = [n for n, v in parts.items() if v == verdict]
        if named:
            return Verdict(f"{shown}; {' and '.join(named)} {why}", verdict)
    return Verdict(shown, MATCHED)


@rule(
    ("series", "task", "min", "control"),
    lambda c: (
        f"{c['task']} accuracy of {c['series']} >= {c['min']:.0%} at every length past L, its whole interval, "
        f"and above {c['control']}'s beyond the intervals at one of them"
    ),
    rows="retrieval",
)
def retrieval_kept(claim: dict, rows: list[dict]) -> Verdict:
    """The series' accuracy on the task is at least `min` at every length past
    the training length, each whole interval above it, and above the
    control's (the plain model) beyond the intervals at one such length at
    least: where the plain model retrieves as well, the task at these lengths
    says nothing about the method."""
    s, c = (
        _accuracy_series(rows, claim["series"], claim["task"]),
        _accuracy_series(rows, claim["control"], claim["task"]),
    )
    past = sorted(L for L, r in s.items() if L > r["train_len"])
    if not past:
        return Verdict(f"no {claim['series']} {claim['task']} result past the training length", NOT_COMPARABLE)
    shown = "; ".join(f"{L}: {_pct(s[L])}" + (f" vs {claim['control']} {_pct(c[L])}" if L in c else "") for L in past)
    if not all(_has_interval(s[L]) for L in past):
        return Verdict(f"{shown}; {NO_INTERVALS}", NOT_COMPARABLE)
    bar = {L: in_band((s[L]["accuracy_lo"], s[L]["accuracy_hi"]), lo=claim["min"]) for L in past}
    low = [str(L) for L in past if bar[L] == NOT_MATCHED]
    if low:
        return Verdict(f"{shown}; below {claim['min']:.0%} at {', '.join(low)}", NOT_MATCHED)
    both = [L for L in past if L in c]
    if not both:
        return Verdict(f"{shown}; control missing: no {claim['control']} {claim['task']} run", NOT_COMPARABLE)
    if any(not _has_interval(c[L]) for L in both):
        return Verdict(f"{shown}; no intervals to tell it from the {claim['control']} control", NOT_COMPARABLE)
    straddle = [str(L) for L in past if bar[L] == TIED]
    if straddle:
        return Verdict(f"{shown}; the interval straddles {claim['min']:.0%} at {', '.join(straddle)}", TIED)
    if not any(s[L]["accuracy_lo"] > c[L]["accuracy_hi"] for L in both):
        return Verdict(f"{shown}; {claim['control']} retrieves within the intervals at every length", TIED)
    return Verdict(shown, MATCHED)


# --- schemes paired by seed ---------------------------------------------------------------


def _per_seed(rows: list[dict], name: str) -> dict[float, dict]:
    """multiplier -> {seed: PPL} of one series (the group trained at the
    shortest length); a run without a seed is kept under None. Raises
    Ambiguous where the series names runs that are not seed replicas."""
    mine = _series_rows(rows, name)
    if not mine:
        return {}
    if all(r.get("seed") not in (None, "") for r in mine):
        _series(rows, name)  # the same check as every other rule: seed replicas, or refuse
    pick = min(r["train_len"] for r in mine)
    out = {}
    for r in mine:
        if r["train_len"] == pick and isinstance(r.get("ppl"), float):
            seed = r.get("seed")
            out.setdefault(round(r["ratio"], 6), {})[None if seed in (None, "") else int(seed)] = r["ppl"]
    return out


def _references(claim: dict) -> list[str]:
    ref = claim["reference"]
    return [ref] if isinstance(ref, str) else list(ref)


def _paired_against(claim: dict, rows: list[dict], reference: str) -> tuple[str, str]:
    """(verdict, what decided it) of the series against one reference, paired by seed at every multiplier
    from `from_multiplier` on."""
    name, bound = claim["series"], float(claim.get("max_ratio", 1.0))
    a, b = _per_seed(rows, name), _per_seed(rows, reference)
    ks = sorted(k for k in a if k in b and k >= float(claim["from_multiplier"]))
    if not ks:
        return NOT_COMPARABLE, f"no length >= {claim['from_multiplier']} x L with both {name} and {reference}"
    unseeded = [n for n, s in ((name, a), (reference, b)) if any(None in s[k] for k in ks)]
    if unseeded:
        return NOT_COMPARABLE, (
            f"{' and '.join(unseeded)} ha{'ve' if len(unseeded) > 1 else 's'} runs without a seed (an evaluation "
            f"that does not record its checkpoint's): nothing to pair by seed"
        )
    parts, verdicts = [], {}
    for k in ks:
        common = sorted(set(a[k]) & set(b[k]))
        st = seed_interval(math.log(a[k][s] / b[k][s]) for s in common)
        if st is None:
            return NOT_COMPARABLE, (
                f"{len(common)} seed{'s' * (len(common) != 1)} of both {name} and {reference} at {k:g} x L: the "
                f"t-interval over seeds needs 2 or more"
            )
        ratios = [math.exp(st[c]) for c in ("mean", "lo", "hi")]
        # Four decimals where the whole interval sits within half a percent of 1 (a window control's gain),
        # which three would print as "1.000 [0.999, 1.000]".
        d = 4 if all(abs(r - 1) < 0.005 for r in ratios) else 3
        parts.append(f"{k:g} x L {ratios[0]:.{d}f} [{ratios[1]:.{d}f}, {ratios[2]:.{d}f}]")
        verdicts[k] = in_band((ratios[1], ratios[2]), hi=bound)
        n = st["n"]
    shown = f"{name} / {reference}, paired over {n} seeds: " + "; ".join(parts)
    for verdict, why in ((NOT_MATCHED, "above"), (TIED, "straddling")):
        at = [f"{k:g}" for k, v in verdicts.items() if v == verdict]
        if at:
            return verdict, f"{shown} (interval {why} {bound:g} at {', '.join(at)} x L)"
    return MATCHED, shown


@rule(
    ("series", "reference", "from_multiplier"),
    lambda c: (
        f"PPL of {c['series']} / PPL of {' and of '.join(_references(c))}, paired by seed: the 95% t-interval "
        f"over seeds of the log ratio below ln {float(c.get('max_ratio', 1.0)):g} at every k >= "
        f"{c['from_multiplier']} x L"
    ),
)
def below_across_seeds(claim: dict, rows: list[dict]) -> Verdict:
    """The series has a lower PPL than each reference at every multiplier
    from `from_multiplier` on, across seeds: per seed s the log ratio
    ln(PPL_series,s / PPL_reference,s) on the same windows, and the 95%
    t-interval of its mean over the seeds both ran (compare.py's
    compare_seed_pairs.csv, the same statistics from the same rows: its
    `holds_across_seeds` is the interval excluding 0) wholly below
    ln(max_ratio) (max_ratio 1 unless the claim says: "at or below" is a
    margin such as 1.02). Matched where it is at every such length against
    every reference; not matched where a ratio's interval lies wholly above
    the bound at one length; tied where an interval straddles it (training
    noise decides); not comparable without a length both ran, with fewer
    than 2 common seeds, or with runs that carry no seed."""
    found = [(ref, *_paired_against(claim, rows, ref)) for ref in _references(claim)]
    verdict = next(v for v in (NOT_MATCHED, NOT_COMPARABLE, TIED, MATCHED) if any(f[1] == v for f in found))
    return Verdict("; ".join(why for _, _, why in found), verdict)


# --- a task solved past the training sizes where the control fails -------------------------


def _task_point(rows: list[dict], scheme: str, task: str, where: str = "beyond") -> dict | None:
    """The scheme's exact match on the task past the training sizes (where="beyond") or inside
    them (where="inside"), over its seeds."""

    def pick(r):
        if where == "beyond":
            return r["accuracy"], r.get("n")
        inside = r.get("inside") or {}
        return inside.get("accuracy"), inside.get("n")

    runs = [pick(r) for r in rows if r["scheme"] == scheme and r["task"] == task]
    runs = [(a, n) for a, n in runs if a is not None]
    return {**_point(runs), "runs": len(runs)} if runs else None


def _shown_task(name: str, p: dict) -> str:
    band = p["band"]
    return (
        f"{name} {p['accuracy']:.0%}"
        + (f" [{band[0]:.0%}, {band[1]:.0%}]" if band else "")
        + (f" ({p['runs']} seeds)" if p["runs"] > 1 else "")
    )


@rule(
    ("series", "control", "tasks", "min", "max_control"),
    lambda c: (
        f"exact match {_WHERE[_where(c)]} on each of {', '.join(c['tasks'])}: {c['series']} >= {c['min']:.0%} "
        f"and {c['control']} <= {c['max_control']:.0%}, each whole interval (Wilson, widened by the seed spread)"
    ),
    rows="task",
)
def task_solved_where_control_fails(claim: dict, rows: list[dict]) -> Verdict:
    """On every task of `tasks`, the series solves the task past the
    training sizes (its exact match there, seeds' mean, the whole 95%
    Wilson interval widened by the seeds' spread at least `min`) where the
    control does not (its whole interval at most `max_control`). With
    `where: inside` the same is read inside the training sizes: for a test
    split (`<task>@<split>`, scripts/task.py's eval.splits) that is the
    trained sizes drawn at other settings, as CoPE's dense and sparse splits
    are. Not matched where the series' interval lies wholly below `min` or
    the control's wholly above `max_control` on one task (the control solves
    it too: the task says nothing of the scheme); tied where an interval
    straddles its bound; not comparable where a task lacks a run of either
    or a count to make an interval of."""
    methods = [r for r in rows if r["method"] == "none"]
    where = _where(claim)
    parts, verdicts = [], []
    for task in claim["tasks"]:
        s = _task_point(methods, claim["series"], task, where)
        c = _task_point(methods, claim["control"], task, where)
        if s is None or c is None:
            missing = " and ".join(n for n, p in ((claim["series"], s), (claim["control"], c)) if p is None)
            parts.append(f"{task}: no {missing} run")
            verdicts.append(NOT_COMPARABLE)
            continue
        parts.append(f"{task}: {_shown_task(claim['series'], s)} vs {_shown_task(claim['control'], c)}")
        if s["band"] is None or c["band"] is None:
            parts[-1] += " (no counts to make intervals of)"
            verdicts.append(NOT_COMPARABLE)
            continue
        mine, theirs = in_band(s["band"], lo=claim["min"]), in_band(c["band"], hi=claim["max_control"])
        if NOT_MATCHED in (mine, theirs):
            parts[-1] += (
                " ("
                + " and ".join(
                    w
                    for w, v in (
                        (f"{claim['series']} below {claim['min']:.0%}", mine),
                        (f"{claim['control']} above {claim['max_control']:.0%}", theirs),
                    )
                    if v == NOT_MATCHED
                )
                + ")"
            )
            verdicts.append(NOT_MATCHED)
        elif TIED in (mine, theirs):
            parts[-1] += " (an interval straddles its bound)"
            verdicts.append(TIED)
        else:
            verdicts.append(MATCHED)
    verdict = next(v for v in (NOT_MATCHED, NOT_COMPARABLE, TIED, MATCHED) if v in verdicts)
    return Verdict("; ".join(parts) + f" (exact match {_WHERE[where]})", verdict)


_WHERE = {"beyond": "past the training sizes", "inside": "inside the training sizes"}


def _where(claim: dict) -> str:
    where = claim.get("where", "beyond")
    if where not in _WHERE:
        raise ConfigError(
            f"Claim {claim.get('id', '?')!r}: where={where!r} must be beyond (past the training sizes, the default) "
            f"or inside (the training sizes: a test split's other settings at the trained sizes)."
        )
    return where
