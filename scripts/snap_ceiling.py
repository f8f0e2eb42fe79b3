"""What completing masks to text blocks does to a perfect mask: the ceiling the answers' extent sets.

Each held-out question's target is snapped as `Predictor()` snaps a mask (`snap_to_blocks` with the
page's `page_blocks`, ink and skew) and scored against itself; the page's text units
(`class_answers.text_units`) are scored too — the best single unit, and the union of the units
lying at least half inside the target. On a clean page the words come from the text layer; with
`--scan` from tesseract's reading of the page degraded as `dociq eval --scan` degrades it, so the
gap between the two is what the scan's words cost the answers' extent, whatever the model does.
No model is run.

    python scripts/snap_ceiling.py --corpus data/corpus --split val --scan --ocr-cache outputs/ocr_cache/corpus_val

--by-rotation splits the scanned pages by how far the scan turned them (level, under 1°, 1° or more).
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.masks import mask_iou
from dociq.data.schema import Page
from dociq.data.scoring import VAL_SEED
from dociq.data.text_blocks import page_blocks, page_ink, skew_slope
from dociq.evaluation.answers import page_seed
from dociq.inference.class_answers import text_units
from dociq.models.word_snap import fill_unit, snap_to_blocks

QUESTIONS_PER_PAGE = 8          # as the evaluation asks (dociq.evaluation.answers)
MEASURES = ("snapped target", "units inside", "best unit")


def rotation(page: Page) -> float:
    """How many degrees the scan turned the page (`degrade.rotate_page` notes it in the page's meta), 0 if not."""
    turns = [re.fullmatch(r"rotate\((-?[0-9.]+)\)", str(step)) for step in page.meta.get("degradations", [])]
    return sum(abs(float(m.group(1))) for m in turns if m)


def rotation_group(degrees: float) -> str:
    """The --by-rotation group of a scan turned `degrees`."""
    return "level" if degrees == 0 else "under 1°" if degrees < 1 else "1° or more"


def painted_units(size: tuple[int, int], boxes: np.ndarray, units: Sequence[Sequence[int]],
                  slope: float) -> list[np.ndarray]:
    """bool [H, W] per text unit: the box around its words along the page's lines (`fill_unit`)."""
    painted = []
    for unit in units:
        mask = np.zeros(size, bool)
        fill_unit(mask, boxes[list(unit)], slope)
        painted.append(mask)
    return painted


def units_inside(painted: Sequence[np.ndarray], target: np.ndarray) -> np.ndarray:
    """bool [H, W]: the union of the units lying at least half inside the target."""
    inside = [m for m in painted if m.any() and (m & target).sum() >= 0.5 * m.sum()]
    return np.any(inside, 0) if inside else np.zeros_like(target)


def page_ceilings(page: Page, seed: int = VAL_SEED) -> list[dict]:
    """One record per question the evaluation asks of `page`: its kind and the IoU of its target
    snapped to the page's blocks, of the units at least half inside it, and of the best unit."""
    generator = torch.Generator().manual_seed(page_seed(page, seed))
    questions = [page.questions[k] for k in choose_questions(page, QUESTIONS_PER_PAGE, generator)]
    boxes = np.asarray(page.word_boxes, np.float64).reshape(-1, 4)
    if not questions or not len(boxes):
        return []
    words = list(page.words)
    slope = skew_slope(boxes)
    blocks = page_blocks(page.image, boxes, words, slope, ocr=page.word_confidences is not None)
    ink = page_ink(page.image)
    painted = painted_units(page.size, boxes, text_units(blocks, boxes, words, slope), slope)
    out = []
    for q in questions:
        target = np.asarray(q.mask, bool)
        snapped = snap_to_blocks(target, boxes, words, blocks=blocks, ink=ink, slope=slope)
        out.append({"kind": q.kind, "rotation": rotation(page), "snapped target": mask_iou(snapped, target), "units inside": mask_iou(units_inside(painted, target), target),
                    "best unit": max([mask_iou(m, target) for m in painted] or [0.0])})
    return out


def table(views: dict[str, Iterable[dict]]) -> str:
    """A markdown table: per view and question kind, the mean of each measure ×100 (and the count)."""
    lines = ["| pages | questions | " + " | ".join(MEASURES) + " |", "|---|---|" + "---|" * len(MEASURES)]
    for view, records in views.items():
        by_kind = defaultdict(list)
        for r in records:
            by_kind[r["kind"]].append(r)
        for kind in sorted(by_kind):
            rows = by_kind[kind]
            cells = " | ".join(f"{100 * np.mean([r[m] for r in rows]):.1f}" for m in MEASURES)
            lines.append(f"| {view} | {kind} ({len(rows)}) | {cells} |")
    return "\n".join(lines)


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose the pages: --corpus, --split, --packages, --pages, --scan, --scan-seed, --ocr-cache."""
    p.add_argument("--corpus", default="data/corpus")
    p.add_argument("--split", default="val", help="a split of the corpus, or all (as dociq eval --split)")
    p.add_argument("--packages", nargs="+", default=None, help="only these source packages (as dociq eval)")
    p.add_argument("--pages", type=int, default=None, help="the first N pages (default all)")
    p.add_argument("--scan", action="store_true", help="also the pages scanned and read by tesseract")
    p.add_argument("--scan-seed", type=int, default=VAL_SEED, help="which scan of each page (dociq eval --scan's)")
    p.add_argument("--ocr-cache", default=None, help="tesseract's cache folder (as dociq eval --ocr-cache)")


def page_views(args: argparse.Namespace) -> tuple[dict[str, Sequence[Page | None]], int]:
    """({"clean": the split's pages, and with --scan "scanned": the same pages degraded and read by
    tesseract}, how many of them to read)."""
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.data.scanned import ScannedPages

    pages = CorpusDocuments(root=args.corpus, split=None if args.split == "all" else args.split,
                            packages=args.packages)
    views = {"clean": pages}
    if args.scan:
        views["scanned"] = ScannedPages(pages, args.scan_seed, cache_dir=args.ocr_cache)
    return views, len(pages) if args.pages is None else min(args.pages, len(pages))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_view_arguments(p)
    p.add_argument("--by-rotation", action="store_true", help="with --scan: the scanned pages by how far they turned")
    args = p.parse_args(argv)

    views, count = page_views(args)
    records = {view: [r for i in range(count) if data[i] is not None for r in page_ceilings(data[i])]
               for view, data in views.items()}
    if args.by_rotation and "scanned" in records:
        scanned = records.pop("scanned")
        for group in ("level", "under 1°", "1° or more"):
            records[f"scanned, {group}"] = [r for r in scanned if rotation_group(r["rotation"]) == group]
    print(table(records))


if __name__ == "__main__":
    main()
