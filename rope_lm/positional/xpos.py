"""xPos (Sun et al., 2023, "A Length-Extrapolatable Transformer"): RoPE times
an exponential decay of the logit with distance.

Channel pair i gets zeta_i = (2i/d + gamma) / (1 + gamma) < 1 (d = rotary
dims); the query at n is scaled by zeta^(n / scale_base) and the key at m by
zeta^(-m / scale_base), so q_n . k_m carries zeta^((n - m) / scale_base).
Positions enter relative to the centre of the sequence, (T - 1) / 2, which leaves
every score unchanged (only n - m survives) but halves the exponents, as the
reference implementation does, so long sequences stay inside float range.
"""

import math

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional.rope import RoPE

# Largest |exponent| (natural log) of a query/key gain we allow: e^80 ~ 5e34
# leaves float32/bfloat16 room for the activations it multiplies.
MAX_LOG_GAIN = 80.0


@SCHEMES.register("xpos")
class XPos(RoPE):
    def __init__(
        self,
        dims,
        base: float = 10000.0,
        rotary_fraction: float = 1.0,
        pairing: str = "interleaved",
        gamma: float = 0.4,
        scale_base: float = 512.0,
    ):
        super().__init__(dims, base=base, rotary_fraction=rotary_fraction, pairing=pairing)
        if not gamma > 0:
            raise ConfigError(f"pos.gamma={gamma} must be positive (xPos decay offset).")
        if not scale_base > 0:
            raise ConfigError(f"pos.scale_base={scale_base} must be positive.")
        self.gamma, self.scale_base = float(gamma), float(scale_base)
        i = torch.arange(self.rot_dim // 2, dtype=torch.float32)
        self.register_buffer("zeta", (2 * i / self.rot_dim + gamma) / (1 + gamma), persistent=False)

    def max_length(self) -> int:
        log_min = -math.log(float(self.zeta.min()))
        return int(2 * self.scale_base * MAX_LOG_GAIN / log_min)

    def validate(self, seq_len, scaling):
        if seq_len > self.max_length():
            raise ConfigError(
                f"xPos gains zeta^(+-n/scale_base) overflow float range past {self.max_length()} tokens "
                f"(pos.scale_base={self.scale_base:g}, pos.gamma={self.gamma:g}); {seq_len} were asked for. "
                f"Raise pos.scale_base or evaluate shorter lengths."
            )

    def _gain(self, pos, centre, sign):
        expo = sign * (pos.to(torch.float32) - centre) / self.scale_base
        g = self.zeta.to(pos.device)[None, :] ** expo[:, None]  # (T, rot/2)
        return torch.cat((g, g), dim=-1) if self.pairing == "half" else g.repeat_interleave(2, dim=-1)

    def rotate(self, q, k, q_pos, k_pos, layer, ctx):
        q, k = super().rotate(q, k, q_pos, k_pos, layer, ctx)
        # One centre for queries and keys, so the gains cancel to
        # zeta^((n - m)/scale_base); taken from the length, not from these
        # positions, so that keys a KV cache rotated in an earlier call share it.
        centre = (ctx.seq_len - 1) / 2
        r = self.rot_dim

        def scaled(x, gain):
            out = x[..., :r] * gain.to(x.dtype)
            return torch.cat((out, x[..., r:]), dim=-1) if x.shape[-1] > r else out

        return scaled(q, self._gain(q_pos, centre, 1.0)), scaled(k, self._gain(k_pos, centre, -1.0))
