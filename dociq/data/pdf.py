"""PDF pages: open, count, render to RGB arrays, text-layer words with boxes in the rendered page's pixels.

Every PDF the package opens with pdfium goes through here (the text layer of `dociq.data.ocr`, the
engine's import, the corpus builder, the CLI's --pdf and `dociq segment`), so a file fails the same
way wherever it is read: a `PdfOpenError` (a `BadSampleError`) naming the file, saying whether it
is missing, password-protected, without pages or broken, and the fix.

Coordinates: a page rendered at `scale` pixels per PDF point (dpi / 72) is a bitmap of
`render_size(page, scale)`; `text_layer_words(page, size)` maps the page onto a canvas of `size`
(H, W), so words land on the pixels of a render of that size.

pypdfium2 is a required dependency and light to import; pdfplumber (the corpus builder's tag
tree) stays with its one user.
"""
from __future__ import annotations

import ctypes
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS, BadSampleError, check_page_pixels

POINTS_PER_INCH = 72.0          # PDF user space: `scale` = dpi / POINTS_PER_INCH pixels per point
PdfSource = Union[str, Path, bytes]  # a file, or a PDF held in memory (a zip member)

FIX_BROKEN = "re-export or re-download the PDF"
FIX_ENCRYPTED = ("save a copy without the password (e.g. `qpdf --decrypt --password=... in.pdf out.pdf`) "
                 "and read that")
NO_PAGES = "not a readable PDF: it has no pages"
PROBLEMS = ("missing", "encrypted", "empty", "broken")


class PdfOpenError(BadSampleError):
    """A PDF that cannot be opened; `problem` is one of PROBLEMS, for callers that sort failures
    (the corpus builder reports encrypted and zero-page documents apart from broken ones)."""

    def __init__(self, path: str | Path, reason: str, fix: str, problem: str = "broken"):
        super().__init__(path, reason, fix)
        self.problem = problem

    def __reduce__(self):  # picklable across worker processes, problem included
        return (type(self), (self.path, self.reason, self.fix, self.problem))


def _name(source: PdfSource, name: str | Path | None) -> str | Path:
    if name is not None:
        return name
    return "<PDF in memory>" if isinstance(source, (bytes, bytearray)) else source


def open_pdf(source: PdfSource, name: str | Path | None = None) -> pdfium.PdfDocument:
    """The document at `source` (a path, or the bytes of a PDF), with at least one page; errors name
    `name` (default: the path). The caller closes it. A missing, encrypted, page-less or broken file
    is a PdfOpenError."""
    shown = _name(source, name)
    if isinstance(source, bytearray):
        source = bytes(source)
    if not isinstance(source, bytes):
        source = Path(source)
        if not source.is_file():
            raise PdfOpenError(shown, "PDF file not found", "check the path and the file name", "missing")
    try:
        doc = pdfium.PdfDocument(source)
    except (pdfium.PdfiumError, OSError, ValueError) as err:
        problem = _why_unreadable(source)
        if problem == "encrypted":
            raise PdfOpenError(shown, f"not a readable PDF: it is password-protected ({err})", FIX_ENCRYPTED,
                               problem) from err
        if problem == "empty":
            raise PdfOpenError(shown, NO_PAGES, FIX_BROKEN, problem) from err
        raise PdfOpenError(shown, f"not a readable PDF ({err})", FIX_BROKEN, problem) from err
    if len(doc) == 0:  # pypdfium2 refuses these itself; older releases may not
        doc.close()
        raise PdfOpenError(shown, NO_PAGES, FIX_BROKEN, "empty")
    return doc


def _why_unreadable(source: Path | bytes) -> str:
    """'encrypted', 'empty' or 'broken' for a PDF pypdfium2 refused. Its error does not tell: a file
    that loads but has no pages is reported with pdfium's last error, left over from an earlier
    file (a zero-page PDF read after an encrypted one says "Incorrect password"). Loading it again
    through the C API does: a handle means it has no pages, none means a fresh error code."""
    try:
        if isinstance(source, Path):
            raw = pdfium_c.FPDF_LoadDocument(os.fsencode(source) + b"\x00", None)
        else:
            raw = pdfium_c.FPDF_LoadMemDocument64(source, len(source), None)
    except (OSError, ValueError, TypeError, ctypes.ArgumentError):
        return "broken"
    if raw:
        pdfium_c.FPDF_CloseDocument(raw)
        return "empty"
    code = pdfium_c.FPDF_GetLastError()
    return "encrypted" if code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY) else "broken"


def page_count(source: PdfSource, name: str | Path | None = None) -> int:
    """Pages of the PDF (a PdfOpenError naming the file when it cannot be opened)."""
    doc = open_pdf(source, name)
    try:
        return len(doc)
    finally:
        doc.close()


def load_page(doc: pdfium.PdfDocument, page_index: int, name: str | Path) -> pdfium.PdfPage:
    """Page `page_index` (from 0) of an open document; a BadSampleError naming `name` when there is
    no such page or pdfium cannot load it. The caller closes it (closing the document does too)."""
    count = len(doc)
    if not 0 <= page_index < count:
        raise BadSampleError(name, f"page {page_index} requested but the PDF has {count} pages",
                             f"ask for a page index from 0 to {count - 1} (pages count from 0)")
    try:
        return doc[page_index]
    except pdfium.PdfiumError as err:
        raise BadSampleError(name, f"page {page_index} cannot be read ({err})", FIX_BROKEN) from err


