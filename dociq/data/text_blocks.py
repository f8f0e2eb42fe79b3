"""Text lines and blocks from OCR word boxes alone: the page's reading structure by geometry.

A document region a user means — a paragraph, a list item, a heading, a code listing — is a block
of lines of words. The words' boxes are known exactly at any resolution, so the blocks are found
from them, not from pixels: `group_lines` joins words that overlap vertically and splits at wide
gaps (column gutters, table cells); `group_blocks` joins lines whose spacing, height and column
match, and starts a new block at a bullet or an enumerator. `dociq segment-page` seeds its text
regions with the blocks, and `word_snap.snap_to_blocks` completes a mask to the blocks it covers.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from scipy import ndimage


# A scan's skew, as the slope of its text lines: looked for up to 3 degrees, ignored under 0.15.
MAX_SKEW, MIN_SKEW = 0.052, 0.0026
SKEW_CHUNK = 256                  # words paired with every other word at a time


def skew_slope(boxes: np.ndarray) -> float:
    """The slope (dy / dx) of a page's text lines, 0 for a level page: the most common slope between
    words of one line — pairs at least two word heights apart whose centres rise by at most
    MAX_SKEW of their distance; slopes under MIN_SKEW count as level."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    heights = boxes[:, 3] - boxes[:, 1]
    slopes, weights = [], []
    for start in range(0, len(boxes), SKEW_CHUNK):     # pairs a chunk of words at a time: bounded memory
        rows = slice(start, start + SKEW_CHUNK)
        dx = centres[None, :, 0] - centres[rows, None, 0]
        dy = centres[None, :, 1] - centres[rows, None, 1]
        near = np.minimum(heights[rows, None], heights[None, :])
        pairs = (dx >= 2 * near) & (np.abs(dy) <= MAX_SKEW * dx + 0.25 * near)
        slopes.append(dy[pairs] / dx[pairs])
        weights.append(dx[pairs])
    slopes, weights = np.concatenate(slopes), np.concatenate(weights)
    if len(slopes) < 5:
        return 0.0
    counts, edges = np.histogram(slopes, bins=40, range=(-MAX_SKEW - 0.01, MAX_SKEW + 0.01), weights=weights)
    peak = (edges[counts.argmax()] + edges[counts.argmax() + 1]) / 2
    slope = float(np.median(slopes[np.abs(slopes - peak) <= 0.004]))
    return slope if abs(slope) >= MIN_SKEW else 0.0


