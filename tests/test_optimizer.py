"""build_optimizer: AdamW with decay on matrices only; optim.fused chooses the
fused kernel (CUDA by default, CPU on request), the same update to float tolerance."""

import dataclasses
import os

import pytest
import torch
import yaml

from rope_lm.train.lit import OptimConfig, build_optimizer


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
    from rope_lm.core.errors import ConfigError
    from rope_lm.core.typed import typed_dataclass

    with pytest.raises(ConfigError, match="optim.fused"):
        typed_dataclass(OptimConfig, {"fused": "yes"}, "optim.", "optim")


def test_optimizer_defaults_are_the_train_run_defaults():
    """OptimConfig's defaults and conf/config.yaml's optim block (which Hydra
    needs for its overrides and --help) are one set of values."""
    from tests.conftest import ROOT

    with open(os.path.join(ROOT, "conf", "config.yaml")) as f:
        conf = yaml.safe_load(f)["optim"]
    assert conf == dataclasses.asdict(OptimConfig())


def test_lit_takes_the_typed_settings_and_checkpoints_keep_a_dict(tmp_path):
    """LitLM takes the validated OptimConfig (what pipeline builds) or a dict
    (what a checkpoint holds); either way the checkpoint stores plain values
    and loads back to the same settings."""
    import lightning as L

    from rope_lm.train.checkpointing import load_checkpoint
    from rope_lm.train.lit import LitLM
    from tests.conftest import TINY_MODEL

    typed = OptimConfig(lr=5e-4, warmup_steps=3, beta2=0.99)
    common = dict(
        model=TINY_MODEL, pos={"name": "rope"}, scaling={"name": "none"}, vocab_size=64, train_len=16, max_steps=4
    )
    lit = LitLM(optim=typed, **common)
    assert lit.optim is typed and lit.hparams["optim"] == dataclasses.asdict(typed)
    trainer = L.Trainer(
        max_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.strategy.connect(lit)
    path = str(tmp_path / "x.ckpt")
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)  # plain values only: no class needed to read it
    assert saved["hyper_parameters"]["optim"] == dataclasses.asdict(typed)
    assert load_checkpoint(path)[0].optim == typed
    assert LitLM(optim={"lr": 5e-4}, **common).optim == OptimConfig(lr=5e-4)


def test_a_learned_run_from_before_the_table_left_weight_decay_resumes_with_its_own_groups():
    """A checkpoint whose optimizer state has the old groups (the learned table decaying with the
    other matrices) resumes with those groups, so its saved state loads; a new run keeps the table
    out of weight decay."""
    from rope_lm.train.lit import LitLM, decay_group_sizes
    from tests.conftest import TINY_MODEL

    lit = LitLM(
        model=TINY_MODEL,
        pos={"name": "learned"},
        scaling={"name": "none"},
        optim={},
        vocab_size=64,
        train_len=16,
        max_steps=4,
    )
    old, new = decay_group_sizes(lit.model, False), decay_group_sizes(lit.model, True)
    assert old != new  # the table moved from the decayed group to the other
    before, _ = build_optimizer(lit.model, OptimConfig(), 4, honour_listed=False)
    lit.on_load_checkpoint({"optimizer_states": [before.state_dict()]})
    resumed = lit.configure_optimizers()["optimizer"]
    assert [len(g["params"]) for g in resumed.param_groups] == old
    resumed.load_state_dict(before.state_dict())  # what Lightning does next: no group mismatch
    fresh = LitLM(
        model=TINY_MODEL,
        pos={"name": "learned"},
        scaling={"name": "none"},
        optim={},
        vocab_size=64,
        train_len=16,
        max_steps=4,
    )
    assert [len(g["params"]) for g in fresh.configure_optimizers()["optimizer"].param_groups] == new


class GradNorms(__import__("lightning").Callback):
    """The gradient norm the optimizer stepped with (after clipping; Lightning zeroes gradients at the
    start of the next step's closure)."""

    def __init__(self):
        self.norms = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(
            float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
        )


def test_fused_adamw_trains_under_bf16_mixed_with_gradient_clipping(tmp_path):
    """The CUDA default (bf16-mixed, fused AdamW, trainer.gradient_clip_val 1.0): Lightning refuses to clip
    for a fused optimizer under any mixed precision (fp16's scaler would unscale inside step()); bf16 has
    no scaler, so LitLM clips there itself. Found on an H200 (docs/benchmarks.md "GPU rows"); reproduced
    here on CPU, where fused AdamW and bf16 autocast run too."""
    import lightning as L

    from rope_lm.train.lit import LitLM
    from tests.conftest import TINY_MODEL

    torch.manual_seed(0)
    x = torch.randint(0, 64, (24, 17))
    batches = torch.utils.data.DataLoader(list(zip(x[:, :-1], x[:, 1:])), batch_size=4)
    lit = LitLM(
        model=TINY_MODEL,
        pos={"name": "rope"},
        scaling={"name": "none"},
        optim={"warmup_steps": 0, "lr": 0.5, "fused": True},
        vocab_size=64,
        train_len=16,
        max_steps=4,
    )
    norms = GradNorms()
    trainer = L.Trainer(
        max_steps=4,
        precision="bf16-mixed",
        gradient_clip_val=0.01,
        logger=False,
        callbacks=[norms],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(lit, batches)
    assert lit.trainer.optimizers[0].defaults["fused"] is True
    assert len(norms.norms) == 4 and all(n <= 0.01 * (1 + 1e-3) for n in norms.norms), norms.norms
