"""Sliding-window attention at evaluation: each query sees only its last
`window` keys (itself included), so no relative distance exceeds what
training showed when window <= L. auto: window = the training length.

``sinks: k`` keeps the first k tokens visible to every query as well
(StreamingLLM, Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks"): models put large attention weights on the first tokens
whatever they hold, and a window that drops them loses that outlet.

``sink_positions`` says where a query reads the sinks from. ``cache`` (the
paper's rolling cache, which numbers positions within the cache): once a
query lies past window + k tokens, the sinks sit just before its window, at
index distance w + k - 1 - j, never past what training showed; a second
rotary pass (AttnPlan.two_pass) rotates the query at index w + k - 1 for the
sink keys. Position biases and absolute tables have no such pass, so
``cache`` is refused for them. ``text``: the sinks keep their positions in
the text, only the mask changes.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.scaling.base import METHODS, ScalingMethod, positive_int

SINK_POSITIONS = ("cache", "text")


@METHODS.register("window")
class SlidingWindow(ScalingMethod):
    def __init__(self, window="auto", sinks: int = 0, sink_positions: str = "cache", **common):
        super().__init__(**common)
        self.window = positive_int(window, "window")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ConfigError(f"scaling.sinks={sinks!r} must be a number of tokens >= 0 (StreamingLLM keeps 4).")
        if sink_positions not in SINK_POSITIONS:
            raise ConfigError(
                f"scaling.sink_positions={sink_positions!r} must be cache (the sinks just before the "
                f"window, as StreamingLLM's rolling cache numbers them) or text (where they are)."
            )
        self.sinks = sinks
        self.sink_positions = sink_positions
        # Read by a growing KV cache: the sinks' far-pass rotation is redone as the length grows.
        self.far_pass = bool(sinks) and sink_positions == "cache"

    @property
    def label(self) -> str:
        """``window-sinks4`` with sinks (``window-sinks4-text`` at text
        positions), so tables tell it from the plain window."""
        base = super().label
        if not self.sinks:
            return base
        head, plus, tail = base.partition("+")
        return f"{head}-sinks{self.sinks}{'-text' if self.sink_positions == 'text' else ''}{plus}{tail}"

    def size(self, ctx) -> int:
        return ctx.train_len if self.window == "auto" else self.window

    def validate(self, seq_len, scheme, train_len):
        rotation_only = scheme.has_bias or scheme.has_content_terms or scheme.owns_attention
        if self.far_pass and (rotation_only or scheme.family == "absolute"):
            raise ConfigError(
                f"scaling.sink_positions=cache re-reads the sink tokens at positions just before the window, which "
                f"only a rotation can do; positional scheme {scheme.name!r} ({scheme.family}) has no second "
                f"rotary pass. Use scaling.sink_positions=text (the sinks where they are in the text)."
            )

    def plan(self, pos, ctx):
        w, T = self.size(ctx), pos.shape[0]
        # With sinks nothing is hidden until a query lies past window + sinks. The sequence's length
        # decides (a KV cache planned for it reads its first tokens with the plan of the full forward),
        # so a layer whose own window is shorter meets the method's sinks from its first token either way.
        if w + self.sinks >= max(T, ctx.seq_len or 0):
            return AttnPlan()
        plan = AttnPlan(window=w, sink_tokens=self.sinks)
        if self.far_pass:
            # Past the window only the sinks are in view; a query reads them
            # from index w + k - 1 at most (the last slot of a full cache).
            slot = torch.arange(T, device=pos.device).clamp(max=w + self.sinks - 1)
            plan.alt_q_pos, plan.alt_k_pos, plan.alt_from = pos[slot], pos, w
        return plan

    def describe(self, scheme, ctx):
        out = {**super().describe(scheme, ctx), "window": self.size(ctx)}
        return {**out, "sinks": self.sinks, "sink_positions": self.sink_positions} if self.sinks else out
