"""FlexAttention as every path that runs it needs it: compiled once per
process, a causal (windowed, with sink tokens) block mask made once per
forward, gpt-oss's learned sink logits merged through its log-sum-exp, and a
failed compile remembered on the model's scheme so that its later calls take
SDPA at once. Shared by rope_lm/kernels/attention.py and the schemes that
compute their own attention (rope_lm/positional/_forget_gate.py)."""

import logging

import torch

from rope_lm.core.visible_keys import visible

log = logging.getLogger("rope_lm.core.flex")

_compiled = None


def flex_fn(compiled: bool = True):
    """torch's flex_attention, compiled once for the process (eager when not
    `compiled`: tests, and CPU where compiling costs more than it saves)."""
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled
    if not compiled:
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def block_mask(T: int, window, sink_tokens: int, device, memo: dict):
    """The causal (windowed) block mask of T queries over T keys, made once per
    forward (memo: PosContext.memo) and shared by every layer that asks."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = ("flex_block_mask", T, window, sink_tokens, str(device))
    if key not in memo:

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(q_idx, kv_idx, window, sink_tokens)

        memo[key] = create_block_mask(mask_mod, None, None, T, T, device=device)
    return memo[key]


def with_sinks(flex, q, k, v, score_mod, mask, sink_logits):
    """flex(q, k, v) with learned sink logits (H,) in each softmax's
    denominator (None: none): every weight shrinks by
    exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)."""
    if sink_logits is None:
        return flex(q, k, v, score_mod=score_mod, block_mask=mask)
    from torch.nn.attention.flex_attention import AuxRequest

    out, aux = flex(q, k, v, score_mod=score_mod, block_mask=mask, return_aux=AuxRequest(lse=True))
    keep = torch.sigmoid(aux.lse.float() - sink_logits.float()[None, :, None])
    return (out * keep[..., None].to(out.dtype)).to(out.dtype)


def failed_on(scheme, device) -> bool:
    """Whether compiled flex already failed for this scheme instance on this device type."""
    return device.type in getattr(scheme, "flex_failed_on", ())


def remember_failure(scheme, device, error: Exception) -> None:
    """Remembered on this scheme instance (this model) only: no C++ compiler
    or Triton on that device, or a score_mod it cannot lower."""
    scheme.flex_failed_on = getattr(scheme, "flex_failed_on", frozenset()) | {device.type}
    log.warning(
        "Compiled flex attention is unavailable for %s on %s (%s: %s); using sdpa.",
        scheme.name,
        device.type,
        type(error).__name__,
        str(error).splitlines()[0] if str(error) else "",
    )
