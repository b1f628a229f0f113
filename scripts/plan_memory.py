"""What one device will hold during training, before the run: the same
overrides as train.py (and its refusals), traced with fake tensors at a few
lengths and fitted in the length (rope_lm/train/memory_plan.py), so any
data.seq_len, and the longest one that fits device_gb, takes seconds.

    python scripts/plan_memory.py model=small data.seq_len=8192
    python scripts/plan_memory.py model=base data.seq_len=16384 trainer.precision=bf16-mixed device_gb=80
    python scripts/plan_memory.py model=base data.seq_len=16384 trainer=fsdp trainer.devices=8 device_gb=80
    python scripts/plan_memory.py data.seq_len=1048576 device_gb=80

trainer.precision=auto plans for this machine (float32 without a GPU): give
bf16-mixed to plan a GPU run from a machine without one. The vocabulary is
data.vocab_size (the size the tokenizer is trained to).
"""

import hydra
from omegaconf import OmegaConf

from rope_lm.cli import hydra_task


@hydra.main(config_path="../conf", config_name="plan_memory", version_base="1.3")
@hydra_task
def main(cfg):
    from rope_lm.runs.pipeline import plan_memory

    print(plan_memory(OmegaConf.to_container(cfg, resolve=True)))


if __name__ == "__main__":
    main()
