"""Ink on a page that no word read covers, cut into text-sized pieces to be read again one by one.

Tesseract's page layout drops a lone short word far from any other text — a page number at the
margin — with the specks: on the scanned own split it read 48 % of the page numbers against 93-94 %
of the paragraphs, list items and code. Read again from a crop of the piece alone as one text line,
the digit comes back (docs/finetune.md, "Page numbers tesseract dropped, read from their ink").

    pieces = unread_pieces(grey, ink_boxes)     # [K, 4] x0, y0, x1, y1 in grey's pixels
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage

from dociq.data.ruling_lines import otsu_threshold

# A piece is text-sized when its ink is this many times the median word's ink height, and at most
# MAX_WIDTH heights wide (longer pieces are drawings or rules, not a word tesseract skipped).
MIN_HEIGHT, MAX_HEIGHT, MAX_WIDTH = 0.5, 1.6, 20.0
# Letters closer than this share of the ink height are one piece; ink within it of a word is the word's.
JOIN = 0.6
# A page with more unread pieces than this is a drawing or a photograph: its pieces are not text.
MAX_PIECES = 12


def unread_pieces(grey: np.ndarray, ink_boxes: np.ndarray) -> np.ndarray:
    """float [K, 4]: boxes (x0, y0, x1, y1, pixels of `grey`) of the text-sized pieces of ink
    that none of the words read (`ink_boxes`, their glyph-tight boxes) covers, top to bottom; none
    when the page has no words to size them by or more than MAX_PIECES of them."""
    ink_boxes = np.asarray(ink_boxes, np.float64).reshape(-1, 4)
    if not len(ink_boxes):
        return np.zeros((0, 4))
    height = float(np.median(ink_boxes[:, 3] - ink_boxes[:, 1]))
    reach = max(1, round(JOIN * height))
    ink = grey <= otsu_threshold(grey)             # Otsu: levels up to the threshold are the dark class
    covered = np.zeros_like(ink)
    for x0, y0, x1, y1 in ink_boxes.round().astype(int):
        covered[max(0, y0 - reach):y1 + reach, max(0, x0 - reach):x1 + reach] = True
    ink &= ~covered
    joined = ndimage.binary_dilation(ink, structure=np.ones((1, 2 * reach + 1), bool))
    labels, _ = ndimage.label(joined)
    pieces = []
    for k, where in enumerate(ndimage.find_objects(labels), 1):
        own = ink[where] & (labels[where] == k)
        rows, cols = np.flatnonzero(own.any(1)), np.flatnonzero(own.any(0))
        if not len(rows):
            continue
        y0, y1 = where[0].start + rows[0], where[0].start + rows[-1] + 1
        x0, x1 = where[1].start + cols[0], where[1].start + cols[-1] + 1
        tall = (y1 - y0) / height
        if MIN_HEIGHT <= tall <= MAX_HEIGHT and (x1 - x0) <= MAX_WIDTH * height:
            pieces.append([x0, y0, x1, y1])
    if len(pieces) > MAX_PIECES:
        return np.zeros((0, 4))
    return np.array(sorted(pieces, key=lambda b: (b[1], b[0])), np.float64).reshape(-1, 4)
