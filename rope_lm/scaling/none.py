"""Direct extrapolation: positions past the training length are used as they are."""

from rope_lm.scaling.base import METHODS, ScalingMethod


@METHODS.register("none")
class Direct(ScalingMethod):
    pass
