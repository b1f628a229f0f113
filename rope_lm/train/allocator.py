"""The CPU allocator policy for training: keep freed activation-sized blocks
for reuse. A process-wide setting, so it is switched explicitly by the
training entry point (KeepFreedMemory, a Lightning callback) and by the
benchmark, never by a model's forward pass."""

import ctypes
import os
import sys

import lightning as L

_MALLOC_KEEP_BYTES = 1 << 30
_MALLOC_DEFAULT_BYTES = 128 * 1024  # glibc's initial mmap and trim thresholds
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_malloc_state: dict = {}


def _mallopt(mmap_threshold: int, trim_threshold: int) -> bool:
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
        )
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def keep_freed_memory(training: bool = True) -> bool:
    """While training, ask glibc malloc to keep freed blocks up to 1 GiB for
    reuse instead of handing them back to the kernel.

    By default glibc serves every block of 32 MiB or more (the logits and
    their gradients, e.g. 2048 tokens x 4096 vocabulary in float32) from a
    fresh mmap, so each training step page-faults and zero-fills them anew:
    13 ms per 32 MiB block on this project's CPU, 8% of a tiny-model step.
    A training step allocates the same sizes every time, so kept blocks are
    simply reused. Evaluation is different: over a long sequence the blocked
    attention allocates ever larger blocks between small ones it keeps, and a
    heap that never returns memory fragments (measured: 2 GB instead of 0.5 GB
    at 16k tokens); so outside training the thresholds go back to glibc's
    128 KiB (if this process raised them) and big blocks are mmapped again.

    Set for the span of training by the KeepFreedMemory callback that the
    training entry point installs (and by the benchmark); costs a dict lookup
    unless the mode changes. ROPE_LM_KEEP_FREED_MEMORY=0 leaves malloc alone.
    Returns whether freed memory is being kept."""
    mode = bool(training)
    if _malloc_state.get("mode") is mode:
        return _malloc_state.get("kept", False)
    _malloc_state["mode"] = mode
    allowed = os.environ.get("ROPE_LM_KEEP_FREED_MEMORY", "1") != "0" and sys.platform.startswith("linux")
    if mode and allowed:
        _malloc_state["kept"] = _mallopt(_MALLOC_KEEP_BYTES, _MALLOC_KEEP_BYTES)
    elif _malloc_state.get("kept"):
        _mallopt(_MALLOC_DEFAULT_BYTES, _MALLOC_DEFAULT_BYTES)
        _malloc_state["kept"] = False
    return _malloc_state.get("kept", False)


class KeepFreedMemory(L.Callback):
    """keep_freed_memory(True) while fit runs, back to glibc's defaults after,
    so the evaluation that follows fragments nothing."""

    def on_fit_start(self, trainer, pl_module):
        keep_freed_memory(True)

    def on_fit_end(self, trainer, pl_module):
        keep_freed_memory(False)

    def on_exception(self, trainer, pl_module, exception):
        keep_freed_memory(False)
