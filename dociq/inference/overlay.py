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

from dociq.data.schema import REGION_CLASSES

# the colour of the i-th prompt's mask (`overlay`)
MASK_COLOURS = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                         [70, 240, 240]], dtype=np.float32)
# the colours of the layout classes (`category_colour`): one each, so a legend is never ambiguous
# (Trubetskoy's 20 distinct colours); a name outside REGION_CLASSES hashes onto the same palette
_PALETTE = np.array([[230, 25, 75], [0, 130, 200], [128, 0, 0], [60, 180, 75], [245, 130, 48], [145, 30, 180],
                     [70, 153, 144], [240, 50, 230], [154, 99, 36], [0, 0, 117], [128, 128, 0], [66, 212, 244],
                     [191, 239, 69], [169, 169, 169], [255, 225, 25], [220, 190, 255], [250, 190, 212],
                     [170, 255, 195], [255, 216, 177], [255, 250, 200]], dtype=np.float32)
_CLASS_COLOURS = {name: _PALETTE[i] for i, name in enumerate([*REGION_CLASSES, "region"])}
_STRIPE_PX = 6          # answers to questions are tinted in diagonal stripes of this width


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
    """A fixed colour per class name (the same in every overlay; distinct for the layout classes)."""
    if name in _CLASS_COLOURS:
        return _CLASS_COLOURS[name]
    return _PALETTE[zlib.crc32(name.encode()) % len(_PALETTE)]


def text_colour(fill) -> tuple[int, int, int]:
    """Black on a light fill, white on a dark one."""
    r, g, b = (float(c) for c in fill)
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def stripes(shape: tuple[int, int]) -> np.ndarray:
    """bool [H, W]: diagonal stripes, the pattern that marks a question's answer."""
    ys, xs = np.ogrid[:shape[0], :shape[1]]
    return ((xs + ys) // _STRIPE_PX) % 2 == 0


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
    `questions` (regions with a `question`) are tinted in stripes of the i-th prompt colour and
    labelled "Q<i+1>". With `legend`, a strip under the page names each colour: the classes drawn,
    then "Q<n>: <question>" for every question (the picture is taller than the page)."""
    order = sorted(range(len(regions)), key=lambda i: -regions[i].area)
    styles = [region_colour_and_label(r, questions) for r in regions]
    answer = [getattr(r, "question", None) in questions for r in regions]
    hatch = stripes(np.asarray(image).shape[:2]) if any(answer) else None
    masks = (regions[i].mask & hatch if answer[i] else regions[i].mask for i in order)
    canvas = Image.fromarray(tint(image, masks, (styles[i][0] for i in order), alpha))
    draw = ImageDraw.Draw(canvas)
    for i in order:
        r = regions[i]
        colour = tuple(int(c) for c in styles[i][0])
        x0, y0, x1, y1 = (float(v) for v in r.box)
        draw.rectangle([x0, y0, max(x0, x1 - 1), max(y0, y1 - 1)], outline=colour, width=3 if answer[i] else 2)
        label = f"{styles[i][1]} {r.score:.2f}"
        tx, ty = x0 + 2, max(0.0, y0 - 11)
        left, top, right, bottom = draw.textbbox((tx, ty), label)
        draw.rectangle([left - 1, top - 1, right + 1, bottom + 1], fill=colour)
        draw.text((tx, ty), label, fill=text_colour(colour))
    if not legend:
        return np.asarray(canvas)
    classes = sorted({label for (_, label), is_answer in zip(styles, answer) if not is_answer})
    entries = [(label, category_colour(label), False) for label in classes]
    entries += [(f"Q{i + 1}: {q}", MASK_COLOURS[i % len(MASK_COLOURS)], True) for i, q in enumerate(questions)]
    return draw_legend(np.asarray(canvas), entries)


def draw_legend(image: np.ndarray, entries: Sequence[tuple[str, np.ndarray, bool]], row: int = 16) -> np.ndarray:
    """uint8 [H + legend, W, 3]: the page with a white strip under it, one swatch (striped when the
    entry's third item is true, as answers are drawn) and its label per row, cut to the page's width."""
    h, w = image.shape[:2]
    canvas = Image.new("RGB", (w, h + row * max(len(entries), 1) + 8), (255, 255, 255))
    canvas.paste(Image.fromarray(np.asarray(image)), (0, 0))
    draw = ImageDraw.Draw(canvas)
    draw.line([(0, h), (w, h)], fill=(0, 0, 0), width=1)
    size = row - 4
    for k, (label, colour, striped) in enumerate(entries):
        y = h + 4 + k * row
        fill = tuple(int(c) for c in colour)
        if striped:
            swatch = np.where(stripes((size, size))[..., None], np.asarray(fill, np.uint8), np.uint8(255))
            canvas.paste(Image.fromarray(swatch.astype(np.uint8)), (6, y + 2))
            draw.rectangle([6, y + 2, 6 + size, y + 2 + size], outline=(0, 0, 0))
        else:
            draw.rectangle([6, y + 2, 6 + size, y + 2 + size], fill=fill, outline=(0, 0, 0))
        text = label
        while len(text) > 4 and draw.textlength(text) > w - row - 16:
            text = text[:-5] + "..."
        draw.text((row + 10, y + 2), text, fill=(0, 0, 0))
    return np.asarray(canvas)
