"""Export an engine store as COCO instance JSON that `data=coco` (`CocoDocuments`) reads unchanged.

Layout written: `<out>.json` plus `images/<page id>.png` beside it (the folder `CocoDocuments`
looks in by default), hard-linked from the store when the file system allows, else copied.

This module only builds one `CocoPage` record per page from the store; the file is written by
dociq's one COCO writer, `dociq.data.datasets.coco.write_coco_records` (see that module for the
fields). What goes where:
- image entry: id (1..N), file_name `<page id>.png`, width, height, page_id, words (text + xywh
  bbox), split, source and the store's folder in meta;
- each accepted annotation WITH a category is a COCO annotation (id = the store's annotation id,
  category, compressed RLE segmentation, bbox, area; no text/word_ids: the reader gives it the
  words inside), and its question (when it has text) is a question whose `annotation_ids` is
  [that annotation];
- an accepted annotation WITHOUT a category is a question only, its target the saved mask
  (`segmentation` RLE): it has no class to be a region of;
- with category_questions=True each page also gets "segment every <category>" (kind "category")
  over all its annotations of that category, unless an annotator's question says the same.
Every image is in place before the JSON is written (atomically), so the JSON never lists a
missing image.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Iterator

from dociq.data.datasets.coco import (CocoPage, CocoQuestion, CocoRegion, category_question_text,
                                      write_coco_records)
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
    no_words: list[str] = []
    info = {"description": f"dociq engine export of {store.data_dir}", "split": split,
            "checkpoint": None if store.checkpoint() is None else str(store.checkpoint())}
    path = write_coco_records(store_records(store, split, category_questions, include_empty, no_words),
                              out_path, out_path.parent / "images", info=info)
    if no_words:
        log.warning("%d exported pages have no words (%s%s): CocoDocuments needs require_words=False or "
                    "ocr='tesseract' for them", len(no_words), ", ".join(no_words[:5]),
                    ", ..." if len(no_words) > 5 else "")
    return path


def store_records(store: EngineStore, split: str | None = None, category_questions: bool = True,
                  include_empty: bool = False, no_words: list[str] | None = None) -> Iterator[CocoPage]:
    """The store's pages (of `split`; None: all) as `CocoPage` records, one at a time (see the
    module doc); the ids of pages without words are appended to `no_words`."""
    by_page = defaultdict(list)
    for ann in store.annotations(status="accepted"):
        by_page[ann.page_id].append(ann)
    for page in store.pages(split=split):
        anns = by_page.get(page.id, [])
        if not anns and not include_empty:
            continue
        words, boxes = store.page_words(page.id)
        if not words and no_words is not None:
            no_words.append(page.id)
        regions, questions = [], []
        by_category = defaultdict(list)
        for ann in anns:
            if ann.category is not None:
                by_category[ann.category].append(len(regions))
                if ann.question.strip():
                    questions.append(CocoQuestion(ann.question, ann.kind, [len(regions)]))
                regions.append(CocoRegion(label=ann.category, segmentation=dict(ann.rle), bbox=list(ann.bbox),
                                          area=float(ann.area), id=ann.id))
            else:
                questions.append(CocoQuestion(ann.question, ann.kind, segmentation=dict(ann.rle)))
        if category_questions:
            asked = {q.text.strip().lower() for q in questions}
            for name, ids in by_category.items():
                text = category_question_text(name)
                if text not in asked:
                    questions.append(CocoQuestion(text, "category", ids))
        yield CocoPage(image=store.page_path(page.id), width=page.width, height=page.height, words=words,
                       word_boxes=boxes, regions=regions, questions=questions, page_id=page.id,
                       file_name=f"{page.id}.png",
                       meta={"split": page.split, "source": page.source, "engine_store": str(store.data_dir)})
