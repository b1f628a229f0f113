"""Probes of a trained model: the retrieval battery, passkey, synthetic-task runs, diagnostics, the lm-eval model."""