def level_boxes(word_boxes: np.ndarray, slope: float) -> np.ndarray:
    """float64 [N, 4]: the boxes moved as the page would put them with its text lines level — each
    box raised by `slope` (dy / dx, `skew_slope`) times its centre's x. Two degrees across a 600-px
    column move a line's last word 21 px below its first, more than a line's pitch, so on a
    skewed scan lines and blocks are grouped from these."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4).copy()
    if slope:
        shift = slope * (boxes[:, 0] + boxes[:, 2]) / 2
        boxes[:, 1] -= shift
        boxes[:, 3] -= shift
    return boxes


def line_marks(boxes: np.ndarray) -> np.ndarray:
    """bool [N]: the marks among one line's words — less than a third of the line's vertical extent
    tall and narrower than half of it: leader dots, commas, hyphens (a lowercase word such as "on"
    is about half the extent tall, and wider)."""
    extent = boxes[:, 3].max() - boxes[:, 1].min()
    return ((boxes[:, 3] - boxes[:, 1]) < extent / 3) & ((boxes[:, 2] - boxes[:, 0]) < extent / 2)


def line_height(boxes: np.ndarray) -> float:
    """The height of a text line: the median height of its words, punctuation (`line_marks`) left out."""
    heights = boxes[:, 3] - boxes[:, 1]
    tall = heights[~line_marks(boxes)]
    return max(float(np.median(tall if len(tall) else heights)), 1.0)


# A word this many times its row's text height is no text of the row: a frame's side or a rule an
# OCR read as a glyph, a drop capital. Its box would join the rows of several lines into one.
TALL_WORD = 2.5
# A word this many times its row's text height may be one an OCR boxed across two lines.
BRIDGE_WORD = 1.8


def _rows(boxes: np.ndarray, ids: np.ndarray, min_overlap: float) -> list[list[int]]:
    """The words `ids` joined into rows: each joins the row it overlaps most vertically, when that
    overlap is at least `min_overlap` of the shorter of the two heights."""
    order = ids[np.argsort((boxes[ids, 1] + boxes[ids, 3]) / 2, kind="stable")]
    spans = np.zeros((len(ids), 2))  # y0, y1 of each row so far
    rows: list[list[int]] = []
    for i in order:
        y0, y1 = boxes[i, 1], boxes[i, 3]
        top, bottom = spans[:len(rows), 0], spans[:len(rows), 1]
        share = (np.minimum(y1, bottom) - np.maximum(y0, top)) / np.maximum(np.minimum(y1 - y0, bottom - top), 1.0)
        best = int(share.argmax()) if len(rows) else -1     # the first row of the largest overlap
        if best < 0 or not (share[best] >= min_overlap and share[best] > 0):
            spans[len(rows)] = y0, y1
            rows.append([int(i)])
        else:
            spans[best] = min(spans[best, 0], y0), max(spans[best, 1], y1)
            rows[best].append(int(i))
    return rows


def _without_tall_words(boxes: np.ndarray, row: list[int], min_overlap: float) -> list[list[int]]:
    """A row without its words taller than TALL_WORD x its text height (`line_height`): each of
    those a row of its own, the others joined into rows again without them. A word over
    BRIDGE_WORD x the text height that joined two rows into one (an OCR's box two lines tall) is
    set apart too, then joins the row it overlaps most."""
    ids = np.asarray(row)
    heights, text = boxes[ids, 3] - boxes[ids, 1], line_height(boxes[ids])
    tall, bridge = heights > TALL_WORD * text, heights > BRIDGE_WORD * text
    if not bridge.any() or bridge.all():
        return [row]
    rows = _rows(boxes, ids[~bridge], min_overlap)
    if len(rows) == 1:                        # the tall-ish words joined no rows: they stay in it
        rows = [[int(i) for i in ids[~tall]]]
    else:
        for i in ids[bridge & ~tall]:
            overlap = [min(boxes[i, 3], boxes[r, 3].max()) - max(boxes[i, 1], boxes[r, 1].min()) for r in rows]
            rows[int(np.argmax(overlap))].append(int(i))
    return [[int(i)] for i in ids[tall]] + rows


def group_lines(word_boxes: np.ndarray, min_overlap: float = 0.5, gap_factor: float = 1.5,
                marks: np.ndarray | None = None) -> list[list[int]]:
    """Word indices per text line, each line left to right, lines top to bottom.

    A word joins the line it overlaps most vertically, when that overlap is at least `min_overlap`
    of the shorter of the two heights; a word over TALL_WORD x its line's text height (a frame's
    side an OCR read as "|") is set apart and the line's other words joined again without it, else
    its box joins the lines of both columns beside it. A line is then split where the horizontal gap between two
    neighbours exceeds `gap_factor` x the line's median word height (column gutters, table
    cells), which is far wider than a space between words. Punctuation (`line_marks`) neither
    sets the line height nor opens a gap, so a contents line's dot leaders stay one line; `marks`
    (bool [N], e.g. `leader_words`) names more words that open no gap — leader dots whose boxes
    are as tall as the line's letters."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    lines = [row for joined in _rows(boxes, np.arange(len(boxes)), min_overlap)
             for row in _without_tall_words(boxes, joined, min_overlap)]
    out = []
    for line in lines:
        line.sort(key=lambda k: boxes[k, 0])
        height = line_height(boxes[line])
        short = dict(zip(line, line_marks(boxes[line]) | (False if marks is None else np.asarray(marks)[line])))
        part = [line[0]]
        for prev, k in zip(line, line[1:]):
            # a gap next to punctuation is a leader's, not a gutter
            if boxes[k, 0] - boxes[prev, 2] > gap_factor * height and not (short[prev] or short[k]):
                out.append(part)
                part = []
            part.append(k)
        out.append(part)
    out.sort(key=lambda ids: (boxes[ids, 1].min(), boxes[ids, 0].min()))
    return out


