"""Mask geometry in numpy: a mask's tight box, the boxes of many masks, mask IoU one-to-one and
many-to-many.

Masks are bool [H, W] (a stack is bool [N, H, W]). Boxes are pixel boxes x0, y0, x1, y1 with
exclusive x1, y1: a mask of the single pixel (x, y) has the box x, y, x + 1, y + 1, the box that
slices the mask as `mask[y0:y1, x0:x1]` and that torchvision's `masks_to_boxes` gives plus one.
The engine, the COCO loader, the automatic segmenter and the simulated annotator all read boxes
and IoU from here, so the conventions are stated once. The collator's torch twin is
`dociq.data.collate.mask_box` (it runs on tensors inside the batch).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def mask_box(mask: np.ndarray) -> np.ndarray | None:
    """float32 [4] tight box x0, y0, x1, y1 (exclusive) of the mask's pixels; None when the mask is
    empty (callers differ on what an empty mask's box is: no box, a zero box, nothing to slice)."""
    rows = np.flatnonzero(np.any(mask, axis=1))
    if not len(rows):
        return None
    cols = np.flatnonzero(np.any(mask, axis=0))
    return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], dtype=np.float32)


def mask_boxes(masks: np.ndarray) -> np.ndarray:
    """bool [N, H, W] -> float32 [N, 4] tight boxes x0, y0, x1, y1 (exclusive), a row of zeros for
    an empty mask. Batched: two reductions over the stack instead of N `mask_box` calls."""
    masks = np.asarray(masks, dtype=bool)
    if masks.shape[0] == 0:
        return np.zeros((0, 4), np.float32)
    rows, cols = masks.any(2), masks.any(1)                                   # [N, H], [N, W]
    h, w = masks.shape[1:]
    boxes = np.stack([cols.argmax(1), rows.argmax(1), w - cols[:, ::-1].argmax(1), h - rows[:, ::-1].argmax(1)],
                     axis=1).astype(np.float32)
    boxes[~rows.any(1)] = 0        # argmax of an all-False row is 0, which would read as the whole page
    return boxes


def mask_iou(pred: np.ndarray, target: np.ndarray) -> float:
    """IoU of two bool [H, W] masks; 1.0 when both are empty (an empty answer to an empty target is
    right, which is what the simulated annotator scores)."""
    union = np.logical_or(pred, target).sum()
    return float(np.logical_and(pred, target).sum() / union) if union else 1.0


def mask_iou_matrix(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> np.ndarray:
    """N bool [H, W] masks x K bool [H, W] masks -> float32 [N, K] mask IoU; 0 for a pair with an
    empty mask (unlike `mask_iou`: here an empty mask matches nothing).

    Intersections are counted only inside the box where both masks can meet, and only for pairs
    whose boxes overlap, so a page of many regions needs no [N, H*W] copy (a 1000 x 1000 page with
    100 regions would take 400 MB as float, 100 MB as a bool stack)."""
    iou = np.zeros((len(a), len(b)), dtype=np.float32)
    if len(a) == 0 or len(b) == 0:
        return iou
    a_boxes, b_boxes = _int_boxes(a), _int_boxes(b)            # zeros for an empty mask: meets nothing
    a_area, b_area = [np.count_nonzero(m) for m in a], [np.count_nonzero(m) for m in b]
    x0 = np.maximum(a_boxes[:, None, 0], b_boxes[None, :, 0])
    y0 = np.maximum(a_boxes[:, None, 1], b_boxes[None, :, 1])
    x1 = np.minimum(a_boxes[:, None, 2], b_boxes[None, :, 2])
    y1 = np.minimum(a_boxes[:, None, 3], b_boxes[None, :, 3])
    for n, k in zip(*np.nonzero((x1 > x0) & (y1 > y0))):
        window = np.s_[y0[n, k]:y1[n, k], x0[n, k]:x1[n, k]]
        inter = np.count_nonzero(a[n][window] & b[k][window])
        iou[n, k] = inter / max(a_area[n] + b_area[k] - inter, 1)
    return iou


def _int_boxes(masks: Sequence[np.ndarray]) -> np.ndarray:
    """int64 [N, 4] tight boxes, one mask at a time (no [N, H, W] stack); zeros for an empty mask."""
    out = np.zeros((len(masks), 4), dtype=np.int64)
    for i, m in enumerate(masks):
        box = mask_box(m)
        if box is not None:
            out[i] = box
    return out
