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
