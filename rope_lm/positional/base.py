"""The positional-scheme interface the model calls (docs/schemes.md).

A scheme implements only the hooks it needs; the defaults are identities, so
the model and the attention kernels never name a specific scheme.

Shapes: x is (B, T, C); q, k, v are (B, H, T, D); positions are 1-D tensors of
length T shared by the batch (float when an extrapolation method remaps them).
"""

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from rope_lm.core.errors import ConfigError


@dataclass(frozen=True)
class Dims:
    d_model: int
    n_head: int
    head_dim: int
    n_layer: int
    train_len: int  # the context the model was (pre)trained at


@dataclass(frozen=True)
class RotarySpec:
    """What a rotary scheme offers extrapolation methods: the channels it
    rotates, its base, and how it pairs them (rope_lm.positional.frequencies)."""

    rot_dim: int
    base: float
    pairing: str  # 'half' (GPT-NeoX/Llama) | 'interleaved' (GPT-J/RoFormer)


@dataclass
class PosContext:
    """What every hook sees about the current forward pass."""

    seq_len: int
    train_len: int
    scaling: Any  # rope_lm.scaling.ScalingMethod
    # The length a fine-tune trained the scaling at (init_from), else None; a
    # `factor: auto` method never scales below it, so a model fine-tuned at
    # s = 4 is evaluated at s = 4 on shorter sequences too.
    tuned_len: int | None = None
    # The model's mode (model.train() / model.eval()), never autograd's: a
    # method that acts only at evaluation reads this, so evaluation numbers do
    # not depend on whether gradients are recorded.
    training: bool = False
    memo: dict = field(default_factory=dict)  # computed once, shared by all layers of one forward
    # What a scheme carries from one KV-cached call to the next (a recurrent
    # scheme's hidden state); a fresh dict for a forward without a cache.
    state: dict = field(default_factory=dict)
    # Under context parallelism (trainer.context_parallel), the split of the sequence over the group's
    # devices (rope_lm.core.sequence_shards.SequenceShards): the layer's input holds this device's tokens
    # only, while positions and seq_len are the whole sequence's. None otherwise.
    shards: Any = None


