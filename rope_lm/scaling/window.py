"""Sliding-window attention at evaluation: each query sees only its last
`window` keys (itself included), so no relative distance exceeds what
training showed when window <= L. auto: window = the training length.

``sinks: k`` keeps the first k tokens visible to every query as well
(StreamingLLM, Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks"): models put large attention weights on the first tokens
whatever they hold, and a window that drops them loses that outlet. Keys
keep their positions in the text; StreamingLLM's rolling cache numbers
them within the cache instead (docs/methods.md)."""

from rope_lm.attention import AttnPlan
from rope_lm.errors import ConfigError
from rope_lm.scaling import METHODS
from rope_lm.scaling.base import ScalingMethod, positive_int


@METHODS.register("window")
class SlidingWindow(ScalingMethod):
    def __init__(self, window="auto", sinks: int = 0, **common):
        super().__init__(**common)
        self.window = positive_int(window, "window")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ConfigError(f"scaling.sinks={sinks!r} must be a number of tokens >= 0 (StreamingLLM keeps 4).")
        self.sinks = sinks

    @property
    def label(self) -> str:
        """``window-sinks4`` with sinks, so tables tell it from the plain window."""
        base = super().label
        if not self.sinks:
            return base
        head, plus, tail = base.partition("+")
        return f"{head}-sinks{self.sinks}{plus}{tail}"

    def size(self, ctx) -> int:
        return ctx.train_len if self.window == "auto" else self.window

    def plan(self, pos, ctx):
        w = self.size(ctx)
        # With sinks nothing is hidden until a query lies past window + sinks.
        return AttnPlan(window=w, sink_tokens=self.sinks) if w + self.sinks < pos.shape[0] else AttnPlan()

    def describe(self, scheme, ctx):
        out = {**super().describe(scheme, ctx), "window": self.size(ctx)}
        return {**out, "sinks": self.sinks} if self.sinks else out
