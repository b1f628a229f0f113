"""A mixture-of-experts MLP in gpt-oss's form (``model.mlp: moe`` with
``model.experts``), so gpt-oss checkpoints load whole.

A router (a linear map with bias) scores the experts for every token; the
token goes to its ``top_k`` best, weighted by the softmax of those top_k
scores. Expert e computes, from one (d_model -> 2 x hidden) projection whose
even columns are the gate g and odd columns the input u (with biases),

    g' = min(g, limit),  u' = clamp(u, -limit, limit)
    y  = ((u' + 1) * g' * sigmoid(alpha * g')) @ down_e + b_e

(OpenAI's gpt-oss model card: a SwiGLU with clamping and a residual
connection in the linear branch). The tensors keep transformers' layout
(experts first, input dimension before output), so loading is a copy.

There is no load-balancing loss: training from scratch runs, but nothing
keeps the router from favouring a few experts; the option exists to import
and study the released models.
"""

import torch
from torch import nn

from rope_lm.core.errors import ConfigError

DEFAULTS = {"count": None, "top_k": None, "limit": 7.0, "alpha": 1.702}


def check(experts, mlp: str) -> None:
    """ConfigError for model.experts settings that do not fit model.mlp."""
    if mlp != "moe":
        if experts is not None:
            raise ConfigError(
                f"model.experts={experts!r} is set with model.mlp={mlp}; experts need model.mlp=moe "
                f"(or set model.experts=null)."
            )
        return
    if not isinstance(experts, dict) or set(experts) - set(DEFAULTS):
        raise ConfigError(
            f"model.mlp=moe needs model.experts, a mapping with count (experts), top_k (experts per "
            f"token) and optionally limit and alpha (the clamped SwiGLU's); got {experts!r}."
        )
    count, top_k = experts.get("count"), experts.get("top_k")
    for key, value in (("count", count), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.experts.{key}={value!r} must be a positive integer.")
    if top_k > count:
        raise ConfigError(
            f"model.experts.top_k={top_k} exceeds model.experts.count={count}: a token cannot go to "
            f"more experts than there are."
        )
    for key in ("limit", "alpha"):
        value = experts.get(key, DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"model.experts.{key}={value!r} must be a positive number.")


class Experts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        settings = {**DEFAULTS, **cfg.experts}
        E, d, hidden = settings["count"], cfg.d_model, cfg.hidden_size
        self.top_k, self.limit, self.alpha = settings["top_k"], float(settings["limit"]), float(settings["alpha"])
        self.router = nn.Linear(d, E, bias=True)
        self.gate_up = nn.Parameter(torch.empty(E, d, 2 * hidden))
        self.gate_up_bias = nn.Parameter(torch.empty(E, 2 * hidden))
        self.down = nn.Parameter(torch.empty(E, hidden, d))
        self.down_bias = nn.Parameter(torch.empty(E, d))
        self.drop = nn.Dropout(cfg.dropout)
        for p in (self.gate_up, self.down):
            nn.init.normal_(p, mean=0.0, std=0.02)
        for p in (self.gate_up_bias, self.down_bias):
            nn.init.zeros_(p)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        gu = h @ self.gate_up[e] + self.gate_up_bias[e]
        gate = gu[:, 0::2].clamp(max=self.limit)
        up = gu[:, 1::2].clamp(min=-self.limit, max=self.limit)
        return ((up + 1) * gate * torch.sigmoid(self.alpha * gate)) @ self.down[e] + self.down_bias[e]

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        top, chosen = self.router(h).topk(self.top_k, dim=-1)
        weight = top.softmax(dim=-1)
        out = torch.zeros_like(h)
        # each expert runs once, on the tokens that chose it
        for e in chosen.unique().tolist():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, token, (self.expert(e, h[token]) * weight[token, slot, None]).to(out.dtype))
        return self.drop(out.view(x.shape))