class PositionalScheme(nn.Module):
    name: str = "?"  # set by the registry
    # 'none' | 'absolute' | 'rotary' | 'bias' | 'relative': scaling methods
    # use it to decide whether they apply.
    family: str = "none"
    # Capabilities that extrapolation methods read (and nothing else of a scheme):
    rotary: RotarySpec | None = None  # set by schemes that rotate Q and K with RoPE frequencies
    table_rows: int | None = None  # set by schemes whose positions index a trained table of this many rows
    has_bias: bool = False  # implements bias() (and, for flex attention, score_mod())
    # Whether compiled flex attention can train the scheme. Inductor refuses the backward of a score_mod
    # that reads one learned tensor at several indices (FIRE's unrolled MLP), and only at the first
    # backward, past where a failed compile can fall back (torch 2.11 on an H200, docs/benchmarks.md);
    # such a scheme trains through SDPA with its bias as the mask and uses flex at inference.
    flex_trains: bool = True
    has_content_terms: bool = False  # implements content_scores() and/or value_term()
    # distance_bias() returns the same table for every layer (computed once per forward, in PosContext.memo).
    distance_bias_shared: bool = False
    # Positions that read the content (FoX, stick-breaking, CoPE, PaTH, DAPE): the scheme computes the whole
    # attention itself in attention(), from q, k, v and per-token terms it derives from the layer's input
    # (token_terms). Kernels hand such a scheme everything and choose nothing; it offers its own fast path
    # and its explicit reference (kernel="explicit"), which tests/test_attention.py holds equal.
    owns_attention: bool = False
    # token_terms() reads the layer's normed input (a forget gate, a Householder direction).
    reads_input: bool = False
    # Whether attention() serves gpt-oss's learned sink logits (a softmax's extra denominator term).
    serves_sink_logits: bool = False
    # Whether attention() serves a second pass bounded per query (AttnPlan.alt_below: Dual Chunk Attention's
    # chunks), not only by distance (ReRoPE, Self-Extend).
    serves_chunked_passes: bool = False

    def __init__(self, dims: Dims):
        super().__init__()
        self.dims = dims

    def validate(self, seq_len: int, scaling) -> None:
        """Raise ConfigError if this scheme cannot run at seq_len under scaling."""

    def embed(self, x: torch.Tensor, pos: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        return x

    def rotate(self, q, k, q_pos, k_pos, layer: int, ctx: PosContext):
        return q, k

    def bias(self, layer: int, q_pos, k_pos, ctx: PosContext) -> torch.Tensor:
        """Additive logit bias, shape (H, Tq, Tk)."""
        raise NotImplementedError

    def distance_bias(self, layer: int, pos, ctx: PosContext) -> torch.Tensor | None:
        """(H, T) bias at the distances pos[d] - pos[0], d = 0..T-1, where the
        bias is a function of p_i - p_j alone for these positions (given that
        they form an arithmetic progression); None otherwise. Lets attention
        read every block's bias out of one row (rope_lm/kernels/distance_bias.py)."""
        return None

    def masked_bias(
        self, layer: int, pos, start: int, end: int, window: int | None, ctx: PosContext
    ) -> torch.Tensor | None:
        """At inference: the (H, end - start, end) float32 bias of queries
        start..end-1 over keys 0..end-1 with the causal mask (and the window,
        if any) already in it as -inf, ready to be SDPA's mask; None where the
        scheme has no faster way than bias() plus a mask. The tensor may be a
        buffer that the next call overwrites."""
        return None

    def score_mod(self, layer: int, pos, ctx: PosContext) -> Callable | None:
        """FlexAttention score_mod(score, b, h, q_idx, kv_idx) adding the same
        bias as bias(); None means flex attention is not offered."""
        return None

    def content_scores(self, layer: int, q, k, q_pos, k_pos, ctx: PosContext):
        """Extra logits from content-position terms, shape (B, H, Tq, Tk), or None."""
        return None

    def value_term(self, layer: int, probs, q_pos, k_pos, ctx: PosContext):
        """Extra attention output from positional values, (B, H, Tq, D), or None."""
        return None

    def check_sink_logits(self, wanted: bool) -> None:
        """One paragraph where learned sink logits are asked of a scheme that
        computes its attention without a softmax denominator for them to join."""
        if wanted and self.owns_attention and not self.serves_sink_logits:
            raise ConfigError(
                f"Positional scheme {self.name!r} computes its attention without a softmax denominator, so "
                f"learned sink logits (model.sink_logits) have nothing to join; turn model.sink_logits off for "
                f"its layers, or use a softmax scheme (fox, cable, cope, rope, alibi, ...)."
            )

    def why_not_split(self) -> str | None:
        """Why context parallelism (a sequence split over devices, each pair
        scored at its global positions over all-gathered keys) cannot serve
        this scheme, in a sentence; None where it can."""
        if self.owns_attention:
            return "it computes its attention in a kernel of its own, which has no form over a split sequence."
        if self.has_content_terms:
            return "its content-position terms are computed by the explicit kernel, which has no sharded form."
        return None

    def token_terms(self, layer: int, x: torch.Tensor, ctx: PosContext) -> dict[str, torch.Tensor]:
        """Per-token tensors (B, H, T, d) that attention() reads, derived from
        the layer's normed input x (B, T, C) (reads_input schemes). A KV cache
        keeps them beside the keys, so a step computes only its own tokens'."""
        return {}

    def attention(self, layer: int, q, k, v, terms: dict, pos, plan, ctx: PosContext, kernel: str = "auto"):
        """The attention output (B, H, t, D) of an owns_attention scheme.

        q (B, H, t, D) are the last t of len(pos) queries (t = len(pos) in a
        full forward, fewer in a KV-cached step), log-n's scale already on
        them; k, v (B, H, len(pos), D) and every terms tensor cover all
        tokens, key/value heads already repeated to H. plan carries the window
        and sink tokens (rope_lm.positional._content.allowed_pairs reads them).
        kernel is "explicit" for the reference written from the paper's formula,
        anything else for the scheme's fastest path; the two must agree."""
        raise NotImplementedError