@contextmanager
def open_page(source: PdfSource, page_index: int, name: str | Path | None = None) -> Iterator[pdfium.PdfPage]:
    """`with open_page(path, i) as page:` one page, its document closed on leaving (errors as
    `open_pdf` and `load_page`)."""
    shown = _name(source, name)
    doc = open_pdf(source, shown)
    try:
        page = load_page(doc, page_index, shown)
        try:
            yield page
        finally:
            page.close()
    finally:
        doc.close()


def render_size(page: pdfium.PdfPage, scale: float) -> tuple[int, int]:
    """(H, W) of the bitmap pdfium renders `page` into at `scale` pixels per point: ceil(points *
    scale) on each side, as pypdfium2's PdfPage.render sizes it."""
    w_pt, h_pt = page.get_size()
    return math.ceil(h_pt * scale), math.ceil(w_pt * scale)


def render_page(page: pdfium.PdfPage, scale: float, size: tuple[int, int] | None = None, *,
                max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS, name: str | Path = "PDF",
                what: str = "PDF page") -> np.ndarray:
    """`page` as RGB uint8 [H, W, 3] at `scale` pixels per point (dpi / 72), resized (bilinear) to
    exactly `size` (H, W) when given and the aspect differs. A requested size or bitmap over
    `max_page_pixels` (None: no cap) is a BadSampleError naming `name` and `what`, raised before
    any pixels are allocated (a huge MediaBox or a wrong annotated size would ask for gigabytes)."""
    if size is not None:
        check_page_pixels(name, int(size[1]), int(size[0]), max_page_pixels, f"{what} as requested")
    height, width = render_size(page, scale)
    check_page_pixels(name, width, height, max_page_pixels,
                      f"{what} rendered at {scale * POINTS_PER_INCH:.0f} dpi")
    try:
        img = np.array(page.render(scale=scale).to_pil().convert("RGB"), dtype=np.uint8)
    except pdfium.PdfiumError as err:
        raise BadSampleError(name, f"{what} cannot be rendered ({err})", FIX_BROKEN) from err
    if size is not None and img.shape[:2] != tuple(size):
        from PIL import Image

        img = np.array(Image.fromarray(img).resize((int(size[1]), int(size[0])), Image.BILINEAR))
    return np.ascontiguousarray(img)


def text_layer_words(page: pdfium.PdfPage, size: tuple[int, int], *, name: str | Path = "PDF",
                     what: str = "PDF page") -> tuple[list[str], np.ndarray]:
    """The page's text-layer words in reading order and their boxes, float32 [N, 4] x0, y0, x1, y1
    in pixels of the page mapped onto a canvas of `size` (H, W). Words split at whitespace,
    generated characters (pdfium's inferred spaces and line breaks) and jumps between lines."""
    height, width = int(size[0]), int(size[1])
    sub = 16  # map onto a 16x finer integer canvas: pdfium's page->device map rounds to ints
    dev_x, dev_y = ctypes.c_int(), ctypes.c_int()

    def to_px(x, y):
        pdfium_c.FPDF_PageToDevice(page, 0, 0, width * sub, height * sub, 0, x, y, dev_x, dev_y)
        return dev_x.value / sub, dev_y.value / sub

    try:
        textpage = page.get_textpage()
    except pdfium.PdfiumError as err:
        raise BadSampleError(name, f"{what}: its text layer cannot be read ({err})", FIX_BROKEN) from err
    words: list[str] = []
    boxes: list[list[float]] = []
    cur: list[str] = []
    cur_box = prev_box = None
    try:
        for i in range(textpage.count_chars()):
            ch = chr(pdfium_c.FPDFText_GetUnicode(textpage, i))
            if ch.isspace() or ch == "\x00" or pdfium_c.FPDFText_IsGenerated(textpage, i):
                _flush(cur, cur_box, words, boxes)
                cur, cur_box, prev_box = [], None, None
                continue
            left, bottom, right, top = textpage.get_charbox(i)
            xs, ys = zip(to_px(left, bottom), to_px(right, top))
            box = [min(xs), min(ys), max(xs), max(ys)]
            if prev_box is not None and _starts_new_word(prev_box, box):
                _flush(cur, cur_box, words, boxes)
                cur, cur_box = [], None
            cur.append(ch)
            cur_box = box if cur_box is None else [min(cur_box[0], box[0]), min(cur_box[1], box[1]),
                                                   max(cur_box[2], box[2]), max(cur_box[3], box[3])]
            prev_box = box
        _flush(cur, cur_box, words, boxes)
    finally:
        textpage.close()
    return words, np.array(boxes, np.float32).reshape(-1, 4)


def _flush(chars, box, words, boxes):
    if chars:
        words.append("".join(chars))
        boxes.append(box)


def _starts_new_word(prev, box) -> bool:
    """Chars without a space between them still split when they are on different lines or far apart."""
    height = max(prev[3] - prev[1], box[3] - box[1], 1.0)
    overlap = min(prev[3], box[3]) - max(prev[1], box[1])
    return overlap < 0.3 * height or box[0] - prev[2] > 0.6 * height or box[2] < prev[0]


__all__ = ["PdfOpenError", "POINTS_PER_INCH", "PROBLEMS", "open_pdf", "page_count", "load_page", "open_page",
           "render_size", "render_page", "text_layer_words"]
