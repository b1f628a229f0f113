"""Sharded training (trainer=fsdp, trainer.sharded=true): every block's
parameters, gradients and optimizer state split across the devices with
FSDP2 (torch's fully_shard) through Lightning's ModelParallelStrategy.

Each Block is one FSDP unit: its weights are gathered just before it runs
(and again when backward reaches it) and freed after, so a device holds the
whole of one block at a time and 1/N of the others. What sits outside the
blocks (the embedding, tied to the output head; the final norm; positional
schemes with parameters, such as T5's buckets or FIRE's network) forms the
root unit, gathered for the whole step. Buffers (RoPE's inverse
frequencies, bias slopes) are never sharded: every rank keeps its own full
copy, built at construction exactly as in one process.

Checkpoints are gathered: rank 0 writes one ordinary rope-lm checkpoint file
(the whole model and the whole optimizer state), so a sharded run resumes on
any number of devices, or on one, and evaluation, scripts/export_hf.py and
every other reader open it as they open any checkpoint.

The root unit is the LightningModule's training loss (lit.TrainingLoss), not
the model: the loss reads the output head's weight directly (rope_lm.model.head
chunks it), and FSDP gathers a unit's weights when that unit's forward runs.
"""

from lightning.pytorch.strategies import ModelParallelStrategy
import torch

from rope_lm.core.errors import ConfigError


class BlockShardedStrategy(ModelParallelStrategy):
    """FSDP2 over every device of the run (one data-parallel mesh of
    devices x nodes, no tensor parallelism), checkpoints gathered into one
    file on rank 0."""

    def __init__(self):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False)

    def setup_environment(self):
        # Lightning's "auto" would make the mesh one data-parallel group per node; every device is one here.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def check_sharded(lightning: dict) -> None:
    """Refuse, before any work, trainer settings the sharded preset cannot serve."""
    strategy = lightning.get("strategy", "auto")
    if strategy != "auto":
        raise ConfigError(
            f"trainer.sharded=true (the trainer=fsdp preset) chooses the strategy itself (FSDP2 per block through "
            f"Lightning's ModelParallelStrategy), so trainer.strategy={strategy!r} cannot be used with it. Remove "
            f"trainer.strategy, or set trainer.sharded=false (a new run: leave out trainer=fsdp) to run "
            f"{strategy!r} (e.g. trainer.strategy=ddp)."
        )


def check_shardable(cfg, pos: dict, scaling: dict | None, layers, setting: str = "trainer=fsdp") -> None:
    """Refuse a model fully_shard cannot take, before any work: FSDP2 shards
    every parameter along a dimension, so a scalar parameter (FIRE's c and
    L multiplier) has none. The model is built on the meta device: shapes
    only; `layers`: its resolved layer specs (ModelConfig.resolve); `setting`:
    what asked for FSDP2 (the preset, or context parallelism)."""
    from rope_lm.model.transformer import TransformerLM

    with torch.device("meta"):
        model = TransformerLM(cfg, pos, scaling, layers)
    scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
    if scalars:
        raise ConfigError(
            f"{setting} cannot shard this model with FSDP2: its parameters {', '.join(scalars[:4])}"
            f"{' ...' if len(scalars) > 4 else ''} are scalars (pos={pos.get('name')}), and FSDP2 shards every "
            f"parameter along a dimension. Train it on one device or with DDP (trainer.strategy=ddp "
            f"trainer.devices=N; model.activation_checkpointing=true saves memory in both), or shard a scheme "
            f"whose parameters are tensors (rope, alibi, t5, ...)."
        )


def check_world(devices: int, nodes: int) -> None:
    """Sharding over one device saves nothing; say so instead of running it."""
    if devices * nodes < 2:
        raise ConfigError(
            f"trainer=fsdp shards the model over the devices, but this run has {devices} device(s) on {nodes} "
            f"node(s) (trainer.devices, trainer.num_nodes). Give it two or more (e.g. trainer.devices=8 on a GPU "
            f"node, or trainer.accelerator=cpu trainer.devices=2), or train on one device with "
            f"trainer.sharded=false (a new run: leave out trainer=fsdp; a resumed one, whose settings come from "
            f"its run.yaml: add trainer.sharded=false; model.activation_checkpointing=true saves memory there)."
        )


def shard(root: torch.nn.Module, blocks, mesh, precision: str) -> None:
    """fully_shard each block, then the root (what the blocks leave). With
    bf16-mixed (the default on a GPU with bf16), the gathered weights and the
    compute are bfloat16 while the sharded weights, the optimizer and the
    gradient reduction stay float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision == "bf16-mixed":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy)
