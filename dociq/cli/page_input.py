"""The page of a command line: an image file, or a page of a PDF and its text layer, and OCR words
from a JSON file (`dociq predict` and `dociq segment-page` read them alike)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dociq.data.ocr import OcrWords, PdfTextLayer
from dociq.data.pdf import page_count
from dociq.inference.prompts import check_words

# --dpi of a PDF page: below 36 a page's text is a pixel or two high; a letter page at 1,200 dpi is
# 134 MP (the page-pixel cap, 50 MP, refuses it; a small page may pass).
DPI_RANGE = (36.0, 1200.0)


def read_words_json(path: str | Path) -> tuple[list, list]:
    """OCR words for the CLI's --words: a JSON list of {"text": str, "box": [x0, y0, x1, y1]}, or an
    object {"words": [str, ...], "boxes": [[x0, y0, x1, y1], ...]}; boxes in pixels of the page."""
    path = Path(path)
    form = ('a list of {"text": "...", "box": [x0, y0, x1, y1]} or {"words": [...], "boxes": [[x0, y0, x1, y1], '
            '...]}, boxes in page pixels')
    if not path.is_file():
        raise FileNotFoundError(f"--words {path}: file not found; give a JSON file of {form}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--words {path}: not JSON ({err}); give {form}") from err
    if isinstance(data, dict):
        missing = [k for k in ("words", "boxes") if k not in data]
        if missing:
            raise ValueError(f"--words {path}: the object lacks the key(s) {missing}; give {form}")
        return data["words"], data["boxes"]
    if not isinstance(data, list):
        raise ValueError(f"--words {path}: the JSON is a {type(data).__name__}; give {form}")
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "text" not in item or "box" not in item:
            raise ValueError(f"--words {path}: item [{i}] = {str(item)[:60]} lacks 'text' or 'box'; give {form}")
    return [item["text"] for item in data], [item["box"] for item in data]


def read_words(path: str | Path, size: tuple[int, int]) -> tuple[list[str], np.ndarray]:
    """--words read and checked against the page of `size` (H, W): one string and one pixel box per
    word (a non-string names its item, words[i]); the error names the file."""
    words, boxes = read_words_json(path)
    try:
        return check_words(words, boxes, size)
    except ValueError as err:
        raise ValueError(f"--words {path}: {err}") from err


def read_pdf_page(path: str | Path, page: int, dpi: float) -> tuple[np.ndarray, OcrWords]:
    """Page `page` (numbered from 1) of a PDF rendered at `dpi`, and its text-layer words."""
    check_dpi(dpi)
    if page < 1:
        raise ValueError(f"--page {page}: pages are numbered from 1")
    count = page_count(path)                         # a BadSampleError naming the file when unreadable
    if page > count:
        raise ValueError(f"--pdf {path}: --page {page} but the PDF has {count} page(s); give --page 1..{count}")
    return PdfTextLayer(dpi=dpi).read(path, page - 1)


def check_dpi(dpi: float) -> float:
    """--dpi, the resolution a PDF page is rendered at (`dociq predict`, `dociq segment-page`, `dociq segment`)."""
    low, high = DPI_RANGE
    if not (math.isfinite(dpi) and low <= dpi <= high):
        raise ValueError(f"--dpi {dpi:g}: give a resolution from {low:g} to {high:g} dots per inch "
                         "(default 144)")
    return dpi
