"""build_optimizer: AdamW with decay on matrices only; optim.fused chooses the
fused kernel (CUDA by default, CPU on request), the same update to float tolerance."""

import pytest
import torch

from rope_lm.lit import OptimConfig, build_optimizer


def steps(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-2, warmup_steps=0, fused=fused), max_steps=10)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()
    return opt, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_fused_on_cpu_only_when_asked_and_the_same_update():
    default, a = steps(None)
    fused, b = steps(True)
    assert not default.defaults.get("fused") and fused.defaults["fused"] is True
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]  # matrices / biases


def test_fused_setting_is_checked():
    from rope_lm.config import typed_dataclass
    from rope_lm.errors import ConfigError

    with pytest.raises(ConfigError, match="optim.fused"):
        typed_dataclass(OptimConfig, {"fused": "yes"}, "optim.", "optim")
