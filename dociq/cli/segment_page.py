"""`dociq segment-page`: segment everything on a page and name each region's layout class
(dociq.inference.automatic.PageSegmenter), write the overlay and, with --coco-json, COCO results.

    dociq segment-page CKPT page.png --out overlay.png --coco-json regions.json [--words words.json]
    dociq segment-page CKPT --pdf paper.pdf --page 3 --out overlay.png       # pages from 1

A user's mistake (a missing file, bad words JSON, a page the PDF lacks) is one line on stderr and
exit status 2 (`--debug`: the traceback). docs/automatic.md has the options.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from dociq.cli import report_errors
from dociq.cli.page_input import DPI_RANGE, read_pdf_page, read_words
from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS
from dociq.data.image_io import load_page_image
from dociq.evaluation.coco_map import category_ids_by_name
from dociq.inference.automatic import DEFAULT_SEEDS, SEEDS, UNCLASSIFIED, PageSegmenter, to_coco_results
from dociq.inference.overlay import draw_overlay
from dociq.inference.predictor import load_predictor


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq segment-page",
                                description="Segment every region of a page and name its layout class.")
    p.add_argument("checkpoint", help="a stage=finetune checkpoint (.ckpt) or a from_pretrained folder")
    p.add_argument("image", nargs="?", help="page image (or give --pdf FILE --page N)")
    p.add_argument("--pdf", help="a PDF: segment its page --page (its text layer gives the words)")
    p.add_argument("--page", type=int, default=1, help="page of --pdf, numbered from 1 (default 1)")
    p.add_argument("--dpi", type=float, default=144.0,
                   help="render --pdf at this resolution, %g to %g (default 144)" % DPI_RANGE)
    p.add_argument("--words", help='OCR words JSON as for dociq predict: [{"text", "box": [x0, y0, x1, y1]}] '
                   '(page pixels) or {"words": [...], "boxes": [...]}')
    p.add_argument("--ocr", default=None, help="OCR backend when no --words / --pdf: tesseract (default: none)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="overlay.png", help="overlay image to write")
    p.add_argument("--coco-json", help="write the regions as a COCO result list (RLE masks) here")
    p.add_argument("--image-id", default=1, type=int, help="image_id of the COCO results (default 1)")
    p.add_argument("--annotations", help="a COCO annotation file whose category ids (matched by name) the "
                   "results use; default: the model's classes numbered from 1, as printed")
    p.add_argument("--points-per-side", type=int, default=16)
    p.add_argument("--seeds", nargs="+", default=list(DEFAULT_SEEDS), choices=list(SEEDS),
                   help="seed kinds (default: ocr_blocks class_boxes): ocr_blocks, the OCR text blocks (see "
                        "--block-masks); class_boxes, the boxes of the class answers' parts; grid and ocr_lines, "
                        "SAM-style clicks")
    add_region_options(p, snap_flag="--snap")
    p.add_argument("--pred-iou-thresh", type=float, default=0.5)
    p.add_argument("--stability-score-thresh", type=float, default=0.8)
    p.add_argument("--box-nms-thresh", type=float, default=0.7)
    p.add_argument("--min-region-area", type=int, default=64)
    p.add_argument("--no-classify", action="store_true", help="do not ask the class questions")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def add_region_options(group, snap_flag: str) -> None:
    """How PageSegmenter finds text regions and names them (shared with `dociq eval --data coco`)."""
    group.add_argument("--block-masks", default="words", choices=["words", "model"],
                       help="ocr_blocks seeds: the block's words' box is the region (words) or a box prompt (model)")
    group.add_argument("--class-source", default="auto", choices=["auto", "answers", "units", "words"],
                       help="name regions by the class questions' answers, by the unit classifier or by the "
                            "word-class head (auto: units)")
    group.add_argument("--class-match", default="iou", choices=["iou", "coverage"],
                       help="name a region by its IoU with a part of a class answer, or by its share inside it")
    group.add_argument(snap_flag, dest="snap_regions", action="store_true",
                       help="snap the regions' text parts to their words' box")


def region_options(args) -> dict:
    """PageSegmenter's keyword arguments from `add_region_options`."""
    return {"block_masks": args.block_masks, "class_source": args.class_source, "class_match": args.class_match,
            "snap": args.snap_regions}


def _page_input(args) -> tuple[np.ndarray, Any, Any]:
    """(image, words, word_boxes) from IMAGE / --pdf --page / --words, as `dociq predict` reads them."""
    if args.pdf and args.image:
        raise ValueError("give either IMAGE or --pdf FILE, not both")
    words = boxes = None
    if args.pdf:
        image, found = read_pdf_page(args.pdf, args.page, args.dpi)
        words, boxes = list(found.words), found.boxes
    elif args.image:
        if not Path(args.image).is_file():
            raise FileNotFoundError(f"page image {args.image} does not exist")
        image = load_page_image(Path(args.image), DEFAULT_MAX_PAGE_PIXELS)
    else:
        raise ValueError("no page given: pass IMAGE or --pdf FILE --page N")
    if args.words:
        words, boxes = read_words(args.words, image.shape[:2])
    return image, words, boxes


def run(args) -> int:
    """Segment the page, write the overlay (and the COCO results); 0 when done."""
    image, words, boxes = _page_input(args)                  # before the model: a wrong path fails fast
    category_ids = None
    if args.annotations:
        category_ids = category_ids_by_name(args.annotations)
    segmenter = PageSegmenter(load_predictor(args.checkpoint, args.device),
                              points_per_side=args.points_per_side, seeds=args.seeds,
                              pred_iou_thresh=args.pred_iou_thresh,
                              stability_score_thresh=args.stability_score_thresh,
                              box_nms_thresh=args.box_nms_thresh, min_region_area=args.min_region_area,
                              classify=not args.no_classify, **region_options(args))
    regions = segmenter.segment(image, words=words, word_boxes=boxes, ocr=None if words is not None else args.ocr)
    Image.fromarray(draw_overlay(image, regions)).save(args.out)
    for r in regions:
        x0, y0, x1, y1 = (int(v) for v in r.box)
        print(f"{r.category:16s} IoU {r.score:.3f}  stability {r.stability:.3f}  class IoU {r.category_score:.2f}  "
              f"box ({x0}, {y0}, {x1}, {y1})  {r.area} px  seed {r.seed}")
    print(f"{len(regions)} regions; overlay written to {args.out}")
    if args.coco_json:
        if category_ids is None:
            category_ids = {name: i + 1 for i, name in enumerate([*segmenter.categories, UNCLASSIFIED])}
        results = to_coco_results(regions, args.image_id, category_ids)
        Path(args.coco_json).write_text(json.dumps(results))
        print(f"{len(results)} COCO results written to {args.coco_json} (category ids: "
              + ", ".join(f"{n}={i}" for n, i in category_ids.items()) + ")")
        if len(results) < len(regions):
            print(f"{len(regions) - len(results)} regions left out: their class has no category id")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`dociq segment-page ...`: 0 on success, 2 on a user error (one line on stderr)."""
    args = build_parser().parse_args(argv)
    return report_errors("segment-page", lambda: run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
