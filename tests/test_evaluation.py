"""ppl@L, the per-position split at L_train and sliding windows, against hand computations."""

import math

import numpy as np
import pytest
import torch

from rope_lm.errors import ConfigError
from rope_lm.evaluation import EvalConfig, evaluate_lengths, ppl_at_length, scored_tokens, sliding_window_ppl
from rope_lm.model import build_model
from tests.conftest import TINY_MODEL


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = build_model(TINY_MODEL, {"name": "rope"}, None, vocab_size=50, train_len=8)
    return m.eval()


@pytest.fixture(scope="module")
def stream():
    return np.random.default_rng(0).integers(0, 50, size=200).astype(np.uint16)


def hand_nll(model, context: list[int], target: int) -> float:
    """-log p(target | context) from one forward of the context, in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([context]))[0, -1].double()
    return float(-(logits[target] - torch.logsumexp(logits, 0)))


def test_ppl_at_length_equals_a_hand_computation(model, stream):
    L, n = 16, 64
    row = ppl_at_length(model, stream, L, n, train_len=8, batch_tokens=32, buckets=4)
    nll = []
    for t in range(n):
        w0 = (t // L) * L  # each window starts fresh
        nll.append(hand_nll(model, [int(v) for v in stream[w0 : t + 1]], int(stream[t + 1])))
    assert row["tokens"] == n and row["windows"] == n // L
    assert row["ppl"] == pytest.approx(math.exp(sum(nll) / n), rel=1e-5)
    within = [v for t, v in enumerate(nll) if t % L < 8]
    beyond = [v for t, v in enumerate(nll) if t % L >= 8]
    assert row["loss_within"] == pytest.approx(sum(within) / len(within), rel=1e-5)
    assert row["loss_beyond"] == pytest.approx(sum(beyond) / len(beyond), rel=1e-5)
    assert row["per_position"]["width"] == 4
    first_bucket = [v for t, v in enumerate(nll) if t % L < 4]
    assert row["per_position"]["loss"][0] == pytest.approx(sum(first_bucket) / len(first_bucket), rel=1e-5)


def test_a_length_that_does_not_divide_the_budget_ends_in_a_shorter_window(model, stream):
    L, n = 12, 64  # 5 windows of 12 and one of 4: 1.5 x L_train, as the pe_extrapolation preset evaluates
    row = ppl_at_length(model, stream, L, n, train_len=8, batch_tokens=32, buckets=12)
    nll = []
    for t in range(n):
        w0 = (t // L) * L
        nll.append(hand_nll(model, [int(v) for v in stream[w0 : t + 1]], int(stream[t + 1])))
    pos = [t % L for t in range(n)]
    assert row["tokens"] == n and row["windows"] == 6
    assert row["ppl"] == pytest.approx(math.exp(sum(nll) / n), rel=1e-5)
    beyond = [v for v, p in zip(nll, pos) if p >= 8]
    assert row["tokens_beyond"] == len(beyond) == 20
    assert row["loss_beyond"] == pytest.approx(sum(beyond) / len(beyond), rel=1e-5)
    for p in (0, 3, 4, 11):  # positions the short window covers (6 scores) and does not (5)
        at_p = [v for v, q in zip(nll, pos) if q == p]
        assert row["per_position"]["loss"][p] == pytest.approx(sum(at_p) / len(at_p), rel=1e-5)
    # A bucket across the short window's end (positions 0-5; 0-3 scored 6 times, 4-5 5 times) is the token mean.
    coarse = ppl_at_length(model, stream, L, n, train_len=8, batch_tokens=32, buckets=2)["per_position"]
    first = [v for v, q in zip(nll, pos) if q < 6]
    assert coarse["width"] == 6 and coarse["loss"][0] == pytest.approx(sum(first) / len(first), rel=1e-5)


def test_fractional_multipliers_score_the_same_tokens(model, stream):
    cfg = EvalConfig(multipliers=[1, 1.25, 1.5, 2, 4], token_budget=100, batch_tokens=64, position_buckets=4)
    rows = evaluate_lengths(model, stream, cfg, train_len=8)
    assert [r["length"] for r in rows] == [8, 10, 12, 16, 32]
    assert {r["tokens"] for r in rows} == {96}


def test_every_length_scores_the_same_tokens(model, stream):
    cfg = EvalConfig(multipliers=[1, 2, 4], token_budget=100, batch_tokens=64, position_buckets=4)
    rows = evaluate_lengths(model, stream, cfg, train_len=8)
    assert [r["length"] for r in rows] == [8, 16, 32]
    assert {r["tokens"] for r in rows} == {96}  # budget rounded down to a multiple of the longest
    assert rows[0]["loss_beyond"] is None and rows[1]["loss_beyond"] is not None


def test_sliding_window_scores_each_token_once_with_bounded_context(model, stream):
    L, n = 16, 48
    same = sliding_window_ppl(model, stream, L, n, stride=L, batch_tokens=64)
    assert same["ppl"] == pytest.approx(ppl_at_length(model, stream, L, n, 8, 64, 4)["ppl"], rel=1e-6)
    stride = 4
    row = sliding_window_ppl(model, stream, L, n, stride=stride, batch_tokens=64)
    nll = []
    for t in range(n):
        if t < L:
            start = 0
        else:  # the window that scores t ends at the end of t's stride block
            end = min(n, L + ((t - L) // stride + 1) * stride)
            start = end - L
        nll.append(hand_nll(model, [int(v) for v in stream[start : t + 1]], int(stream[t + 1])))
    assert row["tokens"] == n
    assert row["ppl"] == pytest.approx(math.exp(sum(nll) / n), rel=1e-5)


def test_lengths_past_the_split_and_non_positive_lengths_are_refused():
    with pytest.raises(ConfigError, match="has 100 tokens.*longest evaluation length 128"):
        scored_tokens(100, [32, 128], 10_000)
    with pytest.raises(ConfigError, match="not positive"):
        EvalConfig(multipliers=[0, 1]).resolve_lengths(64)
    with pytest.raises(ConfigError, match="not positive"):
        EvalConfig(lengths=[-5]).resolve_lengths(64)
