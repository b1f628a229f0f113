"""FoX, the Forgetting Transformer (Lin et al., 2025, ICLR, "Forgetting
Transformer: Softmax Attention with a Forget Gate"): a forget gate per head
and token, read off the layer's normed input x_t,

    f_t = sigmoid(w_h . x_t + b_h),

down-weights every key by the gates of the tokens after it:

    logit_ij = q_i . k_j / sqrt(D) + sum_{s=j+1..i} log f_s,

softmax attention otherwise, with no other position encoding (the paper's
FoX without RoPE, the official repository's default ``use_rope: false``).
The gate is a bias over the whole path from key to query: a fully open gate
(f = 1) leaves attention as NoPE has it, and a closed one forgets all before.

Defaults are the official code's (zhixuan-lin/forgetting-transformer,
``fgate_type: full``): the gate projection is a linear map with a bias,
weights N(0, 0.02) and bias 0, so f starts near sigmoid(0) = 1/2 (the
special bias initialisation it offers is for its data-independent gates
only); log f is computed in float32. Each layer has its own projection
(n_layer x (d_model -> n_head)), each query head its own gate (grouped
key/value heads are repeated to the query heads before the scheme sees them,
as flash-linear-attention's forgetting attention also gates query heads).
The bias is kept out of weight decay, as the model's other biases are.

Kernels (rope_lm/positional/_forget_gate.py): the reference, a float-mask
SDPA path (CPU, training, KV-cached steps) and a FlexAttention score_mod on
CUDA at inference. A KV cache keeps each token's log-gate, (B, H, T, 1), beside
its key and value; a step sums them again (O(T) per head, against the O(T D)
of its attention).
"""

import math

import torch
from torch import nn
import torch.nn.functional as F

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES, _forget_gate
from rope_lm.positional._content import refuse_sink_logits
from rope_lm.positional.base import PositionalScheme


@SCHEMES.register("fox")
class ForgettingTransformer(PositionalScheme):
    family = "content"
    owns_attention = True
    reads_input = True
    serves_sink_logits = True  # a softmax: learned sinks join its denominator
    # Compiled flex's backward through gradients of the gates read inside its score_mod has not been
    # run on a GPU here, and a failure there comes at the first backward, past where the forward can
    # fall back; training takes the float-mask SDPA path (the CUDA kernel computes the mask's gradient),
    # inference takes flex. tests/test_fox.py's CUDA check of flex with gradients says when it may.
    flex_trains = False
    no_weight_decay = ("gate_bias",)

    def __init__(self, dims, init_std: float = 0.02, bias_init: float = 0.0):
        super().__init__(dims)
        for key, value in (("init_std", init_std), ("bias_init", bias_init)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"pos.{key}={value!r} must be a finite number ({self._knob_text()}).")
        if init_std < 0:
            raise ConfigError(f"pos.init_std={init_std} must be >= 0 ({self._knob_text()}).")
        L, H, C = dims.n_layer, dims.n_head, dims.d_model
        # Plain parameters, not nn.Linear: the model's own init of every nn.Linear would overwrite bias_init.
        self.gate_weight = nn.Parameter(torch.randn(L, H, C) * init_std)
        self.gate_bias = nn.Parameter(torch.full((L, H), float(bias_init)))

    def _knob_text(self) -> str:
        return (
            "the standard deviation of the gate weights' normal init and the gate bias's initial value; "
            "the paper's code uses 0.02 and 0"
        )

    def log_gate(self, logits: torch.Tensor) -> torch.Tensor:
        """log f from the gate's pre-activation, float32."""
        return F.logsigmoid(logits)

    def token_terms(self, layer, x, ctx):
        logits = F.linear(x, self.gate_weight[layer].to(x.dtype), self.gate_bias[layer].to(x.dtype))
        return {_forget_gate.TERM: self.log_gate(logits.float()).transpose(1, 2).unsqueeze(-1)}

    def attention(self, layer, q, k, v, terms, pos, plan, ctx, kernel="auto"):
        refuse_sink_logits(self, plan)
        return _forget_gate.attention(self, q, k, v, terms[_forget_gate.TERM], plan, ctx, kernel)
