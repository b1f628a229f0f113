"""Extrapolation methods, registered by name (see docs/methods.md).

One module a method, named as the method (pi.py is `scaling=pi`), each a
ScalingMethod subclass decorated with ``@METHODS.register("name")`` plus a
conf/scaling/<name>.yaml; every module here is imported on first use. What
several methods share sits in underscore modules, which the registry skips:
_frequency.py (FrequencyMethod, RampMethod) and _two_pass_map.py (TwoPassMap).
The RoPE frequency formulas are pure functions in rope_lm/positional/frequencies.py.
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
