"""Position from recurrence: a unidirectional GRU/LSTM over the token
embeddings before the first block (the RNN-Transformer of Neishi & Yoshinaga,
2019, "On the Relation between Position Information and Sentence Length in
Neural Machine Translation").

The recurrence reads tokens left to right, so it is causal by construction
and its notion of position is implicit: it ignores the position tensor, and
methods that remap positions do not act on it (family 'none', like NoPE).
The RNN output is added to the embeddings, so token identity keeps a direct
path past the recurrence.
"""

from torch import nn

from rope_lm.core.errors import ConfigError
from rope_lm.positional import SCHEMES
from rope_lm.positional.base import PositionalScheme

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


@SCHEMES.register("recurrent")
class Recurrent(PositionalScheme):
    family = "none"

    def __init__(self, dims, cell: str = "gru", num_layers: int = 1):
        super().__init__(dims)
        if cell not in CELLS:
            raise ConfigError(f"pos.cell={cell!r} is not a recurrent cell; use one of {', '.join(CELLS)}.")
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ConfigError(f"pos.num_layers={num_layers!r} must be a positive integer.")
        self.rnn = CELLS[cell](dims.d_model, dims.d_model, num_layers=num_layers, batch_first=True)

    def why_not_split(self):
        return "its recurrence reads the tokens in order, left to right, which a device holding two chunks cannot."

    def embed(self, x, pos, ctx):
        # ctx.state carries the hidden state from one KV-cached call to the next.
        out, ctx.state["recurrent"] = self.rnn(x, ctx.state.get("recurrent"))
        return x + out
