"""Loaders over a token cache (rope_lm/data/token_cache.py builds it): fixed-length
windows, a resumable sample order, the Lightning data module."""

import lightning as L
import numpy as np
import torch

from rope_lm.core.errors import ConfigError
from rope_lm.data.token_cache import DataConfig, TokenCache


class TokenWindows(torch.utils.data.Dataset):
    """Non-overlapping (input, target) windows of seq_len tokens from a token array."""

    def __init__(self, tokens: np.ndarray, seq_len: int, max_tokens: int | None = None):
        self.tokens = tokens
        self.seq_len = seq_len
        usable = len(tokens) - 1 if max_tokens is None else min(len(tokens) - 1, max_tokens)
        self.n = max(0, usable // seq_len)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = i * self.seq_len
        chunk = torch.from_numpy(np.asarray(self.tokens[s : s + self.seq_len + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]


def data_replica(trainer) -> tuple[int, int]:
    """(this process's data-parallel rank, the number of data-parallel
    replicas): every process under DDP; under context parallelism the
    devices that share a sequence read one batch and count as one replica
    (the strategy's distributed_sampler_kwargs say so, as Lightning's own
    sampler would read them)."""
    kwargs = getattr(getattr(trainer, "strategy", None), "distributed_sampler_kwargs", None) or {}
    return kwargs.get("rank", trainer.global_rank), kwargs.get("num_replicas", trainer.world_size)


class StepSampler(torch.utils.data.Sampler):
    """Sample order fixed by (seed, global sample index): epoch e is permutation
    seed + e of the windows. Starting at ``start`` samples resumes the exact
    order of an uninterrupted run; ranks take interleaved samples.

    Endless unless ``total`` is given: training stops at trainer.max_steps, so
    Lightning's own epoch bookkeeping (which a resume would restore mid-epoch)
    never decides which data comes next."""

    def __init__(self, n: int, seed: int, total: int | None = None, start: int = 0, rank: int = 0, world: int = 1):
        self.n, self.seed, self.total, self.start, self.rank, self.world = n, seed, total, start, rank, world

    def _perm(self, epoch):
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self):
        epoch, perm = None, None
        g = self.start + self.rank
        while self.total is None or g < self.total:
            if g // self.n != epoch:
                epoch = g // self.n
                perm = self._perm(epoch)
            yield int(perm[g % self.n])
            g += self.world


class LMDataModule(L.LightningDataModule):
    """Train/validation loaders over a TokenCache.

    The training sample order depends only on (seed, global sample index): global
    rank r of a world of W processes takes samples start + r, start + r + W, ...,
    so a step's global batch is the same samples however many processes or nodes
    share it (2 nodes x 1 process read what 1 node x 2 devices read). The loader
    starts at the samples the run had consumed when its checkpoint was written
    (kept in the checkpoint by state_dict), so a resumed run continues exactly
    where the interrupted one stopped, also on another number of processes or
    nodes, whose global batch may differ (see StepSampler)."""

    def __init__(self, cache: TokenCache, cfg: DataConfig, seed: int, accumulate: int = 1):
        super().__init__()
        self.cache, self.cfg, self.seed = cache, cfg, seed
        self.accumulate = accumulate
        self._restored = None  # (samples consumed, global step) of the checkpoint a resume starts from
        self.train = TokenWindows(cache.tokens("train"), cfg.seq_len)
        self.val = TokenWindows(cache.tokens("valid"), cfg.seq_len, cfg.val_tokens)
        if len(self.train) < cfg.batch_size:
            raise ConfigError(
                f"data.batch_size={cfg.batch_size} is larger than the training split, which holds only "
                f"{len(self.train)} windows of data.seq_len={cfg.seq_len} tokens ({len(cache.tokens('train'))} tokens). "
                f"Lower the batch size or the sequence length, or use more text."
            )
        if len(self.val) == 0:
            raise ConfigError(
                f"The validation split has {len(cache.tokens('valid'))} tokens, fewer than one window of "
                f"data.seq_len={cfg.seq_len}; lower data.seq_len or raise data.valid_fraction."
            )

    def samples_at(self, step: int) -> int:
        """Training samples (over all processes) consumed before `step` (this sitting's global batch
        counted from the checkpoint it resumed from; a checkpoint written before its count was kept
        is taken to have had this sitting's global batch)."""
        t = self.trainer
        per_step = self.cfg.batch_size * self.accumulate * data_replica(t)[1]
        samples, since = self._restored or (0, 0)
        return samples + (step - since) * per_step

    def state_dict(self):
        step = self.trainer.global_step
        return {"samples": self.samples_at(step), "step": step}

    def load_state_dict(self, state):
        self._restored = (int(state["samples"]), int(state["step"]))

    def train_dataloader(self):
        t = self.trainer
        start = self.samples_at(t.global_step)
        sampler = StepSampler(len(self.train), self.seed, None, start, *data_replica(t))
        return torch.utils.data.DataLoader(
            self.train,
            batch_size=self.cfg.batch_size,
            sampler=sampler,
            num_workers=self.cfg.num_workers,
            drop_last=True,
        )

    def val_dataloader(self):
        return torch.utils.data.DataLoader(
            self.val, batch_size=self.cfg.batch_size, shuffle=False, num_workers=self.cfg.num_workers
        )
