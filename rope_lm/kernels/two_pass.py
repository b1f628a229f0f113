"""Two-pass plans (AttnPlan.alt_from: ReRoPE, leaky ReRoPE, Self-Extend) as
attentions over only the keys each rotation serves, merged by log-sum-exp.

Pair (i, j), j <= i, takes the logit of q and k rotated at their positions
when i - j < alt_from (the near band) and of q and k rotated at
alt_q_pos / alt_k_pos when i - j >= alt_from (the far region). The two key
sets are disjoint, so the softmax over both is the merge of one softmax per
set: with o_p the output and l_p the log-sum-exp of the logits of part p,

    out = sum_p exp(l_p - l) o_p,   l = log sum_p exp(l_p).

A block of queries s..e-1 therefore runs, each over a slice of the keys:

* the near band, keys (s - alt_from, e): one masked attention whose mask
  (at most block x (alt_from + block)) depends only on the block's shape;
* the far region, keys 0..e-1-alt_from: the part every query of the block
  sees (keys 0..s-alt_from) unmasked, then the small triangle the later
  queries add, causal. Under a window the far region is a band like the near
  one, masked.

Grouped key/value heads stay grouped: the G query heads of a key/value head
are folded into the query rows, (B, Hkv, G * block, D). On the CPU, without
gradients, each part runs torch's fused flash kernel, which returns the
log-sum-exp; where gradients are needed (its log-sum-exp carries none) or
off the CPU, each part is written out in float32 over the same key slices,
scores of at most one block at a time, as the explicit path holds.

A plan with a per-query boundary (AttnPlan.alt_below: Dual Chunk
Attention, whose far keys of query i are those before alt_below[i], a chunk
start) runs by runs of queries that share one boundary b: the far part is
keys 0..b-1, which every such query sees, unmasked; the near part keys b..e-1,
split into the keys before the block (unmasked) and a causal triangle. Under
a window both are bands, masked.

What this module cannot serve (unsupported(): a scheme with a bias or
content-position terms, plan fields it does not know) stays on the explicit
kernel; attention.choose_kernel asks.
"""

from dataclasses import MISSING, fields
import logging
import math

import torch

log = logging.getLogger("rope_lm.kernels.two_pass")

# AttnPlan fields this kernel honours; a plan that sets any other stays explicit.
HONOURED = frozenset({"q_scale", "window", "alt_q_pos", "alt_k_pos", "alt_from", "alt_below"})
# Queries per block on the fused path: the CPU flash kernel re-reads a
# block's keys for every 32-128 rows of it, so large blocks read keys less
# often; the masks (band and triangle) grow with the block, not with T.
FUSED_QUERIES = 512
_told: set[str] = set()


def unsupported(scheme, plan) -> str | None:
    """Why this two-pass plan must take the explicit kernel, or None."""
    if scheme.has_content_terms:
        return f"{scheme.name} adds content-position terms"
    if scheme.has_bias:
        return f"{scheme.name} adds a bias to the logits"
    for f in fields(plan):
        value = getattr(plan, f.name)
        if f.name in HONOURED or value is None:
            continue
        if f.default is not MISSING and isinstance(value, (bool, int, float, str)) and value == f.default:
            continue
        return f"the plan sets {f.name}, which the two-pass kernel does not apply"
    return None


def fits(scheme, plan) -> bool:
    """Whether the two-pass kernel serves this plan; says once per reason
    why not (the explicit kernel then serves it, slower)."""
    why = unsupported(scheme, plan)
    if why is not None and why not in _told:
        _told.add(why)
        log.info("Two-pass attention on the explicit kernel: %s.", why)
    return why is None


def full_attention(q, k, v, scheme, layer, pos, plan, ctx, max_elements: int):
    """attention.attend for a two-pass plan: q (B, H, T, D), k and v
    (B, Hkv, T, D) unrotated, Hkv dividing H; returns (B, H, T, D)."""
    qr, kr = scheme.rotate(q, k, pos, pos, layer, ctx)
    q2, k2 = scheme.rotate(q, k, plan.alt_q_pos, plan.alt_k_pos, layer, ctx)
    if plan.q_scale is not None:
        qs = plan.q_scale.to(q.dtype)[:, None]
        qr, q2 = qr * qs, q2 * qs
    return attention(qr, kr, q2, k2, v, plan, 0, max_elements)


