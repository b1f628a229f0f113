"""Inverse frequencies and attention factors equal Hugging Face transformers'
(modeling_rope_utils.ROPE_INIT_FUNCTIONS) over a grid of head_dim, base,
training length, factor and current length. transformers is a test-only
dependency."""

import itertools
import math

import pytest
import torch

pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from rope_lm.positional import PosContext  # noqa: E402
from rope_lm.positional import frequencies as F  # noqa: E402
from rope_lm.scaling import build_scaling  # noqa: E402

hf_logging.set_verbosity_error()

HEAD_DIMS = (16, 64, 128)
BASES = (10000.0, 500000.0)
TRAIN_LENS = (16, 256, 4096)
FACTORS = (1.0, 1.5, 4.0, 16.0)
RTOL = 2e-6  # transformers computes in float32; we compute in float64 and round once


def hf(rope_type, head_dim, base, max_pos, seq_len=None, partial=1.0, **params):
    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": rope_type, "rope_theta": base, "partial_rotary_factor": partial, **params},
    )
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def assert_same(ours, theirs):
    (inv, factor), (ref_inv, ref_factor) = ours, theirs
    assert inv.dtype == torch.float32 and inv.shape == ref_inv.shape
    torch.testing.assert_close(inv, ref_inv.float(), rtol=RTOL, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12, abs=1e-12)


def grid():
    return itertools.product(HEAD_DIMS, BASES, TRAIN_LENS, FACTORS)


def test_linear_matches_hf():
    for d, base, L, s in grid():
        assert_same(F.linear(d, base, L, L * s), hf("linear", d, base, L, factor=s))


def test_dynamic_matches_hf_at_every_length():
    for d, base, L, s in grid():
        for T in (L // 2, L, L + 1, 3 * L, 8 * L):
            assert_same(F.dynamic_ntk(d, base, L, T, s), hf("dynamic", d, base, L, seq_len=T, factor=s))


@pytest.mark.parametrize(
    "rope_type,ours,band_keys,bands",
    [
        ("yarn", F.yarn, ("beta_fast", "beta_slow"), ((32, 1), (16, 2))),
        ("llama3", F.llama3, ("low_freq_factor", "high_freq_factor"), ((1.0, 4.0), (2.0, 8.0))),
    ],
)
def test_band_methods_match_hf(rope_type, ours, band_keys, bands):
    """YaRN and Llama 3: frequencies split into kept / ramped / interpolated bands by two knobs."""
    for d, base, L, s in grid():
        for band in bands:
            ref = hf(
                rope_type,
                d,
                base,
                int(L * max(s, 2)),
                factor=s,
                original_max_position_embeddings=L,
                **dict(zip(band_keys, band)),
            )
            assert_same(ours(d, base, L, L * s, *band), ref)


def test_yarn_without_truncation_matches_hf():
    for d, base, L, s in grid():
        ref = hf("yarn", d, base, int(L * max(s, 2)), factor=s, original_max_position_embeddings=L, truncate=False)
        assert_same(F.yarn(d, base, L, L * s, truncate=False), ref)
    # the fractional ends matter: rounding them gives other frequencies
    assert not torch.equal(F.yarn(64, 1e4, 256, 1024, truncate=False)[0], F.yarn(64, 1e4, 256, 1024)[0])


def test_longrope_matches_hf_short_and_long():
    for d, base, L, s in grid():
        g = torch.Generator().manual_seed(d + L)
        long = (1 + 8 * torch.rand(d // 2, generator=g)).tolist()
        short = (1 + 0.2 * torch.rand(d // 2, generator=g)).tolist()
        for T in (L // 2, L, L + 1, 4 * L):
            ref = hf(
                "longrope",
                d,
                base,
                int(L * max(s, 2)),
                seq_len=T,
                factor=s,
                original_max_position_embeddings=L,
                long_factor=long,
                short_factor=short,
            )
            assert_same(F.longrope(d, base, L, L * s, short, long, seq_len=T), ref)


def test_partial_rotary_matches_hf():
    # rope_lm passes the rotary width (head_dim * rotary_fraction) as rot_dim.
    for d, frac in ((64, 0.25), (128, 0.5)):
        r = int(d * frac)
        assert_same(
            F.yarn(r, 10000.0, 256, 1024),
            hf("yarn", d, 10000.0, 1024, partial=frac, factor=4.0, original_max_position_embeddings=256),
        )
        assert_same(
            F.dynamic_ntk(r, 10000.0, 256, 1000), hf("dynamic", d, 10000.0, 256, seq_len=1000, partial=frac, factor=1.0)
        )


@pytest.mark.parametrize(
    "name,rope_type", [("pi", "linear"), ("yarn", "yarn"), ("llama3", "llama3"), ("dynamic_ntk", "dynamic")]
)
def test_methods_with_auto_factor_match_hf_at_each_length(name, rope_type):
    """factor: auto at length T is HF with factor = T / L (dynamic: slope 1 at T)."""
    method = build_scaling({"name": name})
    d, base, L = 64, 10000.0, 128
    extra = {"low_freq_factor": 1.0, "high_freq_factor": 4.0} if name == "llama3" else {}
    for T in (64, 128, 200, 1024):
        ctx = PosContext(seq_len=T, train_len=L, scaling=method)
        s = max(1.0, T / L)
        if rope_type == "dynamic":
            ref = hf("dynamic", d, base, L, seq_len=T, factor=1.0)
        elif rope_type == "linear":
            ref = hf("linear", d, base, L, factor=s)
        else:
            ref = hf(rope_type, d, base, 2 * T, factor=s, original_max_position_embeddings=L, **extra)
        assert_same(method.rope_frequencies(d, base, ctx), ref)


def test_longrope_method_fixed_factor_matches_hf():
    d, base, L = 32, 10000.0, 64
    long, short = [1.0 + i for i in range(d // 2)], [1.0] * (d // 2)
    method = build_scaling({"name": "longrope", "factor": 8, "long_factor": long, "short_factor": short})
    for T in (32, 64, 65, 512):
        ctx = PosContext(seq_len=T, train_len=L, scaling=method)
        ref = hf(
            "longrope",
            d,
            base,
            8 * L,
            seq_len=T,
            factor=8.0,
            original_max_position_embeddings=L,
            long_factor=long,
            short_factor=short,
        )
        assert_same(method.rope_frequencies(d, base, ctx), ref)
        assert ref[1] == pytest.approx(math.sqrt(1 + math.log(8) / math.log(L)))
