"""Context parallelism (trainer.context_parallel=K): each training sequence
split over K devices, composed with FSDP2 on a 2-D mesh of data x context
through Lightning's ModelParallelStrategy.

The mesh is Lightning's (data_parallel, tensor_parallel) one with the second
dimension used for the context: ranks r*K .. r*K + K - 1 form data-parallel
replica r and share its batch; each holds T/K of every sequence
(rope_lm/core/sequence_shards.py: PyTorch's head-tail shards) and attends
over the keys of all K (rope_lm/kernels/sharded_sequence.py). FSDP2 shards
each block over the context dimension and replicates it over the data one
(HSDP): the K devices of a replica hold one copy of the weights between them,
and every gradient is the mean over all devices, so the mean of their token
means is the loss of the global batch that one process would have computed
and the step is the same. Checkpoints are gathered into one ordinary file by
rank 0, as under trainer=fsdp, so a run resumes on any number of devices,
with or without context parallelism, and is evaluated by one process.
"""

import torch

from rope_lm.core.errors import ConfigError
from rope_lm.core.sequence_shards import SequenceShards, head_tail_order, shard_of
from rope_lm.train.sharding import BlockShardedStrategy


class ContextParallelStrategy(BlockShardedStrategy):
    """FSDP2 over a (data, context) mesh of every device of the run; K the
    context dimension."""

    def __init__(self, context_parallel: int):
        super().__init__()
        self.context_parallel = context_parallel

    def setup_environment(self):
        world = self.num_nodes * self.num_processes
        self._data_parallel_size = world // self.context_parallel
        self._tensor_parallel_size = self.context_parallel
        # ModelParallelStrategy's own setup with these sizes (BlockShardedStrategy's makes every device data-parallel).
        super(BlockShardedStrategy, self).setup_environment()


def sequence_shards(mesh, seq_len: int, device) -> SequenceShards:
    """This device's shards of a sequence of seq_len tokens over the context
    dimension of `mesh` (the strategy's (data_parallel, tensor_parallel) mesh)."""
    from torch.distributed.distributed_c10d import _get_process_group_name

    context = mesh["tensor_parallel"]
    return SequenceShards(
        seq_len=seq_len,
        rank=context.get_local_rank(),
        size=context.size(),
        group_name=_get_process_group_name(context.get_group()),
        k_index=head_tail_order(seq_len, context.size(), device),
    )


def split(x: torch.Tensor, y: torch.Tensor, shards: SequenceShards):
    """This device's tokens and targets of a batch (B, T)."""
    return shard_of(x, shards), shard_of(y, shards)


def check_settings(context_parallel: int, seq_len: int, compile: bool, strategy) -> None:
    """Refuse, before any work, the trainer settings context parallelism cannot serve."""
    k = context_parallel  # a positive integer (TrainerConfig.validate)
    if k == 1:
        return
    if seq_len % (2 * k):
        fits = [n for n in (seq_len - seq_len % (2 * k), seq_len + 2 * k - seq_len % (2 * k)) if n > 0]
        raise ConfigError(
            f"trainer.context_parallel={k} cuts each sequence into {2 * k} chunks (two per device, head and tail, "
            f"so every device has the same share of the causal mask), but data.seq_len={seq_len} is not a multiple "
            f"of {2 * k}. Use data.seq_len={' or '.join(map(str, fits))}, or a context_parallel that divides "
            f"data.seq_len / 2."
        )
    if compile:
        raise ConfigError(
            f"trainer.compile=true is not served with trainer.context_parallel={k}: the keys and values are "
            f"all-gathered between the layers' compiled parts, which rope-lm does not compile across. Leave "
            f"trainer.compile off (the default) for a context-parallel run, or train on one device per sequence "
            f"(trainer.context_parallel=1) to compile."
        )
    if strategy not in (None, "auto"):
        raise ConfigError(
            f"trainer.context_parallel={k} chooses the strategy itself (FSDP2 on a data x context mesh through "
            f"Lightning's ModelParallelStrategy), so trainer.strategy={strategy!r} cannot be used with it. Remove "
            f"trainer.strategy, or set trainer.context_parallel=1."
        )


def check_world(context_parallel: int, devices: int, nodes: int) -> None:
    world = devices * nodes
    if world % context_parallel or world < context_parallel:
        raise ConfigError(
            f"trainer.context_parallel={context_parallel} splits each sequence over that many devices, but the run "
            f"has {devices} device(s) on {nodes} node(s) (trainer.devices x trainer.num_nodes = {world}), which "
            f"{context_parallel} does not divide. Give it a multiple of {context_parallel} devices in all, or a "
            f"context_parallel that divides {world}."
        )


def check_served(cfg, pos: dict, scaling: dict | None, layers) -> None:
    """Refuse, before any work, a model the sharded kernel cannot serve: a
    scheme of any layer (layers: the resolved layer specs), or the method; and
    one FSDP2 cannot shard (sharding.check_shardable). Builds no weights."""
    from rope_lm.model.transformer import layer_schemes
    from rope_lm.scaling import build_scaling
    from rope_lm.train.sharding import check_shardable

    method = build_scaling(scaling)
    seen = set()
    for i, scheme in enumerate(layer_schemes(cfg, pos, layers)):
        if id(scheme) in seen:
            continue
        seen.add(id(scheme))
        where = f" (layer {i})" if layers else ""
        why = scheme.why_not_split()
        if why:
            raise ConfigError(
                f"trainer.context_parallel cannot split the sequence under positional scheme {scheme.name!r}"
                f"{where}: {why} Context parallelism all-gathers keys and values and scores "
                f"each pair at its global positions, which serves schemes whose logit is a rotation or a bias of "
                f"the two positions (rope, p-RoPE, xpos, alibi, t5, kerple, sandwich, nope, learned, sinusoidal, multiplicative). Train "
                f"{scheme.name!r} with one device per sequence (trainer.context_parallel=1; "
                f"model.activation_checkpointing=true saves memory), or use one of those schemes."
            )
    if method.far_pass:
        raise ConfigError(
            f"trainer.context_parallel cannot serve extrapolation method {method.name!r}: its second rotary pass "
            f"(a near band and a far region merged per query) is computed by rope-lm's two-pass kernel, which has "
            f"no sharded form. Fine-tune with a method that changes frequencies or positions (pi, ntk, yarn, "
            f"ntk_by_parts, llama3, longrope, logn, window), or with trainer.context_parallel=1."
        )
    check_shardable(cfg, pos, scaling, layers, "trainer.context_parallel (FSDP2 on a data x context mesh)")
