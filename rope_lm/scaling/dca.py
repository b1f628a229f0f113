"""Dual Chunk Attention (An et al., 2024, "Training-Free Long-Context Scaling
of Large Language Models", ChunkLlama; the training-free method of
Qwen2.5-1M): `scaling=dca`.

The sequence is cut into chunks of c = chunk_size - local_size tokens. A key
sits at position j mod c; the query's position depends on where the key is:

* intra-chunk (key in the query's chunk): i mod c, so the pair keeps its
  true relative position i - j;
* successive-chunk (key in the chunk just before): min(i mod c + c,
  chunk_size), so the first local_size + 1 queries of a chunk keep the true
  i - j across the boundary (locality), and the later ones read the previous
  chunk as the inter-chunk region does;
* inter-chunk (any earlier chunk): chunk_size, one large fixed position,
  relative position chunk_size - (j mod c), between local_size + 1 and
  chunk_size.

No relative position exceeds chunk_size, at any length. These are the
paper's maps (its chunk size s is c here, its query position c - 1 for the
inter-chunk region is chunk_size, and its local window w the successive
chunk's exact queries) with the indices of its code and of Qwen2.5-1M's
(vLLM's DualChunkRotaryEmbedding): chunk_size and local_size as they name
them. Defaults follow ChunkLlama's: chunk_size = 3L/4, local_size = L/16.
Qwen2.5-1M's setting is chunk_size = L, local_size = L/32 (its 262,144 and
8,192); its serving code also scales the logits by 0.1 ln(T/L) + 1, which is
not part of DCA and not applied here (log-n is: scaling.logn=true).

Computed as a two-pass plan: intra pairs and successive pairs of the first
local_size + 1 queries of a chunk are exact RoPE (rotating q and k at their
true positions gives the same relative position), every other pair takes q
rotated at chunk_size against k rotated at j mod c, so a query's far keys are
exactly those before a boundary (AttnPlan.alt_below: its chunk's start, or
the previous chunk's start for the first local_size + 1 queries).
rope_lm/kernels/two_pass.py runs each run of queries with one boundary as
an unmasked far part plus the near keys, merged by log-sum-exp.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.kernels.attention import AttnPlan
from rope_lm.scaling.base import METHODS, ScalingMethod, positive_int


@METHODS.register("dca")
class DualChunkAttention(ScalingMethod):
    applies_to = frozenset({"rotary"})
    # the far pass starts once the sequence outgrows a chunk; a growing KV cache keeps raw keys for it
    far_pass = True

    def __init__(self, chunk_size="auto", local_size="auto", **common):
        super().__init__(**common)
        self.chunk_size = positive_int(chunk_size, "chunk_size")
        self.local_size = positive_int(local_size, "local_size")
        if chunk_size != "auto" and local_size != "auto" and chunk_size <= 2 * local_size:
            raise ConfigError(self._sizes_text(chunk_size, local_size))

    @staticmethod
    def _sizes_text(S, w) -> str:
        return (
            f"scaling.chunk_size={S} with scaling.local_size={w}: DCA's chunks are chunk_size - local_size = "
            f"{S - w} tokens, and they must be longer than local_size (chunk_size > 2 x local_size) for the "
            f"successive chunk's exact queries to be a local window inside a chunk. ChunkLlama uses 3L/4 and "
            f"L/16 (the defaults, auto), Qwen2.5-1M L and L/32."
        )

    @classmethod
    def applies(cls, scheme) -> bool:
        # The per-query boundary is applied by rope-lm's kernels, and by a scheme that computes its own
        # attention only where it says it serves it (PoPE).
        return super().applies(scheme) and (not scheme.owns_attention or scheme.serves_chunked_passes)

    def check(self, scheme) -> None:
        if scheme.family == "rotary" and scheme.owns_attention and not scheme.serves_chunked_passes:
            raise ConfigError(
                f"Extrapolation method 'dca' (setting `scaling`) does not apply to positional scheme "
                f"{scheme.name!r}: it computes its own attention, which applies second rotary passes by "
                f"distance (ReRoPE, Self-Extend), while DCA's regions follow chunks (a per-query boundary, "
                f"AttnPlan.alt_below). Use scaling=self_extend or rerope with it, or DCA with pos=rope or pope."
            )
        super().check(scheme)

    def sizes(self, L: int) -> tuple[int, int]:
        """(chunk_size, local_size) at the training length L."""
        S = max(3, 3 * L // 4) if self.chunk_size == "auto" else self.chunk_size
        w = max(1, L // 16) if self.local_size == "auto" else self.local_size
        return S, w

    def validate(self, seq_len, scheme, train_len):
        S, w = self.sizes(train_len)
        if S <= 2 * w:
            raise ConfigError(self._sizes_text(S, w))
        if S > train_len:
            raise ConfigError(
                f"scaling.chunk_size={S}: DCA's relative positions reach chunk_size, past the {train_len} "
                f"positions the model was trained on (L = {train_len}); give chunk_size <= {train_len} "
                f"(auto: 3L/4 = {3 * train_len // 4})."
            )

    def plan(self, pos, ctx):
        S, w = self.sizes(ctx.train_len)
        c = S - w
        # ctx.seq_len, not len(pos): a planned KV cache decides on the whole sequence from its first call.
        if ctx.seq_len <= c:
            return AttnPlan()
        chunk_start = torch.div(pos, c, rounding_mode="floor") * c
        head = (pos - chunk_start) <= w  # the successive chunk is near for these queries
        boundary = torch.where(head, chunk_start - c, chunk_start).clamp(min=0)
        # positions increase with the index, so the keys before a position are the first ones
        below = torch.searchsorted(pos.contiguous(), boundary.contiguous())
        return AttnPlan(
            alt_q_pos=torch.full_like(pos, S),
            alt_k_pos=pos - torch.div(pos, c, rounding_mode="floor") * c,
            alt_from=w + 2,  # a far pair's smallest distance: a query at i mod c = w + 1, its chunk's start
            alt_below=below,
        )

    def describe(self, scheme, ctx):
        S, w = self.sizes(ctx.train_len)
        out = super().describe(scheme, ctx)
        out.update(chunk_size=S, local_size=w, chunk=S - w, max_relative_position=min(ctx.seq_len - 1, S))
        return out
