"""torch.compile with a clear fallback where compilation is unavailable."""

import logging
import os
import shutil

import torch
from torch import nn

log = logging.getLogger("rope_lm.train.compile")


def _no_cpu_compiler() -> str | None:
    """Why inductor cannot build CPU kernels here, or None if it probably can.
    Checked up front because inductor otherwise fails deep inside the first
    call with a long traceback about a missing compiler."""
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return None
    if any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return None
    return "no C++ compiler (g++, c++ or clang++, or $CXX) was found, and inductor needs one for CPU kernels"


class CompiledForward(nn.Module):
    """``module`` run through ``torch.compile``, falling back to the eager
    module, once and with one warning, if compiling fails; ``compiled`` tells
    which is in use.

    It is an nn.Module that shares the wrapped module's parameters, buffers
    and submodules (the same dicts, not copies), so it can stand wherever the
    module stood, e.g. LitLM's ``_forward`` child: parameters(), train()/eval(),
    .to() and the state_dict keys are exactly the module's, and checkpoints of
    compiled and uncompiled runs are interchangeable (torch.compile's own
    wrapper would prefix every key with ``_orig_mod.``)."""

    def __init__(self, module: nn.Module, **compile_kwargs):
        super().__init__()
        for shared in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            object.__setattr__(self, shared, getattr(module, shared))
        object.__setattr__(self, "module", module)  # not registered: its contents already are
        self.compiled = False
        self.reason: str | None = None
        self._checked_device = False
        # Plain attributes, never registered: the shared _modules dict is the
        # wrapped module's own, which must not come to contain itself.
        object.__setattr__(self, "_fn", module)
        try:
            object.__setattr__(self, "_fn", torch.compile(module, **compile_kwargs))
            self.compiled = True
        except Exception as e:  # compile() itself rejects some platforms (Python versions, Windows) up front
            self._fall_back(f"{type(e).__name__}: {e}")

    def _fall_back(self, reason: str):
        self.reason = reason
        self.compiled = False
        object.__setattr__(self, "_fn", self.module)
        log.warning(
            "torch.compile is unavailable (%s); running uncompiled. Set trainer.compile=false to silence this.", reason
        )

    def forward(self, *args, **kwargs):
        if self.compiled and not self._checked_device:
            self._checked_device = True
            on_cpu = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
            why = _no_cpu_compiler() if on_cpu else None
            if why:
                self._fall_back(why)
        if not self.compiled:
            return self.module(*args, **kwargs)
        try:
            return self._fn(*args, **kwargs)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self._fall_back(f"failed on first use: {type(e).__name__}: {first}")
            return self.module(*args, **kwargs)


def maybe_compile(module: nn.Module, **compile_kwargs) -> CompiledForward:
    """``module`` behind torch.compile, or the module itself, with a warning,
    if compiling fails (no C++ compiler, unsupported platform)."""
    return CompiledForward(module, **compile_kwargs)
