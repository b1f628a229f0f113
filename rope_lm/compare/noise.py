"""Telling rows apart from noise, for every comparison: two rows are within
noise of each other when their intervals overlap (within_noise), and a run is
read against the window-L control (a model whose attention is cut to the last
L keys) by where its interval lies from the control's (against_control)."""

WINDOW_CONTROL = "window"  # the method whose series is the window-L control (attention cut to the last L keys)


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
