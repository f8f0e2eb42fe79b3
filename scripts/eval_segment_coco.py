"""COCO AP of what `dociq segment` writes, on the pages of a COCO layout file (the corpus's
held-out split: `dociq corpus export data/corpus val/annotations.json --split val`).

Each page image goes through `DocumentSegmenter.segment_page` and `document_formats.coco_page`, the
functions `dociq segment --format coco` runs, with `dociq segment`'s defaults; its regions are
matched to the file's categories by name and scored with COCOeval (dociq.evaluation.coco_map).
`dociq eval --data coco` scores `PageSegmenter` on the same pages: the two AP agree when the
document pipeline (reading, region conversion, reading order, COCO writing) loses nothing.

    python scripts/eval_segment_coco.py CKPT --annotations val/annotations.json [--words stored|tesseract]

--words stored: the words the COCO file holds (the PDF text layer; as `dociq eval` reads them);
tesseract: read from the page image, as `dociq segment` does for an image without a text layer.
Results: docs/segment.md ("Quality of what it writes").
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS  # noqa: E402
from dociq.data.image_io import load_page_image  # noqa: E402
from dociq.data.ocr import OcrWords  # noqa: E402
from dociq.evaluation.coco_map import coco_map  # noqa: E402
from dociq.inference.automatic import normalise_name  # noqa: E402
from dociq.inference.document_formats import category_ids, coco_page  # noqa: E402
from dociq.inference.documents import DocumentSegmenter, PageResult  # noqa: E402
from dociq.inference.predictor import load_predictor  # noqa: E402


class StoredWords(DocumentSegmenter):
    """`DocumentSegmenter` that reads each page's words from the COCO file instead of OCR."""

    def __init__(self, predictor, words: dict[str, OcrWords]) -> None:
        super().__init__(predictor)
        self.words = words

    def read_page(self, path, page):
        image = load_page_image(path, DEFAULT_MAX_PAGE_PIXELS)
        stored = self.words[Path(path).name].scaled_to(image.shape[:2])
        return PageResult(page=page, image=image, words=list(stored.words), word_boxes=stored.boxes,
                          word_source="stored", dpi=None)


def stored_words(gt: dict) -> dict[str, OcrWords]:
    out = {}
    for image in gt["images"]:
        words = image.get("words") or []
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (wd["bbox"] for wd in words)], np.float32)
        out[image["file_name"]] = OcrWords([wd["text"] for wd in words], boxes.reshape(-1, 4),
                                           (image["height"], image["width"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--annotations", type=Path, required=True)
    ap.add_argument("--image-dir", type=Path, help="default: images/ beside the annotations")
    ap.add_argument("--words", choices=("stored", "tesseract"), default="stored")
    ap.add_argument("--max-pages", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the scores here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gt = json.loads(args.annotations.read_text(encoding="utf-8"))
    image_dir = args.image_dir or args.annotations.parent / "images"
    predictor = load_predictor(args.checkpoint)
    segmenter = StoredWords(predictor, stored_words(gt)) if args.words == "stored" else \
        DocumentSegmenter(predictor, ocr="tesseract")
    ids = category_ids(segmenter.categories)
    to_gt = {normalise_name(c["name"]): c["id"] for c in gt["categories"]}
    name_of = {i: name for name, i in ids.items()}
    images = gt["images"][:args.max_pages] if args.max_pages else gt["images"]
    results, start = [], time.perf_counter()
    for n, image in enumerate(images, start=1):
        page = segmenter.segment_page(image_dir / image["file_name"], 1)
        _image, annotations = coco_page(image["file_name"], page, ids, first_id=1)
        for a in annotations:
            category = to_gt.get(normalise_name(name_of[a["category_id"]]))
            if category is not None:
                results.append({**a, "image_id": image["id"], "category_id": category})
        if n % 25 == 0 or n == len(images):
            print(f"[segment] {n}/{len(images)} pages, {(time.perf_counter() - start) / n:.2f} s/page", flush=True)
    scores = coco_map(args.annotations, results, image_ids=[i["id"] for i in images])
    print("| words | pages | regions | segm AP | AP50 | AP75 | bbox AP | s/page |")
    print("|---|---|---|---|---|---|---|---|")
    segm, bbox = scores["segm"], scores["bbox"]
    print(f"| {args.words} | {len(images)} | {len(results)} | {100 * segm['AP']:.1f} | {100 * segm['AP50']:.1f} | "
          f"{100 * segm['AP75']:.1f} | {100 * bbox['AP']:.1f} | {(time.perf_counter() - start) / len(images):.2f} |")
    print("per class segm AP: " + ", ".join(f"{k} {100 * v['AP']:.1f}" for k, v in segm["per_class"].items()
                                            if v["AP"] is not None))
    if args.json:
        args.json.write_text(json.dumps({"words": args.words, "pages": len(images), "regions": len(results),
                                         "segm": {k: v for k, v in segm.items() if k != "summary"},
                                         "bbox": {k: v for k, v in bbox.items() if k != "summary"}}, indent=1))


if __name__ == "__main__":
    main()
