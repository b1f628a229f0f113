"""No process-wide side effects from the model: evaluation numbers do not
depend on whether autograd records, and a forward pass never touches the
allocator (the training entry point sets it, for the span of fit)."""

import pytest
import torch

from rope_lm.model.transformer import build_model
from rope_lm.train import allocator
from tests.conftest import TINY_MODEL


@pytest.mark.parametrize("scaling", [{"name": "ntk", "logn": True}, {"name": "logn"}, {"name": "yarn"}])
def test_evaluation_numbers_do_not_depend_on_grad_mode(scaling):
    torch.manual_seed(0)
    model = build_model(TINY_MODEL, {"name": "rope"}, scaling, vocab_size=50, train_len=8).eval()
    x = torch.randint(0, 50, (2, 32))
    with torch.no_grad():
        without = model(x)
    with torch.enable_grad():
        with_grad = model(x).detach()
    assert torch.equal(without, with_grad)
    model.train()  # log-n acts at evaluation only (logn_in_training=false): training mode differs
    with torch.no_grad():
        training = model(x)
    assert torch.equal(training, without) == (scaling["name"] == "yarn")


def test_a_forward_pass_leaves_the_allocator_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_mallopt", lambda *a: calls.append(a) or True)
    monkeypatch.setattr(allocator, "_malloc_state", {})
    model = build_model(TINY_MODEL, {"name": "rope"}, None, vocab_size=50, train_len=8).train()
    model(torch.randint(0, 50, (2, 16))).sum().backward()
    with torch.no_grad():
        model.eval()(torch.randint(0, 50, (2, 16)))
    assert calls == []
    callback = allocator.KeepFreedMemory()
    callback.on_fit_start(None, None)
    callback.on_fit_end(None, None)
    assert calls == [(allocator._MALLOC_KEEP_BYTES,) * 2, (allocator._MALLOC_DEFAULT_BYTES,) * 2]
