"""Export an engine store as COCO instance JSON that `data=coco` (`CocoDocuments`) reads unchanged.

Layout written: `<out>.json` plus `images/<page id>.png` beside it (the folder `CocoDocuments`
looks in by default), hard-linked from the store when the file system allows, else copied.

What goes where (dociq's COCO extension, see dociq/data/datasets/coco.py):
- image entry: id (1..N), file_name `<page id>.png`, width, height, page_id, words (text + xywh
  bbox), split and source in meta;
- each accepted annotation WITH a category is a COCO annotation (id = the store's annotation id,
  category, compressed RLE segmentation, bbox, area), and its question (when it has text) is a
  question whose `annotation_ids` is [that annotation];
- an accepted annotation WITHOUT a category is a question only, its target the saved mask
  (`segmentation` RLE): it has no class to be a region of;
- with category_questions=True each page also gets "segment every <category>" (kind "category")
  over all its annotations of that category, unless an annotator's question says the same.
Every image is in place before the JSON is written (atomically), so the JSON never lists a
missing image.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from collections import defaultdict
from pathlib import Path

from dociq.data.datasets.coco import category_question_text
from dociq.io.atomic import atomic_write_text
from dociq.engine.store import EngineStore

log = logging.getLogger(__name__)


def export_coco(store: EngineStore, out_path: str | Path, split: str | None = None,
                category_questions: bool = True, include_empty: bool = False) -> Path:
    """Write the store's accepted annotations as COCO JSON at `out_path` (images into
    `<out_path's folder>/images/`). split: only pages of that split (None: all).
    include_empty: also pages without accepted annotations (they carry no questions).
    Returns the JSON path."""
    out_path = Path(out_path)
    if out_path.suffix.lower() != ".json":
        raise ValueError(f"out_path: {out_path} should be a .json file (the images go to "
                         f"{out_path.parent / 'images'}). Fix: e.g. --out export/annotations.json")
    image_dir = out_path.parent / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    by_page = defaultdict(list)
    for ann in store.annotations(status="accepted"):
        by_page[ann.page_id].append(ann)
    categories: dict[str, int] = {}
    images, coco_anns, no_words = [], [], []
    for page in store.pages(split=split):
        anns = by_page.get(page.id, [])
        if not anns and not include_empty:
            continue
        image_id = len(images) + 1
        file_name = f"{page.id}.png"
        _place(store.page_path(page.id), image_dir / file_name)
        words, boxes = store.page_words(page.id)
        if not words:
            no_words.append(page.id)
        questions = []
        by_category = defaultdict(list)
        for ann in anns:
            if ann.category is not None:
                cat_id = categories.setdefault(ann.category, len(categories) + 1)
                coco_anns.append({"id": ann.id, "image_id": image_id, "category_id": cat_id,
                                  "bbox": list(ann.bbox), "area": float(ann.area), "iscrowd": 0,
                                  "segmentation": dict(ann.rle)})
                by_category[ann.category].append(ann.id)
                if ann.question.strip():
                    questions.append({"text": ann.question, "kind": ann.kind, "annotation_ids": [ann.id]})
            else:
                questions.append({"text": ann.question, "kind": ann.kind, "segmentation": dict(ann.rle)})
        if category_questions:
            asked = {q["text"].strip().lower() for q in questions}
            for name, ids in by_category.items():
                text = category_question_text(name)
                if text not in asked:
                    questions.append({"text": text, "kind": "category", "annotation_ids": ids})
        images.append({
            "id": image_id, "file_name": file_name, "width": page.width, "height": page.height,
            "page_id": page.id,
            "words": [{"text": t, "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                      for t, b in zip(words, boxes.tolist())],
            "questions": questions,
            "meta": {"split": page.split, "source": page.source, "engine_store": str(store.data_dir)},
        })
    if no_words:
        log.warning("%d exported pages have no words (%s%s): CocoDocuments needs require_words=False or "
                    "ocr='tesseract' for them", len(no_words), ", ".join(no_words[:5]),
                    ", ..." if len(no_words) > 5 else "")
    data = {
        "info": {"description": f"dociq engine export of {store.data_dir}", "split": split,
                 "checkpoint": None if store.checkpoint() is None else str(store.checkpoint())},
        "images": images, "annotations": coco_anns,
        "categories": [{"id": i, "name": name, "supercategory": "document"} for name, i in categories.items()],
    }
    atomic_write_text(out_path, json.dumps(data))
    return out_path


def _place(src: Path, dst: Path) -> None:
    """Hard-link the store's PNG (pages never change in place), else copy it; replace atomically."""
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
