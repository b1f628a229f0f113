"""Rotary position embedding (Su et al., RoFormer, 2021).

Pairs of query/key channels are rotated by angle pos * theta_i, so the score
q_m . k_n depends on positions only through m - n. The inverse frequencies
come from the active scaling method, which is where NTK, YaRN, PI, ... act.

Two ways to rotate less than everything, which are different models:

* ``rotary_fraction`` (GPT-NeoX's partial rotary): only the first
  round(head_dim * f) channels rotate, and the frequency ladder is laid over
  those channels alone, base^(-2i / (head_dim * f)), so it still spans 1 down
  to 1/base.
* ``p_rope`` (Barbero et al. 2024, "Round and Round We Go! What makes Rotary
  Positional Encodings useful?"): the ladder of the rotated channels is kept
  as it is and only its highest round(p * pairs) frequencies rotate; the
  lowest ones are set to zero, so their channels carry content without
  position. The paper's argument: the lowest frequencies barely turn within
  the training length, act as semantic channels, and are what breaks past it.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional.base import PositionalScheme, RotarySpec

PAIRINGS = ("half", "interleaved")


def rotate(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, pairing: str, factor: float = 1.0):
    """Rotate the first 2*len(inv_freq) channels of x (..., T, D) by pos * inv_freq.

    'half' pairs channel i with i + r/2 (GPT-NeoX, Llama); 'interleaved' pairs
    2i with 2i+1 (GPT-J, the RoFormer paper). ``factor`` multiplies cos and
    sin, as Hugging Face applies YaRN-style attention factors.
    """
    rot = 2 * inv_freq.numel()
    angles = pos.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    cos = (angles.cos() * factor).to(x.dtype)
    sin = (angles.sin() * factor).to(x.dtype)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if pairing == "half":
        x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


@SCHEMES.register("rope")
class RoPE(PositionalScheme):
    family = "rotary"

    def __init__(
        self, dims, base: float = 10000.0, rotary_fraction: float = 1.0, pairing: str = "half", p_rope: float = 1.0
    ):
        super().__init__(dims)
        if pairing not in PAIRINGS:
            raise ConfigError(f"pos.pairing={pairing!r} is not a RoPE pairing; use one of {', '.join(PAIRINGS)}.")
        if not 0.0 < rotary_fraction <= 1.0:
            raise ConfigError(f"pos.rotary_fraction={rotary_fraction} must be in (0, 1].")
        rot_dim = int(round(dims.head_dim * rotary_fraction))
        if rot_dim < 2 or rot_dim % 2:
            raise ConfigError(
                f"RoPE rotates channel pairs, but head_dim={dims.head_dim} (model.d_model / model.n_head) "
                f"times pos.rotary_fraction={rotary_fraction} gives {dims.head_dim * rotary_fraction:g} "
                f"rotary channels; choose sizes that give an even number of at least 2."
            )
        if base <= 1:
            raise ConfigError(f"pos.base={base} must be greater than 1.")
        if not 0.0 < p_rope <= 1.0:
            raise ConfigError(
                f"pos.p_rope={p_rope} must be in (0, 1]: the share of RoPE's frequencies that rotate, "
                f"highest first (1: all of them; for none use pos=nope)."
            )
        self.base = float(base)
        self.rot_dim = rot_dim
        self.p_rope = float(p_rope)
        # Frequency pairs that keep their rotation; at least the highest one.
        self.kept_pairs = max(1, round(p_rope * rot_dim / 2))
        self.pairing = pairing
        self.rotary = RotarySpec(rot_dim, self.base, pairing)

    def frequencies(self, ctx):
        key = ("rope_freq", self.rot_dim, self.base, self.kept_pairs)
        if key not in ctx.memo:
            inv_freq, factor = ctx.scaling.rope_frequencies(self.rot_dim, self.base, ctx)
            dropped = inv_freq.numel() - self.kept_pairs
            if dropped > 0:
                # p-RoPE: pair i's base frequency is base^(-2i/d), so the last pairs are the lowest.
                inv_freq = torch.cat((inv_freq[: self.kept_pairs], inv_freq.new_zeros(dropped)))
            ctx.memo[key] = (inv_freq, factor)
        return ctx.memo[key]

    def rotate(self, q, k, q_pos, k_pos, layer, ctx):
        inv_freq, factor = self.frequencies(ctx)
        inv_freq = inv_freq.to(q.device)
        return (
            rotate(q, q_pos, inv_freq, self.pairing, factor),
            rotate(k, k_pos, inv_freq, self.pairing, factor),
        )
