"""FIRE's bias past its L at CPU inference, written straight into SDPA's mask.

Past L the bias of query i depends on i itself (the normaliser psi(i)), so no
one-row Toeplitz view serves it and every block of queries needs its own
(H, Tq, Tk) values. Built from torch ops, that block costs a search, two
gathers per head and several passes over memory, about ten times the
attention itself at 16k tokens (docs/benchmarks.md). This loop (numba,
parallel over queries) makes one pass: per query row it computes
x_j = psi(i - j) / den_i once, finds where x crosses each knot of the
piecewise-linear f (x never grows with j, so a binary search per knot
suffices), and writes slope * x + intercept per head and segment, with -inf
outside the causal (and window) range, so the buffer is the whole mask.

The values are those of ``Fire._piecewise`` (the same float32 x, the same
segment for every x, one multiply and one add per value), so the two paths
agree to the last bit on this machine (tests/test_attention.py).
"""

import functools
import importlib.util

import numpy as np
import torch

_kernel = None


@functools.cache
def available() -> bool:
    # Without numba the torch path (Fire._piecewise) serves; this one is only faster.
    return importlib.util.find_spec("numba") is not None


def _compile():
    global _kernel
    if _kernel is None:
        import numba  # imported here: a second of start-up that only FIRE past its L needs

        @numba.njit(parallel=True, cache=True, boundscheck=False, nogil=True)
        def masked_bias(psi, den, q0, window, knots, slope, intercept, out):
            H, Tq, Tk = out.shape
            ninf = np.float32(-np.inf)
            for a in numba.prange(Tq):
                i = q0 + a
                lo = max(0, i - window + 1) if window > 0 else 0
                n = min(i, Tk - 1) + 1  # keys lo .. n - 1 are seen
                for h in range(H):
                    out[h, a, :lo] = ninf
                    out[h, a, n:] = ninf
                if lo >= n:
                    continue
                m = n - lo
                # x of keys lo .. n - 1, i.e. of distances i - lo down to i - n + 1
                x = np.empty(m, np.float32)
                distances = psi[i - n + 1 : i - lo + 1][::-1]
                for c in range(m):
                    x[c] = distances[c] / den[i]
                seg = np.searchsorted(knots, x[0])  # knots < x: torch.bucketize's segment
                start = 0
                while start < m:
                    if seg == 0:
                        end = m
                    else:  # the segment lasts while x > its lower knot
                        knot, lo_s, hi_s = knots[seg - 1], start, m
                        while lo_s < hi_s:
                            mid = (lo_s + hi_s) // 2
                            if x[mid] > knot:
                                lo_s = mid + 1
                            else:
                                hi_s = mid
                        end = lo_s
                    # 1-D slices: loops over them vectorise (3-D indexing did
                    # not, and ran 3.6x slower)
                    xs = x[start:end]
                    for h in range(H):
                        s, b = slope[seg, h], intercept[seg, h]
                        row = out[h, a, lo + start : lo + end]
                        for c in range(xs.shape[0]):
                            row[c] = s * xs[c] + b
                    start = end
                    seg -= 1

        _kernel = masked_bias
    return _kernel


def masked_bias(out, psi, den, q0: int, window: int | None, knots, slope, intercept):
    """Fill out (H, Tq, Tk), float32, contiguous, on the CPU: entry (h, a, j)
    is slope[s, h] * x + intercept[s, h] for x = psi[i - j] / den[i] and i =
    q0 + a, where s counts the knots below x; -inf where j > i or i - j >=
    window. psi is indexed by the distance, den by the query's index."""
    import numba

    kernel = _compile()
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    arrays = [t.detach().numpy() for t in (psi, den, knots, slope, intercept, out)]
    kernel(arrays[0], arrays[1], int(q0), int(window or 0), *arrays[2:])
    return out
