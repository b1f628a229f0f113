"""A stand-in model for tests whose predictions are a rule over the sequence
read so far (an oracle, a scripted answer), usable with and without the KV
cache: with a cache it keeps the rows read in cache.state, as a real model
keeps their keys, so rope_lm.infer.generate decodes it like a TransformerLM."""

from types import SimpleNamespace

import torch
from torch import nn


class SequenceModel(nn.Module):
    """Subclasses give logits_of(rows): (B, T, vocab) logits for the token
    rows read so far (lists of ids)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))  # a parameter, for the device
        self.cfg = SimpleNamespace(vocab_size=vocab)
        self.lm_head = nn.Identity()  # hidden() returns the logits themselves

    def validate_length(self, n):
        pass

    def logits_of(self, rows: list[list[int]]) -> torch.Tensor:
        raise NotImplementedError

    def hidden(self, idx, pos=None, cache=None):
        rows = idx.tolist()
        if cache is not None:
            cache.begin(idx.shape[0], idx.shape[1])
            rows = [before + row for before, row in zip(cache.state.get("rows", [[]] * len(rows)), rows)]
            cache.state["rows"] = rows
            cache.commit(idx.shape[1])
        return self.logits_of(rows)[:, -idx.shape[1] :]

    def forward(self, idx, cache=None):
        return self.lm_head(self.hidden(idx, cache=cache))
