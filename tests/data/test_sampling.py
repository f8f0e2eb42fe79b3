"""The training order is a function of (seed, step): what exact resume stands on."""
from __future__ import annotations

import logging

import pytest
import torch

from dociq.data.sampling import SeedCarryingDataset, SeededCollate, StepBatchSampler, StepDataLoader


def _steps(sampler: StepBatchSampler, epochs: int) -> list[list[tuple[int, int]]]:
    return [batch for _ in range(epochs) for batch in sampler]


def test_starting_at_step_k_gives_the_tail_of_the_uninterrupted_order():
    full = _steps(StepBatchSampler(10, 3, seed=7), epochs=3)          # 3 batches an epoch
    for k in range(len(full)):
        epochs_left = 3 - k // 3
        assert _steps(StepBatchSampler(10, 3, seed=7, start_step=k), epochs_left) == full[k:], k


def test_every_epoch_is_a_fresh_permutation_and_batches_carry_distinct_seeds():
    batches = _steps(StepBatchSampler(12, 4, seed=0), epochs=2)
    epoch0 = [i for b in batches[:3] for i, _ in b]
    epoch1 = [i for b in batches[3:] for i, _ in b]
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))
    assert epoch0 != epoch1
    seeds = [{s for _, s in b} for b in batches]
    assert all(len(s) == 1 for s in seeds) and len(set.union(*seeds)) == len(batches)
    assert _steps(StepBatchSampler(12, 4, seed=1), 2) != batches


def test_too_few_pages_for_one_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than data.batch_size=8"):
        StepBatchSampler(5, 8, seed=0)


def test_the_collator_draws_from_the_batch_seed_in_any_worker():
    """The same batch seed gives the same random choices whether or not other batches came first."""
    seen = []

    def collator(pages, batch_seed):
        g = torch.Generator().manual_seed(batch_seed)
        return {"pages": list(pages), "noise": torch.rand(2, generator=g)}

    data = SeedCarryingDataset(list(range(20)))
    loader = StepDataLoader(data, batch_sampler=StepBatchSampler(20, 4, seed=3),
                            collate_fn=SeededCollate(collator), num_workers=1)
    for batch in loader:
        seen.append(batch)
    later = StepDataLoader(data, batch_sampler=StepBatchSampler(20, 4, seed=3, start_step=2),
                           collate_fn=SeededCollate(collator), num_workers=0)
    for a, b in zip(seen[2:], later):
        assert a["pages"] == b["pages"] and torch.equal(a["noise"], b["noise"])


def test_resuming_with_another_seed_or_batch_size_is_reported(caplog):
    loader = StepDataLoader(SeedCarryingDataset(list(range(20))),
                            batch_sampler=StepBatchSampler(20, 4, seed=3),
                            collate_fn=SeededCollate(lambda pages, batch_seed: pages))
    saved = loader.state_dict()
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        loader.load_state_dict(saved)
        assert not caplog.records
        loader.load_state_dict(dict(saved, seed=4, batch_size=8))
    assert "seed 4 -> 3" in caplog.text and "batch_size 8 -> 4" in caplog.text


def _batches(sampler):
    return [b for b in sampler]


def test_data_parallel_ranks_split_each_step_into_disjoint_shares():
    one = _batches(StepBatchSampler(40, 4, seed=3))
    ranks = [_batches(StepBatchSampler(40, 2, seed=3, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 10
    for step in range(10):
        pages = [[i for i, _ in ranks[r][step]] for r in (0, 1)]
        assert not set(pages[0]) & set(pages[1])
        # the two shares are the global batch of 4 that one process would draw at this step
        assert pages[0] + pages[1] == [i for i, _ in one[step]]
        seeds = {ranks[r][step][0][1] for r in (0, 1)}
        assert len(seeds) == 2, "each rank's random choices follow its own seed"


def test_data_parallel_share_is_a_function_of_seed_step_and_rank():
    full = _batches(StepBatchSampler(40, 2, seed=5, num_replicas=2, rank=1))
    resumed = _batches(StepBatchSampler(40, 2, seed=5, num_replicas=2, rank=1, start_step=6))
    assert resumed == full[6:]
    with pytest.raises(ValueError, match="rank 2 of 2"):
        StepBatchSampler(40, 2, seed=5, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="2 processes"):
        StepBatchSampler(3, 2, seed=5, num_replicas=2, rank=0)


def test_one_process_keeps_the_batch_seeds_of_earlier_runs():
    from dociq.data.sampling import _BATCH_STREAM, mixed_seed

    batch = next(iter(StepBatchSampler(16, 4, seed=9)))
    assert {s for _, s in batch} == {mixed_seed(9, _BATCH_STREAM, 0)}
