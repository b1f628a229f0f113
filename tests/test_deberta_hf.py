"""rope-lm's DeBERTa attention against transformers' DeBERTa-v2
DisentangledSelfAttention: with p2c=released the attention probabilities
are the same; with p2c=paper (delta(j, i)) exactly the p2c term differs."""

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DebertaV2Config  # noqa: E402
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention  # noqa: E402

from rope_lm.core.errors import ConfigError  # noqa: E402
from rope_lm.kernels.attention import AttnPlan, attention_probs  # noqa: E402
from rope_lm.positional import Dims, PosContext, build_scheme  # noqa: E402
from rope_lm.scaling import build_scaling  # noqa: E402

K, MAX_REL, C, H, T = 8, 16, 32, 4, 24  # T > MAX_REL: exact, log-bucketed and clipped distances all occur


def pair(p2c, pos_att_type=("c2p", "p2c")):
    torch.manual_seed(0)
    config = DebertaV2Config(
        hidden_size=C,
        num_attention_heads=H,
        relative_attention=True,
        position_buckets=K,
        max_relative_positions=MAX_REL,
        pos_att_type=list(pos_att_type),
        share_att_key=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    theirs = DisentangledSelfAttention(config).eval()
    ours = build_scheme(
        {"name": "deberta", "position_buckets": K, "max_relative_positions": MAX_REL, "p2c": p2c},
        Dims(C, H, C // H, 1, 16),
    )
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(0.3 * torch.randn_like(p))
        ours.rel_embeddings.copy_(torch.randn(2 * K, C))
        # rope-lm's position projections have no bias: K^r = P W_{k,r}
        theirs.pos_key_proj.bias.zero_()
        theirs.pos_query_proj.bias.zero_()
        ours.w_kr[0].copy_(theirs.pos_key_proj.weight.t())
        ours.w_qr[0].copy_(theirs.pos_query_proj.weight.t())
    return ours, theirs


def probabilities(ours, theirs):
    x = torch.randn(2, T, C)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(2, 1, T, T)
    with torch.no_grad():
        _, want = theirs(x, causal, output_attentions=True, rel_embeddings=ours.rel_embeddings.detach())
        q, k = (proj(x).view(2, T, H, C // H).transpose(1, 2) for proj in (theirs.query_proj, theirs.key_proj))
        pos = torch.arange(T)
        ctx = PosContext(seq_len=T, train_len=16, scaling=build_scaling(None))
        got = attention_probs(q, k, ours, 0, pos, AttnPlan(), ctx)
    return got, want


def test_released_convention_equals_transformers():
    got, want = probabilities(*pair("released"))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_paper_convention_differs_only_in_p2c():
    got, want = probabilities(*pair("paper"))
    assert (got - want).abs().max() > 1e-2
    # With p2c=released the two agree (above); c2p alone agrees under either
    # setting, so the paper/released difference is the p2c index, nothing else.
    ours, theirs = pair("paper")
    ours_released, _ = pair("released")
    c2p_only = lambda s: s.content_scores  # noqa: E731
    q = torch.randn(1, H, T, C // H)
    k = torch.randn(1, H, T, C // H)
    pos = torch.arange(T)
    ctx = PosContext(seq_len=T, train_len=16, scaling=build_scaling(None))
    with torch.no_grad():
        paper = c2p_only(ours)(0, q, torch.zeros_like(k), pos, pos, ctx)
        released = c2p_only(ours_released)(0, q, torch.zeros_like(k), pos, pos, ctx)
    torch.testing.assert_close(paper, released)  # k = 0: only the c2p term remains


def test_bad_p2c_is_refused():
    with pytest.raises(ConfigError, match=r"pos.p2c='both'"):
        build_scheme({"name": "deberta", "p2c": "both"}, Dims(C, H, C // H, 1, 16))
