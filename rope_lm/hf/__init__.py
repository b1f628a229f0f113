"""Hugging Face interchange for the Llama family and the 2025 families with
per-layer layouts (docs/pretrained.md).

config.py maps config.json to rope-lm settings and back (families.py for
SmolLM3, Qwen3, Gemma 3, Cohere2, gpt-oss, Llama 4 dense), weights.py streams
safetensors in and out under the parameter-name map, load.py and export.py
are the entry points.
"""

from rope_lm.hf.config import FAMILIES, UNSUPPORTED
from rope_lm.hf.export import export_hf
from rope_lm.hf.load import HFInfo, hf_checkpoint, hf_init, hf_lit, load_hf

__all__ = ["FAMILIES", "UNSUPPORTED", "HFInfo", "export_hf", "hf_checkpoint", "hf_init", "hf_lit", "load_hf"]
