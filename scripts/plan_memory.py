"""What one device will hold during training, before the run: the same
overrides as train.py, traced with fake tensors (rope_lm/train/memory_plan.py).

    python scripts/plan_memory.py model=small data.seq_len=8192
    python scripts/plan_memory.py model=base data.seq_len=16384 trainer.precision=bf16-mixed device_gb=80
    python scripts/plan_memory.py model=base data.seq_len=16384 trainer=fsdp trainer.devices=8 device_gb=80

trainer.precision=auto plans for this machine (float32 without a GPU): give
bf16-mixed to plan a GPU run from a machine without one. The vocabulary is
data.vocab_size (the size the tokenizer is trained to).
"""

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task
from rope_lm.core.errors import ConfigError


@hydra.main(config_path="../conf", config_name="plan_memory", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.runs.config import resolve_run
    from rope_lm.train.memory_plan import format_plan, plan, setup_of

    config = OmegaConf.to_container(cfg, resolve=True)
    device_gb = config.pop("device_gb", None)
    if device_gb is not None and (
        isinstance(device_gb, bool) or not isinstance(device_gb, (int, float)) or not device_gb > 0
    ):
        raise ConfigError(f"device_gb={device_gb!r} must be a positive number of GiB (e.g. device_gb=80), or null.")
    run = resolve_run(config)
    setup = setup_of(run.trainer)
    result = plan(
        run.model,
        run.pos,
        run.scaling,
        run.data.vocab_size,
        run.data.seq_len,
        run.data.batch_size,
        setup,
        run.optim,
        device_gb,
    )
    print(format_plan(result, device_gb))


if __name__ == "__main__":
    main()