def line_extents(boxes: np.ndarray, lines: Sequence[Sequence[int]]) -> np.ndarray:
    """float [L, 4]: x0, y0, x1, y1 around the words of each line (word indices into boxes [N, 4])."""
    return np.array([[boxes[ln, 0].min(), boxes[ln, 1].min(), boxes[ln, 2].max(), boxes[ln, 3].max()]
                     for ln in lines]).reshape(-1, 4)


def line_points(word_boxes: np.ndarray, **grouping) -> np.ndarray:
    """float [L, 2] pixel (x, y): one click per text line, the centre of the word nearest the line's
    middle (on ink, where a click on a line lands)."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    points = []
    for ids in group_lines(boxes, **grouping):
        b = boxes[ids]
        middle = (b[:, 0].min() + b[:, 2].max()) / 2
        centres = (b[:, :2] + b[:, 2:]) / 2
        points.append(centres[np.argmin(np.abs(centres[:, 0] - middle))])
    return np.asarray(points, dtype=np.float32).reshape(-1, 2)


# An enumerator or bullet opening a line starts a new block: list items sit as close as lines.
# Leader dots as a text layer spells them: a contents line's dots, one or several to a word.
_LEADER = re.compile(r"^[.\u00b7\u2026\u2025]+$")
# A line with at least this many leader words ends a contents entry.
LEADER_DOTS = 3
# Ink differs from the paper by more than this (0-255) in some channel; a rendered glyph's
# anti-aliased edge is under it, a code listing's light grey shading (~8) far under it.
INK_CONTRAST = 40
_ITEM_OPENER = re.compile(r"^([\u2022\u2023\u25e6\u2043\u2219\u00b7*\u2013-]|\(?[0-9]{1,3}[.)]|\(?[a-zA-Z][.)]|[ivxIVX]{1,4}[.)])$")
# A heading's number ("5", "5.3", "A.2.1.") sets its title apart by a wide space, as a cell's gap does.
_SECTION_NUMBER = re.compile(r"^([0-9]{1,3}(\.[0-9]{1,3})*|[A-Z](\.[0-9]{1,3})+)\.?$")


def opens_list_item(word: str) -> bool:
    """Whether a line opening with `word` opens a list item: a bullet or an enumerator ("•", "3.", "b)")."""
    return bool(_ITEM_OPENER.match(str(word).strip()))


# What tesseract reads a typeset bullet ("•", "◦", "▪") as, alone at the head of a line: on scanned
# manual pages these open list items at least twice as often as they start other lines ("=", "."
# and "@" open code lines more often, and stay out).
BULLET_READINGS = frozenset("e o \u00ab \u00bb \u00a9 \u00ae \u00a2 + \u2014 \u00b0".split())


def read_bullets(words: Sequence[str] | None, count: int = 0) -> np.ndarray:
    """bool [N]: the words an OCR engine may have read from a bullet (BULLET_READINGS)."""
    if words is None:
        return np.zeros(count, bool)
    return np.array([str(w).strip() in BULLET_READINGS for w in words], bool)


def numbering_words(words: Sequence[str] | None, count: int = 0) -> np.ndarray:
    """bool [N]: the words that can number what follows them on a line: a bullet, a list item's
    enumerator ("3.", "b)", "iv.") or a heading's number ("5.3", "A.1")."""
    if words is None:
        return np.zeros(count, bool)
    stripped = [str(w).strip() for w in words]
    return np.array([bool(_ITEM_OPENER.match(w) or _SECTION_NUMBER.match(w)) for w in stripped], bool)


def leader_words(words: Sequence[str] | None, count: int = 0) -> np.ndarray:
    """bool [N]: the words that are leader dots ('.', '·', '…' and runs of them), as a contents
    line's text layer spells its leaders."""
    if words is None:
        return np.zeros(count, bool)
    return np.array([bool(_LEADER.match(str(w).strip())) for w in words], bool)


LEADING_MARGIN = 0.25       # a paragraph's gap exceeds the page's line spacing by more than this, in lines
RUN_WIDTH = 25              # a run measuring the leading is at least this many line heights wide


RAGGED_PAIRS = 8            # pairs of lines a ragged page's leading is measured on, at least


