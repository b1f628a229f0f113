"""Log-n ("entropy-invariant") logit scaling (Chiang & Cholak, 2022; Su, 2021).

The logits of the query at 0-based index i are multiplied by
max(1, log n / log L), with n = i + 1 the number of keys it attends to
(itself included) and L the training length, so attention entropy does not
grow with the context; n <= L is the identity. Works with every scheme via
AttnPlan.q_scale. `scaling=logn` is direct extrapolation plus log-n; any
other method takes `logn: true` to add it (label e.g. ``ntk+logn``).
See rope_lm/scaling/base.py for when it acts (evaluation only by default).
"""

from rope_lm.core.errors import ConfigError
from rope_lm.scaling.base import METHODS, ScalingMethod


@METHODS.register("logn")
class LogN(ScalingMethod):
    def __init__(self, logn: bool = True, **common):
        if logn is not True:
            raise ConfigError("scaling=logn with scaling.logn=false is direct extrapolation; use scaling=none.")
        super().__init__(logn=True, **common)
