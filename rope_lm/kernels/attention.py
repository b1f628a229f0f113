"""Causal attention under a positional scheme, on the cheapest kernel it allows.

* ``sdpa``: torch's scaled_dot_product_attention. Plain causal when the scheme
  adds nothing to the logits. At inference, a bias that depends only on the
  distance i - j is read out of one padded row per head, as a strided view
  (rope_lm/kernels/distance_bias.py). Otherwise (training, FIRE past its L, T5 on
  fractional positions) the bias (or a window) becomes a float mask one block
  of queries at a time, or, where the scheme offers ``masked_bias`` (FIRE past
  its L on the CPU), comes as that mask in one pass; memory grows linearly in
  the sequence length either way.
* ``flex``: FlexAttention with the scheme's score_mod and a causal (windowed)
  block mask; compiled, so no T x T tensor exists. torch refuses flex
  backward on CPU, so there it serves inference only and training falls back
  to ``sdpa``; if compilation fails it falls back to ``sdpa`` too.
* ``explicit``: the reference, written out: scores, bias, content terms,
  mask, softmax, values. Also blocked over queries. Every other path must
  agree with it (tests/test_attention.py).

Grouped-query attention: k and v may carry fewer heads than q (a divisor of
them). Every entry point but the two-pass kernel (which folds a group's
query heads into rows instead, and serves only rotary schemes without
per-head terms) repeats each key/value head over its group of query heads
(match_heads) before the scheme sees them, so positional schemes
with per-head parameters (ALiBi slopes, T5 buckets, ...) act on query heads
and every kernel computes exactly the same thing as with full heads.

Under context parallelism (PosContext.shards) the queries are one device's
share of the sequence and the keys every device's: sharded_sequence.py.

Two-pass plans (ReRoPE, leaky ReRoPE, Self-Extend, Dual Chunk Attention) go to ``two_pass``
(rope_lm/kernels/two_pass.py: near band and far region each over only its keys,
merged by log-sum-exp, grouped heads kept) unless ``explicit`` is asked for
or the plan needs what that kernel lacks (two_pass.unsupported).

A scheme whose positions read the content (``owns_attention``: FoX,
stick-breaking, CoPE, PaTH, DAPE) computes its attention itself
(``scheme_attention``): it is handed q, k, v and the per-token terms it
derived from the layer's input, and offers its own fast path beside its
explicit reference (``kernel="explicit"``).

``auto``: explicit where content-position terms require it; flex on CUDA
for a bias or a window; sdpa otherwise, CPU included. On CPU, compiled flex
spends 6-30 s compiling per new sequence length before it is faster than the
blocked SDPA mask, which an evaluation over 5 lengths never earns back
(measurements: docs/schemes.md).
"""

from dataclasses import dataclass
import math

import torch
import torch.nn.functional as F

from rope_lm.core import flex as flex_kernel
from rope_lm.kernels import distance_bias, offset_sdpa, sharded_sequence, two_pass
from rope_lm.kernels.sdpa_parts import match_heads, sink_column, with_sink_key

KERNELS = ("auto", "sdpa", "flex", "explicit")


@dataclass
class AttnPlan:
    """What an extrapolation method asks of attention beyond plain causal."""

    q_scale: torch.Tensor | None = None  # (T,) multiplier on each query (log-n scaling)
    window: int | None = None  # query i sees key j only if i - j < window
    # Second rotary pass (ReRoPE, Self-Extend): where i - j >= alt_from, the
    # logit uses q rotated at alt_q_pos and k rotated at alt_k_pos instead.
    alt_q_pos: torch.Tensor | None = None
    alt_k_pos: torch.Tensor | None = None
    alt_from: int | None = None
    # A per-query boundary on the second pass (Dual Chunk Attention, whose regions follow chunks, not
    # distances): (T,) key indices; with it, a pair (i, j) at distance >= alt_from takes the second
    # rotation only if j < alt_below[i]. alt_from stays the smallest distance any such pair has.
    alt_below: torch.Tensor | None = None
    # StreamingLLM's attention sinks: under a window, keys 0..sink_tokens-1
    # stay visible to every query.
    sink_tokens: int = 0
    # gpt-oss's learned sinks: (H,) logits that join each query's softmax
    # denominator with no value (rope_lm/model/softmax_options.py).
    sink_logits: torch.Tensor | None = None

    @property
    def two_pass(self) -> bool:
        return self.alt_from is not None


