"""A decoder-only, pre-norm, causal transformer that knows positional schemes
only through the hooks of rope_lm.positional.base (see DESIGN.md)."""

from dataclasses import dataclass, asdict

import torch
from torch import nn
from torch.nn import functional as F

from rope_lm.attention import KERNELS, attend
from rope_lm.errors import ConfigError
from rope_lm.positional import Dims, PosContext, build_scheme
from rope_lm.scaling import build_scaling


@dataclass
class ModelConfig:
    vocab_size: int
    train_len: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    tie_embeddings: bool = True
    bias: bool = False
    attention: str = "auto"  # one of attention.KERNELS
    tuned_len: int | None = None  # set by a fine-tune (init_from): see PosContext.tuned_len

    def validate(self):
        for key in ("vocab_size", "train_len", "n_layer", "n_head", "d_model"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"model setting {key}={getattr(self, key)} must be a positive integer.")
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}; "
                f"the head dimension must be a whole number (e.g. d_model={self.n_head * max(1, self.d_model // self.n_head)})."
            )
        if self.attention not in KERNELS:
            raise ConfigError(f"model.attention={self.attention!r} is not a kernel; use one of {', '.join(KERNELS)}.")
        if self.mlp_ratio <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(f"model.mlp_ratio={self.mlp_ratio} must be positive and model.dropout={self.dropout} "
                              f"within [0, 1).")

    def dims(self) -> Dims:
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.n_layer, self.train_len)


def check_fit(cfg: ModelConfig, pos: dict, scaling: dict | None, length: int) -> None:
    """Refuse a scheme/method pair that does not fit, or a length the scheme or
    method cannot serve, building only the scheme and the method (no weights)."""
    scheme = build_scheme(pos, cfg.dims())
    method = build_scaling(scaling)
    method.check(scheme)
    scheme.validate(length, method)
    method.validate(length, scheme, cfg.train_len)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head = cfg.n_head
        self.kernel = cfg.attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, scheme, pos, plan, ctx):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = attend(q, k, v, scheme, self.layer, pos, plan, ctx, self.kernel)
        return self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, layer)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, scheme, pos, plan, ctx):
        x = x + self.attn(self.norm1(x), scheme, pos, plan, ctx)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig, pos: dict, scaling: dict | None = None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.pos_scheme = build_scheme(pos, cfg.dims())
        self.set_scaling(scaling)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's
        # variance independent of depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layer) ** 0.5)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_scaling(self, scaling):
        """Swap the extrapolation method (a config dict or a ScalingMethod)."""
        method = build_scaling(scaling) if scaling is None or isinstance(scaling, dict) else scaling
        method.check(self.pos_scheme)
        self.scaling = method

    def validate_length(self, seq_len: int):
        self.pos_scheme.validate(seq_len, self.scaling)
        self.scaling.validate(seq_len, self.pos_scheme, self.cfg.train_len)

    def num_params(self, non_embedding=True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def context(self, seq_len: int) -> PosContext:
        """What the positional and scaling hooks see for a sequence of seq_len tokens."""
        return PosContext(seq_len=seq_len, train_len=self.cfg.train_len, scaling=self.scaling,
                          tuned_len=self.cfg.tuned_len, training=self.training)

    def forward(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab)."""
        return self.lm_head(self.hidden(idx, pos))

    def hidden(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) -> final normed hidden states (B, T, d_model), what
        lm_head projects: for losses computed a chunk at a time (rope_lm.head)."""
        T = idx.shape[1]
        ctx = self.context(T)
        if pos is None:
            pos = torch.arange(T, device=idx.device)
        pos = self.scaling.map_positions(pos, self.pos_scheme, ctx)
        plan = self.scaling.attention_plan(pos, ctx)
        x = self.drop(self.pos_scheme.embed(self.wte(idx), pos, ctx))
        for block in self.blocks:
            x = block(x, self.pos_scheme, pos, plan, ctx)
        return self.norm(x)


def build_model(model: dict, pos: dict, scaling: dict | None, vocab_size: int, train_len: int,
                tuned_len: int | None = None) -> TransformerLM:
    """A model from checked settings (rope_lm.config.resolve_run checks a run's)."""
    cfg = ModelConfig(vocab_size=vocab_size, train_len=train_len, tuned_len=tuned_len,
                      **{k: v for k, v in model.items() if k != "name"})
    return TransformerLM(cfg, pos, scaling)


__all__ = ["ModelConfig", "TransformerLM", "build_model", "asdict"]
