"""What scoring one length cost: wall seconds and peak memory, recorded in each
row of results.json so a study can put a method's price beside its perplexity.

Peak memory is the device's own high-water mark over that length alone: on CUDA
torch's max_memory_allocated after a reset, on a CPU the process's peak resident
memory (VmHWM) after the kernel's mark is moved back to the current RSS (Linux >=
4.0, /proc/self/clear_refs). The CPU figure includes the weights and whatever
else the process holds; where the mark cannot be reset the row says so instead
of reporting a process-lifetime peak as this length's."""

from contextlib import contextmanager
import time

import torch

# The keys a row of results.json gets from measured(): what scoring it cost, not what it measured.
COST_KEYS = ("seconds", "peak_memory_mb", "peak_memory")


def status_kb(key: str) -> int | None:
    """A field of /proc/self/status in kB (VmRSS, VmHWM, ...); None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_cpu_peak() -> bool:
    """Move the kernel's peak-RSS mark back to the current RSS; False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return status_kb("VmHWM") is not None


def _cuda_device(device) -> torch.device | None:
    device = torch.device(device) if device is not None else None
    return device if device is not None and device.type == "cuda" else None


@contextmanager
def measured(device=None):
    """Yields a dict that holds, after the block, `seconds`, `peak_memory_mb`
    (None where it could not be measured) and `peak_memory` (what the figure
    is, or why it is missing)."""
    cost: dict = {}
    cuda = _cuda_device(device)
    if cuda is not None:
        torch.cuda.synchronize(cuda)
        torch.cuda.reset_peak_memory_stats(cuda)
        kind = "cuda max_memory_allocated"
    else:
        kind = "peak resident memory of the process (VmHWM)" if reset_cpu_peak() else None
    start = time.perf_counter()
    try:
        yield cost
    finally:
        if cuda is not None:
            torch.cuda.synchronize(cuda)
            peak = torch.cuda.max_memory_allocated(cuda) / 2**20
        else:
            kb = status_kb("VmHWM") if kind else None
            peak = kb / 1024 if kb is not None else None
        cost.update(
            seconds=time.perf_counter() - start,
            peak_memory_mb=peak,
            peak_memory=kind or "not measured: the peak-RSS mark cannot be reset here (/proc/self/clear_refs)",
        )
