"""The device a model is opened on: `auto` picks a GPU when there is one, and
a device that this machine does not have is refused in one paragraph (torch's
own answer is an AssertionError raised from deep inside the first `.to()`)."""

import torch

from rope_lm.core.errors import ConfigError


def resolve_device(name, setting: str = "device") -> str:
    name = "auto" if name is None else str(name)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{setting}={name!r} is not a device; use cpu, cuda, cuda:N or auto.") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"{setting}={name} but this machine has no CUDA device (torch {torch.__version__}"
                f"{'' if torch.version.cuda else ', a CPU-only build'}); use {setting}=cpu, or {setting}=auto to "
                f"take a GPU where there is one."
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"{setting}={name} but this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}."
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{setting}={name} but this machine has no Apple GPU (MPS); use {setting}=cpu or auto.")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{setting}={name!r}: rope-lm runs on cpu, cuda or mps; use one of those or auto.")
    return name
