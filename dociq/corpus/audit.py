"""The label audit: pages from different documents with their regions drawn, one colour per class.

`draw_audit(corpus, out_png, pages=50)` takes at most one page per document (a seeded choice),
draws each page's regions (box, class name) and writes one PNG per page into `<out>_pages/` and a
contact sheet at `out_png`, with `<out>_pages/index.json` listing page ids and their regions, so a
reviewer can note per page and class what a careful annotator would accept.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw
from torch.utils.data import Subset

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.schema import REGION_CLASSES, Page

# one colour per class, fixed so audits from different builds read alike
_PALETTE = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#7f3c8d", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf", "#006d2c", "#a50f15", "#08519c", "#b8860b", "#3f007d"]
CLASS_COLOURS = dict(zip(REGION_CLASSES, _PALETTE))


def draw_labels(page: Page, width: int = 2) -> Image.Image:
    image = Image.fromarray(page.image).convert("RGB")
    draw = ImageDraw.Draw(image)
    for region in page.regions:
        colour = CLASS_COLOURS.get(region.label, "#000000")
        x0, y0, x1, y1 = (float(v) for v in region.box)
        draw.rectangle((x0, y0, x1, y1), outline=colour, width=width)
        draw.text((x0 + 1, max(0.0, y0 - 10)), region.label, fill=colour)
    return image


def pick_pages(dataset, pages: int, seed: int = 0) -> list[int]:
    """Indices of up to `pages` pages, each from a different document (a seeded order)."""
    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    chosen, docs = [], set()
    for index in order:
        doc = dataset[index].meta.get("doc_id")
        if doc in docs:
            continue
        docs.add(doc)
        chosen.append(index)
        if len(chosen) == pages:
            break
    return chosen


def pick_pages_per_package(dataset, per_package: int, seed: int = 0) -> list[int]:
    """`per_package` pages of each package (each from a different document), package by package."""
    packages = sorted({dataset.page_meta(i)["package"] for i in range(len(dataset))})
    chosen = []
    for package in packages:
        ids = [i for i in range(len(dataset)) if dataset.page_meta(i)["package"] == package]
        chosen += [ids[k] for k in pick_pages(Subset(dataset, ids), per_package, seed)]
    return chosen


def draw_audit(corpus, out_png, pages: int = 50, split: str = "train", seed: int = 0,
               columns: int = 10, thumb: int = 320, per_package: int | None = None) -> Path:
    """A contact sheet of `pages` pages from different documents, or of `per_package` pages of
    each package (one row per package), their labels drawn; full-size pages beside it."""
    dataset = CorpusDocuments(corpus, split=split)
    out_png = Path(out_png)
    page_dir = out_png.with_name(out_png.stem + "_pages")
    page_dir.mkdir(parents=True, exist_ok=True)
    if per_package is not None:
        chosen, columns = pick_pages_per_package(dataset, per_package, seed), per_package
    else:
        chosen = pick_pages(dataset, pages, seed)
    thumbs, index = [], []
    for n, i in enumerate(chosen):
        page = dataset[i]
        drawn = draw_labels(page)
        drawn.save(page_dir / f"{n:03d}.png")
        index.append({"file": f"{n:03d}.png", "page_id": page.meta.get("page_id"),
                      "labeller": page.meta.get("labeller"),
                      "regions": [[r.label, [round(float(v)) for v in r.box]] for r in page.regions]})
        drawn.thumbnail((thumb, thumb))
        caption = ImageDraw.Draw(drawn)  # whose page it is, for a sheet of several genres
        caption.rectangle((0, 0, 6 * len(str(page.meta.get("package", ""))) + 6, 12), fill="white")
        caption.text((2, 1), str(page.meta.get("package", "")), fill="black")
        thumbs.append(drawn)
    (page_dir / "index.json").write_text(json.dumps(index, indent=1))
    rows = max(1, -(-len(thumbs) // columns))
    sheet = Image.new("RGB", (columns * thumb, rows * thumb + 24), "white")
    for k, t in enumerate(thumbs):
        sheet.paste(t, ((k % columns) * thumb, (k // columns) * thumb + 24))
    draw = ImageDraw.Draw(sheet)
    x = 4
    for label, colour in CLASS_COLOURS.items():  # the legend
        draw.text((x, 6), label, fill=colour)
        x += 7 * len(label) + 14
    sheet.save(out_png)
    return out_png
