"""The repeated-span probe (rope_lm/probes/repeated_span.py): the sequences hold what they say (a span,
filler, the span again d tokens after its start; the control with the first copy replaced by other
text), the loss is the second copy's NLL computed straight from the logits, and a model that reads d
tokens back shows the drop where a model that cannot shows none."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import ModelConfig, TransformerLM
from rope_lm.probes import repeated_span as RS


def test_the_regions_are_disjoint_deterministic_and_shared_across_distances():
    n, span, longest = 2_000, 5, 80
    stream = np.arange(n)  # every token unique: a token tells where in the stream it came from
    draws = RS.draw(n, span, longest, 12, seed=3)
    assert draws == RS.draw(n, span, longest, 12, seed=3)
    assert RS.draw(n, span, longest, 20, seed=3)[:12] == draws  # more samples keep the earlier ones
    assert RS.draw(n, span, longest, 12, seed=4) != draws
    tails = {}
    for d in (5, 10, 40, 80):
        with_copy, without = RS.sequences(stream, draws, span, longest, d)
        assert with_copy.shape == without.shape == (12, d + span)
        for row, other, draw in zip(with_copy.numpy(), without.numpy(), draws):
            copy = stream[draw.span : draw.span + span]
            assert (row[:span] == copy).all() and (row[d:] == copy).all()  # the copies d apart
            assert (other[d:] == copy).all() and (other[:span] == stream[draw.other : draw.other + span]).all()
            assert (row[span:d] == other[span:d]).all()  # the same filler on both sides
            filler_end = draw.filler + longest - span
            assert (row[span:d] == stream[filler_end - (d - span) : filler_end]).all()
            regions = [set(range(draw.span, draw.span + span)), set(range(draw.other, draw.other + span))]
            regions.append(set(range(draw.filler, filler_end)))
            assert sum(len(r) for r in regions) == len(set().union(*regions))  # disjoint in the stream
            assert max(max(r) for r in regions) < n
        # The text right before the second copy is the same at every distance: only the first copy moves.
        if d - span >= 3:
            tails[d] = with_copy[:, d - 3 : d].numpy()
    assert all((t == tails[80]).all() for t in tails.values())


def tiny_model(vocab=61, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, train_len=16, n_layer=2, n_head=2, d_model=32, tie_embeddings=False)
    m = TransformerLM(cfg, {"name": "rope"})
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


def test_the_loss_is_the_second_copys_nll_from_the_logits():
    model = tiny_model()
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 61, size=600)
    span, distances = 4, [4, 12, 24]
    draws = RS.draw(len(stream), span, max(distances), 6, seed=1)
    for d in distances:
        row = RS.score_distance(model, stream, draws, span, max(distances), d, 16, 7, 200, seed=0)
        with_copy, without = RS.sequences(stream, draws, span, max(distances), d)
        by_hand = {}
        for name, rows in (("copy", with_copy), ("nocopy", without)):
            nll = []
            for seq in rows:
                with torch.no_grad():
                    logits = model(seq[None, :-1])[0]
                # Input d - 1 + j predicts token d + j: the second copy's j-th token.
                nll.append(F.cross_entropy(logits[d - 1 : d + span - 1], seq[d : d + span]).item())
            by_hand[name] = np.array(nll)
            assert row["per_sample"][name] == pytest.approx(nll, abs=1e-5)
            assert row[name]["loss"] == pytest.approx(np.mean(nll), abs=1e-5)
            assert row[name]["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-5)
            assert row[name]["loss_lo"] <= row[name]["loss"] <= row[name]["loss_hi"]
            assert row[name]["ppl_lo"] == pytest.approx(math.exp(row[name]["loss_lo"]), rel=1e-3)
        assert row["drop"]["loss"] == pytest.approx(np.mean(by_hand["nocopy"] - by_hand["copy"]), abs=1e-5)
        assert row["drop"]["loss_lo"] <= row["drop"]["loss"] <= row["drop"]["loss_hi"]
        assert (row["distance"], row["sequence"], row["samples"], row["ratio"]) == (d, d + span, 6, d / 16)


class Induction(torch.nn.Module):
    """Predicts, with logit `strength`, the token that followed the latest earlier occurrence of the
    current token within `lookback` positions (uniform where there is none): an induction head that
    reads exactly `lookback` tokens back. lookback=0 reads nothing but the current token."""

    def __init__(self, vocab: int, lookback: int, strength: float = 8.0):
        super().__init__()
        self.vocab, self.lookback, self.strength = vocab, lookback, strength
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # token_losses reads the device off a parameter

    def forward(self, x):
        B, T = x.shape
        t = torch.arange(T)
        gap = t[:, None] - t[None, :]  # query t, key p: t - p
        seen = (x[:, :, None] == x[:, None, :]) & (gap > 0) & (gap <= self.lookback)
        latest = torch.where(seen, t[None, None, :].expand(B, T, T), -1).amax(-1)  # (B, T)
        follower = x.gather(1, (latest + 1).clamp(max=T - 1))
        logits = torch.zeros(B, T, self.vocab)
        hit = latest >= 0
        logits[hit] = logits[hit].scatter(-1, follower[hit][:, None], self.strength)
        return logits


def test_a_model_that_reads_d_back_copies_and_one_that_cannot_shows_no_drop():
    vocab, span, lookback, strength = 3_000, 6, 16, 8.0
    stream = np.random.default_rng(0).permutation(vocab)  # no token repeats: only the copy can be copied
    distances = [6, 8, 16, 17, 32, 64]
    draws = RS.draw(len(stream), span, max(distances), 5, seed=0)
    uniform = math.log(vocab)
    copied = math.log1p((vocab - 1) * math.exp(-strength))  # the loss of a token the model copies
    reader, blind = Induction(vocab, lookback, strength), Induction(vocab, 0, strength)
    for d in distances:
        row = RS.score_distance(reader, stream, draws, span, max(distances), d, 16, 4096, 100, seed=0)
        assert row["nocopy"]["loss"] == pytest.approx(uniform, abs=1e-4)
        if d <= lookback:  # the second copy's tokens but its first follow a token seen d back: copied
            expected = (uniform + (span - 1) * copied) / span
            assert row["per_sample"]["copy"] == pytest.approx([expected] * 5, abs=1e-4)
            assert row["drop"]["loss"] > 5 and row["drop"]["loss_lo"] > 5
        else:  # the first copy is out of its reach: both sides are the same
            assert row["per_sample"]["copy"] == row["per_sample"]["nocopy"]
            assert row["drop"] == {"loss": 0.0, "loss_lo": 0.0, "loss_hi": 0.0}
        flat = RS.score_distance(blind, stream, draws, span, max(distances), d, 16, 4096, 100, seed=0)
        assert flat["per_sample"]["copy"] == flat["per_sample"]["nocopy"] and flat["drop"]["loss"] == 0.0


def test_a_prefix_is_read_first_and_moves_nothing_the_probe_scores():
    """Gemma's <bos>: a token before the first copy, not scored; the copies keep their distance, and a
    reader of d tokens back still copies exactly where it did."""
    vocab, span, d, bos = 3_000, 6, 16, 2_999
    stream = np.random.default_rng(0).permutation(vocab - 1)
    draws = RS.draw(len(stream), span, 32, 5, seed=0)
    plain = RS.sequences(stream, draws, span, 32, d)
    with_bos = RS.sequences(stream, draws, span, 32, d, prefix=[bos])
    for a, b in zip(plain, with_bos):
        assert b.shape == (5, d + span + 1) and (b[:, 0] == bos).all() and torch.equal(b[:, 1:], a)
    reader = Induction(vocab, d)
    row = RS.score_distance(reader, stream, draws, span, 32, d, 16, 4096, 100, seed=0, prefix=[bos])
    assert row["sequence"] == d + span + 1
    assert row == {
        **RS.score_distance(reader, stream, draws, span, 32, d, 16, 4096, 100, seed=0),
        "sequence": d + span + 1,
    }


def test_the_tokenizers_own_prefix_and_the_warning_for_text_cut_mid_document():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    from rope_lm.data.special_tokens import encode_piece, mid_text_warning, text_prefix

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert text_prefix(tok) == [] and mid_text_warning(tok, "x") is None
    tok.add_special_tokens(["<bos>"])
    tok.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 3)])
    assert tok.encode("a b").ids == [3, 0, 1] and encode_piece(tok, "a b") == [0, 1] and text_prefix(tok) == [3]
    text = mid_text_warning(tok, "eval.protocol=stream")
    assert text.startswith("eval.protocol=stream starts windows in the middle of documents, without the '<bos>'")
    assert "eval.protocol=documents" in text and "\n" not in text


def test_bad_spans_and_short_texts_are_refused_in_one_paragraph():
    with pytest.raises(ConfigError, match=r"the distance 8 is shorter than the span \(16 tokens\)"):
        RS.check(16, [8, 16, 32])
    with pytest.raises(ConfigError, match="span=0 must be a positive"):
        RS.check(0, [8])
    with pytest.raises(ConfigError, match=r"has 100 tokens, too few .* it takes 136"):
        RS.check(8, [8, 128], n_tokens=100)
    RS.check(8, [8, 128], n_tokens=136)
    assert len(RS.draw(136, 8, 128, 3, 0)) == 3  # exactly enough text: the regions side by side
