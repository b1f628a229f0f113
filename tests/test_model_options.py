"""Llama-family architecture options of ModelConfig: the defaults leave the
original model untouched, and every option computes what it says."""

import hashlib

from conftest import ROOT
import pytest
import torch
import torch.nn.functional as F
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import build_model
from rope_lm.positional import SCHEMES, Dims, build_scheme
from rope_lm.scaling import METHODS

BASE = {"n_layer": 2, "n_head": 4, "d_model": 64, "mlp_ratio": 2.0}
LLAMA = {
    **BASE,
    "mlp": "swiglu",
    "mlp_hidden": 96,
    "n_kv_head": 2,
    "head_dim": 24,
    "norm_eps": 1e-5,
    "qkv_bias": True,
    "tie_embeddings": False,
}


def weights_digest(model_cfg, pos, seed=0):
    torch.manual_seed(seed)
    model = build_model(model_cfg, pos, None, vocab_size=300, train_len=16)
    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        h.update(key.encode())
        h.update(str(tuple(value.shape)).encode())
        h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


# sha256 of (name, shape, bytes) of every state_dict entry after
# torch.manual_seed(0), computed with the model code before these options
# existed (commit c5ccf26): same names, shapes, init order and values.
@pytest.mark.parametrize(
    "model_cfg,pos,digest",
    [
        (BASE, "rope", "ee06a190a341900b58c06f8aab967d7ef69ed029463b8ab58b0dcdaf146db41f"),
        (BASE, "learned", "5b2acf2be5746a5c4409ba4fb3ca8303b4e681ddee38c325f4c44b6b26bb8bbc"),
        (
            {**BASE, "bias": True, "tie_embeddings": False},
            "rope",
            "2a9ba0c9182eab0de3627064331f67572d88afe141524a5f4d3a68fa5772171c",
        ),
    ],
)
def test_default_models_are_bit_identical_to_before_the_options(model_cfg, pos, digest):
    assert weights_digest(model_cfg, {"name": pos}) == digest


def test_explicit_defaults_equal_omitted_ones():
    explicit = {**BASE, "mlp": "gelu", "n_kv_head": 4, "head_dim": 16, "qkv_bias": False}
    assert weights_digest(explicit, {"name": "rope"}) == weights_digest(BASE, {"name": "rope"})


def test_parameter_shapes_of_a_llama_shaped_model():
    m = build_model(LLAMA, {"name": "rope"}, None, vocab_size=300, train_len=16)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    # (4 query + 2 key + 2 value heads) x head_dim 24, all projected from d_model 64
    assert shapes["blocks.0.attn.qkv.weight"] == (8 * 24, 64)
    assert shapes["blocks.0.attn.qkv.bias"] == (8 * 24,)
    assert shapes["blocks.0.attn.proj.weight"] == (64, 4 * 24)
    assert "blocks.0.attn.proj.bias" not in shapes  # qkv_bias is separate from `bias`
    assert shapes["blocks.0.mlp.gate.weight"] == shapes["blocks.0.mlp.fc.weight"] == (96, 64)
    assert shapes["blocks.0.mlp.proj.weight"] == (64, 96)
    assert m.lm_head.weight.data_ptr() != m.wte.weight.data_ptr()
    assert m.blocks[0].norm1.eps == m.norm.eps == 1e-5


