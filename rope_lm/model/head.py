"""Cross-entropy of the output projection, a chunk of tokens at a time.

The full (tokens x vocab) logits of a 16k-token window with a 32k vocabulary
take 2 GiB in float32, and the log-softmax and its gradient as much again,
for a result of one number per token. Here each chunk's logits live only
while that chunk is scored; backward recomputes them from the saved hidden
states (one extra lm_head matmul per chunk) instead of keeping them.

Sequences of at most CHUNK_TOKENS tokens take the plain computation, so a
run whose batches fit in one chunk (the default training run: 16 x 128
tokens) computes exactly what it did before, bit for bit.
"""

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 4096
# Scoring only (no backward): a chunk's float32 logits held to this, so a large vocabulary scores fewer
# tokens at a time; up to 65,536 entries CHUNK_TOKENS fit. Gemma 3's 262,144 take 1,024 tokens a chunk: an
# 8,192-token window of Gemma 3 270M peaked at 3.9 GB instead of 10.0 GB, in the same time, to the same loss.
SCORING_LOGITS_BYTES = 1 << 30


def scoring_chunk(vocab_size: int) -> int:
    """Tokens a chunk when per-token losses are only scored (evaluation): CHUNK_TOKENS, fewer for a
    vocabulary whose logits would pass SCORING_LOGITS_BYTES."""
    return max(64, min(CHUNK_TOKENS, SCORING_LOGITS_BYTES // (4 * vocab_size)))


def _chunk_logits(h, weight):
    return F.linear(h, weight).float()


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, hidden, weight, targets, chunk):
        losses = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        lse = torch.empty_like(losses)
        for s in range(0, hidden.shape[0], chunk):
            logits = _chunk_logits(hidden[s : s + chunk], weight)
            lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
            losses[s : s + chunk] = lse[s : s + chunk] - logits.gather(1, targets[s : s + chunk, None])[:, 0]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return losses

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_losses):
        hidden, weight, targets, lse = ctx.saved_tensors
        chunk = ctx.chunk
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            # d loss_t / d logits_t = softmax_t - onehot(target_t), times the incoming gradient of loss_t.
            g = torch.exp(_chunk_logits(h, weight) - lse[s : s + chunk, None])
            g[torch.arange(h.shape[0], device=h.device), targets[s : s + chunk]] -= 1.0
            g = g * grad_losses[s : s + chunk, None]
            if grad_hidden is not None:
                grad_hidden[s : s + chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += g.t() @ h.float()
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None


def token_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = CHUNK_TOKENS
) -> torch.Tensor:
    """Per-token cross-entropy (float32, shape of targets) of the logits
    hidden @ weight.T, hidden (..., C), weight (vocab, C), without holding
    more than `chunk` tokens' logits at once."""
    h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if h.shape[0] <= chunk:
        return F.cross_entropy(_chunk_logits(h, weight), y, reduction="none").view(targets.shape)
    return _ChunkedCrossEntropy.apply(h, weight, y, chunk).view(targets.shape)


def mean_cross_entropy(hidden, weight, targets, chunk: int = CHUNK_TOKENS) -> torch.Tensor:
    """Mean token cross-entropy; within one chunk, exactly F.cross_entropy
    of the full logits (the training loss as it always was)."""
    if targets.numel() <= chunk:
        logits = F.linear(hidden, weight)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    return token_cross_entropy(hidden, weight, targets, chunk).mean()
