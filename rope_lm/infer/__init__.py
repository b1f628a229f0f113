"""Inference: decoding through the KV cache."""
