"""Pages as a scanner and an OCR engine would hand them over: each page degraded (skew, blur,
noise, JPEG: dociq.data.degrade) and its words read back by tesseract from the degraded image, in
place of the born-digital text layer.

    dociq eval CKPT --data corpus --corpus data/corpus_unseen --split all --scan   # held-out scans
    python train.py stage=finetune data=corpus_mixed_scanned                     # training on scans

The targets move with the image (degrade_page warps masks and boxes), the questions stay the
page's own, so a question names words the OCR may have misread, as a user's question would. Each
region's `word_ids` are re-drawn over the OCR words (those whose box centre it holds), so the
word-class targets follow the words the model now reads. A page's degradation is drawn from its id
and the seed, so every answerer (and every epoch) sees the same scan, and the OCR is cached by image
content: a second pass over the same pages reads the cache (`scripts/ocr_scanned_pages.py` fills it
ahead of a training run).
"""
from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from dociq.data.degrade import degrade_page
from dociq.data.ocr import TesseractOCR
from dociq.data.schema import Page
from dociq.data.text_blocks import words_in_masks


def degraded(page: Page, seed: int, index: int = 0) -> Page:
    """The page as scan `seed` of it: the degradation is drawn from the page's id (else `index`) and
    the seed, so every reader of the same page and seed gets the same scan."""
    page_id = str(page.meta.get("page_id", index))
    return degrade_page(page, np.random.default_rng([int(seed), zlib.crc32(page_id.encode())]))


class ScannedPages(Sequence):
    """`pages` (any sequence or map-style data set of `Page`s) with each page degraded and its words
    replaced by tesseract's reading of it. seed: which scan each page gets; ocr: an OCR engine with
    `recognise(image)` (default `TesseractOCR(cache=cache_dir)`)."""

    def __init__(self, pages: Sequence[Page | None], seed: int = 0, ocr=None,
                 cache_dir: str | Path | None = None):
        self.pages, self.seed = pages, int(seed)
        self.ocr = ocr if ocr is not None else TesseractOCR(cache=cache_dir)

    def __len__(self) -> int:
        return len(self.pages)

    def __getitem__(self, index: int) -> Page | None:
        page = self.pages[index]
        if page is None:                                  # a bad page stays skipped
            return None
        scanned = degraded(page, self.seed, index)
        read = self.ocr.recognise(scanned.image)
        words = list(read.words)
        boxes = np.asarray(read.boxes, np.float32).reshape(-1, 4)
        owned = words_in_masks(boxes, [r.mask for r in scanned.regions])
        regions = [dataclasses.replace(r, word_ids=ids, text=" ".join(words[k] for k in ids))
                   for r, ids in zip(scanned.regions, owned)]
        return dataclasses.replace(scanned, words=words, word_boxes=boxes, regions=regions,
                                   word_confidences=np.asarray(read.confidences, np.float32),
                                   meta={**scanned.meta, "words_from": "tesseract", "scanned": True})
