"""ppl@L, the per-position split at L_train and sliding windows, against hand computations."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.eval.evaluation import EvalConfig, _sliding, _stream, evaluate_lengths, scored_tokens
from rope_lm.model.transformer import build_model
from tests.conftest import TINY_MODEL


def ppl_at_length(model, stream, L: int, n: int, train_len: int, batch_tokens: int, buckets: int) -> dict:
    """The row of ppl@L under the stream protocol, as evaluate_lengths computes it for one length."""
    return _stream(model, stream, L, n, train_len, batch_tokens, buckets)[0]


def sliding_window_ppl(model, stream, L: int, n: int, stride: int, batch_tokens: int, buckets: int = 32) -> dict:
    """The row of the sliding protocol at L (each of n targets scored once with up to L tokens of context)."""
    return _sliding(model, stream, L, n, stride, L, batch_tokens, buckets)[0]


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


# --- protocols: sliding (batched), documents; bootstrap intervals -------------------------------

from rope_lm.eval import bootstrap  # noqa: E402
from rope_lm.eval.evaluation import eval_summary, plan_documents, sliding_windows, token_losses  # noqa: E402


def one_window_at_a_time(model, stream, L, n, stride):
    """The sliding window as a plain loop, one forward pass per window: the
    per-target losses in target order and each target's position in its window."""
    stride = min(stride, L)
    tokens = torch.from_numpy(np.asarray(stream[: n + 1], dtype=np.int64))
    losses, positions, begin = [], [], 0
    while begin < n:
        end = min(n, begin + (L if begin == 0 else stride))
        start = max(0, end - L)
        window = token_losses(model, tokens[start:end][None], tokens[start + 1 : end + 1][None], 10**6)[0]
        losses.append(window[begin - start :])
        positions += list(range(begin - start, end - start))
        begin = end
    return torch.cat(losses), positions


