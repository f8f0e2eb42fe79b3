"""`dociq predict`: segment a page with a stage=finetune checkpoint (or a model folder) and prompts.

    dociq predict CKPT page.png --question "the page footer" --ocr tesseract --out overlay.png
    dociq predict CKPT --pdf paper.pdf --page 2 --question "the title" --coco-json out.json

The overlay, one PNG per mask (--masks-dir) and COCO results (--coco-json, RLE by dociq.io.rle)
are written; a user's mistake is one line on stderr and exit status 2 (`--debug`: the traceback).
docs/predict.md has every option. The Predictor itself is dociq.inference.predictor.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from dociq.cli import report_errors
from dociq.cli.backend import add_backend_arguments, load_backend
from dociq.cli.page_input import DPI_RANGE, read_pdf_page, read_words
from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS
from dociq.data.image_io import load_page_image
from dociq.data.ocr import OcrWords
from dociq.inference.overlay import overlay
from dociq.inference.snapping import DEFAULT_SNAP
from dociq.inference.prompts import check_threshold
from dociq.io.rle import encode_rle


@dataclass(frozen=True)
class Output:
    prompt: int                 # index of the prompt
    candidate: int | None       # multimask candidate 0..2 (None: one mask per prompt)
    label: str                  # the question, or what the prompt was
    mask: np.ndarray            # bool [H, W]
    score: float                # predicted IoU


def outputs(masks: np.ndarray, scores: np.ndarray, labels: list[str]) -> list[Output]:
    """Flatten [Q, H, W] / [Q] or multimask [Q, 3, H, W] / [Q, 3] predictions, prompt-major."""
    if masks.ndim == 3:
        return [Output(q, None, labels[q], masks[q], float(scores[q])) for q in range(len(masks))]
    return [Output(q, k, labels[q], masks[q, k], float(scores[q, k]))
            for q in range(masks.shape[0]) for k in range(masks.shape[1])]


def coco_results(results: list[Output], image_id: int, file_name: str, questions: list[str]) -> list[dict]:
    """COCO segmentation results (pycocotools' loadRes format: image_id, category_id, segmentation as
    compressed RLE, score) plus the question text (null for a point/box prompt) and the prompt index."""
    out = []
    for r in results:
        rle = encode_rle(r.mask)
        entry = {"image_id": image_id, "category_id": 1, "segmentation": rle, "score": r.score,
                 "bbox": [float(v) for v in mask_utils.toBbox(rle)], "area": float(mask_utils.area(rle)),
                 "question": questions[r.prompt] if questions else None, "prompt": r.prompt,
                 "file_name": file_name}
        if r.candidate is not None:
            entry["candidate"] = r.candidate
        out.append(entry)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq predict",
                                description="Segment a page with a stage=finetune checkpoint (docs/predict.md).")
    p.add_argument("checkpoint", help="a stage=finetune .ckpt file, or a from_pretrained folder "
                                      "(config.json + model.safetensors)")
    p.add_argument("image", nargs="?", help="the page image (PNG/JPEG/TIFF); or give --pdf FILE --page N")
    p.add_argument("--pdf", help="a born-digital PDF: its page --page is rendered and its text layer is the OCR")
    p.add_argument("--page", type=int, default=None, help="page of --pdf, numbered from 1 (default 1)")
    p.add_argument("--dpi", type=float, default=144.0,
                   help="render resolution of --pdf, %g to %g (default 144)" % DPI_RANGE)
    p.add_argument("--question", action="append", help="a question (repeat for several prompts, one call)")
    p.add_argument("--point", nargs=2, type=float, action="append", metavar=("X", "Y"),
                   help="a positive click in page pixels (repeat for several, one prompt)")
    p.add_argument("--box", nargs=4, type=float, action="append", metavar=("X0", "Y0", "X1", "Y1"),
                   help="a box in page pixels (repeat for several prompts; one box is shared by all questions)")
    p.add_argument("--words", help='OCR words as JSON: [{"text": ..., "box": [x0, y0, x1, y1]}, ...] or '
                                   '{"words": [...], "boxes": [[x0, y0, x1, y1], ...]}, page pixels')
    p.add_argument("--ocr", default=None, choices=["tesseract", "pdf"],
                   help="OCR for the page words: tesseract, or pdf (the text layer of --pdf, its default)")
    add_backend_arguments(p)
    p.add_argument("--threshold", type=float, default=0.0,
                   help="mask logit threshold, a finite number (default 0; lower keeps more pixels)")
    p.add_argument("--snap", choices=("blocks", "words", "none"), default=DEFAULT_SNAP,
                   help="masks at word-box precision: 'blocks' (the default) completes each paragraph / list item "
                        "they hold or a click lands in and keeps a box's mask in its box, 'words' snaps them to "
                        "their words' box, 'none' returns the decoder's masks (docs/predict.md)")
    p.add_argument("--multimask", action="store_true", help="the 3 candidate masks per prompt (SAM's multimask)")
    p.add_argument("--out", default=None, help="overlay image to write (default: ./<input>_prediction.png)")
    p.add_argument("--masks-dir", help="also write one PNG per mask (0/255) into this folder")
    p.add_argument("--coco-json", help="also write the masks as COCO results JSON (RLE, score, question)")
    p.add_argument("--image-id", type=int, default=1, help="image_id of the COCO results (default 1)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def _page_and_words(args) -> tuple[np.ndarray, Any, str, str | None]:
    """-> page image, words (OcrWords / (words, boxes) / None), a name for outputs, the OCR backend."""
    if args.pdf and args.image:
        raise ValueError(f"give the page as an image ({args.image}) or as --pdf {args.pdf}, not both")
    if not args.pdf and not args.image:
        raise ValueError("give the page: an image path, or --pdf FILE --page N")
    if args.page is not None and not args.pdf:
        raise ValueError(f"--page {args.page} needs --pdf FILE (an image has one page)")
    if args.words and args.ocr:
        raise ValueError(f"give the words by --words {args.words} or --ocr {args.ocr}, not both")
    if args.ocr == "pdf" and not args.pdf:
        raise ValueError("--ocr pdf reads a PDF's text layer and an image has none: give --pdf FILE --page N, "
                         "or --ocr tesseract for a scanned image")
    if args.pdf:
        page = args.page or 1
        image, words = read_pdf_page(args.pdf, page, args.dpi)
        name = f"{Path(args.pdf).stem}_p{page}"
        ocr = None
        if args.ocr == "tesseract" or args.words:
            words, ocr = None, args.ocr
    else:
        image = load_page_image(args.image, DEFAULT_MAX_PAGE_PIXELS)   # before the model: a wrong path fails fast
        words, name, ocr = None, Path(args.image).stem, args.ocr
    if args.words:
        words = read_words(args.words, image.shape[:2])
    return image, words, name, ocr


def run(args) -> None:
    check_threshold(args.threshold, "--threshold")
    image, words, name, ocr = _page_and_words(args)
    if args.masks_dir and Path(args.masks_dir).exists() and not Path(args.masks_dir).is_dir():
        raise ValueError(f"--masks-dir {args.masks_dir} is a file: give a folder")
    predictor = load_backend(args)
    predictor.snap = None if args.snap == "none" else args.snap
    page_words, page_boxes = (words, None) if isinstance(words, OcrWords) or words is None else words
    # the prompts are checked against the page before the page is embedded: a bad one fails fast
    masks, scores = predictor.predict(image, question=args.question, points=args.point, boxes=args.box,
                                      words=page_words, word_boxes=page_boxes, ocr=ocr,
                                      multimask_output=args.multimask, threshold=args.threshold)[:2]
    n = masks.shape[0]
    questions = list(args.question or [])
    questions = questions * n if len(questions) == 1 else questions      # one question shared by all boxes
    labels = [repr(q) for q in questions] if questions else [f"prompt {i}" for i in range(n)]
    results = outputs(masks, scores, labels)
    best = masks if masks.ndim == 3 else masks[np.arange(n), scores.argmax(1)]
    out = Path(args.out) if args.out else Path.cwd() / f"{name}_prediction.png"
    Image.fromarray(overlay(image, best)).save(out)
    for r in results:
        which = "" if r.candidate is None else f" candidate {r.candidate}"
        print(f"{r.label}{which}: {int(r.mask.sum())} px, predicted IoU {r.score:.3f}")
    print(f"overlay written to {out}")
    if args.masks_dir:
        folder = Path(args.masks_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for r in results:
            suffix = "" if r.candidate is None else f"_{r.candidate}"
            Image.fromarray(r.mask.astype(np.uint8) * 255).save(folder / f"{name}_{r.prompt:02d}{suffix}.png")
        print(f"{len(results)} mask PNGs written to {folder}")
    if args.coco_json:
        file_name = Path(args.pdf or args.image).name
        Path(args.coco_json).write_text(json.dumps(coco_results(results, args.image_id, file_name, questions)))
        print(f"COCO results written to {args.coco_json}")


def main(argv: list[str] | None = None) -> int:
    """`dociq predict ...`: 0 when done, 2 on a user's mistake (one line on stderr; --debug raises it
    with its traceback). argparse's usage errors exit 2 as usual."""
    args = build_parser().parse_args(argv)
    return report_errors("predict", lambda: run(args), debug=args.debug, also=(ImportError,))


if __name__ == "__main__":
    sys.exit(main())
