"""Positional frequencies and RoPE frequency scaling, as pure functions.

A leaf module: it imports no scheme and no method, and both read it
(positional/rope.py, sinusoidal and Sandwich for the frequencies,
the scaling/ frequency methods, pi.py ... longrope.py, for the scaled ones).

Each function maps (rot_dim, base, train_len, target_len, knobs) to
(inv_freq, attention_factor): float32 inverse frequencies of shape
(rot_dim // 2,) and a float that multiplies cos and sin (rope.rotate), i.e. q
and k are each scaled by it and the attention logits by its square, as in
Hugging Face transformers. The scale is s = target_len / train_len; every
function is the identity (plain RoPE frequencies, factor 1) for s <= 1.

Arithmetic is float64 from the plain float32 frequencies and the result is
rounded once to float32, so the values agree with transformers' float32
computations to float tolerance and s <= 1 gives plain RoPE exactly.
The ScalingMethod classes (scaling/_frequency.py's FrequencyMethod) decide the
target length (a fixed `factor`, or the current sequence length) and wrap
these.
"""

import math

import torch

from rope_lm.core.errors import ConfigError


def inverse_frequencies(dim: int, base: float, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i = 0 .. ceil(dim/2)-1 in float64: RoPE's
    rotation speeds (Su et al.) and the sinusoidal encoding's frequencies
    (Vaswani et al.). The one copy of the formula; every scheme, method and
    diagnostic reads it from here."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)


def default_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    """RoPE's unscaled inverse frequencies, float32 as the model uses them."""
    return inverse_frequencies(rot_dim, base).float()


def plain_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1, in float64 but taken from the
    scheme's own float32 values, so that s = 1 reproduces plain RoPE bit for bit."""
    return default_inv_freq(rot_dim, base).double()


def _scale(train_len: float, target_len: float) -> float:
    return max(1.0, target_len / train_len)


def _out(inv_freq: torch.Tensor, attention_factor: float = 1.0):
    return inv_freq.to(torch.float32), float(attention_factor)


def linear(rot_dim: int, base: float, train_len: float, target_len: float):
    """Position interpolation (Chen et al., 2023): positions x 1/s, the same
    as every inverse frequency / s."""
    return _out(plain_inv_freq(rot_dim, base) / _scale(train_len, target_len))


def ntk_base(rot_dim: int, base: float, s: float) -> float:
    """NTK-aware base (bloc97, 2023): base * s^(d/(d-2)) stretches the lowest
    frequency by exactly s while leaving the highest (theta_0 = 1) unchanged."""
    if rot_dim <= 2:
        raise ConfigError(
            f"NTK-style scaling needs more than 2 rotary channels (it changes the base through d/(d-2)); "
            f"this model rotates {rot_dim}."
        )
    return base * s ** (rot_dim / (rot_dim - 2))


def ntk_aware(rot_dim: int, base: float, train_len: float, target_len: float):
    s = _scale(train_len, target_len)
    if s == 1.0:
        return _out(plain_inv_freq(rot_dim, base))
    return _out(plain_inv_freq(rot_dim, ntk_base(rot_dim, base, s)))


def dynamic_ntk(rot_dim: int, base: float, train_len: float, seq_len: float, factor: float = 1.0):
    """Dynamic NTK (emozilla, 2023; transformers' "dynamic"): NTK-aware with the
    effective scale factor * T/L - (factor - 1) for the current length
    T = max(seq_len, L). factor = 1 gives s = max(1, T/L)."""
    T = max(seq_len, train_len)
    s = factor * T / train_len - (factor - 1)
    if s <= 1.0:
        return _out(plain_inv_freq(rot_dim, base))
    return _out(plain_inv_freq(rot_dim, ntk_base(rot_dim, base, s)))


def correction_dim(rot_dim: int, base: float, train_len: float, rotations: float) -> float:
    """The (fractional) pair index i whose wavelength 2*pi*base^(2i/d) fits
    `rotations` full turns into train_len tokens."""
    return rot_dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))


