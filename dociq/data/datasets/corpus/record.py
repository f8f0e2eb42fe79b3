"""One corpus page as it is stored: a PNG and a JSON record, and the `Page` it reads back as.

Regions are stored as boxes in page pixels (their masks are the filled boxes); a question stores
the region ids that answer it, and its mask is the union of theirs. Everything a page needs to be
rebuilt is in the record, so a shard can be read without the PDF it came from.

Record keys:
  page_id, doc_id, package, source (path of the document under the build's source folder),
  page_index (0-based page of the PDF), split ("train" | "val"), size [H, W],
  words [str], word_boxes [[x0, y0, x1, y1]], text_layer ("pdf" | "tesseract"),
  regions [{"label", "box": [x0, y0, x1, y1], "word_ids": [int]}],
  questions [{"text", "kind", "region_ids": [int]}], labeller ("tags" | "structure")
"""
from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from PIL import Image

from dociq.data.schema import Page, Question, Region

RECORD_VERSION = 1


def box_mask(box, size: tuple[int, int]) -> np.ndarray:
    """bool [H, W] with the box (pixels, x1/y1 exclusive, rounded outwards) filled."""
    h, w = size
    x0, y0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x1, y1 = min(w, int(np.ceil(box[2]))), min(h, int(np.ceil(box[3])))
    mask = np.zeros((h, w), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


def encode_png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.ascontiguousarray(np.asarray(img.convert("RGB"), dtype=np.uint8))


def record_to_page(png: bytes, record: dict[str, Any] | str) -> Page:
    """The `Page` a stored (PNG, JSON record) pair stands for."""
    if isinstance(record, (str, bytes)):
        record = json.loads(record)
    image = decode_png(png)
    size = image.shape[:2]
    words = list(record["words"])
    # a text layer's glyph box can overhang the page's crop box (a display formula at the top edge);
    # the page shows only what lies inside it
    h, w = size
    word_boxes = np.clip(np.asarray(record["word_boxes"], dtype=np.float32).reshape(-1, 4), 0, [w, h, w, h])
    regions = []
    for r in record["regions"]:
        box = np.asarray(r["box"], dtype=np.float32)
        regions.append(Region(label=r["label"], box=box, mask=box_mask(box, size),
                              text=" ".join(words[j] for j in r["word_ids"]), word_ids=list(r["word_ids"])))
    questions = []
    for q in record["questions"]:
        mask = np.zeros(size, dtype=bool)
        for i in q["region_ids"]:
            mask |= regions[i].mask
        questions.append(Question(text=q["text"], kind=q["kind"], mask=mask, region_ids=list(q["region_ids"])))
    meta = {k: record[k] for k in ("page_id", "doc_id", "package", "source", "page_index", "split",
                                    "labeller", "text_layer") if k in record}
    meta["original_size"] = tuple(size)
    return Page(image=image, words=words, word_boxes=word_boxes, regions=regions, questions=questions,
                links=[tuple(link) for link in record.get("links", [])], meta=meta)
