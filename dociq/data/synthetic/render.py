"""Rendering a laid-out `Draft`: the page image and one bool mask per region.

Shapes go through PIL ImageDraw; words are alpha-blended from cached glyph bitmaps with numpy
(several times faster than ImageDraw.text per word, and pixel-identical in placement because both
use the font's getbbox/getmask2). Masks are written by numpy slicing, never per pixel.
"""
from __future__ import annotations

import random

import numpy as np
from PIL import Image, ImageDraw

from dociq.data.synthetic.draft import Draft, DraftRegion
from dociq.data.synthetic.fonts import word_glyph


def render_image(draft: Draft, rng: random.Random) -> np.ndarray:
    """uint8 [H, W, 3] RGB page: paper tint, shapes, then words on top."""
    tone = rng.randint(238, 255)
    paper = (tone, tone - rng.randint(0, 4), tone - rng.randint(0, 10))
    image = Image.new("RGB", (draft.width, draft.height), paper)
    draw = ImageDraw.Draw(image)
    for s in draft.shapes:
        if s.kind == "rect":
            draw.rectangle(s.xy, outline=s.color, fill=s.fill, width=s.width)
        elif s.kind == "ellipse":
            draw.ellipse(s.xy, outline=s.color, fill=s.fill, width=s.width)
        elif s.kind in ("line", "polyline"):
            draw.line(s.xy, fill=s.color, width=s.width, joint="curve" if s.width > 1 else None)
        else:
            raise ValueError(f"unknown shape kind {s.kind!r}")
    # Words: one alpha plane per ink colour, then one C-level paste per colour. Words never overlap,
    # so max() of the planes is exact, and this is ~10x faster than blending word by word.
    planes: dict[tuple[int, int, int], np.ndarray] = {}
    extents: dict[tuple[int, int, int], list[int]] = {}  # rows each colour's words span
    for w in draft.words:
        alpha, _ = word_glyph(w.font, w.text)
        if alpha.size == 0:
            continue
        x0, y0, x1, y1 = w.box
        # Clip the glyph to the page (boxes are inside by construction; this guards rounding).
        cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, draft.width), min(y1, draft.height)
        if cx0 >= cx1 or cy0 >= cy1:
            continue
        plane = planes.get(w.color)
        if plane is None:
            plane = planes[w.color] = np.zeros((draft.height, draft.width), dtype=np.uint8)
            extents[w.color] = [cy0, cy1]
        span = extents[w.color]
        span[0], span[1] = min(span[0], cy0), max(span[1], cy1)
        window = plane[cy0:cy1, cx0:cx1]
        np.maximum(window, alpha[cy0 - y0:cy1 - y0, cx0 - x0:cx1 - x0], out=window)
    for color, plane in planes.items():
        y0, y1 = extents[color]
        image.paste(color, (0, y0, draft.width, y1), Image.fromarray(plane[y0:y1]))
    return np.asarray(image).copy()


def region_masks(regions: list[DraftRegion], height: int, width: int) -> np.ndarray:
    """bool [R, H, W], one mask per region, in one allocation (per-mask np.zeros of a page-sized
    array cost more than all the drawing)."""
    masks = np.zeros((len(regions), height, width), dtype=bool)
    for mask, region in zip(masks, regions):
        fill_region(mask, region)
    return masks


def fill_region(mask: np.ndarray, region: DraftRegion) -> None:
    """Set the region's pixels: the filled box, or the ellipse inscribed in it (round stamps)."""
    x0, y0, x1, y1 = region.box
    if region.shape == "box":
        mask[y0:y1, x0:x1] = True
    elif region.shape == "ellipse":
        ys = (np.arange(y0, y1) + 0.5 - (y0 + y1) / 2) / max((y1 - y0) / 2, 0.5)
        xs = (np.arange(x0, x1) + 0.5 - (x0 + x1) / 2) / max((x1 - x0) / 2, 0.5)
        mask[y0:y1, x0:x1] = ys[:, None] ** 2 + xs[None, :] ** 2 <= 1.0
    else:
        raise ValueError(f"unknown region shape {region.shape!r}")