def ramp_mix(
    rot_dim: int, base: float, train_len: float, s: float, beta_fast: float, beta_slow: float, truncate: bool = True
):
    """NTK-by-parts frequencies (YaRN paper, eq. 18-19): pairs that turn more
    than beta_fast times within L keep their frequency, pairs that turn fewer
    than beta_slow times are interpolated (/ s), with a linear ramp between.
    As in the YaRN reference code and transformers, the ramp runs over pair
    indices between floor(i(beta_fast)) and ceil(i(beta_slow)), clipped to
    [0, d - 1]; truncate=False keeps the fractional ends (transformers'
    YaRN `truncate: false`, gpt-oss)."""
    theta = plain_inv_freq(rot_dim, base)
    low = correction_dim(rot_dim, base, train_len, beta_fast)
    high = correction_dim(rot_dim, base, train_len, beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001  # a one-index ramp is a step
    gamma = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    # gamma = 0: fast-turning pair, kept; gamma = 1: slow pair, interpolated.
    return theta / s * gamma + theta * (1 - gamma)


def ntk_by_parts(
    rot_dim: int, base: float, train_len: float, target_len: float, beta_fast: float = 32.0, beta_slow: float = 1.0
):
    s = _scale(train_len, target_len)
    return _out(ramp_mix(rot_dim, base, train_len, s, beta_fast, beta_slow))


def yarn_attention_factor(s: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln s + 1, applied to cos and sin (so to q and k)."""
    return 1.0 if s <= 1.0 else 0.1 * math.log(s) + 1.0


def yarn(
    rot_dim: int,
    base: float,
    train_len: float,
    target_len: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    truncate: bool = True,
):
    """YaRN (Peng et al., 2023): NTK-by-parts plus the attention factor."""
    s = _scale(train_len, target_len)
    factor = yarn_attention_factor(s) if attention_factor is None else attention_factor
    return _out(ramp_mix(rot_dim, base, train_len, s, beta_fast, beta_slow, truncate), factor)


def llama3(
    rot_dim: int,
    base: float,
    train_len: float,
    target_len: float,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
):
    """Llama 3.1 frequency scaling (original context = train_len): wavelengths
    shorter than L / high_freq_factor are kept, longer than L / low_freq_factor
    divided by s, and in between interpolated smoothly in L / wavelength."""
    s = _scale(train_len, target_len)
    if high_freq_factor <= low_freq_factor:
        raise ConfigError(
            f"llama3 needs scaling.high_freq_factor ({high_freq_factor}) > scaling.low_freq_factor ({low_freq_factor})."
        )
    theta = plain_inv_freq(rot_dim, base)
    wavelen = 2 * math.pi / theta
    smooth = (train_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mixed = (1 - smooth) * theta / s + smooth * theta
    out = torch.where(wavelen > train_len / low_freq_factor, theta / s, mixed)
    out = torch.where(wavelen < train_len / high_freq_factor, theta, out)
    return _out(out)


def longrope_attention_factor(s: float, train_len: float) -> float:
    """sqrt(1 + ln s / ln L), transformers' default for LongRoPE / Phi-3."""
    return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(train_len))


def longrope(
    rot_dim: int,
    base: float,
    train_len: float,
    target_len: float,
    short_factor,
    long_factor,
    seq_len: float | None = None,
    attention_factor: float | None = None,
):
    """LongRoPE (Ding et al., 2024): inverse frequencies divided by searched
    per-pair factors, long_factor when the current length exceeds L, else
    short_factor (so s <= 1 is the identity only when short_factor is all 1).
    seq_len defaults to target_len."""
    seq_len = target_len if seq_len is None else seq_len
    chosen = long_factor if seq_len > train_len else short_factor
    lam = torch.as_tensor(chosen, dtype=torch.float64)
    if lam.shape != (rot_dim // 2,):
        raise ConfigError(
            f"longrope factors need one entry per rotary channel pair ({rot_dim // 2} for {rot_dim} rotary "
            f"channels), got {tuple(lam.shape)}."
        )
    s = _scale(train_len, target_len)
    factor = longrope_attention_factor(s, train_len) if attention_factor is None else attention_factor
    return _out(plain_inv_freq(rot_dim, base) / lam, factor)
