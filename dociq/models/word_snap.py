"""Masks drawn at word-box precision: snap a predicted mask's text parts to the OCR word boxes.

The mask decoder predicts at stride 4 of its input; on a real page at 256 px a text line is ~3 px
tall, so a mask's edges wander by a line. The words' boxes are known exactly, at any resolution.
Each connected part of a predicted mask that is mostly text is replaced by the bounding box of
the words it holds (a layout region — paragraph, list item, heading, cell — is the box around its
words); parts that are not mostly words (figures, rules, a region with a few labels) are kept as
predicted. `paint_words` draws a mask from the words alone: the boxes of the words the word
grounding calls relevant, with the gaps between words and lines closed.
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage

# A word belongs to a mask part when at least this share of its box is inside the mask.
WORD_INSIDE = 0.5
# A part is snapped when its words' bounding box holds at least this share of it; otherwise the
# part is not a text region (a figure with a caption inside, a drawing with labels).
TEXT_SHARE = 0.7
_EIGHT_NEIGHBOURS = np.ones((3, 3), dtype=bool)


def snap_to_words(mask: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """mask bool [H, W]; word_boxes [K, 4] x0, y0, x1, y1 in the mask's pixels (x1, y1
    exclusive) -> the snapped bool mask [H, W]. The input is not modified."""
    mask = np.asarray(mask, dtype=bool)
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not mask.any() or not len(boxes):
        return mask.copy()
    h, w = mask.shape
    boxes = np.round(boxes).astype(np.int64)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
    boxes = boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]
    labels, count = ndimage.label(mask, structure=_EIGHT_NEIGHBOURS)
    # Integral image: the mask's pixel count inside each word box in O(1).
    integral = np.pad(mask.astype(np.int64).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    x0, y0, x1, y1 = boxes.T
    inside = integral[y1, x1] - integral[y0, x1] - integral[y1, x0] + integral[y0, x0]
    area = (x1 - x0) * (y1 - y0)
    members = inside >= WORD_INSIDE * area
    if not members.any():
        return mask.copy()
    # The part a word belongs to: the most common label over its box.
    part_of = np.array([np.bincount(labels[b[1]:b[3], b[0]:b[2]].ravel(), minlength=count + 1)[1:].argmax() + 1
                        for b in boxes[members]])
    out = mask.copy()
    sizes = ndimage.sum_labels(mask, labels, index=np.arange(1, count + 1))
    for part in np.unique(part_of):
        words = boxes[members][part_of == part]
        bx0, by0 = words[:, 0].min(), words[:, 1].min()
        bx1, by1 = words[:, 2].max(), words[:, 3].max()
        region = labels == part
        held = region[by0:by1, bx0:bx1].sum()
        if held < TEXT_SHARE * sizes[part - 1]:
            continue
        out[region] = False
        out[by0:by1, bx0:bx1] = True
    return out


def paint_words(shape: tuple[int, int], word_boxes: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """bool [H, W]: the boxes of the `relevant` words (bool [K]), grouped into blocks across gaps
    up to the page's median word height (the words of one paragraph), each block drawn as the
    box around its words."""
    h, w = shape
    out = np.zeros((h, w), dtype=bool)
    boxes = np.round(np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)).astype(np.int64)
    if not len(boxes) or not np.any(relevant):
        return out
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
    for x0, y0, x1, y1 in boxes[np.asarray(relevant, dtype=bool)]:
        out[y0:y1, x0:x1] = True
    gap = max(1, int(np.median(boxes[:, 3] - boxes[:, 1])))
    closed = ndimage.binary_closing(np.pad(out, gap), structure=np.ones((gap + 1, gap + 1), bool))
    blocks, _ = ndimage.label(closed[gap:-gap, gap:-gap] | out, structure=_EIGHT_NEIGHBOURS)
    for rows, cols in ndimage.find_objects(blocks):      # a block of words is the box around them
        out[rows, cols] = True
    return out
