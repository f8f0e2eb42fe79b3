"""Erase a page's ruling lines (a table's rules, a form's boxes and underlines) before OCR.

Tesseract reads a ruled table as a picture: on the scanned browser-printed forms whose fields sit in
a ruled table it read back 55 % of the words, and 95 % with the rules erased (a 20-page sample);
pages without long rules read about the same either way (docs/finetune.md, "Scanned forms: a local threshold, rules
erased"). A rule is a run of dark pixels longer than an eighth of the page's long side (across)
or a tenth of it (down) and thinner than 1/200 of it; letters, even bold ones blurred together,
make no such run. Lengths are of the long side, not of the side they run along, so that in a
short strip (a cropped line of text) a letter's stem is no rule.

A field's box is two long rules joined by two short sides, each as tall as a line of text. Left
in, tesseract reads a side as a word ("|", "[") or glues it to the value ("|PSC"), and the side's
height sets the text line's font box, a few pixels taller than the value's. So a side counts as
a rule too: a thin run down whose top and bottom both meet a rule across. A letter's stem touches
at most the one rule it stands on.
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage

MIN_ACROSS, MIN_DOWN, MAX_THICKNESS = 1 / 8, 1 / 10, 1 / 200
# A rule skewed by a scan breaks into runs of thickness / tan(skew) pixels: runs this much of the
# page are found first, then kept where they join into a line of the length above.
PIECE = 1 / 40
# the shortest box side, a share of the long side (a text line is ~1/60 of a page)
SIDE = 1 / 200


def otsu_threshold(grey: np.ndarray) -> int:
    """The grey level (uint8) that best splits the page into ink and paper (Otsu's method)."""
    share = np.bincount(grey.ravel(), minlength=256).astype(np.float64)
    share /= share.sum()
    below = np.cumsum(share)
    mean_below = np.cumsum(share * np.arange(256))
    spread = (mean_below[-1] * below - mean_below) ** 2 / (below * (1 - below) + 1e-12)
    return int(np.argmax(spread))


def _thin_runs(ink: np.ndarray, piece: int, thick: int, axis: int) -> np.ndarray:
    """bool mask of the ink in runs of `piece` pixels along `axis` (1: across, 0: down) that stay
    thinner than `thick` across them."""
    along = (1, piece) if axis == 1 else (piece, 1)
    runs = ndimage.binary_opening(ink, np.ones(along, bool))
    return runs & ~ndimage.binary_opening(runs, np.ones((thick, 1) if axis == 1 else (1, thick), bool))


def _long_lines(ink: np.ndarray, piece: int, length: int, thick: int, axis: int) -> np.ndarray:
    """bool mask of the thin runs (`_thin_runs`) that join into lines spanning `length` pixels."""
    runs = _thin_runs(ink, piece, thick, axis)
    labels, count = ndimage.label(runs, np.ones((3, 3), bool))
    if not count:
        return runs
    spans = np.array([s[axis].stop - s[axis].start for s in ndimage.find_objects(labels)])
    return np.concatenate([[False], spans >= length])[labels]


def ruling_lines(grey: np.ndarray) -> np.ndarray:
    """bool [H, W]: the pixels of long thin horizontal and vertical lines of a uint8 grey page."""
    long_side = max(grey.shape)
    ink = grey < otsu_threshold(grey)
    thick, piece = max(round(long_side * MAX_THICKNESS), 3), max(round(long_side * PIECE), 8)
    across = _long_lines(ink, piece, round(long_side * MIN_ACROSS), thick, axis=1)
    down = _long_lines(ink, piece, round(long_side * MIN_DOWN), thick, axis=0)
    return across | down | _box_sides(ink, across, max(round(long_side * SIDE), 4), thick)


def _box_sides(ink: np.ndarray, across: np.ndarray, piece: int, thick: int) -> np.ndarray:
    """bool mask of the thin runs down, at least `piece` long, whose top and bottom rows each touch
    a rule across (within two pixels): the short sides of boxes drawn between two rules."""
    runs = _thin_runs(ink, piece, thick, axis=0)
    labels, count = ndimage.label(runs, np.ones((3, 3), bool))
    if not count:
        return runs
    near = ndimage.binary_dilation(across, np.ones((5, 5), bool))
    keep = np.zeros(count + 1, bool)
    for k, rows_cols in enumerate(ndimage.find_objects(labels), 1):
        side = labels[rows_cols] == k
        touches = near[rows_cols] & side
        keep[k] = touches[0].any() and touches[-1].any()
    return keep[labels]


def erase_ruling_lines(grey: np.ndarray) -> np.ndarray:
    """The uint8 grey page with its ruling lines (and their blurred edges) painted paper-white."""
    lines = ndimage.binary_dilation(ruling_lines(grey), np.ones((5, 5), bool))
    out = grey.copy()
    out[lines] = 255
    return out