def line_spacing(spans: np.ndarray, heights: np.ndarray | None = None, min_pairs: int = 3,
                 ragged: bool = False) -> float | None:
    """The page's own leading: the median gap, in line heights, between the lines of runs of at
    least three lines one under the other with the same extent (left and right edges within half
    a line, at least 25 lines wide) — a justified paragraph's inner lines; two lines that merely
    happen to end alike (two list items, two notes) make no run. `spans` [L, 4] x0, y0, x1, y1 per
    line, `heights` [L] (default: the spans'). None with fewer than `min_pairs` gaps in such runs
    (ragged text, a page of single lines): nothing to measure.
    With `ragged`, a page without such runs (ragged right) is measured too: every line that starts
    where the line above it starts, under a line 25 heights wide, gives a gap, and the leading is
    the lower quartile of at least RAGGED_PAIRS of them — a paragraph's last line can be as wide as
    its others, so some gaps are paragraph breaks; the quartile is the leading while most are not."""
    spans = np.asarray(spans, dtype=np.float64).reshape(-1, 4)
    heights = spans[:, 3] - spans[:, 1] if heights is None else np.asarray(heights, dtype=np.float64)
    if ragged:
        justified = line_spacing(spans, heights, min_pairs)
        if justified is not None:                      # the surer measure, where the page has one
            return justified
    above = np.full(len(spans), -1)          # the line of the same extent directly above, if any
    for j in range(len(spans)):
        x0, y0, x1, _ = spans[j]
        overlap = np.minimum(spans[:, 2], x1) - np.maximum(spans[:, 0], x0)
        candidates = (spans[:, 3] <= y0 + 0.5 * heights[j]) & (overlap > 0)
        candidates[j] = False
        if not candidates.any():
            continue
        a = int(np.where(candidates, spans[:, 3], -np.inf).argmax())      # the nearest line above, any extent
        taller = max(heights[a], heights[j])
        same_extent = abs(spans[a, 0] - x0) <= 0.5 * taller and (ragged or abs(spans[a, 2] - x1) <= 0.5 * taller)
        wide = (spans[a, 2] - spans[a, 0] if ragged else x1 - x0) >= RUN_WIDTH * taller
        if same_extent and wide and taller <= 1.3 * max(min(heights[a], heights[j]), 1.0):
            above[j] = a
    if ragged:
        gaps = [(spans[j, 1] - spans[above[j], 3]) / max(heights[above[j]], heights[j]) for j in np.flatnonzero(above >= 0)]
        return float(np.quantile(gaps, 0.25)) if len(gaps) >= RAGGED_PAIRS else None
    in_run = (above >= 0) & ((above[np.maximum(above, 0)] >= 0) | np.isin(np.arange(len(spans)), above))
    gaps = [(spans[j, 1] - spans[above[j], 3]) / max(heights[above[j]], heights[j]) for j in np.flatnonzero(in_run)]
    return float(np.median(gaps)) if len(gaps) >= min_pairs else None


def paragraph_gap(spans: np.ndarray, heights: np.ndarray | None = None, default: float = 0.6,
                  ragged: bool = False) -> float:
    """The widest gap, in line heights, that still joins two lines of a block: `default`, unless
    the page's own `line_spacing` (measured on ragged-right pages too with `ragged`) is wider — a
    thesis set one-and-a-half or double spaced — when it is that spacing plus LEADING_MARGIN: its
    paragraphs stay whole, and still part where a gap exceeds the leading."""
    spacing = line_spacing(spans, heights, ragged=ragged)
    return default if spacing is None or spacing <= default else spacing + LEADING_MARGIN