def attention(qr, kr, q2, k2, v, plan, q0: int, max_elements: int):
    """Queries at absolute indices q0..q0+t-1 over keys 0..q0+t-1. qr and q2
    (B, H, t, D): the queries rotated for the near and the far pass (log-n
    already applied); kr, k2, v (B, Hkv, q0+t, D): the keys rotated for each
    pass and the values, grouped heads unrepeated. Returns (B, H, t, D)."""
    B, H, t, D = qr.shape
    Hkv = kr.shape[1]
    if H % Hkv:
        raise ValueError(f"{Hkv} key/value heads cannot serve {H} query heads.")
    if plan.alt_below is not None:
        return _boundary_attention(qr, kr, q2, k2, v, plan, q0, max_elements)
    G, N = H // Hkv, q0 + t
    w, window = plan.alt_from, plan.window
    # Distance ranges (lo, hi) of each pass; hi None: unbounded.
    near = (0, (min(w, window) if window else w) - 1)
    far = None if window and window <= w else (w, window - 1 if window else None)
    fused = qr.device.type == "cpu" and not _needs_grad(qr, kr, q2, k2, v)
    widest = max(near[1], far[1] or 0) if far else near[1]
    block = _block_rows(B, H, G, t, N, widest, fused, max_elements)
    masks = _Masks()
    near_pass = _Pass(qr, kr, v, q0, G, fused, masks)
    far_pass = _Pass(q2, k2, v, q0, G, fused, masks)
    out = qr.new_empty(B, Hkv, G, t, v.shape[-1])
    for s in range(q0, N, block):
        e = min(N, s + block)
        masks.new_block()
        parts = [near_pass.band(near, s, e)]
        if far is not None and e - 1 >= w:
            parts += far_pass.unbounded(w, s, e) if far[1] is None else [far_pass.band(far, s, e)]
        out[:, :, :, s - q0 : e - q0] = _merge(parts, G, e - s).to(out.dtype)
    return out.flatten(1, 2)


def _boundary_attention(qr, kr, q2, k2, v, plan, q0: int, max_elements: int):
    """attention() for a plan with a per-query boundary: query i takes the
    far rotation over keys j < alt_below[i] and the near one over the rest
    up to itself, each within the window if there is one."""
    B, H, t, D = qr.shape
    Hkv = kr.shape[1]
    G, N, window = H // Hkv, q0 + t, plan.window
    below = plan.alt_below[q0:N].tolist()
    fused = qr.device.type == "cpu" and not _needs_grad(qr, kr, q2, k2, v)
    block = _block_rows(B, H, G, t, N, window or 0, fused, max_elements)
    masks = _Masks()
    near_pass = _Pass(qr, kr, v, q0, G, fused, masks)
    far_pass = _Pass(q2, k2, v, q0, G, fused, masks)
    blocks, s = [], q0
    while s < N:  # blocks of at most `block` queries that share one boundary
        b, e = below[s - q0], s + 1
        while e < min(N, s + block) and below[e - q0] == b:
            e += 1
        masks.new_block()
        lo = max(0, s - window + 1) if window else 0  # the first key any query of the block sees
        parts = []
        if window:
            parts.append(near_pass.span(s, e, max(b, lo), e, window))
        else:
            if s > b:
                parts.append(near_pass.span(s, e, b, s, None, causal=False))
            parts.append(near_pass.span(s, e, s, e, None))
        if b > lo:
            # the queries that still see a key before b: under a window, the first ones of the block
            last = min(e, b + window - 1) if window else e
            parts.append(far_pass.span(s, last, lo, b, window, causal=False))
        blocks.append(_merge_rows(parts, G, s, e))
        s = e
    return torch.cat(blocks, dim=3).to(qr.dtype).flatten(1, 2)


