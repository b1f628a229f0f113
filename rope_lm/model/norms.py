"""The normalisation layers a block can use (``model.norm``).

* ``rms``: RMSNorm, x / rms(x) * w (Llama, Qwen, SmolLM; rope-lm's default).
* ``rms_offset``: RMSNorm scaled by (1 + w), w starting at 0, computed in
  float32 and cast back after the scaling (Gemma's convention, so a
  checkpoint's stored w loads as it is).
* ``layer``: LayerNorm without a bias, (x - mean) / std * w (Cohere).

``eps`` None is torch's RMSNorm default, finfo(float32).eps, for every kind.
"""

import torch
from torch import nn
from torch.nn import functional as F


class OffsetRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        out = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


NORMS = {
    "rms": lambda dim, eps: nn.RMSNorm(dim, eps=eps),
    "rms_offset": OffsetRMSNorm,
    "layer": lambda dim, eps: nn.LayerNorm(dim, eps=torch.finfo(torch.float32).eps if eps is None else eps, bias=False),
}
NORM_KINDS = tuple(NORMS)


def build_norm(kind: str, dim: int, eps: float | None) -> nn.Module:
    return NORMS[kind](dim, eps)
