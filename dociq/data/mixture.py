"""A fixed, seeded mixture of page data sets (e.g. synthetic and real pages for fine-tuning)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from torch.utils.data import Dataset

from dociq.data.sampling import mixed_seed


_MIX_STREAM = 0x313C


class MixedDocuments(Dataset):
    """A fixed, seeded mixture of data sets, e.g. synthetic and real pages for fine-tuning.

    datasets: the data sets (any map-style data sets of `Page`s).
    weights:  the share of the mixture each one gets (normalised); None: proportional to their
              sizes (a shuffled concatenation).
    length:   pages in the mixture; None: the smallest length in which every data set with a
              positive weight shows each of its pages at least once, max(len_k / weight_k).
    seed:     the mixture's seed.

    The mixture has exactly round(weight_k * length) slots of data set k (largest remainders).
    Which slot holds which data set is a seeded permutation, and slot j of data set k reads its
    item perm_k,c[j mod len_k], a fresh seeded permutation of it per cycle c = j // len_k (a data
    set smaller than its share repeats; a larger one contributes a seeded subset). So
    `mixture[i]` is a pure function of (seed, i) for given data set sizes and weights: the same
    page in every worker and after a resume, as the (seed, step) batch order needs.
    """

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float] | None = None,
                 length: int | None = None, seed: int = 0) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("MixedDocuments needs at least one data set")
        sizes = [len(d) for d in self.datasets]
        self.weights = _mixture_weights(weights, sizes)
        for k, (size, weight) in enumerate(zip(sizes, self.weights)):
            if weight > 0 and size == 0:
                raise ValueError(f"data set {k} ({type(self.datasets[k]).__name__}) is empty but has "
                                 f"weight {weight:.3g}: give it pages or weight 0")
        if length is None:
            length = max(math.ceil(size / w - 1e-9) for size, w in zip(sizes, self.weights) if w > 0)
        if not isinstance(length, (int, np.integer)) or length < 1:
            raise ValueError(f"length={length!r}: pass an int >= 1, or None")
        self.seed = int(seed)
        counts = _apportion(int(length), self.weights)
        self._source, self._item = _assign(counts, sizes, self.seed)

    def __len__(self) -> int:
        return len(self._source)

    def source_of(self, index: int) -> tuple[int, int]:
        """(data set number, index in that data set) of mixture page `index`."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a mixture of {len(self)} pages")
        return int(self._source[index]), int(self._item[index])

    def __getitem__(self, index: int):
        k, j = self.source_of(index)
        return self.datasets[k][j]


def _mixture_weights(weights: Sequence[float] | None, sizes: list[int]) -> list[float]:
    if weights is None:
        weights = [float(s) for s in sizes]
    weights = [float(w) for w in weights]
    if len(weights) != len(sizes):
        raise ValueError(f"{len(weights)} weights for {len(sizes)} data sets: give one weight per data set")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights={weights}: need finite non-negative numbers with a positive sum")
    total = sum(weights)
    return [w / total for w in weights]


def _apportion(length: int, weights: list[float]) -> list[int]:
    """Integer counts summing to `length`, proportional to `weights` (largest remainders)."""
    quotas = [w * length for w in weights]
    counts = [math.floor(q + 1e-9) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[:length - sum(counts)]:
        counts[k] += 1
    return counts


def _assign(counts: list[int], sizes: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slot of the mixture: which data set, and which of its items."""
    rng = np.random.default_rng(mixed_seed(seed, _MIX_STREAM))
    source = rng.permutation(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    item = np.empty(len(source), dtype=np.int64)
    for k, (count, size) in enumerate(zip(counts, sizes)):
        if count == 0:
            continue
        cycles = math.ceil(count / size)
        order = np.concatenate([np.random.default_rng(mixed_seed(seed, _MIX_STREAM, k + 1, c)).permutation(size)
                                for c in range(cycles)])
        item[source == k] = order[:count]
    return source, item
