"""Bad input: one error type that names the file, what is wrong and the fix, plus the skip policy.

Every reader in `dociq.data` raises `BadSampleError` for a page it cannot use. Data sets take
`on_bad_sample="raise"|"skip"`; with "skip", `BadSamplePolicy.run` turns the error into `None`
(the collator drops `None` and counts it), logs one warning per page and records it in
`policy.bad_samples` so a caller in the same process can list what was skipped. A region that
cannot be a target (zero area) is not a bad page: readers drop just that region, warn once and
record it in `policy.dropped_regions`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

log = logging.getLogger("dociq.data")

ON_BAD_SAMPLE = ("raise", "skip")

# Boxes may overshoot the page by this fraction of its width/height (rounding in exporters,
# anti-aliased polygon edges) and are clipped; anything further out is an annotation error.
BOX_OVERSHOOT_TOLERANCE = 0.01

# Pixel cap for one page image, decoded or rendered, checked from the header / the PDF page size
# before any pixels are allocated. 50 MP is above A4 and US Letter at 600 dpi (~35 MP) and A3 at
# 500 dpi (~48 MP), the finest scans document data sets ship; a 50 MP page already costs 150 MB
# as RGB plus 50 MB per region mask, so anything larger is far more likely a wrong width/height or
# a huge PDF MediaBox than a page a model at 1024 px could use.
DEFAULT_MAX_PAGE_PIXELS = 50_000_000

T = TypeVar("T")


class BadSampleError(ValueError):
    """A page that cannot be used. `str(err)` reads "<path>: <reason>. Fix: <fix>"."""

    def __init__(self, path: str | Path, reason: str, fix: str):
        self.path = str(path)
        self.reason = reason
        self.fix = fix
        super().__init__(f"{self.path}: {reason}. Fix: {fix}")

    def __reduce__(self):  # keep it picklable across DataLoader worker processes
        return (type(self), (self.path, self.reason, self.fix))


@dataclass(frozen=True)
class BadSample:
    """A skipped page: its index in the data set, the offending file and the reason."""

    index: int | None
    path: str
    reason: str


@dataclass(frozen=True)
class DroppedRegion:
    """A region dropped from an otherwise good page: page index, annotation file, which region, why."""

    index: int | None
    path: str
    what: str
    reason: str


def check_on_bad_sample(value: str) -> str:
    if value not in ON_BAD_SAMPLE:
        raise ValueError(
            f"on_bad_sample={value!r} is not one of {ON_BAD_SAMPLE}. Fix: pass 'raise' to stop on "
            "the first bad page or 'skip' to drop bad pages and log them"
        )
    return value


class BadSamplePolicy:
    """Applies `on_bad_sample` to page loads and keeps the list of skipped pages."""

    def __init__(self, on_bad_sample: str = "raise"):
        self.mode = check_on_bad_sample(on_bad_sample)
        self._seen: dict[int | None, BadSample] = {}
        self._unindexed: list[BadSample] = []
        self._dropped: dict[tuple, DroppedRegion] = {}

    @property
    def bad_samples(self) -> list[BadSample]:
        return [*self._unindexed, *self._seen.values()]

    @property
    def dropped_regions(self) -> list[DroppedRegion]:
        return list(self._dropped.values())

    def record_dropped(self, index: int | None, path: str | Path, what: str, reason: str) -> None:
        """Log and remember a dropped region once (epochs re-read the same pages)."""
        key = (index, str(path), what)
        if key in self._dropped:
            return
        self._dropped[key] = DroppedRegion(index, str(path), what, reason)
        log.warning("dropping region %s of %s (index %s): %s", what, path, index, reason)

    def record(self, index: int | None, err: BadSampleError) -> None:
        """Log and remember a bad page once (epochs re-read the same pages)."""
        sample = BadSample(index, err.path, err.reason)
        if index is None:
            self._unindexed.append(sample)
        elif index in self._seen:
            return
        else:
            self._seen[index] = sample
        log.warning("skipping bad sample %s (index %s): %s", err.path, index, err.reason)

    def run(self, index: int | None, load: Callable[[], T]) -> T | None:
        """`load()`; on `BadSampleError` re-raise ("raise") or record it and return None ("skip")."""
        try:
            return load()
        except BadSampleError as err:
            if self.mode == "raise":
                raise
            self.record(index, err)
            return None


def _rounded(b: np.ndarray) -> list[float]:
    return [round(float(v), 2) for v in b]  # numpy's round overflows on huge hostile values


def check_box_in_page(
    box, size: tuple[int, int], path: str | Path, what: str,
    tolerance: float = BOX_OVERSHOOT_TOLERANCE,
) -> np.ndarray:
    """Return box x0,y0,x1,y1 clipped to the page; raise if it lies further out than `tolerance`.

    `what` names the box in the error ("annotation id 7", "word 3 'Total'").
    """
    h, w = size
    fix_tail = "correct the annotation, or pass on_bad_sample='skip' to drop the page"
    try:
        b = np.asarray(box, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):  # strings, nested lists, dicts: not four numbers
        b = None
    if b is None or b.shape != (4,) or not np.all(np.isfinite(b)):
        raise BadSampleError(path, f"{what} has an invalid box {box!r:.80}: need 4 finite numbers x0, y0, x1, y1",
                             fix_tail)
    x0, y0, x1, y1 = b
    if x1 < x0 or y1 < y0:
        raise BadSampleError(
            path, f"{what} has a box with negative size x0,y0,x1,y1={_rounded(b)}", fix_tail
        )
    tx, ty = tolerance * w, tolerance * h
    if x0 < -tx or y0 < -ty or x1 > w + tx or y1 > h + ty:
        raise BadSampleError(
            path,
            f"{what} has box x0,y0,x1,y1={_rounded(b)} outside the {w}x{h} page "
            f"(more than {tolerance:.0%} overshoot)",
            "check that the annotation belongs to this image and uses pixel coordinates of the "
            "stored image; " + fix_tail,
        )
    return np.array([min(max(x0, 0), w), min(max(y0, 0), h), min(max(x1, 0), w), min(max(y1, 0), h)],
                    dtype=np.float32)


def check_boxes_in_page(
    boxes, size: tuple[int, int], path: str | Path, describe: Callable[[int], str],
    tolerance: float = BOX_OVERSHOOT_TOLERANCE,
) -> np.ndarray:
    """`check_box_in_page` for float [N, 4] boxes at once (pages hold hundreds of words).

    `describe(i)` names box i for the error; the first bad box raises exactly as the single check."""
    h, w = size
    try:
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    except (TypeError, ValueError):  # some box is no 4 numbers: let the single check name it
        for i, box in enumerate(boxes):
            check_box_in_page(box, size, path, describe(i), tolerance)
        raise BadSampleError(path, "boxes are not a list of [x0, y0, x1, y1]",
                             "correct the annotation, or pass on_bad_sample='skip' to drop the page")
    tx, ty = tolerance * w, tolerance * h
    bad = (~np.isfinite(b).all(axis=1)) | (b[:, 2] < b[:, 0]) | (b[:, 3] < b[:, 1]) \
        | (b[:, 0] < -tx) | (b[:, 1] < -ty) | (b[:, 2] > w + tx) | (b[:, 3] > h + ty)
    if bad.any():
        i = int(np.argmax(bad))
        check_box_in_page(b[i], size, path, describe(i), tolerance)
    out = np.empty_like(b, dtype=np.float32)
    np.clip(b[:, 0::2], 0, w, out=out[:, 0::2], casting="unsafe")
    np.clip(b[:, 1::2], 0, h, out=out[:, 1::2], casting="unsafe")
    return out


def check_page_pixels(path: str | Path, width: int, height: int, max_page_pixels: int | None,
                      what: str = "page") -> None:
    """Raise before allocating a `width` x `height` page larger than `max_page_pixels` (None: no cap)."""
    if max_page_pixels is not None and width * height > max_page_pixels:
        raise BadSampleError(
            path,
            f"{what} is {width}x{height} (WxH) = {width * height / 1e6:.1f} MP, over the "
            f"max_page_pixels cap of {max_page_pixels / 1e6:.1f} MP",
            "check the annotated width/height (or the PDF page size), downscale the page, or raise "
            "max_page_pixels if pages this large are intended; on_bad_sample='skip' drops the page")
