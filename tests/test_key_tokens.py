"""Key-token perplexity (rope_lm/probes/key_tokens.py, LongPPL): the selection is the paper's two
thresholds on the long-short difference and the long-context log-likelihood, computed here by hand on
fixed losses; the short losses are each target's loss from its own short window; the key-token PPL
is exp(mean NLL) over the selected targets; a model that copies from far back has exactly the copied
tokens as key tokens; the evaluator's losses are kept in a file keyed by what they depend on."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.probes import key_tokens as K
from tests.test_repeated_span import Induction


def test_selection_is_the_two_thresholds_on_candidates_computed_by_hand():
    # Binary fractions, so that differences at the thresholds are exact in float32 as by hand.
    long = torch.tensor(
        [
            [0.125, 0.5, 1.0, 0.5, 1.875, 2.0, 0.25, 3.0],
            [0.25, 0.125, 0.25, 1.5, 0.5, 0.0, 1.0, 1.75],
        ]
    )
    short = torch.tensor(
        [
            [9.0, 9.0, 9.0, 2.5, 4.0, 6.0, 2.25, 8.0],
            [9.0, 9.0, 9.0, 3.625, 2.5, 2.0, 3.125, 4.5],
        ]
    )
    alpha, beta, k = 2.0, -2.0, 3
    expected = torch.zeros_like(long, dtype=torch.bool)
    for w in range(2):
        for j in range(long.shape[1]):
            lsd = short[w, j].item() - long[w, j].item()
            lcl = -long[w, j].item()
            expected[w, j] = j >= k and lsd > alpha and lcl > beta
    chosen = K.select(long, short, k, alpha, beta)
    assert torch.equal(chosen, expected)
    # The edges, one by one: j < K never (however large the difference); LSD of exactly alpha and a long
    # loss of exactly -beta are not above the thresholds; a NaN short loss is no key token.
    assert chosen[0].tolist() == [False, False, False, False, True, False, False, False]
    assert chosen[1].tolist() == [False, False, False, True, False, False, True, True]
    short[1, 3] = float("nan")
    assert not K.select(long, short, k, alpha, beta)[1, 3]


def test_key_token_ppl_is_exp_of_the_mean_nll_over_the_selected_targets():
    g = torch.Generator().manual_seed(0)
    losses = torch.rand(6, 10, generator=g) * 5
    key = torch.rand(6, 10, generator=g) > 0.7
    key[2] = False  # a window with no key token
    out = K.score(losses, key, 500, 0, 10)
    assert out["key_ppl"] == pytest.approx(math.exp(losses[key].double().mean().item()), rel=1e-9)
    assert out["ppl"] == pytest.approx(math.exp(losses.double().mean().item()), rel=1e-9)
    assert (out["key_tokens"], out["tokens"], out["windows"]) == (int(key.sum()), 60, 6)
    assert out["key_share"] == pytest.approx(int(key.sum()) / 60)
    assert out["ppl_lo"] <= out["ppl"] <= out["ppl_hi"] and out["key_ppl_lo"] <= out["key_ppl"] <= out["key_ppl_hi"]
    none = K.score(losses, torch.zeros_like(key), 500, 0, 10)
    assert none["key_ppl"] is None and none["key_ppl_lo"] is None and none["key_tokens"] == 0


def tiny_model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, train_len=16, n_layer=2, n_head=2, d_model=32, tie_embeddings=False)
    m = TransformerLM(cfg, {"name": "rope"})
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@pytest.mark.parametrize("short,stride", [(8, 1), (8, 3), (8, 8)])
def test_each_targets_short_and_long_losses_are_its_own_forwards(short, stride):
    model = tiny_model()
    stream = np.random.default_rng(1).integers(0, 61, size=3 * 21 + 1)
    x, y = K.windows(stream, 21, 3)
    assert torch.equal(x[1], torch.from_numpy(stream[21:42])) and torch.equal(y[1], torch.from_numpy(stream[22:43]))
    long, short_loss = K.evaluator_losses(model, x, y, short, stride, batch_tokens=40)
    assert torch.isnan(short_loss[:, :short]).all()
    for w in range(3):
        for j in range(21):
            with torch.no_grad():
                whole = F.cross_entropy(model(x[w : w + 1, : j + 1])[0, -1], y[w, j]).item()
            assert long[w, j].item() == pytest.approx(whole, abs=1e-5)
            if j < short:
                continue
            # Short windows end every `stride` targets past K: target j is read from the window whose
            # block of `stride` targets holds it, K inputs ending at that block's end (or the text's).
            end = min(short + ((j - short) // stride + 1) * stride, 21)
            begin = end - short
            assert short - stride + 1 <= j - begin + 1 <= short  # its context: K - S + 1 to K tokens
            with torch.no_grad():
                alone = F.cross_entropy(model(x[w : w + 1, begin : j + 1])[0, -1], y[w, j]).item()
            assert short_loss[w, j].item() == pytest.approx(alone, abs=1e-5)


def test_a_model_that_copies_from_far_back_has_exactly_the_copied_tokens_as_key_tokens():
    vocab, T, k = 64, 40, 8
    tokens = np.random.default_rng(0).permutation(vocab)[: T + 1]
    tokens[30:36] = tokens[2:8]  # a block repeated 28 tokens later, past the short context
    x, y = K.windows(tokens, T, 1)
    reader = Induction(vocab, lookback=10_000, strength=10.0)
    long, short = K.evaluator_losses(reader, x, y, k, 1, batch_tokens=4096)
    chosen = K.select(long, short, k, K.ALPHA, K.BETA)
    # Input 30 + i (the block's i-th token) was seen at 2 + i and what followed it is the target for i < 5;
    # the block's last token was followed by other text the first time: the model is wrong there.
    assert torch.nonzero(chosen[0]).flatten().tolist() == [30, 31, 32, 33, 34]
    blind = Induction(vocab, lookback=0)
    assert not K.select(*K.evaluator_losses(blind, x, y, k, 1, 4096), k, K.ALPHA, K.BETA).any()


def test_the_evaluators_losses_are_kept_for_their_key_only(tmp_path):
    long, short = torch.rand(2, 5), torch.rand(2, 5)
    key = K.cache_key({"identity": {"weights": "abc", "step": 3}, "scaling": None}, "text1", 4, 1)
    path = K.cache_file(str(tmp_path), key)
    assert K.read_cached(path, key) is None
    K.write_cached(path, key, long, short, {"train_len": 4, "tokenizer": None})
    got = K.read_cached(path, key)
    assert torch.equal(got[0], long) and torch.equal(got[1], short)
    other = K.cache_key({"identity": {"weights": "abd", "step": 3}, "scaling": None}, "text1", 4, 1)
    assert K.cache_file(str(tmp_path), other) != path and K.read_cached(path, other) is None
    with open(path, "wb") as f:
        f.write(b"not a numpy file")
    assert K.read_cached(path, key) is None
    x = torch.arange(12).view(2, 6)
    assert K.text_digest(x, x + 1) != K.text_digest(x, x + 2) and K.text_digest(x, x + 1) == K.text_digest(x, x + 1)
    a, b = torch.tensor([[True, False]]), torch.tensor([[False, True]])
    assert K.selection_id("t", a) != K.selection_id("t", b) and K.selection_id("t", a) != K.selection_id("u", a)


def test_the_tokenizers_must_cut_the_text_alike():
    tok = {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "pre_tokenizer": None}
    same = json.dumps(tok)
    assert K.same_tokenizer(same, json.dumps(tok, indent=2))
    assert K.same_tokenizer(same, json.dumps({**tok, "padding": {"length": 8}}))
    assert not K.same_tokenizer(same, json.dumps({**tok, "model": {"type": "BPE", "vocab": {"a": 1, "b": 0}}}))
    assert not K.same_tokenizer(same, None) and not K.same_tokenizer(None, None)


def test_bad_key_token_settings_are_refused_in_one_paragraph():
    with pytest.raises(ConfigError, match=r"stride S between 1 and K"):
        K.check(8, 9, 2.0, -2.0, None)
    with pytest.raises(ConfigError, match=r"the length 8 is not longer than the short context K = 8"):
        K.check(8, 2, 2.0, -2.0, [8, 16])
    with pytest.raises(ConfigError, match="key_tokens.alpha=nan must be a finite number"):
        K.check(None, None, float("nan"), -2.0, None)
    K.check(8, 8, 2.0, -2.0, [9])
    assert K.window_count(1000, 100, 32_768) == 9 and K.window_count(1000, 100, 250) == 2
    assert K.window_count(1000, 100, 50) == 1
