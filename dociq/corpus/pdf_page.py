"""What a PDF page holds, in the pixels of its rendered image: words with their fonts and marked-content
ids, text lines, ruling lines and graphics, images, and (when the PDF is tagged) its structure tree.

pdfplumber reads the text layer (fonts and marked-content ids per character, tables, the tag
tree); pypdfium2 renders the page. Coordinates are pixels of the rendered image: `scale` pixels per
PDF point, origin top-left of the page's crop box, as `Page.word_boxes` expects.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

# Fonts whose name says monospace: TeX's typewriter faces and the common system ones.
_MONO = re.compile(r"mono|courier|typewriter|cmtt|lmtt|sftt|txtt|ectt|tctt|rm-lmtt|inconsolata|consol|"
                   r"menlo|fixed|\btt\d|code", re.I)
_BOLD = re.compile(r"bold|black|heavy|semibold|demi|cmbx|\bbx\d|-bd|sfbx", re.I)
# pdfminer's stand-in for a glyph whose font maps it to no character (no ToUnicode entry): a music
# or chess symbol, or the letters of a font the PDF left unmapped; it is ink, not text
UNMAPPED_GLYPH = re.compile(r"\(cid:\d+\)")


@dataclass
class Word:
    text: str
    box: tuple[float, float, float, float]  # pixels
    size: float  # font size in points
    font: str
    mcid: int | None  # marked-content id of most of its characters (tagged PDFs)

    @property
    def mono(self) -> bool:
        return bool(_MONO.search(self.font))

    @property
    def bold(self) -> bool:
        return bool(_BOLD.search(self.font))


@dataclass
class Line:
    """Words on one baseline within one column, left to right."""

    word_ids: list[int]
    box: tuple[float, float, float, float]
    size: float

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]


@dataclass
class PdfPageContent:
    width: int  # rendered pixels
    height: int
    scale: float  # pixels per point
    words: list[Word]
    lines: list[Line]
    rules: list[tuple[float, float, float, float]]  # thin horizontal/vertical strokes (pixels)
    graphics: list[tuple[float, float, float, float]]  # other vector paths (pixels)
    graphics_mcid: list[int | None]
    images: list[tuple[float, float, float, float]]
    images_mcid: list[int | None]
    struct: list[dict] = field(default_factory=list)  # pdfplumber's structure tree of the page
    table_grids: list[dict] = field(default_factory=list)  # pdfplumber tables: box + rows of cell boxes
    chars: int = 0
    unmapped_words: int = 0  # words of the text layer that were only unmapped glyphs (left out of `words`)

    def line_text(self, line: Line) -> str:
        return " ".join(self.words[i].text for i in line.word_ids)


def _readable(text: str) -> bool:
    return any(not 0xE000 <= ord(ch) <= 0xF8FF and not ch.isspace() for ch in text)


def _to_px(obj, ox: float, oy: float, scale: float) -> tuple[float, float, float, float]:
    return ((obj["x0"] - ox) * scale, (obj["top"] - oy) * scale, (obj["x1"] - ox) * scale,
            (obj["bottom"] - oy) * scale)


def document_tree(plumber_pdf) -> list[dict]:
    """The document's structure tree (empty when untagged or unreadable). Read once per document:
    pdfplumber's per-page trees lose the marked-content ids of pages after the first in some PDFs
    (Chromium's among them), while the document tree keeps each element's page."""
    try:
        return plumber_pdf.structure_tree or []
    except Exception:  # a broken tag tree reads as untagged; the structure labeller takes over
        return []


def page_tree(tree: list[dict], page_number: int, inherited: int | None = None) -> list[dict]:
    """The part of a document tree with content on page `page_number` (1-based, as pdfplumber). An
    element without a page of its own is on its nearest ancestor's (the PDF's /Pg inheritance)."""
    out = []
    for node in tree:
        page = node.get("page_number", inherited)
        children = page_tree(node.get("children") or [], page_number, page)
        mcids = node.get("mcids") if page == page_number else None
        if children or mcids:
            out.append({"type": node.get("type", ""), "mcids": list(mcids or []), "children": children})
    return out


def _doubled_text(chars) -> bool:
    """Whether some text is drawn twice on the spot (a fake bold); pdfplumber's dedupe is slow, so
    it runs only then."""
    seen, doubled = set(), 0
    for c in chars:
        key = (c["text"], round(c["x0"]), round(c["top"]))
        doubled += key in seen
        seen.add(key)
    return doubled >= 10


def _has_ink(image: np.ndarray, box) -> bool:
    """Whether the rendered page shows anything under a word's box: text clipped by a page break,
    drawn in white or hidden under a figure is in the text layer but not on the page."""
    h, w = image.shape[:2]
    x0, y0 = max(0, int(box[0])), max(0, int(box[1]))
    x1, y1 = min(w, int(np.ceil(box[2]))), min(h, int(np.ceil(box[3])))
    if x1 <= x0 or y1 <= y0:
        return False
    crop = image[y0:y1, x0:x1].astype(np.int16)
    return bool((crop.max(axis=(0, 1)) - crop.min(axis=(0, 1))).max() > 40)


def read_page(plumber_page, scale: float, size: tuple[int, int], with_tables: bool = True,
              struct: list[dict] | None = None, image: np.ndarray | None = None) -> PdfPageContent:
    """Everything the labellers need from one pdfplumber page, mapped to a `size` (H, W) render;
    `struct` is the document's structure tree (`document_tree`), if it has one."""
    ox, oy = plumber_page.bbox[0], plumber_page.bbox[1]
    if _doubled_text(plumber_page.chars):
        plumber_page = plumber_page.dedupe_chars()  # text drawn twice for a fake bold reads once
    raw = plumber_page.extract_words(x_tolerance_ratio=0.18, y_tolerance=2, keep_blank_chars=False,
                                     extra_attrs=["size"], return_chars=True)
    words, unmapped = [], 0
    for w in raw:
        text = UNMAPPED_GLYPH.sub("", w["text"])
        if not _readable(text):
            # pieces of big delimiters and other private-use glyphs are not words, nor unmapped glyphs
            unmapped += text != w["text"]
            continue
        chars = w.get("chars") or []
        mcids = Counter(c.get("mcid") for c in chars)
        fonts = Counter(c.get("fontname", "") for c in chars)
        box = _to_px(w, ox, oy, scale)
        if image is not None and not _has_ink(image, box):
            continue
        words.append(Word(text=text, box=box, size=float(w["size"]),
                          font=fonts.most_common(1)[0][0] if fonts else "",
                          mcid=mcids.most_common(1)[0][0] if mcids else None))
    rules, graphics, graphics_mcid = [], [], []
    for obj in list(plumber_page.lines) + list(plumber_page.rects) + list(plumber_page.curves):
        box = _to_px(obj, ox, oy, scale)
        thin = min(box[2] - box[0], box[3] - box[1]) <= 2.0 * scale
        if thin and max(box[2] - box[0], box[3] - box[1]) > 4 * scale:
            rules.append(box)
        else:
            graphics.append(box)
            graphics_mcid.append(obj.get("mcid"))
    images = [_to_px(im, ox, oy, scale) for im in plumber_page.images]
    images_mcid = [im.get("mcid") for im in plumber_page.images]
    content = PdfPageContent(
        width=int(size[1]), height=int(size[0]), scale=scale, words=words, lines=[], rules=rules,
        graphics=graphics, graphics_mcid=graphics_mcid, images=images, images_mcid=images_mcid,
        chars=len(plumber_page.chars), unmapped_words=unmapped)
    content.lines = group_lines(words)
    if struct is not None:
        content.struct = page_tree(struct, plumber_page.page_number)
    if with_tables:
        content.table_grids = _tables(plumber_page, ox, oy, scale)
    return content


