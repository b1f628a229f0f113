"""Extrapolation methods, registered by name (see docs/methods.md).

Every module here is imported on first use; a method is a ScalingMethod
subclass decorated with ``@METHODS.register("name")`` plus a
conf/scaling/<name>.yaml. frequencies.py holds the RoPE frequency formulas as
pure functions.
"""

from rope_lm.core.errors import ConfigError
from rope_lm.scaling.base import METHODS, ScalingMethod, methods_for


def build_scaling(options: dict | None) -> ScalingMethod:
    return METHODS.build(options, default="none")


def method_label(options: dict | None) -> str:
    """The one name of a method with its settings (e.g. "yarn-x4"), as results,
    run names, tags and comparison rows show it. Options that do not build (a
    setting refused later, with context, by the run's own checks) keep their name."""
    try:
        return build_scaling(options).label
    except ConfigError:
        return str((options or {}).get("name", "none"))


__all__ = ["METHODS", "ScalingMethod", "build_scaling", "method_label", "methods_for"]
