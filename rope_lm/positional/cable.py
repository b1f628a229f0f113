"""Cable (Veisi, Amirzadeh and Mansourian, 2025, "Context-aware Biases for
Length Extrapolation"): a learned, token-specific bias per head, from the
layer's normed input x_t,

    b_t = -softplus(w_h . x_t + b_h) <= 0,
    logit_ij = q_i . k_j / sqrt(D) + sum_{s=j+1..i} b_s,

softmax attention otherwise, with no other position encoding (the paper's
Cable on its own; it also reports Cable added to other RPEs).

The official code (axiomlab/Cable, src/Cable.py) takes the cumulative sum of
-softplus over the sequence and adds b_i - b_j with b that running sum, which
is the sum above; its projection is an nn.Linear with a bias under nanoGPT's
init (weights N(0, 0.02), bias 0), the defaults here. Where this differs from
it: that code scales q . k by 1 (src/Cable.py) or by 1/sqrt(d_model) (the
older Cable.py at the repository's root) rather than by 1/sqrt(D); here every
scheme's dot product has the one scale, 1/sqrt(D), the standard softmax
attention the paper builds on.

Since -softplus(a) = log sigmoid(-a), Cable is FoX's forget gate with the
pre-activation's sign flipped (the same model family, and the same
distribution at the symmetric init); tests/test_fox.py holds the two equal
under negated gate parameters. It subclasses FoX for everything but the
nonlinearity: kernels, KV cache terms, defaults and knobs.
"""

import torch
import torch.nn.functional as F

from rope_lm.positional import SCHEMES
from rope_lm.positional.fox import ForgettingTransformer


@SCHEMES.register("cable")
class Cable(ForgettingTransformer):
    def _knob_text(self) -> str:
        return (
            "the standard deviation of the bias projection's normal init and its bias's initial value; "
            "the paper's code uses 0.02 and 0"
        )

    def log_gate(self, logits: torch.Tensor) -> torch.Tensor:
        return -F.softplus(logits)
