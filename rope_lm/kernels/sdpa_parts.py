"""What every SDPA path of the attention kernels shares: grouped key/value
heads repeated over their query heads, and gpt-oss's learned sink logit
carried as an extra key that a fused kernel computes exactly."""

import math

import torch
import torch.nn.functional as F


def match_heads(q, *kv):
    """k, v (B, Hkv, T, D) repeated to q's H heads; query head h reads
    key/value head h // (H / Hkv), the grouping of Llama and transformers."""
    H = q.shape[1]
    out = []
    for t in kv:
        if t.shape[1] != H:
            if H % t.shape[1]:
                raise ValueError(f"{t.shape[1]} key/value heads cannot serve {H} query heads.")
            t = t.repeat_interleave(H // t.shape[1], dim=1)
        out.append(t)
    return out


def with_sink_key(q, k, v, sink):
    """q (B, h, t, D), k and v (B, h, s, D) and a key 0 prepended whose logit
    is ``sink`` (broadcast to (B, h, t, 1)) for every query and whose value is
    zero. The sink rides in an extra query channel that meets 1 / scale in
    the sink key's and 0 in every other key's, so a fused kernel computes the
    gpt-oss softmax exactly, gradients to the sink included. Channels are
    padded to a multiple of 8 (what CUDA's fused kernels take); pass
    scale=1 / sqrt(D) to SDPA."""
    B, h, t, D = q.shape
    pad = 8 - D % 8
    col = sink.to(q.dtype).expand(B, h, t, 1)
    q = torch.cat((q, col, q.new_zeros(B, h, t, pad - 1)), -1)
    k = F.pad(k, (0, pad))
    key = k.new_zeros(B, k.shape[1], 1, D + pad)
    key[..., D] = math.sqrt(D)
    k = torch.cat((key, k), 2)
    v = torch.cat((v.new_zeros(B, v.shape[1], 1, v.shape[3]), v), 2)
    return q, k, v


def sink_column(plan, H):
    return plan.sink_logits.reshape(1, H, 1, 1)
