"""Keys and values of the tokens a model has read, so that decoding reads
each token once (TransformerLM.hidden(idx, cache=...)).

What is kept, per layer, with grouped key/value heads left grouped:

* keys as attention consumes them: rotated at their positions by a rotary
  scheme (RoPE, xPos; identity for every other scheme), so a step rotates
  only its own tokens;
* for a two-pass method (ReRoPE, leaky ReRoPE, Self-Extend) also the keys
  rotated at their far-pass positions (alt_k_pos), and for a scheme with
  content-position terms (Transformer-XL, Shaw, DeBERTa) the raw keys;
* values.

A sliding-window layer (Gemma 3's local layers, scaling=window) lets go of
the keys before its window once as many again have come (LayerCache.keep_last),
so it holds about two windows, not the whole sequence; with sink tokens, a far
pass or log-n it keeps every key, as those read positions from the start.

* for a scheme that computes its own attention from terms it reads off each
  token (FoX's forget gates, PaTH's Householder directions), those terms;
  such a scheme's keys are kept unrotated.

Bias schemes (ALiBi, T5, Kerple, FIRE, Sandwich) need nothing more: each
step computes the bias of its queries' true positions against every key's.
Absolute schemes add the rows of the new tokens' positions; a recurrent
scheme carries its hidden state (PosContext.state) from call to call.

Length. Several methods depend on the total length (``factor: auto``,
dynamic NTK, Self-Extend's ``group: auto``, LongRoPE's short/long factors,
the decision whether a window or a far pass bites at all). A cache is made
for a planned length (``planned_len``; generation plans prompt +
max_new_tokens), and every call sees that length (PosContext.seq_len), so
the cached run equals one full forward of the finished sequence at that
length, for every scheme and method. Without a plan the length is the
tokens held so far after each call, and what was written is kept: keys
rotated under an earlier length stay as they were (what transformers does
for dynamic NTK); docs/methods.md says what that means per method.
"""

import torch

from rope_lm.core.errors import ConfigError


class LayerCache:
    """One layer's tensors, (B, heads, capacity, D) buffers filled up to the
    cache's length; written in place, grown by doubling up to the plan. Row 0
    holds the token at position `first`: 0, unless a sliding-window layer has
    let go of the keys no later query can see (keep_last)."""

    def __init__(self, owner: "KVCache"):
        self.owner = owner
        self.buffers: dict[str, torch.Tensor] = {}
        self.first = 0

    def extend(self, name: str, new: torch.Tensor) -> torch.Tensor:
        """Append new (B, h, t, D) at the current call's start; return the
        rows of this name from `first` to the end, a view of the buffer."""
        start = self.owner.start - self.first
        end = start + new.shape[2]
        buf = self.buffers.get(name)
        if buf is None and self.owner.start:
            raise RuntimeError(
                f"the cache holds no {name!r} for its first {self.owner.start} tokens; a cache serves one model "
                f"under one method."
            )
        if buf is None or buf.shape[2] < end:
            # Grown by doubling, never past the plan: a plan for a long generation that a stop
            # token ends early holds only what was written.
            capacity = max(end, 2 * (0 if buf is None else buf.shape[2]), 64)
            if self.owner.planned_len:
                capacity = min(capacity, self.owner.planned_len)
            grown = new.new_empty(new.shape[0], new.shape[1], capacity, new.shape[3])
            if buf is not None:
                grown[:, :, :start] = buf[:, :, :start]
            buf = self.buffers[name] = grown
        buf[:, :, start:end] = new
        return buf[:, :, :end]

    def keep_last(self, n: int, end: int) -> None:
        """Let go of every row before position end - n (a sliding-window
        layer: no later query sees those keys), into buffers of twice what is
        kept, so their memory goes back; done once n rows or more would go,
        so the copying costs as little per token as doubling does."""
        first = max(self.first, end - n)
        cut = first - self.first
        if cut < n:
            return
        rows = end - first
        for name, buf in self.buffers.items():
            kept = buf.new_empty(buf.shape[0], buf.shape[1], max(2 * rows, 64), buf.shape[3])
            kept[:, :, :rows] = buf[:, :, cut : cut + rows]
            self.buffers[name] = kept
        self.first = first

    def has(self, name: str) -> bool:
        return name in self.buffers


class KVCache:
    """Per-layer keys and values of the tokens read so far. ``planned_len``
    fixes the length that length-dependent method settings are evaluated at
    (the buffers still grow as tokens come, up to it); None lets the cache
    grow without a bound, the settings following the tokens held."""

    def __init__(self, planned_len: int | None = None):
        if planned_len is not None and (
            isinstance(planned_len, bool) or not isinstance(planned_len, int) or planned_len < 1
        ):
            raise ConfigError(
                f"A KV cache's planned length must be a positive number of tokens or None "
                f"(grow freely); got {planned_len!r}."
            )
        self.planned_len = planned_len
        self.length = 0  # tokens held
        self.start = 0  # where the current call's tokens begin
        self.batch_size: int | None = None
        self.layers: dict[int, LayerCache] = {}
        self.state: dict = {}  # what a scheme carries between calls (PosContext.state)

    def layer(self, index: int) -> LayerCache:
        if index not in self.layers:
            self.layers[index] = LayerCache(self)
        return self.layers[index]

    def begin(self, batch_size: int, new_tokens: int) -> int:
        """Check a call of new_tokens tokens fits; return where they start."""
        if new_tokens < 1:
            raise ConfigError("A cached forward needs at least one new token; got an empty sequence.")
        if self.batch_size is not None and batch_size != self.batch_size:
            raise ConfigError(
                f"This KV cache holds {self.batch_size} sequences; a call with {batch_size} "
                f"cannot continue them. Use one cache per batch."
            )
        if self.planned_len is not None and self.length + new_tokens > self.planned_len:
            raise ConfigError(
                f"This KV cache was planned for {self.planned_len} tokens and holds {self.length}; "
                f"{new_tokens} more do not fit. Plan the cache for the whole sequence "
                f"(prompt + new tokens)."
            )
        self.batch_size = batch_size
        self.start = self.length
        return self.start

    def seq_len(self, new_tokens: int) -> int:
        """The length every hook sees in this call."""
        return self.planned_len or self.length + new_tokens

    def commit(self, new_tokens: int) -> None:
        self.length += new_tokens


