"""Overlays: the page with masks tinted on it, one drawing routine for every output of dociq.

    overlay(image, masks)             # `dociq predict`: mask i in colour i (the prompt's order)
    draw_overlay(image, regions)      # `dociq segment-page`: class colours, boxes and "<class> <IoU>" labels
"""
from __future__ import annotations

import zlib
from typing import Iterable, Sequence

import numpy as np
from PIL import Image, ImageDraw

# the colour of the i-th prompt's mask (`overlay`)
MASK_COLOURS = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                         [70, 240, 240]], dtype=np.float32)
# the colours of the layout classes (`category_colour`)
_PALETTE = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                     [70, 200, 200], [240, 50, 230], [128, 128, 0], [0, 128, 128], [170, 110, 40],
                     [128, 0, 0], [0, 0, 128]], dtype=np.float32)


def tint(image: np.ndarray, masks: Iterable[np.ndarray], colours: Iterable[np.ndarray], alpha: float) -> np.ndarray:
    """uint8 [H, W, 3]: each bool [H, W] mask blended into the page in its colour, in order (a later
    mask is painted over an earlier one)."""
    out = np.asarray(image).astype(np.float32)
    for m, colour in zip(masks, colours):
        out[m] = (1 - alpha) * out[m] + alpha * colour
    return out.clip(0, 255).astype(np.uint8)


def overlay(image: np.ndarray, masks: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The page with each mask tinted in its own colour (uint8 [H, W, 3])."""
    return tint(image, masks, (MASK_COLOURS[i % len(MASK_COLOURS)] for i in range(len(masks))), alpha)


def category_colour(name: str) -> np.ndarray:
    """A fixed colour per class name (the same in every overlay)."""
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


def draw_overlay(image: np.ndarray, regions: Sequence, alpha: float = 0.4) -> np.ndarray:
    """uint8 [H, W, 3]: the page with each region (`dociq.inference.automatic.SegmentedRegion`: mask, box,
    area, category, score) tinted in its class's colour, its box outlined and labelled "<class>
    <predicted IoU>"; larger regions are painted first so small ones stay visible."""
    order = sorted(range(len(regions)), key=lambda i: -regions[i].area)
    canvas = Image.fromarray(tint(image, (regions[i].mask for i in order),
                                  (category_colour(regions[i].category) for i in order), alpha))
    draw = ImageDraw.Draw(canvas)
    for i in order:
        r = regions[i]
        colour = tuple(int(c) for c in category_colour(r.category))
        x0, y0, x1, y1 = (float(v) for v in r.box)
        draw.rectangle([x0, y0, max(x0, x1 - 1), max(y0, y1 - 1)], outline=colour, width=2)
        label = f"{r.category} {r.score:.2f}"
        tx, ty = x0 + 2, max(0.0, y0 - 11)
        left, top, right, bottom = draw.textbbox((tx, ty), label)
        draw.rectangle([left - 1, top - 1, right + 1, bottom + 1], fill=colour)
        draw.text((tx, ty), label, fill=(255, 255, 255))
    return np.asarray(canvas)
