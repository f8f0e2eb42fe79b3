"""Training data order as a pure function of (seed, step), so a resumed run sees the same batches.

A resumed run must train on exactly the batches the uninterrupted run would have seen: which pages
form batch `s`, and every random choice the collator makes for it (masks, prompts, clicks). Both
depend only on `(seed, s)` here:

- `StepBatchSampler` draws a fresh permutation of the pages per data epoch from `(seed, epoch)` and
  starts at any step (`start_step`), instead of torch's RandomSampler, whose order comes from the
  global RNG at the moment the loader is iterated.
- Each index it yields carries its batch's seed; `SeededCollate` hands that seed to the collator,
  so batch `s` gets the same masks in any worker process, before or after a restart.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import logging

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

log = logging.getLogger("dociq.data")

# Mixed into the seed sequence so batch seeds never equal page seeds of the same data seed.
_BATCH_STREAM = 0xBA7C
_ORDER_STREAM = 0x0DE5


def mixed_seed(*keys: int) -> int:
    """A well-mixed 63-bit seed from a tuple of non-negative ints (nearby tuples do not collide)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


class StepBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of `(page index, batch seed)`; batch `s` is the same for a given `(seed, s)`.

    One iteration is one data epoch (`len(self)` batches, the last partial batch dropped). The first
    iteration starts at `start_step` (mid-epoch after a resume); each later one starts the next epoch.

    Under data parallelism (`num_replicas` processes) step `s` draws one global batch of
    `batch_size * num_replicas` pages and process `rank` takes its slice, with its own batch seed:
    rank r's share of step s is a function of (seed, s, r), so a resume is as exact as on one process.
    """

    def __init__(self, num_items: int, batch_size: int, seed: int, start_step: int = 0,
                 num_replicas: int = 1, rank: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} of {num_replicas} processes: need 0 <= rank < num_replicas")
        if num_items < batch_size * num_replicas:
            raise ValueError(f"the training set has {num_items} pages, fewer than data.batch_size="
                             f"{batch_size} x {num_replicas} processes: lower data.batch_size or add pages")
        self.num_items, self.batch_size, self.seed = num_items, batch_size, int(seed)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.start_step = int(start_step)

    def __len__(self) -> int:
        return self.num_items // (self.batch_size * self.num_replicas)

    def _batch_seed(self, step: int) -> int:
        if self.num_replicas == 1:  # one process: the seeds every earlier run and checkpoint used
            return mixed_seed(self.seed, _BATCH_STREAM, step)
        return mixed_seed(self.seed, _BATCH_STREAM, step, self.rank)

    def _order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(mixed_seed(self.seed, _ORDER_STREAM, epoch))
        return torch.randperm(self.num_items, generator=g)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, offset = divmod(self.start_step, len(self))
        self.start_step = (epoch + 1) * len(self)   # the next iteration is the next epoch
        order = self._order(epoch)
        for i in range(offset, len(self)):
            step = epoch * len(self) + i
            first = (i * self.num_replicas + self.rank) * self.batch_size
            yield [(int(j), self._batch_seed(step)) for j in order[first:first + self.batch_size]]


class SeedCarryingDataset(Dataset):
    """Wraps a data set so `ds[(index, seed)]` returns `(ds[index], seed)` (see StepBatchSampler)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]):
        index, seed = item
        return self.dataset[index], seed


class SeededCollate:
    """`[(page, seed), ...] -> collator(pages, batch_seed=seed)`: the batch's random choices follow its seed."""

    def __init__(self, collator: Callable) -> None:
        self.collator = collator

    def __call__(self, items: Sequence[tuple[object, int]]) -> dict:
        seeds = {seed for _, seed in items}
        if len(seeds) != 1:
            raise RuntimeError(f"one batch carries {len(seeds)} batch seeds: the loader must use "
                               "StepBatchSampler (batch_sampler=), not batch_size/shuffle")
        return self.collator([page for page, _ in items], batch_seed=seeds.pop())


class StepDataLoader(DataLoader):
    """A DataLoader over a `StepBatchSampler` that Lightning saves and restores with the checkpoint.

    The position needs no saving (the sampler starts at the trainer's step); the state records what
    the order depends on, so a resume with another seed, batch size or data set size is reported
    instead of silently training on other batches than the checkpoint's run would have.
    """

    def state_dict(self) -> dict:
        s = self.batch_sampler
        return {"seed": s.seed, "batch_size": s.batch_size, "num_items": s.num_items,
                "num_replicas": s.num_replicas}

    def load_state_dict(self, state: dict) -> None:
        now = self.state_dict()
        state = {"num_replicas": 1, **state}  # checkpoints from before data parallelism: one process
        changed = {k: (state.get(k), v) for k, v in now.items() if state.get(k) != v}
        if changed:
            log.warning("resuming with a different data order than the checkpoint's run (%s): the "
                        "batches after the resume differ from an uninterrupted run's",
                        ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()))
