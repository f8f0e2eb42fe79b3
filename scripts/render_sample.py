"""Render a generated page with its ground truth, for the README.

    python scripts/render_sample.py [--seed 0] [--index N]          # -> ./synthetic_page.png
    python scripts/render_sample.py --out docs/img/synthetic_page.png  # the README figure: explicit

Left: the page with every region's box coloured by class. Right: the same page with each
question's target mask overlaid in its own colour; the questions are listed underneath.
Without --index the first of 30 pages with the most question kinds and region classes is used.
"""
from __future__ import annotations

import argparse
import colorsys
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from dociq.data.schema import REGION_CLASSES, Page
from dociq.data.synthetic.generator import generate_page
from dociq.data.synthetic.fonts import get_font


def palette(n: int) -> list[tuple[int, int, int]]:
    return [tuple(int(255 * c) for c in colorsys.hsv_to_rgb(i / n, 0.85, 0.9)) for i in range(n)]


def region_panel(page: Page) -> Image.Image:
    colors = dict(zip(REGION_CLASSES, palette(len(REGION_CLASSES))))
    image = Image.fromarray(page.image).convert("RGB")
    draw = ImageDraw.Draw(image)
    for r in page.regions:
        x0, y0, x1, y1 = (float(v) for v in r.box)
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=colors[r.label])
    return image


def question_panel(page: Page, colors) -> Image.Image:
    out = page.image.astype(np.float32)
    for q, color in zip(page.questions, colors):
        out[q.mask] = 0.55 * out[q.mask] + 0.45 * np.asarray(color, np.float32)
    return Image.fromarray(out.astype(np.uint8))


def legend(page: Page, colors, width: int) -> Image.Image:
    font = get_font(("sans", "regular", 13))
    line = 18
    image = Image.new("RGB", (width, 8 + line * len(page.questions)), "white")
    draw = ImageDraw.Draw(image)
    for i, (q, color) in enumerate(zip(page.questions, colors)):
        y = 4 + i * line
        draw.rectangle([8, y + 3, 20, y + 15], fill=color)
        draw.text((28, y), f"[{q.kind}] {q.text}", font=font, fill=(0, 0, 0))
    return image


def pick_index(seed: int, size: int, candidates: int = 30) -> int:
    def score(i: int) -> tuple[int, int]:
        page = generate_page(i, seed, size)
        return len({q.kind for q in page.questions}), len({r.label for r in page.regions})
    return max(range(candidates), key=score)


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("synthetic_page.png"),
                   help="the PNG to write (default: ./synthetic_page.png; the README's: docs/img/synthetic_page.png)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, default=None)
    p.add_argument("--image-size", type=int, default=512)
    args = p.parse_args(argv)
    index = pick_index(args.seed, args.image_size) if args.index is None else args.index
    page = generate_page(index, args.seed, args.image_size)
    colors = palette(max(1, len(page.questions)))
    left, right = region_panel(page), question_panel(page, colors)
    gap = 12
    top = Image.new("RGB", (left.width + gap + right.width, left.height), "white")
    top.paste(left, (0, 0))
    top.paste(right, (left.width + gap, 0))
    notes = legend(page, colors, top.width)
    sheet = Image.new("RGB", (top.width, top.height + notes.height), "white")
    sheet.paste(top, (0, 0))
    sheet.paste(notes, (0, top.height))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(args.out, optimize=True)
    print(f"wrote {args.out} (seed {args.seed}, page {index}, {len(page.questions)} questions)")
    return args.out


if __name__ == "__main__":
    main(sys.argv[1:])