def choose_kernel(requested: str, scheme, plan: AttnPlan, device: torch.device, needs_grad: bool = False) -> str:
    if scheme.owns_attention:
        return "scheme"
    if plan.two_pass and requested != "explicit" and two_pass.fits(scheme, plan):
        return "two_pass"
    if scheme.has_content_terms or plan.two_pass:
        return "explicit"
    if requested in ("sdpa", "explicit"):
        return requested
    usable = flex_usable(scheme, device, needs_grad)
    if requested == "flex":
        return "flex" if usable else "sdpa"
    if (scheme.has_bias or plan.window) and device.type == "cuda" and usable:
        return "flex"
    return "sdpa"


def flex_supported(scheme) -> bool:
    """Whether the scheme offers a score_mod (or needs none)."""
    return not scheme.has_bias or type(scheme).score_mod is not _base_score_mod()


def flex_usable(scheme, device: torch.device, needs_grad: bool) -> bool:
    if not flex_supported(scheme) or flex_kernel.failed_on(scheme, device):
        return False
    # torch raises NotImplementedError for flex backward on CPU.
    return not (needs_grad and (device.type == "cpu" or not scheme.flex_trains))


def _base_score_mod():
    from rope_lm.positional.base import PositionalScheme

    return PositionalScheme.score_mod


def attend(q, k, v, scheme, layer, pos, plan: AttnPlan, ctx, kernel: str = "auto", terms: dict | None = None):
    """q (B, H, T, D), k and v (B, H or a divisor of H, T, D) before any
    rotation; returns (B, H, T, D). terms: what a scheme that reads the
    layer's input derived from it (PositionalScheme.token_terms)."""
    if ctx.shards is not None:  # this device's share of a sequence split over a context-parallel group
        return sharded_sequence.attention(q, k, v, scheme, layer, pos, plan, ctx, kernel)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    chosen = choose_kernel(kernel, scheme, plan, q.device, needs_grad)
    if chosen == "scheme":  # the scheme's own paths, the one asked for included (explicit: its reference)
        return scheme_attention(q, k, v, scheme, layer, pos, plan, ctx, kernel, terms)
    kernel = chosen
    if kernel == "two_pass":  # keeps grouped heads grouped
        return two_pass.full_attention(q, k, v, scheme, layer, pos, plan, ctx, offset_sdpa.MAX_SCORE_ELEMENTS)
    k, v = match_heads(q, k, v)
    if kernel == "explicit":
        return explicit_attention(q, k, v, scheme, layer, pos, plan, ctx)
    q, k = scheme.rotate(q, k, pos, pos, layer, ctx)
    if plan.q_scale is not None:
        q = q * plan.q_scale.to(q.dtype)[:, None]
    if kernel == "flex":
        out = flex_path(q, k, v, scheme, layer, pos, plan, ctx)
        if out is not None:
            return out
    return sdpa_path(q, k, v, scheme, layer, pos, plan, ctx)


def scheme_attention(q, k, v, scheme, layer, pos, plan, ctx, kernel="auto", terms=None):
    """An owns_attention scheme's own attention: q (B, H, t, D), the last t of
    len(pos) queries; k, v and terms over all len(pos) tokens. Heads are
    matched and log-n's scale put on the queries here, once for every such
    scheme; a two-pass plan never reaches one (no rotation to repeat)."""
    k, v = match_heads(q, k, v)
    if plan.q_scale is not None:
        q = q * plan.q_scale[pos.shape[0] - q.shape[2] :].to(q.dtype)[:, None]
    return scheme.attention(layer, q, k, v, terms or {}, pos, plan, ctx, kernel)


# Queries per block, at least, where a scheme's masked_bias fills the mask:
# CPU SDPA re-reads a block's keys and values for every 32 queries of a block
# under 192 rows and every 64 under 768 (ATen's split sizes), and at 16k
# tokens a block of 170 rows costs 1.4x one of 384 (docs/benchmarks.md).
MASKED_BIAS_MIN_QUERIES = 384