def _merge_rows(parts, G, s, e):
    """A block's output (B, Hkv, G, e - s, D) in float32 from its parts
    (first row, (output, lse)), each covering a run of the rows; the first
    covers all of them (every query sees a near key: itself)."""
    (_, (out, lse)), rest = parts[0], parts[1:]
    out, lse = out.float().unflatten(2, (G, -1)), lse.unflatten(2, (G, -1))
    for r, (o, l) in rest:
        o, l = o.float().unflatten(2, (G, -1)), l.unflatten(2, (G, -1))
        a, z = r - s, r - s + o.shape[3]
        share = torch.sigmoid(l - lse[..., a:z])[..., None]
        merged = torch.lerp(out[..., a:z, :], o, share)
        out = torch.cat((out[..., :a, :], merged, out[..., z:, :]), dim=3)
        lse = torch.cat((lse[..., :a], torch.logaddexp(lse[..., a:z], l), lse[..., z:]), dim=3)
    return out


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def _block_rows(B, H, G, t, N, widest, fused, max_elements):
    """Queries per block. Fused, the largest tensors held are the masks,
    each G * block x (widest band + block); written out, the scores of a block
    over every key (B x H x block x N), the explicit path's own bound."""
    if not fused:
        return max(1, min(t, max_elements // max(1, B * H * N)))
    block = min(t, FUSED_QUERIES)
    # A block holds at most three masks (near band, far band or triangle).
    while block > 1 and 3 * G * block * (widest + 1 + block) > max_elements:
        block //= 2
    return block


class _Masks:
    """Additive masks by shape, shared by both passes of a call: a mask
    depends only on its part's shape, so the blocks after the first few
    reuse the same ones. Only the current block's stay held."""

    def __init__(self):
        self.held: dict = {}
        self.used: set = set()

    def new_block(self):
        self.used = set()

    def get(self, key, build):
        if key not in self.held:
            for old in [k for k in self.held if k not in self.used]:
                del self.held[old]
            self.held[key] = build()
        self.used.add(key)
        return self.held[key]


class _Pass:
    """One rotation's queries and keys; runs its parts of a query block."""

    def __init__(self, q, k, v, q0, G, fused, masks):
        self.q = q.unflatten(1, (k.shape[1], G))  # (B, Hkv, G, t, D): query head h = kv * G + g
        self.k, self.v, self.q0, self.G = k, v, q0, G
        self.run = _fused_part if fused else _written_part
        self.dtype = q.dtype if fused else torch.float32  # the additive mask's, as each kernel adds it
        self.masks = masks

    def band(self, rng, s, e):
        """Keys at distance lo..hi from queries s..e-1: rows from the first
        query that has such a key, keys from the first any of them reaches."""
        lo, hi = rng
        r0 = max(s, lo)
        k0, k1 = max(0, r0 - hi), e - lo

        def allowed(device):
            i = torch.arange(r0 - k0, e - k0, device=device)[:, None]
            j = torch.arange(k1 - k0, device=device)[None, :]
            return (i - j >= lo) & (i - j <= hi)

        mask = self._mask(("band", lo, hi, e - r0, r0 - k0, k1 - k0), allowed)
        return r0, self.run(self._rows(r0, e), self.k[:, :, k0:k1], self.v[:, :, k0:k1], mask)

    def unbounded(self, lo, s, e):
        """Keys at distance lo or more, no window: keys 0..r0-lo, which every
        query of the block sees, without a mask; then the later queries'
        extra keys r0-lo+1..e-1-lo, a causal triangle."""
        r0 = max(s, lo)
        cut = r0 - lo + 1
        parts = [(r0, self.run(self._rows(r0, e), self.k[:, :, :cut], self.v[:, :, :cut], None))]
        n = e - r0 - 1
        if n:
            mask = self._mask(("triangle", n), lambda device: torch.ones(n, n, dtype=torch.bool, device=device).tril())
            keys = slice(cut, cut + n)
            parts.append((r0 + 1, self.run(self._rows(r0 + 1, e), self.k[:, :, keys], self.v[:, :, keys], mask)))
        return parts

    def span(self, r0, r1, k0, k1, window, causal=True):
        """Queries r0..r1-1 over keys k0..k1-1: causal (j <= i) and within
        the window where asked; no mask where every pair is allowed."""
        needs = (causal and k1 - 1 > r0) or (window and r1 - 1 - k0 >= window)
        mask = None
        if needs:

            def allowed(device):
                i = torch.arange(r0 - k0, r1 - k0, device=device)[:, None]
                j = torch.arange(k1 - k0, device=device)[None, :]
                ok = (j <= i) if causal else torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=device)
                return ok & (i - j < window) if window else ok

            mask = self._mask(("span", r0 - k0, r1 - r0, k1 - k0, window, causal), allowed)
        return r0, self.run(self._rows(r0, r1), self.k[:, :, k0:k1], self.v[:, :, k0:k1], mask)

    def _rows(self, r0, r1):
        """Queries r0..r1-1 (absolute) folded into rows, (B, Hkv, G * n, D)."""
        return self.q[:, :, :, r0 - self.q0 : r1 - self.q0].flatten(2, 3)

    def _mask(self, key, allowed):
        """The additive mask of a part, (G * rows, keys): 0 where allowed,
        -inf elsewhere, repeated for the G folded heads."""

        def build():
            ok = allowed(self.k.device)
            add = torch.zeros(ok.shape, dtype=self.dtype, device=ok.device).masked_fill_(~ok, float("-inf"))
            return add.repeat(self.G, 1)

        return self.masks.get((*key, self.dtype), build)


def _fused_part(q, k, v, mask):
    """(output, log-sum-exp) of one part by torch's CPU flash kernel."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=mask, scale=1.0 / math.sqrt(q.shape[-1])
    )


def _written_part(q, k, v, mask):
    """(output, log-sum-exp) of one part written out in float32; both carry
    gradients."""
    scores = (q @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]).to(v.dtype) @ v, lse


def _merge(parts, G, n):
    """A block's output (B, Hkv, G, n, D) in float32 from its parts
    (first row, (output, lse)); the first covers all n rows, the others
    the block's last rows. Merging o_a with o_b is a lerp by the share of
    b's softmax mass, sigmoid(l_b - l_a)."""
    (_, (out, lse)), rest = parts[0], parts[1:]
    out, lse = out.float().unflatten(2, (G, n)), lse.unflatten(2, (G, n))
    for index, (_, (o, l)) in enumerate(rest):
        o, l = o.float().unflatten(2, (G, -1)), l.unflatten(2, (G, -1))
        tail = n - o.shape[3]
        share = torch.sigmoid(l - lse[..., tail:])[..., None]
        if _needs_grad(out, o, share):
            out = torch.cat((out[..., :tail, :], torch.lerp(out[..., tail:, :], o, share)), dim=3)
        else:  # the parts' outputs are this call's own tensors
            out[..., tail:, :].lerp_(o, share)
        if index < len(rest) - 1:
            lse = torch.cat((lse[..., :tail], torch.logaddexp(lse[..., tail:], l)), dim=3)
    return out
