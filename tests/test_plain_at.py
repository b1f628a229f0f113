"""TransformerLM.plain_at(T): whether the method changes nothing at length T. The evaluation reuses the
plain model's row there instead of scoring it again (rope_lm/runs/eval_run.py), so a wrong True would
put another model's numbers under a method's name. Every (scheme, method) the model accepts, at lengths
below, at and past L: wherever it says True, the method's logits equal plain positions' exactly."""

import pytest
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.model.transformer import TransformerLM
from rope_lm.scaling import METHODS
from tests.test_kv_cache import PAIRS, L, method_options, model, pos_options, tokens

LENGTHS = (L // 2, L, L + L // 2, 2 * L)


@pytest.mark.parametrize("scheme,method", PAIRS)
def test_where_it_says_plain_the_logits_are_plain_positions(scheme, method):
    m = model(scheme, method)
    idx = tokens(max(LENGTHS))
    for T in LENGTHS:
        try:
            m.validate_length(T)
        except ConfigError:
            continue
        if not m.plain_at(T):
            continue
        with torch.no_grad():
            got = m(idx[:, :T])
            m.set_scaling({"name": "none"})
            want = m(idx[:, :T])
            m.set_scaling(method_options(method))
        assert torch.equal(got, want), (scheme, method, T)


def test_the_frequency_methods_are_plain_up_to_L_and_not_past_it():
    """Not vacuous: the methods whose factor is auto are plain at and below L, and none of them past it."""
    for method in ("yarn", "pi", "ntk", "ntk_by_parts", "dynamic_ntk", "llama3"):
        m = model("rope", method)
        assert [m.plain_at(T) for T in LENGTHS] == [True, True, False, False], method
    fixed = model("rope", "yarn")
    fixed.set_scaling({**method_options("yarn"), "factor": 2.0})
    assert not fixed.plain_at(L // 2)  # a fixed factor rescales at every length
    assert all(model("rope", "none").plain_at(T) for T in LENGTHS)


def test_a_scheme_that_is_not_rotary_is_never_judged_plain_under_a_method():
    m = model("alibi", "window")
    assert not m.plain_at(L // 2) and not m.plain_at(2 * L)
    assert "window" in METHODS.names()


def test_a_layout_judges_only_the_layers_the_method_acts_on():
    """Gemma 3's shape: local layers with a window, global ones scaled; YaRN is plain up to L on the global
    layers, whatever the local ones do."""
    from tests.test_kv_cache import config

    layout = {"pattern": [{"window": 4, "scaling": False}, {"window": 4, "scaling": False}, {}]}
    torch.manual_seed(0)
    m = TransformerLM(config(n_layer=3, layout=layout), pos_options("rope"), method_options("yarn")).eval()
    assert m.scaled_layers == [2] and [m.plain_at(T) for T in LENGTHS] == [True, True, False, False]