def sdpa_path(q, k, v, scheme, layer, pos, plan, ctx):
    k, v = match_heads(q, k, v)
    B, H, T, D = q.shape
    sinks = plan.sink_logits is not None
    if not scheme.has_bias and not plan.window:
        if not sinks:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # A query row in front that no one reads keeps causal SDPA aligned:
        # query i + 1 sees the sink (key 0) and keys 0..i (keys 1..i + 1).
        qs, ks, vs = with_sink_key(q, k, v, sink_column(plan, H))
        qs = F.pad(qs, (0, 0, 1, 0))
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=1 / math.sqrt(D))[:, :, 1:]
    if scheme.has_bias and not sinks and not plan.sink_tokens and _distance_path_allowed(q, k, v):
        table = distance_bias.padded_table(scheme, layer, pos, plan, ctx, q.dtype)
        if table is not None:
            return distance_bias.toeplitz_attention(q, k, v, table, plan)
        out = _masked_bias_attention(q, k, v, scheme, layer, pos, plan, ctx) if q.dtype == torch.float32 else None
        if out is not None:
            return out
    # Blocks of queries, each over the keys it can see (a window's and its sinks), the mask (and bias) as
    # SDPA's float mask: the offset kernel of a cached step, from query 0.
    return offset_sdpa.offset_sdpa(q, k, v, scheme, layer, pos, plan, ctx, 0)


def _masked_bias_attention(q, k, v, scheme, layer, pos, plan, ctx):
    """Blocks whose mask the scheme fills itself, bias included
    (PositionalScheme.masked_bias); None when it does not offer one."""
    B, H, T, _ = q.shape
    out = []
    for s, e in offset_sdpa.query_blocks(B, H, T, MASKED_BIAS_MIN_QUERIES):
        mask = scheme.masked_bias(layer, pos, s, e, plan.window, ctx)
        if mask is None:
            return None  # decided by the scheme and the positions, so at the first block
        out.append(
            F.scaled_dot_product_attention(
                q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=mask.expand(B, H, e - s, e)
            )
        )
    return torch.cat(out, dim=2)