@pytest.mark.parametrize(
    "L, n, stride", [(16, 96, 1), (16, 100, 3), (12, 97, 5), (16, 64, 16), (16, 64, 40), (8, 50, 7)]
)
@pytest.mark.parametrize("batch", [1, 4, 1000])
def test_batched_sliding_window_equals_one_window_at_a_time(model, stream, L, n, stride, batch):
    ref, positions = one_window_at_a_time(model, stream, L, n, stride)
    row, units, got = _sliding(model, stream, L, n, stride, train_len=8, batch_tokens=batch * L, buckets=L)
    assert torch.equal(got, ref)  # the same tokens with the same contexts, bit for bit
    assert row["tokens"] == n == units.count.sum()
    assert row["loss"] == pytest.approx(float(ref.double().sum()) / n, rel=1e-12)
    starts, _ = sliding_windows(n, L, stride)
    assert row["windows"] == len(starts)
    for p in (0, L // 2, L - 1):  # per-position curve: position of each scored token in its window
        at_p = [float(v) for v, q in zip(ref, positions) if q == p]
        if at_p:
            assert row["per_position"]["loss"][p] == pytest.approx(sum(at_p) / len(at_p), rel=1e-9)
    beyond = [float(v) for v, q in zip(ref, positions) if q >= 8]
    assert row["tokens_beyond"] == len(beyond) == units.count_beyond.sum()
    # Units are blocks of L consecutive targets
    assert list(units.keys) == list(range(0, n, L))
    assert units.loss[0] == pytest.approx(float(ref[:L].double().sum()), rel=1e-12)


def test_sliding_stride_one_scores_every_token_with_its_full_context(model, stream):
    L, n = 8, 40
    row = sliding_window_ppl(model, stream, L, n, stride=1, batch_tokens=1024)
    nll = [hand_nll(model, [int(v) for v in stream[max(0, t - L + 1) : t + 1]], int(stream[t + 1])) for t in range(n)]
    assert row["windows"] == 1 + n - L
    assert row["ppl"] == pytest.approx(math.exp(sum(nll) / n), rel=1e-5)


# A hand-made split: 7 documents of known sizes (each ends with its EOS token, id 0).
DOC_SIZES = [5, 40, 20, 70, 33, 17, 36]


@pytest.fixture(scope="module")
def doc_split():
    rng = np.random.default_rng(1)
    docs = [np.append(rng.integers(1, 50, size=k - 1), 0) for k in DOC_SIZES]
    starts = np.cumsum([0] + DOC_SIZES[:-1])
    return np.concatenate(docs).astype(np.uint16), starts


def test_documents_protocol_scores_the_long_documents_truncated_to_L(model, doc_split):
    stream, starts = doc_split
    cfg = EvalConfig(lengths=[8, 16, 32], protocol="documents", token_budget=10**6, batch_tokens=64, position_buckets=8)
    rows = evaluate_lengths(model, stream, cfg, train_len=8, doc_starts=starts)
    long_enough = [i for i, k in enumerate(DOC_SIZES) if k >= 33]  # documents 1, 3, 4, 6
    assert long_enough == [1, 3, 4, 6]
    for row in rows:
        L = row["length"]
        assert row["documents"] == row["units"] == 4 and row["documents_shared"] and row["unit"] == "document"
        assert row["tokens"] == 4 * L  # every document contributes exactly L targets
        nll = [
            hand_nll(model, [int(v) for v in stream[starts[d] : starts[d] + t + 1]], int(stream[starts[d] + t + 1]))
            for d in long_enough
            for t in range(L)
        ]
        assert row["ppl"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
        first = [v for i, v in enumerate(nll) if i % L < row["per_position"]["width"]]
        assert row["per_position"]["loss"][0] == pytest.approx(sum(first) / len(first), rel=1e-5)
        assert row["ppl_lo"] <= row["ppl"] <= row["ppl_hi"]
    summary = eval_summary(cfg, len(stream), starts, 8)
    assert summary["documents"] == {"8": 4, "16": 4, "32": 4} and summary["scored_tokens"]["32"] == 128
    # The budget: token_budget / longest L documents, or eval.max_documents
    plan = plan_documents(starts, len(stream), [8, 16, 32], budget=64, max_documents=None)
    assert [list(c) for c in plan.chosen.values()] == [[1, 3]] * 3
    assert list(plan_documents(starts, len(stream), [8, 32], 10**6, max_documents=3).chosen[8]) == [1, 3, 4]


def test_documents_protocol_with_document_tokens_tiles_each_document_like_the_stream(model, doc_split):
    stream, starts = doc_split
    cfg = EvalConfig(
        lengths=[8, 12, 16],
        protocol="documents",
        document_tokens=40,
        token_budget=10**6,
        batch_tokens=64,
        position_buckets=4,
    )
    rows = evaluate_lengths(model, stream, cfg, train_len=8, doc_starts=starts)
    # B = 40 rounds down to 32 (a multiple of 16); documents with >= 33 tokens: 1, 3, 4, 6
    for row in rows:
        L = row["length"]
        assert (row["documents"], row["tokens"], row["document_tokens"], row["unit"]) == (4, 128, 32, "window")
        assert row["windows"] == row["units"] == 4 * -(-32 // L)
        # the hand reading: each document's first 32 targets, in windows of L starting fresh (12: 12, 12, 8)
        nll = []
        for d in (1, 3, 4, 6):
            for w in range(0, 32, L):
                ids = [int(v) for v in stream[starts[d] + w : starts[d] + min(w + L, 32) + 1]]
                nll += [hand_nll(model, ids[: t + 1], ids[t + 1]) for t in range(len(ids) - 1)]
        assert len(nll) == 128 and row["ppl"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
        # one document alone is the stream protocol on its tokens (48 targets: document 3, the first with 49)
        one = EvalConfig(lengths=[L], token_budget=48, batch_tokens=64, position_buckets=4, bootstrap=0)
        alone = evaluate_lengths(model, stream[starts[3] :], one, train_len=8)[0]
        mine = evaluate_lengths(
            model,
            stream,
            dataclasses.replace(cfg, lengths=[L], document_tokens=48, max_documents=1, bootstrap=0),
            train_len=8,
            doc_starts=starts,
        )[0]
        assert mine["ppl"] == pytest.approx(alone["ppl"], rel=1e-6)
    assert rows[2]["length"] == 16 and rows[2]["ppl_rel_paired"]  # windows of 8 nest in those of 16, per document
    summary = eval_summary(cfg, len(stream), starts, 8)
    assert summary["document_tokens"] == 32 and summary["scored_tokens"] == {"8": 128, "12": 128, "16": 128}
    with pytest.raises(ConfigError, match="document_tokens=8 is shorter than the longest evaluation length 16"):
        plan_documents(starts, len(stream), [8, 16], 10**6, None, document_tokens=8)
    with pytest.raises(ConfigError, match="No document of the test split has the 1025 tokens"):
        plan_documents(starts, len(stream), [8, 16], 10**6, None, document_tokens=1024)
    with pytest.raises(ConfigError, match="applies to eval.protocol=documents only"):
        EvalConfig(document_tokens=64).validate()


def test_documents_protocol_without_a_shared_set_says_how_many_each_length_used(model, doc_split):
    stream, starts = doc_split
    cfg = EvalConfig(lengths=[16, 35, 80], protocol="documents", token_budget=10**6, batch_tokens=64)
    rows = evaluate_lengths(model, stream, cfg, train_len=16, doc_starts=starts)
    # No document has 81 tokens: 16 scores the 6 documents of >= 17 tokens, 35 the 3 of >= 36, 80 is skipped.
    assert [(r["length"], r["documents"], r["documents_shared"], r["tokens"]) for r in rows] == [
        (16, 6, False, 96),
        (35, 3, False, 105),
    ]
    summary = eval_summary(cfg, len(stream), starts, 16)
    assert summary["skipped_lengths"] == [80] and summary["documents"] == {"16": 6, "35": 3}
    assert rows[1]["ppl_rel_paired"] is False  # different documents: resampled independently
    with pytest.raises(ConfigError, match="No document of the test split has the 81 tokens"):
        plan_documents(starts, len(stream), [80, 160], 10**6, None)


def test_documents_of_a_real_cache_end_with_their_eos(tiny_cache):
    stream, starts = tiny_cache.tokens("test"), tiny_cache.doc_starts("test")
    plan = plan_documents(starts, len(stream), [16, 64], 10**6, None)
    ends = plan.starts + plan.lengths
    assert ends[-1] == len(stream) and (stream[ends - 1] == tiny_cache.eos_id).all()
    assert all(plan.lengths[d] >= 65 for d in plan.chosen[16])


def test_bootstrap_is_reproducible_by_seed_and_contains_the_estimate(model, stream):
    cfg = EvalConfig(multipliers=[1, 2, 4], token_budget=160, batch_tokens=64, bootstrap=500, seed=3)
    a = evaluate_lengths(model, stream, cfg, train_len=8)
    b = evaluate_lengths(model, stream, cfg, train_len=8)
    c = evaluate_lengths(model, stream, EvalConfig(**{**cfg.__dict__, "seed": 4}), train_len=8)
    for ra, rb, rc in zip(a, b, c):
        assert (ra["ppl_lo"], ra["ppl_hi"]) == (rb["ppl_lo"], rb["ppl_hi"])
        assert (ra["ppl_lo"], ra["ppl_hi"]) != (rc["ppl_lo"], rc["ppl_hi"]) and ra["ppl"] == rc["ppl"]
        for key in ("ppl", "ppl_within", "ppl_rel"):
            assert ra[f"{key}_lo"] <= ra[key] <= ra[f"{key}_hi"]
        assert ra["units"] == 160 // ra["length"] and ra["unit"] == "window"
    assert a[0]["ppl_rel_lo"] == a[0]["ppl_rel_hi"] == 1.0
    assert all(r["ppl_rel_paired"] for r in a)  # windows of 8 nest in windows of 16 and 32
    off = evaluate_lengths(model, stream, EvalConfig(**{**cfg.__dict__, "bootstrap": 0}), train_len=8)
    assert "ppl_lo" not in off[0] and off[1]["ppl"] == a[1]["ppl"]


def test_bootstrap_interval_is_the_percentile_of_resampled_unit_sums():
    rng = np.random.default_rng(0)
    loss, count = rng.uniform(10, 30, size=40), rng.integers(5, 15, size=40)
    lo, hi = bootstrap.ppl_interval(loss, count, 300, np.random.default_rng(7))
    # The same draws by hand, one resample at a time
    draw = np.random.default_rng(7).integers(0, 40, size=(300, 40))
    ppls = [math.exp(loss[i].sum() / count[i].sum()) for i in draw]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(ppls, [2.5, 97.5])), rel=1e-12)
    assert lo < math.exp(loss.sum() / count.sum()) < hi
    assert bootstrap.ppl_interval(loss[:1], count[:1], 300, np.random.default_rng(7)) == (None, None)


def _units(kind, keys, widths, loss, ends=True):
    keys, widths, loss = (np.asarray(x) for x in (keys, widths, loss))
    return bootstrap.Units(
        kind,
        keys,
        loss.astype(float),
        widths,
        np.zeros(len(keys)),
        np.zeros(len(keys), int),
        keys + widths if ends else None,
    )


def test_relative_ppl_is_paired_where_units_nest():
    fine = _units("window", np.arange(0, 32, 8), [8] * 4, [1.0, 2.0, 3.0, 4.0])
    coarse = _units("window", [0, 16], [16, 16], [5.0, 6.0])
    la, ca, lb, cb = bootstrap.pair(coarse, fine)
    assert list(lb) == [3.0, 7.0] and list(cb) == [16, 16] and list(la) == [5.0, 6.0]
    shifted = _units("window", [4, 20], [16, 12], [5.0, 6.0])
    assert bootstrap.pair(shifted, fine) is None  # a window of 16 starting at 4 splits windows of 8
    docs = _units("document", [1, 3, 4], [8] * 3, [1.0, 2.0, 3.0], ends=False)
    assert bootstrap.pair(docs, _units("document", [1, 3, 4], [16] * 3, [2.0, 4.0, 6.0], ends=False)) is not None
    assert bootstrap.pair(docs, _units("document", [1, 3], [16] * 2, [2.0, 4.0], ends=False)) is None


def test_paired_relative_interval_removes_the_shared_difficulty():
    rng = np.random.default_rng(0)
    hard = rng.uniform(2, 6, size=60)  # per-document difficulty, shared by both lengths
    a = _units("document", np.arange(60), [16] * 60, 16 * (hard + 0.1 + rng.normal(0, 0.01, 60)), ends=False)
    b = _units("document", np.arange(60), [8] * 60, 8 * hard, ends=False)
    paired = bootstrap.ratio_interval(a, b, 500, seed=0, length=16)
    b_other = _units("document", np.arange(100, 160), [8] * 60, 8 * hard, ends=False)
    independent = bootstrap.ratio_interval(a, b_other, 500, seed=0, length=16)
    assert paired["ppl_rel_paired"] and not independent["ppl_rel_paired"]
    ratio = math.exp(a.loss.sum() / a.count.sum() - b.loss.sum() / b.count.sum())
    for ci in (paired, independent):
        assert ci["ppl_rel_lo"] < ratio < ci["ppl_rel_hi"]
    assert (paired["ppl_rel_hi"] - paired["ppl_rel_lo"]) * 10 < independent["ppl_rel_hi"] - independent["ppl_rel_lo"]


@pytest.mark.parametrize(
    "options, words",
    [
        ({"protocol": "windows"}, "not an evaluation protocol"),
        ({"protocol": "sliding"}, "needs eval.sliding_stride"),
        ({"max_documents": 0}, "eval.max_documents=0 must be a positive integer"),
        ({"bootstrap": -1}, "0 turns the intervals off"),
        ({"seed": 1.5}, "eval.seed=1.5 must be an integer"),
    ],
)
def test_bad_protocol_settings_are_one_paragraph_errors(options, words):
    with pytest.raises(ConfigError, match=words) as e:
        EvalConfig(**options).validate()
    assert "\n" not in str(e.value)


def test_rows_are_reported_shortest_first_each_with_its_relative_ppl(model, stream):
    cfg = EvalConfig(multipliers=[0.5, 1, 2], token_budget=160, batch_tokens=64, bootstrap=200)
    reported = []
    rows = evaluate_lengths(model, stream, cfg, train_len=8, on_result=reported.append)
    assert [r["length"] for r in reported] == [r["length"] for r in rows] == [4, 8, 16]
    short = reported[0]
    assert short["ppl_rel"] == pytest.approx(short["ppl"] / reported[1]["ppl"])
    assert short["ppl_rel_paired"]  # windows of 4 nest in windows of 8
    assert short["ppl_rel_lo"] <= short["ppl_rel"] <= short["ppl_rel_hi"]