def test_swiglu_and_attention_by_hand():
    """One block's output written out from its weights: RMSNorm, q/k/v from
    the fused rows, RoPE (half pairing), causal softmax with key/value head
    h // 2 for query head h, SiLU(gate) * up, down."""
    torch.manual_seed(0)
    m = build_model({**LLAMA, "n_layer": 1}, {"name": "rope"}, None, vocab_size=300, train_len=16).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    idx = torch.randint(0, 300, (2, 9))
    T, H, Hkv, D = 9, 4, 2, 24
    blk = m.blocks[0]
    x = m.wte(idx)

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    h = rms(x, blk.norm1.weight)
    qkv = h @ blk.attn.qkv.weight.t() + blk.attn.qkv.bias
    q = qkv[..., : H * D].view(2, T, H, D)
    k = qkv[..., H * D : (H + Hkv) * D].view(2, T, Hkv, D)
    v = qkv[..., (H + Hkv) * D :].view(2, T, Hkv, D)
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2).double() / D)
    ang = (torch.arange(T).double()[:, None] * inv[None]).float()
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rot(t):
        return t * cos + torch.cat([-t[..., D // 2 :], t[..., : D // 2]], -1) * sin

    q, k = rot(q), rot(k)
    out = torch.zeros(2, T, H, D)
    for head in range(H):
        s = torch.einsum("btd,bsd->bts", q[:, :, head], k[:, :, head // 2]) / D**0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out[:, :, head] = s.softmax(-1) @ v[:, :, head // 2]
    x = x + out.reshape(2, T, H * D) @ blk.attn.proj.weight.t()
    h = rms(x, blk.norm2.weight)
    x = x + (F.silu(h @ blk.mlp.gate.weight.t()) * (h @ blk.mlp.fc.weight.t())) @ blk.mlp.proj.weight.t()
    want = rms(x, m.norm.weight) @ m.lm_head.weight.t()
    with torch.no_grad():
        torch.testing.assert_close(m(idx), want, atol=2e-5, rtol=1e-4)


def conf(kind, name):
    with open(f"{ROOT}/conf/{kind}/{name}.yaml") as f:
        return yaml.safe_load(f)


def methods_for(scheme_name):
    scheme = build_scheme(conf("pos", scheme_name), Dims(64, 4, 24, 2, 16))
    return [n for n in METHODS.names() if METHODS.get(n).applies(scheme)]


@pytest.mark.parametrize("scheme", SCHEMES.names())
def test_every_scheme_and_method_with_gqa_equals_the_same_model_with_repeated_heads(scheme):
    """A GQA model and a full-head model whose k/v rows are each key/value
    head copied to its query group give the same logits, for every
    positional scheme under every method that applies to it, past the
    training length."""
    pos = conf("pos", scheme)
    full_cfg = {**LLAMA, "n_kv_head": None}
    for method in methods_for(scheme):
        scaling = conf("scaling", method)
        if method == "longrope":  # one factor per frequency: 12 for RoPE's head of 24, 24 for PoPE's
            pairs = build_scheme(pos, Dims(64, 4, 24, 2, 16)).rotary.rot_dim // 2
            scaling["long_factor"] = [1.0 + i for i in range(pairs)]
        torch.manual_seed(0)
        gqa = build_model(LLAMA, pos, scaling, vocab_size=300, train_len=16).eval()
        full = build_model(full_cfg, pos, scaling, vocab_size=300, train_len=16).eval()
        state = gqa.state_dict()
        H, Hkv, D = 4, 2, 24
        for key in [k for k in state if k.endswith("attn.qkv.weight") or k.endswith("attn.qkv.bias")]:
            q, k, v = state[key].split((H * D, Hkv * D, Hkv * D))
            rep = [
                t.view(Hkv, D, *t.shape[1:]).repeat_interleave(H // Hkv, 0).reshape(H * D, *t.shape[1:]) for t in (k, v)
            ]
            state[key] = torch.cat([q, *rep])
        full.load_state_dict(state)
        idx = torch.randint(0, 300, (1, 40))
        with torch.no_grad():
            got, want = gqa(idx), full(idx)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=lambda m: f"{scheme}/{method}: {m}")


@pytest.mark.parametrize(
    "change,message",
    [
        ({"mlp": "relu"}, r"model.mlp='relu'"),
        ({"n_kv_head": 3}, r"n_kv_head=3 must divide model.n_head=4"),
        ({"n_kv_head": 0}, r"n_kv_head=0 must be a positive integer"),
        ({"head_dim": 2.5}, r"head_dim=2.5 must be a positive integer"),
        ({"norm_eps": -1.0}, r"norm_eps=-1.0 must be a positive"),
        ({"d_model": 66, "head_dim": None}, r"not divisible by model.n_head"),
    ],
)
def test_bad_options_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        build_model({**LLAMA, **change}, {"name": "rope"}, None, vocab_size=300, train_len=16)


def test_explicit_head_dim_need_not_divide_d_model():
    m = build_model({**LLAMA, "d_model": 66}, {"name": "rope"}, None, vocab_size=300, train_len=16)
    assert m(torch.randint(0, 300, (1, 5))).shape == (1, 5, 300)


@pytest.mark.parametrize("preset", ["llama_tiny", "llama_125m"])
def test_llama_presets_build(preset):
    cfg = conf("model", preset)
    with torch.device("meta"):  # shapes only: the 125M preset need not be allocated
        m = build_model(cfg, {"name": "rope"}, None, vocab_size=49152, train_len=256)
    assert m.cfg.mlp == "swiglu" and m.cfg.kv_heads < m.cfg.n_head
    if preset == "llama_125m":  # SmolLM-135M: 134,515,008 parameters with its 49,152-token vocabulary
        assert m.num_params(non_embedding=False) == 134_515_008