def _tables(plumber_page, ox, oy, scale) -> list[dict]:
    """Ruled tables (pdfplumber's line strategy): box and rows of cell boxes (None where merged)."""
    out = []
    try:
        tables = plumber_page.find_tables()
    except Exception:
        return out
    for t in tables:
        rows = []
        for row in t.rows:
            rows.append([None if c is None else _to_px(
                {"x0": c[0], "top": c[1], "x1": c[2], "bottom": c[3]}, ox, oy, scale) for c in row.cells])
        out.append({"box": _to_px({"x0": t.bbox[0], "top": t.bbox[1], "x1": t.bbox[2], "bottom": t.bbox[3]},
                                  ox, oy, scale), "rows": rows})
    return out


def group_lines(words: list[Word]) -> list[Line]:
    """Words into lines: rows of words whose vertical centres agree (fonts of different heights on one
    baseline included), each row split where a horizontal gap is wider than ~1.5 em (a column gap)."""
    order = sorted(range(len(words)), key=lambda i: (words[i].box[1] + words[i].box[3]) / 2)
    rows: list[list[int]] = []
    row_centre = row_height = 0.0
    for i in order:
        b = words[i].box
        h, centre = max(b[3] - b[1], 1.0), (b[1] + b[3]) / 2
        if rows and abs(centre - row_centre) <= 0.35 * min(h, row_height) + 0.5:
            rows[-1].append(i)
            n = len(rows[-1])
            row_centre += (centre - row_centre) / n
            row_height = max(row_height, h)
        else:
            rows.append([i])
            row_centre, row_height = centre, h
    out = []
    for row in rows:
        row.sort(key=lambda i: words[i].box[0])
        current = [row[0]]
        for prev, nxt in zip(row, row[1:]):
            em = max(words[prev].box[3] - words[prev].box[1], words[nxt].box[3] - words[nxt].box[1], 1.0)
            if words[nxt].box[0] - words[prev].box[2] > 1.5 * em:
                out.append(_line(words, current))
                current = []
            current.append(nxt)
        out.append(_line(words, current))
    out.sort(key=lambda line: (line.box[1], line.box[0]))
    return out


def _line(words: list[Word], ids: list[int]) -> Line:
    boxes = np.array([words[i].box for i in ids])
    return Line(ids, (float(boxes[:, 0].min()), float(boxes[:, 1].min()), float(boxes[:, 2].max()),
                      float(boxes[:, 3].max())), float(np.median([words[i].size for i in ids])))
