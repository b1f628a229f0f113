"""rope-lm: train a small decoder-only LM short, evaluate it long."""

from rope_lm.core.errors import ConfigError

__all__ = ["ConfigError"]
