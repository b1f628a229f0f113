"""One training sequence split over the devices of a context-parallel group
(trainer.context_parallel=K): which of its tokens this device holds, where
every gathered key came from, and the gather itself.

The split is PyTorch's head-tail load balancing (torch.distributed.tensor.
experimental's _HeadTailLoadBalancer, the order its context parallelism and
torchtitan use): the sequence is cut into 2K chunks and device r holds chunks
r and 2K-1-r, so under a causal mask every device has the same number of
visible pairs. The keys and values of every device are all-gathered (PyTorch's
flex_cp_allgather, whose backward reduce-scatters the gradients back to the
device that holds each token), so attention sees every key with this
device's queries only. Positions stay global: each query and key is read at
its index in the whole sequence (q_index, k_index), so rotary angles, bias
distances, windows and per-query scales are those of one process holding it
all."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceShards:
    seq_len: int  # T, the whole sequence
    rank: int  # this device's place in the context group
    size: int  # K, the devices of the group
    group_name: str  # the context group's process-group name (for the collectives)
    # (T,) the original index of each token in the order the group's shards are concatenated: a gathered
    # key at row j is token k_index[j]. This device's own tokens are rows rank*T/K .. (rank+1)*T/K - 1.
    k_index: torch.Tensor

    @property
    def local_len(self) -> int:
        return self.seq_len // self.size

    @property
    def q_index(self) -> torch.Tensor:
        """(T/K,) the original indices of this device's tokens (its queries)."""
        n = self.local_len
        return self.k_index[self.rank * n : (self.rank + 1) * n]

    def runs(self) -> list[tuple[int, int, int]]:
        """This device's tokens as contiguous runs of the sequence: (first
        local row, end local row, index of the first token); the head and the
        tail chunk of head-tail shards. Plain integers, so a trace under fake
        tensors (the memory plan) reads them too."""
        chunk = self.seq_len // (2 * self.size)
        return [(0, chunk, self.rank * chunk), (chunk, 2 * chunk, (2 * self.size - 1 - self.rank) * chunk)]

    def in_order(self, x: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """Gathered x (rows in group order along `dim`) back in the sequence's order."""
        return x.index_select(dim, torch.argsort(self.k_index).to(x.device))

    def gather(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every device's k and v (B, h, T/K, D) concatenated in group order
        along the sequence, (B, h, T, D); in backward each device gets back the
        sum of every device's gradient for its own tokens."""
        from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather

        return flex_cp_allgather(k.contiguous(), v.contiguous(), 2, self.group_name)


def head_tail_order(seq_len: int, size: int, device=None) -> torch.Tensor:
    """(T,) token indices in the order of K head-tail shards: device r's
    T/K tokens are chunks r and 2K-1-r of 2K. PyTorch's own load balancer
    computes them, so the shards are the ones its context parallelism makes."""
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    return _HeadTailLoadBalancer(seq_len, size, device or "cpu")._generate_indices(restore=False)[0].to(device)


def shard_of(x: torch.Tensor, shards: SequenceShards, dim: int = 1) -> torch.Tensor:
    """This device's tokens of x along `dim` (the whole sequence there), in
    the order its queries have."""
    return x.index_select(dim, shards.q_index.to(x.device))
