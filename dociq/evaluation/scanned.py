"""Held-out pages as a scanner and an OCR engine would hand them to a user: each page degraded
(skew, blur, noise, JPEG: dociq.data.degrade) and its words read back by tesseract from the
degraded image, in place of the born-digital text layer.

    dociq eval CKPT --data corpus --corpus data/corpus_unseen --split all --scan

The targets move with the image (degrade_page warps masks and boxes), the prompts stay the page's
own, so a question names words the OCR may have misread, as a user's question would. A page's
degradation is drawn from its id and the seed, so every answerer sees the same scan; the OCR is
cached by image content.
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


class ScannedPages(Sequence):
    """`pages` with each page degraded and its words replaced by tesseract's reading of it."""

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
        page_id = str(page.meta.get("page_id", index))
        rng = np.random.default_rng([self.seed, zlib.crc32(page_id.encode())])
        scanned = degrade_page(page, rng)
        words = self.ocr.recognise(scanned.image)
        return dataclasses.replace(scanned, words=list(words.words),
                                   word_boxes=np.asarray(words.boxes, np.float32).reshape(-1, 4),
                                   meta={**scanned.meta, "words_from": "tesseract", "scanned": True})