def join_tests(prev: np.ndarray, prev_height: np.ndarray, span: np.ndarray, height: float,
               max_gap: float = 0.6, max_height_ratio: float = 1.3, min_x_overlap: float = 0.5,
               prev_opens: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """bool [B] per test of `group_blocks`: whether a line (its extent `span` x0, y0, x1, y1 and
    `height`) passes it against each block whose last line is `prev` [B, 4] of `prev_height` [B]
    — "below" (not reaching up into it), "near" (gap at most `max_gap` x the taller height),
    "height" (heights within `max_height_ratio`), "column" (sharing `min_x_overlap` of the
    narrower width) and, with `prev_opens` (bool [B]: the last line opens a list item), "not
    indented". A line joins a block that passes them all."""
    h0, h1 = prev_height, height
    taller = np.maximum(h0, h1)
    gap = span[1] - prev[:, 3]
    overlap = np.minimum(prev[:, 2], span[2]) - np.maximum(prev[:, 0], span[0])
    narrower = np.maximum(np.minimum(prev[:, 2] - prev[:, 0], span[2] - span[0]), 1.0)
    tests = {"below": -0.5 * np.minimum(h0, h1) <= gap, "near": gap <= max_gap * taller,
             "height": taller <= max_height_ratio * np.maximum(np.minimum(h0, h1), 1.0),
             "column": overlap >= min_x_overlap * narrower}
    if prev_opens is not None:
        centred = np.abs((span[0] + span[2]) - (prev[:, 0] + prev[:, 2])) / 2 <= taller
        tests["not indented"] = ~((span[0] - prev[:, 0] > taller) & ~centred & ~prev_opens)
    return tests


def group_blocks(word_boxes: np.ndarray, words: Sequence[str] | None = None, max_gap: float = 0.6,
                 max_height_ratio: float = 1.3, min_x_overlap: float = 0.5,
                 opens_item: np.ndarray | None = None, split_indented: bool = False,
                 split_entries: bool = False, word_heights: bool = False,
                 ends_entry: np.ndarray | None = None) -> list[list[int]]:
    """Word indices per text block (paragraph, list item, code listing, heading), top to bottom.

    Lines (`group_lines`) are joined top to bottom: a line joins the block whose last line is just
    above it, when the gap between them is at most `max_gap` x the line height (paragraph spacing
    is wider than line spacing), the two heights differ by at most `max_height_ratio` (a heading
    over body text), and they share at least `min_x_overlap` of the narrower width (same column).
    Where the page sets its lines further apart (`paragraph_gap`: one-and-a-half or double
    spacing), `max_gap` widens to the page's leading plus LEADING_MARGIN.
    A line whose first word is a bullet or an enumerator ("•", "3.", "b)"), or is marked in
    `opens_item` (bool [N]: a bullet drawn left of it, `drawn_bullets`), starts a new block.
    With `split_indented`, so does a line that starts more than its height right of the line above
    and is not centred under it — a definition's text under its term, a nested item, a reply —
    unless the line above opens a list item (an item's text wraps right of its bullet).
    With `split_entries`, a line holding LEADER_DOTS or more leader dots ends a contents entry: the
    next line starts a block (an entry that wraps keeps its lines up to the one with the leaders);
    so does a line holding a word marked in `ends_entry` (bool [N]: leaders drawn right of it, as
    an OCR leaves them out: `drawn_leaders`), whose gap to the page number opens no new line.
    With `word_heights`, a line's height is its words' (`line_height`), not its extent: an OCR's
    stray glyph, or one word whose box reaches towards the line below, stretches a line's extent
    to two lines, and a height test would set it apart from its paragraph; and the page's leading
    is measured on ragged-right pages too (`line_spacing`'s `ragged`): an OCR's word boxes are
    shorter than a text layer's font boxes, so an ordinary leading is a wider gap in their heights
    (0.6 to 0.8 of them on a browser-printed manual's pages)."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    leaders = leader_words(words, len(boxes)) if split_entries else np.zeros(len(boxes), bool)
    ends_entry = np.zeros(len(boxes), bool) if ends_entry is None else np.asarray(ends_entry, bool)
    lines = group_lines(boxes, marks=leaders | ends_entry)     # an entry's title and page number stay one line
    spans = line_extents(boxes, lines)
    heights = np.array([line_height(boxes[ln]) for ln in lines]) if word_heights else spans[:, 3] - spans[:, 1]
    max_gap = paragraph_gap(spans, heights, max_gap, ragged=word_heights)
    blocks: list[list[int]] = []
    last = np.zeros((len(lines), 4))       # x0, y0, x1, y1 of each block's last line
    last_opens = np.zeros(len(lines), bool)  # whether that line opens a list item
    last_ends = np.zeros(len(lines), bool)   # whether that line ends a contents entry
    last_height = np.zeros(len(lines))       # that line's height
    for line, span, height in zip(lines, spans, heights):
        ends = int(leaders[line].sum()) >= LEADER_DOTS or bool(ends_entry[line].any())
        opener = (words is not None and opens_list_item(words[line[0]])) \
            or (opens_item is not None and bool(opens_item[line[0]]))
        tests = join_tests(last[:len(blocks)], last_height[:len(blocks)], span, height, max_gap,
                           max_height_ratio, min_x_overlap, last_opens[:len(blocks)] if split_indented else None)
        joins = np.logical_and.reduce(list(tests.values())) & ~last_ends[:len(blocks)]
        if opener or not joins.any():
            last[len(blocks)], last_opens[len(blocks)], last_ends[len(blocks)] = span, opener, ends
            last_height[len(blocks)] = height
            blocks.append(list(line))
        else:
            best = int(np.where(joins, last[:len(blocks), 3], -np.inf).argmax())   # the lowest, the first of equals
            blocks[best].extend(line)
            last[best], last_opens[best], last_ends[best], last_height[best] = span, False, ends, height
    blocks.sort(key=lambda ids: (boxes[ids, 1].min(), boxes[ids, 0].min()))
    return blocks


def page_ink(image: np.ndarray, contrast: int = INK_CONTRAST) -> np.ndarray:
    """bool [H, W]: the pixels of a page (uint8 [H, W, 3] or [H, W]) that differ from its paper (the
    median colour) by more than `contrast` in some channel: text, drawings, pictures, shading
    darker than a code listing's light grey."""
    pixels = np.asarray(image, dtype=np.int16)
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    paper = np.median(pixels.reshape(-1, pixels.shape[-1])[:: max(1, pixels[..., 0].size // 100_000)], axis=0)
    return (np.abs(pixels - paper.astype(np.int16)) > contrast).any(-1)


def _dark_ink(image: np.ndarray, ink_below: float) -> np.ndarray:
    """bool [H, W]: the pixels of a page (uint8 [H, W, 3] or [H, W]) darker than `ink_below` x its
    median brightness (its paper)."""
    gray = np.asarray(image, dtype=np.float32)
    gray = gray.mean(-1) if gray.ndim == 3 else gray
    if gray.size == 0:
        return np.zeros(gray.shape, bool)
    return gray < ink_below * float(np.median(gray))


def _pieces_on_ink(image: np.ndarray, word_boxes: np.ndarray, ink_below: float) -> tuple:
    """The word boxes float64 [N, 4], the page's dark ink (`_dark_ink`) and its line pieces
    (`group_lines`), each with its height (`line_height`): none without words or a page."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    ink = _dark_ink(image, ink_below)
    if not len(boxes) or ink.size == 0:
        return boxes, ink, []
    return boxes, ink, [(piece, line_height(boxes[piece])) for piece in group_lines(boxes)]


def drawn_bullets(image: np.ndarray, word_boxes: np.ndarray, ink_below: float = 0.6,
                  reach: float = 2.0, max_size: float = 0.6) -> np.ndarray:
    """bool [N]: the words that open a list item whose bullet is drawn, not written — a CSS list
    marker or a typeset glyph that the text layer and OCR leave out, so the items of a list sit
    as close as a paragraph's lines. A line piece's first word opens an item when the strip left
    of it (up to `reach` x the line height, clear of other words) holds one blob of ink no larger
    than `max_size` x the line height either way, level with the line's middle.

    image uint8 [H, W] or [H, W, 3], the page the boxes [N, 4] are in pixels of; ink is darker than
    `ink_below` x the page's median brightness (its paper)."""
    boxes, ink, pieces = _pieces_on_ink(image, word_boxes, ink_below)
    out = np.zeros(len(boxes), bool)
    h_img, w_img = ink.shape
    for piece, height in pieces:
        b = boxes[piece]
        y0, y1 = int(b[:, 1].min()), int(np.ceil(b[:, 3].max()))
        x1 = int(boxes[piece[0], 0] - 0.1 * height)
        x0 = int(boxes[piece[0], 0] - reach * height)
        if x0 < 0 or x1 <= x0 or y1 <= y0 or y1 > h_img or x1 > w_img:
            continue
        others = (boxes[:, 2] > x0) & (boxes[:, 0] < x1) & (boxes[:, 3] > y0) & (boxes[:, 1] < y1)
        if others.any():                                  # a word in the strip: the piece continues a line
            continue
        labels, count = ndimage.label(ink[y0:y1, x0:x1])
        if count != 1:
            continue
        rows, cols = ndimage.find_objects(labels)[0]
        small = (rows.stop - rows.start) <= max_size * height and (cols.stop - cols.start) <= max_size * height
        middle = (rows.start + rows.stop) / 2
        level = abs(middle - (y1 - y0) / 2) <= 0.3 * (y1 - y0)
        out[piece[0]] = small and level and cols.start > 0
    return out


def drawn_leaders(image: np.ndarray, word_boxes: np.ndarray, ink_below: float = 0.6,
                  max_size: float = 0.35, reach: float = 40.0) -> np.ndarray:
    """bool [N]: the words a contents or index line's leader dots follow ("Usage . . . . 12"), seen
    on the `image` — an OCR reads the title and the page number and leaves the dots out, so the
    entries of a contents page sit as close as a paragraph's lines. A line piece's last word is
    followed by leaders when the strip right of it (to the next word of its row, or `reach` x the
    line height) holds at least LEADER_DOTS blobs of ink, each no larger than `max_size` x the
    line height either way and in the line's lower half, and nothing larger. `image`, `word_boxes`
    and `ink_below` as `drawn_bullets`'."""
    boxes, ink, pieces = _pieces_on_ink(image, word_boxes, ink_below)
    out = np.zeros(len(boxes), bool)
    h_img, w_img = ink.shape
    for piece, height in pieces:
        b = boxes[piece]
        last = piece[-1]
        y0, y1 = max(int(b[:, 1].min()), 0), min(int(np.ceil(b[:, 3].max())), h_img)
        x0 = int(np.ceil(boxes[last, 2] + 0.1 * height))
        level = (boxes[:, 1] < y1) & (boxes[:, 3] > y0) & (boxes[:, 0] > boxes[last, 2])
        x1 = int(min(boxes[level, 0].min() - 0.1 * height if level.any() else np.inf,
                     boxes[last, 2] + reach * height, w_img))
        if x1 - x0 < LEADER_DOTS * 0.5 * height or y1 <= y0:
            continue
        labels, count = ndimage.label(ink[y0:y1, x0:x1])
        if count < LEADER_DOTS:
            continue
        found = ndimage.find_objects(labels)
        small = all((r.stop - r.start) <= max_size * height and (c.stop - c.start) <= max_size * height
                    for r, c in found)
        low = sum((r.start + r.stop) / 2 >= (y1 - y0) / 2 for r, _ in found)
        out[last] = small and low >= LEADER_DOTS
    return out


MARKER_CHARS = 3          # a line's marker ("©", "w -", "N .") spells at most this many characters


def _marker_words(words: Sequence[str]) -> int:
    """How many of a line's first `words` read as a list item's marker an OCR made of a bullet or a
    number drawn in a badge: one word of at most two characters (not two letters: "if", "is"), or
    such a word and a punctuation mark ("w -", "uw ."), MARKER_CHARS characters in all; 0 if none."""
    first = str(words[0]).strip()
    if not 0 < len(first) <= 2 or len(words) < 2:
        return 0
    second = str(words[1]).strip()
    if len(words) > 2 and second and not any(c.isalnum() for c in second) and len(first) + len(second) <= MARKER_CHARS:
        return 2
    return 1 if len(first) == 1 or not first.isalpha() else 0


def hanging_markers(word_boxes: np.ndarray, words: Sequence[str] | None = None, align: float = 0.5,
                    max_gap: float = 1.0) -> np.ndarray:
    """bool [N]: the words that open a list item by its hanging indent: a line piece opens with a
    short marker (`_marker_words`) and the line just below it (at most `max_gap` x the line height
    under it, in its column) starts where the marker's text starts, within `align` x the line
    height — whatever the OCR read the bullet or the number as, the item's text wraps under
    itself, right of its marker. A paragraph's lines start flush with one another."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    out = np.zeros(len(boxes), bool)
    pieces = [] if words is None else group_lines(boxes)
    spans = line_extents(boxes, pieces)
    for piece, span in zip(pieces, spans):
        count = _marker_words([words[k] for k in piece[:3]])
        if not count:
            continue
        height = line_height(boxes[piece])
        text_x = boxes[piece[count], 0]
        gap = spans[:, 1] - span[3]
        below = (gap > -0.5 * height) & (gap <= max_gap * height) & (spans[:, 0] < span[2]) & (spans[:, 2] > text_x)
        if below.any():
            under = spans[int(np.where(below, spans[:, 1], np.inf).argmin())]
            out[piece[0]] = abs(under[0] - text_x) <= align * height and under[0] - span[0] > align * height
    return out


def item_openers(image: np.ndarray, word_boxes: np.ndarray, words: Sequence[str] | None = None,
                 ocr: bool = False) -> np.ndarray:
    """bool [N]: the words that open a list item by a bullet not written as one: drawn left of them
    (`drawn_bullets`), or, with `ocr` (the words are an OCR engine's), read as a letter (`read_bullets`)
    or as any short marker its item's text hangs right of (`hanging_markers`)."""
    opens = drawn_bullets(image, word_boxes)
    if ocr:
        opens |= read_bullets(words, len(opens)) | hanging_markers(word_boxes, words)
    return opens


def page_blocks(image: np.ndarray, word_boxes: np.ndarray, words: Sequence[str] | None = None,
                slope: float | None = None, ocr: bool = False) -> list[list[int]]:
    """The text blocks a reader sees on a page: `group_blocks` with the list items whose bullets are
    drawn on the `image` (`drawn_bullets`), indented lines (`split_indented`) and contents entries
    (`split_entries`) set apart, grouped as if the page's text lines were level (`level_boxes`;
    `slope` dy / dx, None: `skew_slope` of the words). With `ocr` (the words are an OCR engine's),
    lines are compared by their words' heights (`group_blocks`' `word_heights`), a bullet read as
    a letter opens an item (`read_bullets`) and leader dots the OCR left out end a contents entry
    (`drawn_leaders`). What masks are completed to and
    `segment-page` starts its text regions from; the model's own input (`collate`) groups the words
    alone, as it was trained."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    slope = skew_slope(boxes) if slope is None and len(boxes) else (slope or 0.0)
    return group_blocks(level_boxes(boxes, slope), words, opens_item=item_openers(image, boxes, words, ocr),
                        split_indented=True, split_entries=True, word_heights=ocr,
                        ends_entry=drawn_leaders(image, boxes) if ocr else None)


def block_boxes(word_boxes: np.ndarray, words: Sequence[str] | None = None,
                blocks: Sequence[Sequence[int]] | None = None, **grouping) -> np.ndarray:
    """float [K, 4] pixel boxes x0, y0, x1, y1 around the words of each text block: `blocks` (word
    indices, e.g. `page_blocks`), else `group_blocks` of the words."""
    boxes = np.asarray(word_boxes, dtype=np.float32).reshape(-1, 4)
    blocks = group_blocks(boxes, words, **grouping) if blocks is None else blocks
    out = [np.concatenate([boxes[ids, :2].min(0), boxes[ids, 2:].max(0)]) for ids in blocks]
    return np.asarray(out, dtype=np.float32).reshape(-1, 4)


def words_in_masks(word_boxes: np.ndarray, masks: Sequence[np.ndarray]) -> list[list[int]]:
    """For each mask bool [H, W], the indices of the words (boxes [N, 4] pixels) whose box centre
    lies in it."""
    if len(word_boxes) == 0:
        return [[] for _ in masks]
    cx = ((word_boxes[:, 0] + word_boxes[:, 2]) / 2).astype(int)
    cy = ((word_boxes[:, 1] + word_boxes[:, 3]) / 2).astype(int)
    out = []
    for m in masks:
        h, w = m.shape
        out.append(np.flatnonzero(m[cy.clip(0, h - 1), cx.clip(0, w - 1)]).tolist())
    return out
