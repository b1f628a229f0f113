"""Telling rows apart from noise, for every comparison: two rows are within
noise of each other when their intervals overlap (within_noise), and a run is
read against the window-L control (a model whose attention is cut to the last
L keys) by where its interval lies from the control's (against_control).

Over seeds (training noise, which no single run's bootstrap interval holds):
a difference measured once per seed, as the log of a PPL ratio on the same
windows, is summarised by its mean and sd over the n seeds and a 95%
t-interval, mean ± t_{0.975, n-1} · sd / √n (seed_interval); it holds across
seeds only when that interval excludes 0 (a ratio of 1), and is within
training noise otherwise (seed_verdict)."""

import math

WINDOW_CONTROL = "window"  # the method whose series is the window-L control (attention cut to the last L keys)
LEVEL = 0.95
HOLDS = "holds"
WITHIN_TRAINING_NOISE = "within training noise"


def within_noise(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Two rows are within noise of each other when their noise intervals
    overlap; None (not judged) when either has no interval."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def against_control(mine: tuple, control: tuple, shown: str, higher_is_better: bool) -> str:
    """A window-control verdict from two (lo, hi) intervals: **yes** where this run is better beyond
    both, no where worse beyond both, tied where they overlap."""
    above, below = mine[0] > control[1], mine[1] < control[0]
    better, worse = (above, below) if higher_is_better else (below, above)
    return f"**yes** ({shown})" if better else f"no ({shown})" if worse else f"tied ({shown})"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (p in (0.5, 1)), by bisection of t_cdf:
    t_quantile(0.975, 2) = 4.303."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def seed_interval(values) -> dict | None:
    """mean, sd (n - 1 in the denominator) and the 95% t-interval of the mean
    of per-seed values: mean ± t_{0.975, n-1} · sd / √n; None with fewer than
    two seeds. The interval includes training noise: each value is one
    trained model's."""
    v = [float(x) for x in values]
    n = len(v)
    if n < 2:
        return None
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    t = t_quantile(0.5 + LEVEL / 2, n - 1)
    half = t * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "t": t, "lo": mean - half, "hi": mean + half}


def seed_verdict(interval: dict | None) -> str | None:
    """HOLDS where the t-interval of a per-seed log ratio excludes 0, WITHIN_TRAINING_NOISE where it does
    not; None (not judged) without an interval."""
    if interval is None:
        return None
    return HOLDS if interval["lo"] > 0 or interval["hi"] < 0 else WITHIN_TRAINING_NOISE
