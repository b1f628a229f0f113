"""Activation checkpointing (model.activation_checkpointing, rope_lm/model/recompute.py):
the loss and every gradient equal those of the same model without it, for
every registered scheme and every method that fits it (the KV-cache tests'
list, driven by the registries), in training and evaluation mode, under a
layout, with dropout, and through torch.compile; and each block really runs
twice (forward, then again in backward)."""

from conftest import ROOT
import pytest
from test_kv_cache import PAIRS, T, model, tokens
import torch
import torch.nn.functional as F
import yaml

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import ModelConfig


def loss_and_grads(m, idx, on: bool, seed: int = 0):
    m.cfg.activation_checkpointing = on
    m.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for both runs
    loss = F.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same(m, idx, what, **tol):
    tol = tol or dict(atol=1e-6, rtol=1e-5)
    loss, grads = loss_and_grads(m, idx, False)
    loss_ckpt, grads_ckpt = loss_and_grads(m, idx, True)
    torch.testing.assert_close(loss_ckpt, loss, atol=0, rtol=1e-6, msg=what)
    assert grads_ckpt.keys() == grads.keys() and grads, what
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], **tol, msg=f"{what}: {name}")


@pytest.mark.parametrize("scheme,method", PAIRS)
def test_checkpointing_leaves_loss_and_gradients_unchanged(scheme, method):
    m = model(scheme, method)
    idx = tokens(T + 1)
    # Training mode (the methods that act only at evaluation are identities there) and evaluation
    # mode with gradients recorded (where every method acts, past the training length).
    assert_same(m.train(), idx, f"{scheme} under {method}, training")
    assert_same(m.eval(), idx, f"{scheme} under {method}, evaluation")


@pytest.mark.parametrize("name", ["nope_every_4", "local_global"])
def test_checkpointing_under_a_layout(name):
    with open(f"{ROOT}/conf/layout/{name}.yaml") as f:
        layout = yaml.safe_load(f)
    m = model("rope", "yarn", layout=layout, n_layer=4)
    assert m.layout is not None
    assert_same(m.train(), tokens(T + 1), name)
    assert_same(m.eval(), tokens(T + 1), name)


def test_dropout_masks_are_replayed_in_the_recomputation():
    m = model("alibi", "none", dropout=0.2).train()
    assert_same(m, tokens(T + 1), "dropout 0.2")


def test_each_block_runs_again_in_backward():
    m = model("t5", "none").train()
    calls = []
    for block in m.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))  # recomputation may stop before the end
    for on, runs in ((False, 1), (True, 2)):
        calls.clear()
        loss_and_grads(m, tokens(T + 1), on)
        assert len(calls) == runs * len(m.blocks)
    with torch.no_grad():  # nothing to recompute without autograd
        calls.clear()
        m(tokens(T))
        assert len(calls) == len(m.blocks)


def test_checkpointing_through_torch_compile():
    from rope_lm.train.compile import maybe_compile

    m = model("rope", "none").train()
    # Dynamo's capture and AOT autograd are where a checkpointed region is handled under compile;
    # inductor's C++ build of the same graph would take minutes on a test machine's CPU.
    compiled = maybe_compile(m, backend="aot_eager")
    idx = tokens(T + 1)
    out = []
    for on in (False, True):
        m.cfg.activation_checkpointing = on
        m.zero_grad(set_to_none=True)
        loss = F.cross_entropy(compiled(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert compiled.compiled, compiled.reason
    (loss, grads), (loss_ckpt, grads_ckpt) = out
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_the_setting_is_a_boolean():
    cfg = ModelConfig(vocab_size=61, train_len=16, activation_checkpointing="yes")
    with pytest.raises(ConfigError, match="model.activation_checkpointing='yes' must be true or false"):
        cfg.validate()
