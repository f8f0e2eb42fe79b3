"""A data set of pages read from files under a bad-sample policy (dociq.data.errors)."""
from __future__ import annotations

from torch.utils.data import Dataset

from dociq.data.errors import BadSample, BadSamplePolicy, DroppedRegion
from dociq.data.schema import Page


class GuardedDocuments(Dataset):
    """Subclasses set `self.policy` and implement `load_page(index)`; item `index` is that page,
    or, when the policy skips bad pages, None with the reason recorded (the collator drops it)."""

    policy: BadSamplePolicy

    def load_page(self, index: int) -> Page:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Page | None:
        return self.policy.run(index, lambda: self.load_page(index))

    @property
    def bad_samples(self) -> list[BadSample]:
        """Pages skipped so far in this process (each DataLoader worker keeps its own list)."""
        return self.policy.bad_samples

    @property
    def dropped_regions(self) -> list[DroppedRegion]:
        """Zero-area regions dropped so far in this process (each worker keeps its own list)."""
        return self.policy.dropped_regions
