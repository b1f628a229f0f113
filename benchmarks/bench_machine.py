"""What the benchmark records about the machine it runs on (CPU, load,
versions, the compute peak MFU is taken against) and the process-level
clocks and memory marks its measurements read."""

import os
import platform
import resource
import time

import torch

# The process's memory as /proc/self/status gives it, shared with the evaluation's per-length peaks.
from rope_lm.eval.cost import status_kb as _status_kb


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info(device: str, threads: int) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def v(package):  # without importing it: the coordinator never needs these modules
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    info = {
        "nproc": usable_cpus(),
        "cpu": cpu_model(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": v("transformers"),
        "lightning": v("lightning"),
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _peak_rss_kb() -> int:
    hwm = _status_kb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# Dense bf16 tensor-core peaks (TFLOP/s) used for MFU when --peak-tflops is not given.
CUDA_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10G": 70.0,
    "L4": 121.0,
    "RTX 4090": 165.0,
    "A6000": 155.0,
}


def detect_peak_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    for key, tflops in CUDA_PEAK_TFLOPS.items():
        if key in name:
            return tflops
    return None


def matmul_peak_tflops(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 TFLOP/s of an n x n x n matmul on this CPU with `threads`
    threads: the measured ceiling CPU MFU is taken against (not a datasheet)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best / 1e12


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu_seconds() -> float:
    """CPU time of the whole process (all threads), user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()