def cached_attention(q, k, v, scheme, layer, pos, plan, ctx, store: LayerCache, terms: dict | None = None):
    """Attention of the new tokens' q, k, v (B, H or Hkv, t, D, unrotated)
    over every token the cache holds and themselves; pos and plan cover all
    of them (len(pos) = tokens held + t). terms: the new tokens' part of what
    a scheme that reads the layer's input derived from it."""
    from rope_lm.kernels.attention import offset_attention, scheme_attention

    if scheme.owns_attention:
        # Raw keys, values and the per-token terms; each step hands the scheme every token held
        # (a scheme that could carry a running summary instead says so in its module).
        held = {name: store.extend(f"term:{name}", t) for name, t in (terms or {}).items()}
        kk, vv = store.extend("keys", k), store.extend("values", v)
        return scheme_attention(q, kk, vv, scheme, layer, pos, plan, ctx, "auto", held)

    q0 = pos.shape[0] - q.shape[2]
    new_pos = pos[q0:]
    qr, kr = scheme.rotate(q, k, new_pos, new_pos, layer, ctx)
    q2 = k2 = raw = None
    # Unplanned, a far pass may start (or regroup) as the length grows, so its keys are rotated
    # afresh each call from the raw keys kept for it. Planned, every call sees the planned length
    # (PosContext.seq_len), so a far pass is on from the first call or never, as in the full forward.
    regrouped = store.owner.planned_len is None and ctx.scaling.far_pass
    if scheme.has_content_terms or regrouped:
        raw = store.extend("raw_keys", k)
    if plan.two_pass:
        if regrouped:
            q2, _ = scheme.rotate(q, k[:, :, :0], plan.alt_q_pos[q0:], plan.alt_k_pos[:0], layer, ctx)
            _, k2 = scheme.rotate(q[:, :, :0], raw, plan.alt_q_pos[:0], plan.alt_k_pos, layer, ctx)
        else:
            q2, k2 = scheme.rotate(q, k, plan.alt_q_pos[q0:], plan.alt_k_pos[q0:], layer, ctx)
            k2 = store.extend("far_keys", k2)
    raw = raw if scheme.has_content_terms else None
    window = _sliding_window(plan, store)
    kr = store.extend("keys", kr)
    v = store.extend("values", v)
    end = pos.shape[0]
    y = offset_attention(q, kr, v, scheme, layer, pos[store.first :], plan, ctx, qr=qr, k=raw, q2=q2, k2=k2)
    if window:
        store.keep_last(window, end)
    return y


def _sliding_window(plan, store: LayerCache) -> int | None:
    """A sliding-window layer's window, where its cache may let go of the keys
    before it (Gemma 3's local layers keep 512, as transformers' cache does);
    None where every key stays: sink tokens are read from the sequence's start,
    a far pass or log-n's per-query scale reads positions from 0, and raw keys
    kept for content terms or a regrouping far pass are read whole."""
    if plan.window is None or plan.sink_tokens or plan.two_pass or plan.q_scale is not None:
        return None
    return None if store.has("raw_keys") else plan.window


def _buffer_rows(rows: int) -> int:
    """The rows a buffer grown by doubling from 64 (LayerCache.extend) has once it holds `rows`."""
    capacity = 64
    while capacity < rows:
        capacity *= 2
    return capacity


def held_rows(model, prompt_len: int, total: int) -> int:
    """The most key (or value) rows a cache planned for `total` tokens holds over all layers at
    once while `model` reads a prompt of `prompt_len` and writes up to `total`: every token at a
    full-attention layer, about two windows at a sliding-window layer that lets go of the keys before
    its window (_sliding_window's rule, read off the layout: no sinks, and a method on it with neither
    a far pass nor log-n), plus the prompt once at the window layer reading it. An upper bound: a far
    pass that stays off at this length, or a window the method sets at evaluation, count as keeping
    every key."""
    layout = getattr(model, "layout", None)
    n_layer = model.cfg.n_layer
    if layout is None:
        return n_layer * total
    method = model.scaling
    steady, transient = 0, 0
    for i, spec in enumerate(layout):
        scheme = model._layer_schemes[i]
        scaled = i in model.scaled_layers
        keeps_all = (
            spec.window is None
            or spec.sinks
            or scheme.owns_attention
            or scheme.has_content_terms
            or (scaled and (method.far_pass or method.logn or getattr(method, "sinks", 0)))
        )
        if keeps_all:
            steady += total
            continue
        rows = min(total, _buffer_rows(2 * spec.window))
        steady += rows
        transient = max(transient, min(prompt_len, total) - rows)
    return steady + transient