def _distance_path_allowed(q, k, v) -> bool:
    """The one-row distance bias serves inference in eager mode. Training
    (short sequences, where the per-block bias costs little) keeps the
    per-block path: its gradients reach the scheme's parameters through a
    plain (H, Tq, Tk) bias, and it has no data-dependent checks to break a
    compiled graph."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return not needs_grad and not torch.compiler.is_compiling()


def _prepare(q, k, scheme, layer, pos, plan, ctx):
    """Rotated q and k, the second rotary pass if any, with log-n applied to
    every query (the raw q too: content-position terms see the same query)."""
    qr, kr = scheme.rotate(q, k, pos, pos, layer, ctx)
    q2 = k2 = None
    if plan.two_pass:
        q2, k2 = scheme.rotate(q, k, plan.alt_q_pos, plan.alt_k_pos, layer, ctx)
    if plan.q_scale is not None:
        qs = plan.q_scale.to(q.dtype)[:, None]
        qr, q = qr * qs, q * qs
        if plan.two_pass:
            q2 = q2 * qs
    return q, k, qr, kr, q2, k2


def _block_probs(prepared, scheme, layer, pos, plan, ctx, s, e, q0=0):
    """Float32 attention probabilities of queries s..e-1 over keys 0..e-1
    (absolute indices; the query tensors of ``prepared`` start at q0)."""
    q, k, qr, kr, q2, k2 = prepared
    scale = 1.0 / math.sqrt(q.shape[-1])
    rows = slice(s - q0, e - q0)
    scores = (qr[:, :, rows] @ kr[:, :, :e].transpose(-1, -2)) * scale
    if plan.two_pass:
        far = (
            torch.arange(s, e, device=q.device)[:, None] - torch.arange(e, device=q.device)[None, :]
        ) >= plan.alt_from
        if plan.alt_below is not None:
            far = far & (torch.arange(e, device=q.device)[None, :] < plan.alt_below[s:e, None].to(q.device))
        scores = torch.where(far, (q2[:, :, rows] @ k2[:, :, :e].transpose(-1, -2)) * scale, scores)
    if scheme.has_bias:
        scores = scores + scheme.bias(layer, pos[s:e], pos[:e], ctx).to(scores.dtype)
    extra = scheme.content_scores(layer, q[:, :, rows], k[:, :, :e], pos[s:e], pos[:e], ctx)
    if extra is not None:
        scores = scores + extra
    scores = scores.masked_fill(~offset_sdpa.allowed_block(s, e, e, plan, q.device), float("-inf")).float()
    if plan.sink_logits is None:
        return torch.softmax(scores, dim=-1)
    sink = plan.sink_logits.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink), -1), dim=-1)[..., :-1]


def attention_probs(q, k, scheme, layer, pos, plan, ctx, terms: dict | None = None) -> torch.Tensor:
    """(B, H, T, T) float32 probabilities of the explicit path, for diagnostics.

    A scheme that owns its attention mixes values linearly (a softmax, a stick
    broken over the keys, with any remainder on the query's own value), so its
    weights are its explicit path applied to one-hot values: value j = e_j."""
    if scheme.owns_attention:
        T = k.shape[2]
        one_hot = torch.eye(T, dtype=q.dtype, device=q.device).expand(q.shape[0], k.shape[1], T, T)
        return scheme_attention(q, k, one_hot, scheme, layer, pos, plan, ctx, "explicit", terms).float()
    (k,) = match_heads(q, k)
    T = q.shape[2]
    return _block_probs(_prepare(q, k, scheme, layer, pos, plan, ctx), scheme, layer, pos, plan, ctx, 0, T)


def explicit_attention(q, k, v, scheme, layer, pos, plan, ctx):
    k, v = match_heads(q, k, v)
    return _explicit_blocks(_prepare(q, k, scheme, layer, pos, plan, ctx), v, scheme, layer, pos, plan, ctx)


def _explicit_blocks(prepared, v, scheme, layer, pos, plan, ctx, q0=0):
    """The explicit path over prepared (rotated, scaled) tensors whose
    queries are the last ones, from absolute index q0, of len(pos) tokens."""
    B, H, t, _ = prepared[2].shape
    out = []
    for s, e in offset_sdpa.query_blocks(B, H, t, offset=q0):
        probs = _block_probs(prepared, scheme, layer, pos, plan, ctx, s, e, q0).to(v.dtype)
        y = probs @ v[:, :, :e]
        value = scheme.value_term(layer, probs, pos[s:e], pos[:e], ctx)
        out.append(y if value is None else y + value)
    return torch.cat(out, dim=2)


def offset_attention(q, kr, v, scheme, layer, pos, plan, ctx, *, qr, k=None, q2=None, k2=None):
    """Queries at the last q.shape[2] of len(pos) positions over every key
    0..len(pos)-1, as a KV cache calls attention. q is unrotated (content
    terms read it), qr and q2 rotated at the query positions; kr, k2 and v
    cover every key, grouped heads unrepeated. Log-n's q_scale is applied
    here. Equals the rows of the full forward's attention for those queries."""
    q0 = pos.shape[0] - q.shape[2]
    if plan.q_scale is not None:
        qs = plan.q_scale[q0:].to(q.dtype)[:, None]
        q, qr = q * qs, qr * qs
        q2 = None if q2 is None else q2 * qs
    if plan.two_pass and two_pass.fits(scheme, plan):
        return two_pass.attention(qr, kr, q2, k2, v, plan, q0, offset_sdpa.MAX_SCORE_ELEMENTS)
    if scheme.has_content_terms or plan.two_pass:
        kk = kr if k is None else k
        kk, kr, v = match_heads(q, kk, kr, v)
        if plan.two_pass:
            (k2,) = match_heads(q, k2)
        return _explicit_blocks((q, kk, qr, kr, q2, k2), v, scheme, layer, pos, plan, ctx, q0)
    if q0 == 0:  # a prefill: the full forward's kernels (causal SDPA, distance bias)
        return sdpa_path(qr, kr, v, scheme, layer, pos, plan, ctx)
    return offset_sdpa.offset_sdpa(qr, kr, v, scheme, layer, pos, plan, ctx, q0)


def flex_path(q, k, v, scheme, layer, pos, plan, ctx, compiled: bool = True):
    """Flex attention on rotated, scaled q and k; None when it cannot run
    here (the scheme offers no score_mod for these positions, or compiling
    failed), and the caller falls back to sdpa."""
    k, v = match_heads(q, k, v)
    score_mod = None
    if scheme.has_bias:
        score_mod = scheme.score_mod(layer, pos, ctx)
        if score_mod is None:
            return None
    mask = flex_kernel.block_mask(q.shape[2], plan.window, plan.sink_tokens, q.device, ctx.memo)
    try:
        return flex_kernel.with_sinks(flex_kernel.flex_fn(compiled), q, k, v, score_mod, mask, plan.sink_logits)
    except Exception as e:
        if not compiled or torch.compiler.is_compiling():
            raise
        flex_kernel.remember_failure(scheme, q.device, e)
        return None
