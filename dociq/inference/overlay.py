"""Overlays: the page with masks tinted on it, one drawing routine for every output of dociq.

    overlay(image, masks)             # `dociq predict`: mask i in colour i (the prompt's order)
    draw_overlay(image, regions)      # `dociq segment-page`: class colours, boxes and "<class> <IoU>" labels
    draw_overlay(image, regions, questions=qs, legend=True)   # `dociq segment`: + answers "Q<n>", a legend
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


def region_colour_and_label(region, questions: Sequence[str]) -> tuple[np.ndarray, str]:
    """A region's colour and on-page label: a question's answer (a `question` attribute among
    `questions`) takes the i-th prompt colour and "Q<i+1>", any other its class's colour and name."""
    question = getattr(region, "question", None)
    if question is not None and question in questions:
        i = list(questions).index(question)
        return MASK_COLOURS[i % len(MASK_COLOURS)], f"Q{i + 1}"
    return category_colour(region.category), region.category


def draw_overlay(image: np.ndarray, regions: Sequence, alpha: float = 0.4, *, questions: Sequence[str] = (),
                 legend: bool = False) -> np.ndarray:
    """uint8 [H, W, 3]: the page with each region (`dociq.inference.automatic.SegmentedRegion`: mask, box,
    area, category, score) tinted in its class's colour, its box outlined and labelled "<class>
    <predicted IoU>"; larger regions are painted first so small ones stay visible. Answers to
    `questions` (regions with a `question`) are labelled "Q<n>". With `legend`, a strip under the
    page names each colour: the classes drawn, then "Q<n>: <question>" (taller than the page)."""
    order = sorted(range(len(regions)), key=lambda i: -regions[i].area)
    styles = [region_colour_and_label(r, questions) for r in regions]
    canvas = Image.fromarray(tint(image, (regions[i].mask for i in order), (styles[i][0] for i in order), alpha))
    draw = ImageDraw.Draw(canvas)
    for i in order:
        r = regions[i]
        colour = tuple(int(c) for c in styles[i][0])
        x0, y0, x1, y1 = (float(v) for v in r.box)
        draw.rectangle([x0, y0, max(x0, x1 - 1), max(y0, y1 - 1)], outline=colour, width=2)
        label = f"{styles[i][1]} {r.score:.2f}"
        tx, ty = x0 + 2, max(0.0, y0 - 11)
        left, top, right, bottom = draw.textbbox((tx, ty), label)
        draw.rectangle([left - 1, top - 1, right + 1, bottom + 1], fill=colour)
        draw.text((tx, ty), label, fill=(255, 255, 255))
    if not legend:
        return np.asarray(canvas)
    classes = sorted({label for (_, label), r in zip(styles, regions) if getattr(r, "question", None) is None})
    entries = {label: category_colour(label) for label in classes}
    for i, q in enumerate(questions):
        entries[f"Q{i + 1}: {q}"] = MASK_COLOURS[i % len(MASK_COLOURS)]
    return draw_legend(np.asarray(canvas), list(entries.items()))


def draw_legend(image: np.ndarray, entries: Sequence[tuple[str, np.ndarray]], row: int = 16) -> np.ndarray:
    """uint8 [H + legend, W, 3]: the page with a white strip under it, one colour swatch and its
    label per row (labels cut to the page's width)."""
    h, w = image.shape[:2]
    canvas = Image.new("RGB", (w, h + row * max(len(entries), 1) + 8), (255, 255, 255))
    canvas.paste(Image.fromarray(np.asarray(image)), (0, 0))
    draw = ImageDraw.Draw(canvas)
    draw.line([(0, h), (w, h)], fill=(0, 0, 0), width=1)
    for k, (label, colour) in enumerate(entries):
        y = h + 4 + k * row
        draw.rectangle([6, y + 2, 6 + row - 4, y + row - 2], fill=tuple(int(c) for c in colour), outline=(0, 0, 0))
        text = label
        while text and draw.textlength(text, ) > w - row - 16:
            text = text[:-2]
        if text != label:
            text = text[:-1] + "…"
        draw.text((row + 10, y + 2), text, fill=(0, 0, 0))
    return np.asarray(canvas)
