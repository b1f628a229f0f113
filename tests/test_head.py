"""The chunked output head (rope_lm.model.head) equals the full computation:
per-token losses, their mean, and gradients with respect to the hidden
states and the (tied) output matrix; within one chunk it is the plain
computation bit for bit; and no call builds more than a chunk of logits."""

import torch
import torch.nn.functional as F

from rope_lm.eval import evaluation
from rope_lm.eval.evaluation import token_losses
from rope_lm.model import head
from rope_lm.train.lit import LitLM


def full_losses(hidden, weight, targets):
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


def test_chunked_losses_and_gradients_equal_the_full_computation():
    torch.manual_seed(0)
    B, T, C, V = 3, 17, 12, 40
    hidden = torch.randn(B, T, C, requires_grad=True)
    weight = torch.randn(V, C, requires_grad=True)
    targets = torch.randint(0, V, (B, T))
    # Uneven weights per token, so a gradient routed to the wrong token shows.
    mix = torch.rand(B, T)
    want = full_losses(hidden, weight, targets)
    want_grads = torch.autograd.grad((want * mix).sum(), [hidden, weight])
    for chunk in (1, 5, 16, B * T - 1):
        got = head.token_cross_entropy(hidden, weight, targets, chunk=chunk)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad((got * mix).sum(), [hidden, weight])
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    mean = head.mean_cross_entropy(hidden, weight, targets, chunk=5)
    torch.testing.assert_close(mean, want.mean(), atol=1e-6, rtol=1e-6)


def test_within_one_chunk_it_is_the_plain_computation_bit_for_bit():
    torch.manual_seed(1)
    hidden, weight = torch.randn(2, 9, 8), torch.randn(30, 8)
    targets = torch.randint(0, 30, (2, 9))
    plain = F.cross_entropy(F.linear(hidden, weight).float().flatten(0, 1), targets.flatten())
    assert torch.equal(head.mean_cross_entropy(hidden, weight, targets, chunk=18), plain)
    assert torch.equal(
        head.token_cross_entropy(hidden, weight, targets, chunk=18), full_losses(hidden, weight, targets)
    )


def test_no_call_holds_more_than_a_chunk_of_logits(monkeypatch):
    rows = []
    original = head._chunk_logits

    def recording(h, weight):
        rows.append(h.shape[0])
        return original(h, weight)

    monkeypatch.setattr(head, "_chunk_logits", recording)
    hidden = torch.randn(1, 50, 6, requires_grad=True)
    weight = torch.randn(20, 6, requires_grad=True)
    loss = head.mean_cross_entropy(hidden, weight, torch.randint(0, 20, (1, 50)), chunk=8)
    loss.backward()
    assert max(rows) == 8 and sum(rows) == 2 * 50  # forward and backward, every token once each


def _lit():
    torch.manual_seed(2)
    return LitLM(
        model={"n_layer": 2, "n_head": 2, "d_model": 16},
        pos={"name": "alibi"},
        scaling=None,
        optim={},
        vocab_size=64,
        train_len=16,
        max_steps=10,
    )


def test_training_loss_and_gradients_chunked_equal_full(monkeypatch):
    lit = _lit()
    x, y = torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16))
    want = F.cross_entropy(lit.model(x).float().flatten(0, 1), y.flatten())
    want_grads = torch.autograd.grad(want, list(lit.model.parameters()))
    monkeypatch.setattr(head, "CHUNK_TOKENS", 7)
    monkeypatch.setattr(head.mean_cross_entropy, "__defaults__", (7,))
    got = lit.loss((x, y))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    for g, w in zip(torch.autograd.grad(got, list(lit.model.parameters())), want_grads):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_evaluation_losses_chunked_equal_full(monkeypatch):
    model = _lit().model.eval()
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    with torch.no_grad():
        want = full_losses(model.hidden(x), model.lm_head.weight, y)
    seen = []
    monkeypatch.setattr(evaluation, "scoring_chunk", lambda vocab: seen.append(vocab) or 5)
    got = token_losses(model, x, y, batch_tokens=32)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert seen == [64, 64]  # each batch of two windows takes the scoring chunk of this vocabulary


def test_scoring_holds_a_large_vocabularys_logits_to_fewer_tokens(monkeypatch):
    """Gemma 3's 262,144-token vocabulary: 4,096 tokens' logits and their log-sum-exp took 8.6 GiB, the
    peak of every Gemma evaluation; scoring takes 1,024 at a time. Vocabularies up to 65,536 keep 4,096."""
    assert [head.scoring_chunk(v) for v in (8192, 49152, 65536, 262144, 10**8)] == [4096, 4096, 4096, 1024, 64]
    rows = []
    original = head._chunk_logits
    monkeypatch.setattr(head, "_chunk_logits", lambda h, w: rows.append(h.shape[0]) or original(h, w))

    class Wide(torch.nn.Module):
        def __init__(self, vocab=262_144):
            super().__init__()
            self.wte = torch.nn.Embedding(vocab, 4)
            self.lm_head = torch.nn.Linear(4, vocab, bias=False)

        def hidden(self, x):
            return self.wte(x)

    x = torch.randint(0, 262_144, (1, 2_500))
    token_losses(Wide(), x, x, batch_tokens=4_096)
    assert rows == [1024, 1024, 452]
