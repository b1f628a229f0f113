"""p-RoPE (Barbero et al. 2024): the highest frequencies of RoPE's own ladder
keep rotating and the lowest are zeroed, which is not GPT-NeoX's partial rotary
(rotary_fraction), whose ladder is laid over fewer channels."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rope_lm.core.errors import ConfigError
from rope_lm.hf import export_hf, load_hf
from rope_lm.hf.rope_params import p_rope_to_hf
from rope_lm.model.transformer import ModelConfig, TransformerLM, build_model
from rope_lm.positional import Dims, PosContext, build_scheme
from rope_lm.scaling import build_scaling
from tests.test_hf import LLAMA_SHAPED, VOCAB, assert_parity, randomize, save_hf

DIMS = Dims(d_model=64, n_head=4, head_dim=16, n_layer=2, train_len=32)
BASE = 10000.0


def ctx(T=64, scaling=None):
    return PosContext(seq_len=T, train_len=DIMS.train_len, scaling=build_scaling(scaling))


def model(**pos):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=64, train_len=32, vocab_size=50, mlp="swiglu")
    return TransformerLM(cfg, {"name": "rope", **pos}, None)


def test_p_rope_one_is_rope_bit_for_bit():
    idx = torch.randint(0, 50, (2, 48))
    plain, p1 = model(), model(p_rope=1.0)
    p1.load_state_dict(plain.state_dict())
    assert torch.equal(plain(idx), p1(idx))


@pytest.mark.parametrize("p,kept", [(0.75, 6), (0.5, 4), (0.25, 2), (0.1, 1)])
def test_keeps_exactly_the_highest_frequencies(p, kept):
    scheme = build_scheme({"name": "rope", "base": BASE, "p_rope": p}, DIMS)
    inv_freq, factor = scheme.frequencies(ctx())
    # By hand: RoPE's ladder over all 16 channels is base^(-2i/16), i = 0..7.
    ladder = torch.tensor([BASE ** (-2 * i / 16) for i in range(8)])
    torch.testing.assert_close(inv_freq[:kept], ladder[:kept])
    assert torch.all(inv_freq[kept:] == 0) and torch.all(inv_freq[:kept] > 0)
    assert factor == 1.0


def test_differs_from_partial_rotary():
    """rotary_fraction=0.5 rotates 8 channels with base^(-2i/8); p_rope=0.5
    rotates pairs 0..3 with base^(-2i/16): the same count, other frequencies."""
    partial, _ = build_scheme({"name": "rope", "rotary_fraction": 0.5}, DIMS).frequencies(ctx())
    p_rope, _ = build_scheme({"name": "rope", "p_rope": 0.5}, DIMS).frequencies(ctx())
    torch.testing.assert_close(partial, torch.tensor([BASE ** (-2 * i / 8) for i in range(4)]))
    assert not torch.allclose(p_rope[:4], partial)


def test_zeroed_channels_carry_no_position():
    """A query/key pair living only on the dropped pairs scores the same at any
    distance; on a kept pair the score turns with distance."""
    scheme = build_scheme({"name": "rope", "p_rope": 0.5}, DIMS)
    c = ctx()
    pos = torch.arange(40)

    def scores(channel):
        q = torch.zeros(1, 1, 40, 16)
        q[..., channel] = 1.0
        q[..., channel + 8] = 0.5  # half pairing: channel i with i + 8
        qr, kr = scheme.rotate(q, q.clone(), pos, pos, 0, c)
        return (qr[0, 0, -1] * kr[0, 0]).sum(-1)  # the last query against every key

    dropped, kept = scores(7), scores(0)
    torch.testing.assert_close(dropped, torch.full_like(dropped, 1.25))
    expected = 1.25 * torch.cos((39 - pos).float() * 1.0)  # pair 0 turns at frequency 1
    torch.testing.assert_close(kept, expected, atol=1e-5, rtol=1e-5)


def test_scaling_methods_act_on_the_kept_frequencies():
    """Under PI x4 the kept ones are divided by 4 and the dropped stay zero."""
    scheme = build_scheme({"name": "rope", "p_rope": 0.5}, DIMS)
    inv_freq, _ = scheme.frequencies(ctx(128, {"name": "pi", "factor": 4.0}))
    torch.testing.assert_close(inv_freq[:4], torch.tensor([BASE ** (-2 * i / 16) / 4 for i in range(4)]))
    assert torch.all(inv_freq[4:] == 0)


@pytest.mark.parametrize("p", [0.0, -0.5, 1.5])
def test_out_of_range_is_one_paragraph(p):
    with pytest.raises(ConfigError, match="pos.p_rope"):
        build_scheme({"name": "rope", "p_rope": p}, DIMS)


# --- transformers' rope_type "proportional" (import and export) ---


@pytest.mark.parametrize("p,factor", [(0.75, None), (0.5, 2.0), (0.35, None)])
def test_proportional_checkpoints_load_as_p_rope(tmp_path, p, factor):
    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p}
    if factor:
        params["factor"] = factor
    directory, theirs = save_hf(tmp_path, head_dim=20, rope_parameters=params)
    ours, _, info = load_hf(directory)
    kept = int(p * 20 // 2)
    assert ours.pos_scheme.kept_pairs == kept and ours.scaling.name == ("pi" if factor else "none")
    assert_parity(ours, theirs, (12, 80), f"proportional p={p}")


@pytest.mark.parametrize("p,scaling", [(0.75, {"name": "none"}), (0.5, {"name": "pi", "factor": 2.0})])
def test_p_rope_exports_as_proportional(tmp_path, p, scaling):
    torch.manual_seed(0)
    ours = randomize(build_model(LLAMA_SHAPED, {"name": "rope", "p_rope": p}, scaling, VOCAB, 16)).eval()
    export_hf(ours, None, str(tmp_path / "out"))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    assert theirs.config.rope_parameters["rope_type"] == "proportional"
    assert_parity(ours, theirs, (12, 80), f"export p={p}")


def test_p_rope_under_yarn_is_refused(tmp_path):
    model = build_model(LLAMA_SHAPED, {"name": "rope", "p_rope": 0.5}, {"name": "yarn", "factor": 2.0}, VOCAB, 16)
    with pytest.raises(ConfigError, match="proportional"):
        export_hf(model, None, str(tmp_path / "out"))


def test_partial_rotary_factor_keeps_exactly_the_pairs():
    for head_dim in range(2, 300, 2):
        for kept in range(1, head_dim // 2 + 1):
            p = p_rope_to_hf(kept, head_dim)
            assert int(p * head_dim // 2) == kept and round(p * head_dim / 2) == kept
