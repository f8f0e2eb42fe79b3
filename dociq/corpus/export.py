"""Export a built corpus as COCO (with dociq's words and questions), for other tools and `data=coco`.

    dociq corpus export data/corpus out/annotations.json --split val
        -> out/annotations.json + out/images/<n>.png         (write_coco's own layout)
    dociq corpus export data/corpus out/val.json --split val
        -> out/val.json + out/images/val/<n>.png              (file_name "val/<n>.png")

Any other file name than annotations.json gets its own images/<stem>/ folder, so several exports
(train.json, val.json) can share one folder without overwriting each other's images/<n>.png.
`CocoDocuments(annotations)` reads either back (its image_dir defaults to images/ beside the JSON).
Each image entry's "meta" holds the page's provenance: page_id, doc_id, package, split, labeller,
source, page_index, text_layer, shard.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from dociq.data.datasets.coco import write_coco
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.io.atomic import atomic_write_text
from dociq.data.schema import Page

COCO_NAME = "annotations.json"


def export_coco(corpus_dir: str | Path, annotations_json: str | Path, split: str | None = None,
                max_pages: int | None = None, on_bad_sample: str = "raise") -> Path:
    """Write the pages of `split` (None: every split) as COCO at `annotations_json`, images beside
    it; `max_pages` keeps that many, spread over documents as `CorpusDocuments` does. Returns the
    annotation file's path."""
    target = Path(annotations_json)
    if target.is_dir():
        raise ValueError(f"{target} is a folder. Fix: pass the annotation file to write, e.g. {target / COCO_NAME}")
    dataset = CorpusDocuments(corpus_dir, split=split, max_pages=max_pages, on_bad_sample=on_bad_sample)
    pages = _pages(dataset)
    if target.name == COCO_NAME:
        return write_coco(pages, target.parent)
    return _write_named(pages, target)


def _pages(dataset: CorpusDocuments) -> Iterator[Page]:
    """The pages one at a time (a corpus does not fit in memory); skipped bad pages left out."""
    for i in range(len(dataset)):
        page = dataset[i]
        if page is not None:
            yield page


def _write_named(pages: Iterator[Page], target: Path) -> Path:
    """write_coco into a staging folder beside `target`, then move its images to images/<stem>/
    and write `target` (atomically, last: it never names an image that is not there)."""
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".{target.name}.export.tmp"
    if staging.exists():
        shutil.rmtree(staging)  # a killed export's leftovers
    try:
        data = json.loads(write_coco(pages, staging).read_text(encoding="utf-8"))
        for entry in data["images"]:
            entry["file_name"] = f"{target.stem}/{entry['file_name']}"
        images = folder / "images" / target.stem
        if images.exists():
            shutil.rmtree(images)  # an earlier export to the same name
        images.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / "images", images)
        atomic_write_text(target, json.dumps(data))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
