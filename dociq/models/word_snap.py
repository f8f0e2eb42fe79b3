"""Masks drawn at word-box precision: snap a predicted mask's text parts to the OCR word boxes.

The mask decoder predicts at stride 4 of its input; on a real page at 256 px a text line is ~3 px
tall, so a mask's edges wander by a line. The words' boxes are known exactly, at any resolution.
Each connected part of a predicted mask that is mostly text is replaced by the bounding box of
the words it holds (a layout region — paragraph, list item, heading, cell — is the box around its
words); parts that are not mostly words (figures, rules, a region with a few labels) are kept as
predicted. `snap_to_blocks` goes one step further: it completes each text block (paragraph, list
item) the mask has a hold on, or a click lands in, to the whole block — the decoder often paints
the clicked or named line of a paragraph, not the paragraph. `paint_words` draws a mask from the
words alone: the boxes of the words the word grounding calls relevant, with the gaps between words
and lines closed.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import ndimage

from dociq.data.lexical import NO_MATCH, answer_quotes, match_matrix, names_text_unit, quoted_in_parts
from dociq.data.masks import mask_box
from dociq.data.text_blocks import (group_blocks, group_lines, leader_words, level_boxes, line_extents,
                                    numbering_words)

# A word belongs to a mask part when at least this share of its box is inside the mask ...
WORD_INSIDE = 0.5
# ... or when its box holds at least this share of the part: a part smaller than a word (a page
# number's digit is 6 px wide, under two cells of the decoder's stride-4 grid at 384 px) that lies
# mostly on one word means that word, however little of the word it covers.
PART_ON_WORD = 0.5
# A part is snapped when its words' bounding box holds at least this share of it; otherwise the
# part is not a text region (a figure with a caption inside, a drawing with labels).
TEXT_SHARE = 0.7
# A text block is completed when at least this share of its words are in the mask. On held-out
# real pages a quarter beat a half by 4 points on reading questions; a half keeps more of the
# decoder's own cut on forms and tables (docs/experiments.md, 2026-11-26, "Masks completed to text
# blocks").
BLOCK_SHARE = 0.25
# ... and holds at least this many of the block's words, or half of them.
MIN_HELD = 2
# A word ending in ':' followed on its line by a gap wider than this x the word's height is a form
# field's label: the value after it is a region of its own (a space between words is ~0.3 x).
LABEL_GAP = 0.6
# A gap between two words wider than this x the line height parts a table's cells (a space is
# ~0.3 x; on exact answers 0.6-0.8 score alike and 1.0 joins a narrow table's cells again:
# scripts/snap_fidelity.py).
CELL_GAP = 0.8
# A block with at least this many words ending in ':' is a form's fields: each such word is a label.
FORM_LABELS = 2
# A page with at least this many lines that open with a label (a word ending in ':' among their
# first LABEL_LEAD words), labels being LABEL_SHARE of its words or more, is a form: each label on
# it ends a unit, a lone "Name: Ada" block too. (Labels are a fifth of a browser-printed form's
# words, median; one in a hundred of a manual's, and above 8 % on 1-2 % of its pages.)
FORM_PAGE_LABELS, LABEL_LEAD, LABEL_SHARE = 4, 3, 0.08
# A drawing is a picture (a click on it means it) when words cover less than this share of its box;
# a frame or shading around text holds more (0.2 still took the Debian handbook's example boxes).
PICTURE_TEXT = 0.05
# Ink a box prompt frames, on its words' lines, is part of their region when no taller than this x
# the words' median height: a leader dot, a page number or a glyph the OCR missed; not a figure.
GLYPH_HEIGHT = 1.5
# A box prompt's side within this x the framed words' median height of their region is the region's
# edge (the box drawn tight around it); one farther off is a loose frame, and the words' edge stands.
BOX_SIDE_REACH = 0.15
# The gap (pixels) across which a drawing's pieces join, on a page without words to measure a line by.
DRAWING_GAP = 8
_EIGHT_NEIGHBOURS = np.ones((3, 3), dtype=bool)


def pixel_boxes(word_boxes: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """int [K, 4] word boxes as the pixels they touch (x0, y0 down, x1, y1 up), clipped to an [H, W]
    frame (empty boxes stay, zero-sized): a box is drawn as a target region is
    (`dociq.data.datasets.corpus.record.box_mask`), so that a word's mask is its target's, not a pixel short at each edge."""
    h, w = shape
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    boxes = np.concatenate([np.floor(boxes[:, :2] + 1e-6), np.ceil(boxes[:, 2:] - 1e-6)], 1).astype(np.int64)
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
    return boxes


def fill_unit(out: np.ndarray, word_boxes: np.ndarray, slope: float = 0.0) -> None:
    """Fill, in `out` (bool [H, W]), the region of a unit's words (boxes [n, 4] in `out`'s pixels) as a
    target region is drawn: the box around them, in the pixels it touches (`pixel_boxes`). On a page
    whose text lines rise by `slope` (dy / dx: a skewed scan) it is that box on the levelled page,
    each column's top and bottom risen with the line — a slanted band, as the skewed region is, where
    the upright box would add the line's rise above and below it."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not len(boxes):
        return
    h = out.shape[0]
    if not slope:
        x0, y0, x1, y1 = pixel_boxes(np.r_[boxes[:, :2].min(0), boxes[:, 2:].max(0)], out.shape)[0]
        out[y0:y1, x0:x1] = True
        return
    rise = slope * (boxes[:, 0] + boxes[:, 2]) / 2
    top, bottom = (boxes[:, 1] - rise).min(), (boxes[:, 3] - rise).max()
    c0, _, c1, _ = pixel_boxes(np.array([boxes[:, 0].min(), 0.0, boxes[:, 2].max(), 0.0]), out.shape)[0]
    if c1 <= c0:
        return
    column = slope * (np.arange(c0, c1) + 0.5)
    r0 = np.floor(top + column + 1e-6).clip(0, h).astype(np.int64)
    r1 = np.ceil(bottom + column - 1e-6).clip(0, h).astype(np.int64)
    lo, hi = int(r0.min()), int(r1.max())
    rows = np.arange(lo, hi)[:, None]
    out[lo:hi, c0:c1] |= (rows >= r0) & (rows < r1)


def _share_inside(mask: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """float [K]: the share of each (pixel, non-empty) box that the mask covers."""
    x0, y0, x1, y1 = boxes.T
    area = np.maximum((x1 - x0) * (y1 - y0), 1)
    tight = mask_box(mask)
    if tight is None:
        return np.zeros(len(boxes))
    # Integral image of the mask's bounding box (all of its pixels; a page-sized one costs 1,000x
    # more at 1,024 px): the pixel count inside each box, clipped to it, in O(1).
    c0, r0, c1, r1 = tight.astype(np.int64)
    integral = np.pad(mask[r0:r1, c0:c1].astype(np.int32).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    cx0, cx1 = (x0 - c0).clip(0, c1 - c0), (x1 - c0).clip(0, c1 - c0)
    cy0, cy1 = (y0 - r0).clip(0, r1 - r0), (y1 - r0).clip(0, r1 - r0)
    inside = integral[cy1, cx1] - integral[cy0, cx1] - integral[cy1, cx0] + integral[cy0, cx0]
    return inside / area


def _parts(mask: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The mask's connected parts, labelled inside its bounding box (every pixel of it, far fewer
    than the page's): (row, column of the box's corner, labels [h, w], the parts' sizes). The mask
    must not be empty (callers check: an empty mask has no parts and no box)."""
    c0, r0, c1, r1 = mask_box(mask).astype(np.int64)
    labels, count = ndimage.label(mask[r0:r1, c0:c1], structure=_EIGHT_NEIGHBOURS)
    return r0, c0, labels, np.bincount(labels.ravel(), minlength=count + 1)[1:]


def _part_under(labels: np.ndarray, box: np.ndarray) -> tuple[int, int]:
    """(label, pixels) of the mask part with the most pixels inside `box` (in the labels' frame);
    label 0 when none."""
    counts = np.bincount(labels[box[1]:box[3], box[0]:box[2]].ravel(), minlength=2)[1:]
    if not len(counts) or counts.max() == 0:
        return 0, 0
    return int(counts.argmax()) + 1, int(counts.max())


def word_members(mask: np.ndarray, boxes: np.ndarray, parts=None) -> np.ndarray:
    """bool [K]: the words (pixel boxes [K, 4]) the mask holds: at least WORD_INSIDE of the word's
    box inside the mask, or at least PART_ON_WORD of a mask part inside the word's box."""
    share = _share_inside(mask, boxes)
    members = share >= WORD_INSIDE
    partial = np.flatnonzero((share > 0) & ~members)
    if len(partial):
        r0, c0, labels, sizes = _parts(mask) if parts is None else parts
        for k in partial:
            local = (boxes[k] - np.array([c0, r0, c0, r0])).clip(min=0)
            part, held = _part_under(labels, local)
            members[k] = part > 0 and held >= PART_ON_WORD * sizes[part - 1]
    return members


def snap_to_words(mask: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """mask bool [H, W]; word_boxes [K, 4] x0, y0, x1, y1 in the mask's pixels (x1, y1
    exclusive) -> the snapped bool mask [H, W]. The input is not modified."""
    mask = np.asarray(mask, dtype=bool)
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not mask.any() or not len(boxes):
        return mask.copy()
    return _snapped(mask, pixel_boxes(boxes, mask.shape))[0]


def _snapped(mask: np.ndarray, boxes: np.ndarray, exact: np.ndarray | None = None,
             slope: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(the snapped mask, `word_members` bool [K]) of a non-empty mask and pixel boxes [K, 4] (an
    empty box is never a member: no share of it is inside); each part's words drawn by `fill_unit`
    from their `exact` boxes (default the pixel boxes) on a page whose lines rise by `slope`."""
    exact = boxes if exact is None else exact
    parts = _parts(mask)
    members = word_members(mask, boxes, parts)
    if not members.any():
        return mask.copy(), members
    r0, c0, labels, sizes = parts
    rows, cols = labels.shape
    local = (boxes[members] - np.array([c0, r0, c0, r0])).clip(min=0)
    # The part a word belongs to: the most common label over its box.
    part_of = np.array([_part_under(labels, b)[0] for b in local])
    out = mask.copy()
    inside = out[r0:r0 + rows, c0:c0 + cols]               # a view: cleared parts clear `out`
    for part in np.unique(part_of[part_of > 0]):
        words = boxes[members][part_of == part]
        drawn = exact[members][part_of == part]
        bx0, by0 = words[:, 0].min(), words[:, 1].min()
        bx1, by1 = words[:, 2].max(), words[:, 3].max()
        region = labels == part
        held = region[max(by0 - r0, 0):max(by1 - r0, 0), max(bx0 - c0, 0):max(bx1 - c0, 0)].sum()
        # a part smaller than its words' box cannot be a figure around them: it is a word-sized
        # blob, held as a word holds it (PART_ON_WORD)
        small = sizes[part - 1] < (bx1 - bx0) * (by1 - by0)
        if held < (PART_ON_WORD if small else TEXT_SHARE) * sizes[part - 1]:
            continue
        inside[region] = False
        fill_unit(out, drawn, slope)
    return out, members


def snap_to_blocks(mask: np.ndarray, word_boxes: np.ndarray, words: Sequence[str] | None = None,
                   clicks: np.ndarray | None = None, click_labels: np.ndarray | None = None,
                   box: np.ndarray | None = None, min_share: float = BLOCK_SHARE,
                   blocks: Sequence[Sequence[int]] | None = None, ink: np.ndarray | None = None,
                   drawings: np.ndarray | None = None, slope: float = 0.0) -> np.ndarray:
    """`snap_to_words`, then each text block the mask has a hold on is completed to the box around
    the block's words, and a box prompt's mask is kept inside its box. With the page's `ink`
    (`text_blocks.page_ink`), mask parts on blank paper are dropped first and a box prompt's
    drawings are answered whole; `drawings` (`picture_boxes`) are what a click off the text means.

    mask bool [H, W]; word_boxes [K, 4] and clicks [P, 2] (x, y) in the mask's pixels; words [K]
    (their text: a bullet or an enumerator starts a list item's block); click_labels [P] 1 positive,
    0 negative (default all positive); box [4] x0, y0, x1, y1 (x1, y1 exclusive), the prompt's box.
    A block (`text_blocks.group_blocks`) is completed when at least `min_share` of its words are
    in the mask, or when a positive click lands inside it (a click on a paragraph means the
    paragraph, not the line under the cursor); a block holding a negative click is never
    completed. `blocks` (word indices per block) saves regrouping the page's words for each of
    many masks. `slope`: how the page's text lines rise (dy / dx, `text_blocks.skew_slope`; a skewed
    scan's units are drawn along it, `fill_unit`). The input is not modified."""
    mask = np.asarray(mask, dtype=bool)
    if ink is not None and mask.any():
        mask = _on_ink(mask, ink)
    boxes = pixel_boxes(word_boxes, mask.shape)
    exact = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if mask.any() and len(boxes):
        out, members = _snapped(mask, boxes, exact, slope)
    else:
        out, members = mask.copy(), np.zeros(len(boxes), bool)
    clicks = np.zeros((0, 2)) if clicks is None else np.asarray(clicks, dtype=np.float64).reshape(-1, 2)
    positive = np.ones(len(clicks), bool) if click_labels is None else np.asarray(click_labels).reshape(-1) == 1
    on_text = np.zeros(len(clicks), bool)                  # clicks inside some text unit
    if len(boxes):
        # Grouped on the exact boxes (rounding a 3-px line to whole pixels changes which lines
        # join), levelled along a skewed scan's lines; drawn from the exact boxes along the slope.
        level = level_boxes(exact, slope)
        if blocks is None:
            blocks = group_blocks(level, words)
        values = field_values(level, words)
        leaders = leader_words(words, len(exact))
        framed = _inside_box(boxes, box)
        if framed.any():
            # a box prompt asks for one region, what it frames: its words are the answer's whether the
            # decoder painted them or not
            members = members | framed
            _fill_framed(out, np.flatnonzero(framed), boxes, exact, level, clicks[~positive], box, ink, slope)
        for ids in (unit for block in blocks for unit in field_units(block, level, words, values, leaders)):
            x0, y0 = boxes[ids, :2].min(0)
            x1, y1 = boxes[ids, 2:].max(0)
            inside = _clicks_in(clicks, x0, y0, x1, y1)
            on_text |= inside
            # a share of a big block, or most of a small one: one word of a three-word label that a
            # neighbour's mask brushes is not a hold on it
            held = members[ids].mean() >= min_share and (members[ids].sum() >= MIN_HELD or members[ids].mean() >= 0.5)
            if (held or (inside & positive).any()) and not (inside & ~positive).any():
                fill_unit(out, exact[ids], slope)
    if drawings is not None and len(drawings) and len(clicks):
        _click_drawings(out, clicks, positive, on_text, np.asarray(drawings).reshape(-1, 4))
    if box is not None:
        h, w = mask.shape
        x0, y0, x1, y1 = pixel_boxes(np.asarray(box), mask.shape)[0]
        if ink is not None and mask.any():
            out[y0:y1, x0:x1] |= _drawings(mask[y0:y1, x0:x1], ink[y0:y1, x0:x1], boxes - [x0, y0, x0, y0])
        keep = np.zeros((h, w), dtype=bool)
        keep[y0:y1, x0:x1] = True
        out &= keep
    return out


def keep_quoted(mask: np.ndarray, word_boxes: np.ndarray, words: Sequence[str], question: str,
                blocks: Sequence[Sequence[int]] | None = None, slope: float = 0.0) -> np.ndarray:
    """A question that quotes text its answer holds ("which paragraph mentions “under”?",
    "where does the section “1 Usage” start?": `lexical.answer_quotes`) is answered by a region
    holding it. Each quoted word's page words are its best matches on the page (exact, then
    case-folded, then one edit away: `lexical.match_code`), else those holding it as a letter run
    ("getbinval" in "SPI_getbinval": `lexical.quoted_in_parts`); a set of words holds as much of the
    quotation as the quoted words it has a match of. The mask's parts holding less than the best
    of them are dropped; when some text block (`blocks`, word indices) holds more of the quotation
    than any part, the mask is that block instead, if it is the only one. Unchanged when the page
    holds none of the quotation. A question that names a text unit ("which bullet point mentions
    “under”?": `lexical.names_text_unit`) is answered by one whole block: of those holding a match
    inside the kept mask, the one the mask covers most (the decoder often paints the quoted words
    alone, or a neighbour too). A block is drawn along the page's text lines (`slope`, dy / dx:
    `fill_unit`), as the skewed region of a scan is. mask bool [H, W]; word_boxes [K, 4] in its
    pixels; words [K]."""
    quoted = answer_quotes(question)
    if not quoted or not len(words):
        return mask
    codes, _ = match_matrix(" ".join(f"\u201c{w}\u201d" for w in quoted), list(words), len(quoted))
    found = (codes > NO_MATCH) & (codes == codes.max(1, keepdims=True))    # [J, K]: best matches per quoted word
    unmatched = ~found.any(1)
    found[unmatched] = quoted_in_parts([q for q, u in zip(quoted, unmatched) if u], list(words))
    if not found.any():
        return mask
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    h, w = mask.shape
    cx = np.clip(((boxes[:, 0] + boxes[:, 2]) / 2).astype(np.int64), 0, w - 1)
    cy = np.clip(((boxes[:, 1] + boxes[:, 3]) / 2).astype(np.int64), 0, h - 1)
    labels, count = ndimage.label(mask, structure=_EIGHT_NEIGHBOURS)
    part_of = labels[cy, cx]                                             # [K], 0: outside the mask
    held = np.zeros((count + 1, len(found)), bool)                       # parts x quoted words
    for j in range(len(found)):
        held[part_of[found[j]], j] = True
    part_score = held[1:].sum(1)
    block_score = np.array([found[:, list(b)].any(1).sum() for b in (blocks or [])], np.int64)
    best_part = part_score.max() if count else 0
    if len(block_score) and block_score.max() > best_part and (block_score == block_score.max()).sum() == 1:
        return _unit_mask(boxes[list(blocks[int(block_score.argmax())])], mask.shape, slope)
    kept = mask if best_part == 0 else np.isin(labels, np.flatnonzero(part_score == best_part) + 1)
    if blocks and names_text_unit(question):
        inside = kept[cy, cx]
        holding = sorted({b for b, ids in enumerate(blocks) if (found[:, list(ids)].any(0) & inside[list(ids)]).any()})
        if holding:
            covered = [inside[list(blocks[b])].mean() for b in holding]
            return _unit_mask(boxes[list(blocks[holding[int(np.argmax(covered))]])], mask.shape, slope)
    return kept


def _unit_mask(word_boxes: np.ndarray, shape: tuple[int, int], slope: float = 0.0) -> np.ndarray:
    """bool [H, W]: the region of a unit's words, drawn as `fill_unit` draws it."""
    out = np.zeros(shape, bool)
    fill_unit(out, word_boxes, slope)
    return out


def _clicks_in(clicks: np.ndarray, x0, y0, x1, y1) -> np.ndarray:
    """bool [P]: the clicks [P, 2] (x, y) inside the rectangle x0, y0, x1, y1 (x1, y1 exclusive)."""
    return (clicks[:, 0] >= x0) & (clicks[:, 0] < x1) & (clicks[:, 1] >= y0) & (clicks[:, 1] < y1)


def _on_ink(mask: np.ndarray, ink: np.ndarray) -> np.ndarray:
    """The mask without its parts that hold no ink (blobs on blank paper: nothing a region of a
    page can be), unless every part is blank."""
    r0, c0, labels, sizes = _parts(mask)
    rows, cols = labels.shape
    inked = np.bincount(labels[ink[r0:r0 + rows, c0:c0 + cols]], minlength=len(sizes) + 1)[1:] > 0
    if inked.all() or not inked.any():
        return mask
    out = mask.copy()
    out[r0:r0 + rows, c0:c0 + cols] &= np.isin(labels, np.flatnonzero(inked) + 1)
    return out


def _click_drawings(out: np.ndarray, clicks: np.ndarray, positive: np.ndarray, on_text: np.ndarray,
                    drawings: np.ndarray) -> None:
    """Fill, in `out`, the smallest picture (`picture_boxes`, pixel boxes [D, 4]) under each positive
    click that lands off the text: a click on a plot means the plot, as a click on a paragraph means
    the paragraph. A picture holding a negative click is never filled."""
    x, y = clicks[:, 0:1], clicks[:, 1:2]
    under = (x >= drawings[:, 0]) & (x < drawings[:, 2]) & (y >= drawings[:, 1]) & (y < drawings[:, 3])   # [P, D]
    vetoed = under[~positive].any(0)
    area = (drawings[:, 2] - drawings[:, 0]) * (drawings[:, 3] - drawings[:, 1])
    for p in np.flatnonzero(positive & ~on_text):
        hits = np.flatnonzero(under[p] & ~vetoed)
        if len(hits):
            x0, y0, x1, y1 = drawings[hits[area[hits].argmin()]]
            out[y0:y1, x0:x1] = True


def ink_off_words(ink: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """bool [h, w]: the ink map (`text_blocks.page_ink`) with every word's box (page pixels, [K, 4])
    and a pixel past it (its glyphs' anti-aliasing) erased — what is drawn, not written."""
    drawn = np.asarray(ink, dtype=bool).copy()
    h, w = drawn.shape
    word_boxes = np.round(np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)).astype(np.int64)
    near = (word_boxes[:, 2] >= 0) & (word_boxes[:, 3] >= 0) & (word_boxes[:, 0] < w) & (word_boxes[:, 1] < h)
    for bx0, by0, bx1, by1 in word_boxes[near].clip(min=0):
        drawn[by0:by1 + 1, bx0:bx1 + 1] = False
    return drawn


def drawing_boxes(ink: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """int [D, 4] x0, y0, x1, y1 (exclusive) of the drawings in an ink map (bool [h, w],
    `text_blocks.page_ink`) with word boxes [K, 4] in its pixels: ink off every word (a
    figure, a plot, a diagram, a rule, a shaded bar), its pieces joined across gaps up to a line's
    height (the median word height), each drawing boxed by its own ink."""
    drawn = ink_off_words(ink, word_boxes)
    if not drawn.any():
        return np.zeros((0, 4), np.int64)
    word_boxes = np.round(np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)).astype(np.int64)
    heights = word_boxes[:, 3] - word_boxes[:, 1]
    gap = int(np.median(heights[heights > 0])) if (heights > 0).any() else DRAWING_GAP
    # a square dilation, as a separable maximum filter (3x faster on a page-sized box)
    joined, _ = ndimage.label(ndimage.maximum_filter(drawn, size=gap), structure=_EIGHT_NEIGHBOURS)
    # each drawing's box is its own ink's, not the dilation's
    return np.array([[c.start, r.start, c.stop, r.stop]
                     for r, c in filter(None, ndimage.find_objects(np.where(drawn, joined, 0)))], np.int64).reshape(-1, 4)


def text_shares(drawings: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """float [D]: the share of each drawing's box (int [D, 4]) that the words whose centres lie
    inside cover."""
    drawings = np.asarray(drawings).reshape(-1, 4)
    words = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    cx, cy = (words[:, 0] + words[:, 2]) / 2, (words[:, 1] + words[:, 3]) / 2
    area = (words[:, 2] - words[:, 0]) * (words[:, 3] - words[:, 1])
    return np.array([area[(cx >= x0) & (cx < x1) & (cy >= y0) & (cy < y1)].sum() / max((x1 - x0) * (y1 - y0), 1)
                     for x0, y0, x1, y1 in drawings], np.float64)


def picture_boxes(drawings: np.ndarray, word_boxes: np.ndarray, max_text: float = PICTURE_TEXT) -> np.ndarray:
    """The drawings (int [D, 4]) that are pictures — plots, diagrams, photographs — not frames or
    shading around text: the words whose centres lie inside cover less than `max_text` of the box."""
    drawings = np.asarray(drawings).reshape(-1, 4)
    return drawings[text_shares(drawings, word_boxes) < max_text] if len(drawings) else drawings


def _drawings(mask: np.ndarray, ink: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """bool [h, w]: the boxes of the drawings (`drawing_boxes`) whose box holds some of the mask —
    a figure drawn whole where the decoder paints a few blobs of it. All in one frame (a box
    prompt's crop)."""
    out = np.zeros_like(mask)
    for x0, y0, x1, y1 in drawing_boxes(ink, word_boxes):
        if mask[y0:y1, x0:x1].any():
            out[y0:y1, x0:x1] = True
    return out


def _fill_framed(out: np.ndarray, framed_ids: np.ndarray, boxes: np.ndarray, exact: np.ndarray, level: np.ndarray,
                 negative: np.ndarray, box: np.ndarray, ink: np.ndarray | None, slope: float) -> None:
    """Fill, in `out`, the region a box prompt frames: all its words (`framed_ids` into the pixel
    `boxes`, `exact` and levelled `level` word boxes) as one region — a code listing's ragged lines,
    a list's items: one rectangle — but a line holding a `negative` click [P, 2], as far as the
    text-sized ink it frames on their lines reaches (a contents entry's leaders and page number, a
    glyph the OCR did not read: `_framed_glyphs`), its edges at the box's sides drawn close to it
    (`_to_box_sides`)."""
    kept = []
    for line in group_lines(level[framed_ids], gap_factor=np.inf):
        ids = framed_ids[line]
        x0, y0 = boxes[ids, :2].min(0)
        x1, y1 = boxes[ids, 2:].max(0)
        if not _clicks_in(negative, x0, y0, x1, y1).any():
            kept.extend(ids)
    if not kept:
        return
    ids = np.array(kept)
    glyphs = _framed_glyphs(ink, box, exact[ids]) if ink is not None else np.zeros((0, 4))
    line_height = np.median(exact[ids, 3] - exact[ids, 1])
    fill_unit(out, _to_box_sides(np.r_[exact[ids], _on_lines(glyphs, level[ids], slope)], box,
                                 BOX_SIDE_REACH * line_height), slope)


def _framed_glyphs(ink: np.ndarray, box: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """float [G, 4]: the boxes (page pixels) of the ink blobs inside a prompt's box that are no
    taller than GLYPH_HEIGHT x the median of the framed words' heights — dots, digits, glyphs; not
    a figure or a rule's length of ink."""
    x0, y0, x1, y1 = pixel_boxes(np.asarray(box, dtype=np.float64), ink.shape)[0]
    heights = word_boxes[:, 3] - word_boxes[:, 1]
    labels, _ = ndimage.label(ink[y0:y1, x0:x1], structure=_EIGHT_NEIGHBOURS)
    blobs = np.array([[c.start, r.start, c.stop, r.stop] for r, c in filter(None, ndimage.find_objects(labels))],
                     np.float64).reshape(-1, 4)
    small = (blobs[:, 3] - blobs[:, 1]) <= GLYPH_HEIGHT * np.median(heights)
    return blobs[small] + [x0, y0, x0, y0]


def _on_lines(glyphs: np.ndarray, level_words: np.ndarray, slope: float) -> np.ndarray:
    """The glyph boxes whose centre, levelled along the page's lines, lies within the vertical span
    of some of the (levelled) word boxes' lines."""
    if not len(glyphs):
        return glyphs
    centre = (level_boxes(glyphs, slope)[:, 1:4:2].sum(1) / 2)[:, None]
    on = ((centre >= level_words[:, 1]) & (centre < level_words[:, 3])).any(1)
    return glyphs[on]


def _to_box_sides(boxes: np.ndarray, box: np.ndarray, reach: float) -> np.ndarray:
    """The boxes [n, 4] of one region's words and glyphs, those at its edges moved out to each side of
    the prompt's box that lies within `reach` px of the region: a side drawn that close is where the
    user puts the region's edge (a region is drawn around its font's height, not its ink); a side
    drawn farther off is only a loose frame."""
    bx0, by0, bx1, by1 = np.asarray(box, dtype=np.float64).reshape(4)
    gaps = np.array([boxes[:, 0].min() - bx0, boxes[:, 1].min() - by0, bx1 - boxes[:, 2].max(), by1 - boxes[:, 3].max()])
    grow = np.where((gaps > 0) & (gaps <= reach), gaps, 0.0)
    return boxes + grow * [-1, -1, 1, 1]


def _inside_box(boxes: np.ndarray, box: np.ndarray | None) -> np.ndarray:
    """bool [K]: the (pixel) word boxes with at least WORD_INSIDE of their area inside a prompt's
    box (none without a box)."""
    if box is None:
        return np.zeros(len(boxes), bool)
    bx0, by0, bx1, by1 = np.asarray(box, dtype=np.float64).reshape(4)
    x0, y0, x1, y1 = boxes.T.astype(np.float64)
    w = (np.minimum(x1, bx1) - np.maximum(x0, bx0)).clip(min=0)
    h = (np.minimum(y1, by1) - np.maximum(y0, by0)).clip(min=0)
    return w * h >= WORD_INSIDE * np.maximum((x1 - x0) * (y1 - y0), 1)


def field_values(word_boxes: np.ndarray, words: Sequence[str] | None) -> np.ndarray:
    """bool [K]: the words of form fields' values set apart from their labels — each line piece
    (`group_lines`) nearest to the right of a piece that ends in a label (a word ending in ':') on
    the same line. Labels in a column of their own leave the values in a block of their own, one
    value per line, which completing the block would merge."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    out = np.zeros(len(boxes), bool)
    if words is None or not len(boxes):
        return out
    pieces = group_lines(boxes)
    spans = line_extents(boxes, pieces)
    heights = spans[:, 3] - spans[:, 1]
    for j, piece in enumerate(pieces):
        if not str(words[piece[-1]]).endswith(":"):
            continue
        overlap = np.minimum(spans[:, 3], spans[j, 3]) - np.maximum(spans[:, 1], spans[j, 1])
        beside = (spans[:, 0] >= spans[j, 2]) & (overlap > 0.5 * np.minimum(heights, heights[j]))
        if beside.any():
            out[pieces[int(np.where(beside, spans[:, 0], np.inf).argmin())]] = True
    return out


def _numbered_pieces(pieces: list[list[int]], word_boxes: np.ndarray, numbering: np.ndarray) -> list[list[int]]:
    """`pieces` with a line's lone numbering word ("5.3", "3.", "•"; bool [K] `numbering`) joined
    to the one other piece on its line, to its right: a numbered heading or list item is one unit
    however wide the space after its number. A line of three or more pieces is a table's row."""
    spans = np.array([[*word_boxes[p, :2].min(0), *word_boxes[p, 2:].max(0)] for p in pieces]).reshape(-1, 4)
    heights = spans[:, 3] - spans[:, 1]
    joined: dict[int, int] = {}                         # numbering piece -> the piece it opens
    for j, piece in enumerate(pieces):
        if len(piece) != 1 or not numbering[piece[0]]:
            continue
        overlap = np.minimum(spans[:, 3], spans[j, 3]) - np.maximum(spans[:, 1], spans[j, 1])
        line = np.flatnonzero(overlap > 0.5 * np.minimum(heights, heights[j]))
        others = line[line != j]
        if len(others) == 1 and spans[others[0], 0] >= spans[j, 2]:
            joined[j] = int(others[0])
    opened = {k: j for j, k in joined.items()}
    out = []
    for j, piece in enumerate(pieces):
        if j in joined:
            continue                                    # it goes in front of the piece it opens
        out.append(pieces[opened[j]] + piece if j in opened else piece)
    return out


def form_page(word_boxes: np.ndarray, words: Sequence[str] | None) -> bool:
    """Whether the page is a form: FORM_PAGE_LABELS or more of its line pieces (`group_lines`) open
    with a label, a word ending in ':' among their first LABEL_LEAD words, and labels are at least
    LABEL_SHARE of its words."""
    if words is None or not len(words) or sum(str(w).endswith(":") for w in words) < LABEL_SHARE * len(words):
        return False
    pieces = group_lines(np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4))
    led = sum(any(str(words[k]).endswith(":") for k in piece[:LABEL_LEAD]) for piece in pieces)
    return led >= FORM_PAGE_LABELS


def field_units(block: Sequence[int], word_boxes: np.ndarray, words: Sequence[str] | None,
                values: np.ndarray | None = None, leaders: np.ndarray | None = None,
                form: bool | None = None) -> list[list[int]]:
    """A text block as the units a mask is completed to: the block itself, or — on a form or a
    table, where a line holds several fields or cells — each label, value and cell.

    The block's lines are cut into pieces at gaps wider than CELL_GAP x the line height (a table's
    columns, a label's value). A label is a word ending in ':' with a gap wider than LABEL_GAP x
    its height after it on its line; within a piece each label ends a unit. A piece beside another
    on its line is a unit of its own; a piece on a new line continues the unit above when it lies
    under it and holds no label (a value over two lines), unless it is a field's value (`values`,
    bool [K] from `field_values`: its label is in another block). Leader dots (`leaders`, bool [K]
    from `text_blocks.leader_words`, found here when not given) open no gap, and neither does the
    space after a line's number ("5.3", "3.", "•") when one piece of text follows it on the line.
    `form`: the block is on a form (`form_page`), so each label ends a unit; None: the block is a
    form's fields when it holds FORM_LABELS labels or more."""
    ids_all = list(block)
    colons = 0 if words is None else sum(str(words[k]).endswith(":") for k in ids_all)
    values = np.zeros(len(word_boxes), bool) if values is None else values
    # a contents line's leader dots open no gap between its title and its page number
    marks = (leader_words(words, len(word_boxes)) if leaders is None else leaders)[ids_all]
    pieces = [[ids_all[k] for k in piece] for piece in group_lines(word_boxes[ids_all], gap_factor=CELL_GAP, marks=marks)]
    if words is not None:
        numbering = np.zeros(len(word_boxes), bool)
        numbering[ids_all] = numbering_words([words[k] for k in ids_all])
        pieces = _numbered_pieces(pieces, word_boxes, numbering)
    if not colons and not values[ids_all].any() and len(pieces) == len(group_lines(word_boxes[ids_all], marks=marks)):
        return [ids_all]                               # a paragraph: no labels, no cells
    form = colons >= FORM_LABELS if form is None else (form and colons > 0)   # several labels: a form
    units: list[list[int]] = []
    previous = None                                    # x0, y0, x1, y1 of the last piece
    for ids in pieces:
        x0, y0 = word_boxes[ids, :2].min(0)
        x1, y1 = word_boxes[ids, 2:].max(0)
        cuts = [j for j, (a, b) in enumerate(zip(ids, ids[1:]))
                if words is not None and str(words[a]).endswith(":")
                and (form or word_boxes[b, 0] - word_boxes[a, 2] > LABEL_GAP * max(word_boxes[a, 3] - word_boxes[a, 1], 1.0))]
        same_line = previous is not None and min(y1, previous[3]) - max(y0, previous[1]) > 0.5 * (y1 - y0)
        under = previous is not None and min(x1, previous[2]) - max(x0, previous[0]) > 0
        # a piece ending in a label on a form ("Phone:" in a column of labels) opens a unit too
        labelled = bool(cuts) or (form and str(words[ids[-1]]).endswith(":"))
        if units and under and not labelled and not same_line and not values[ids].all():
            units[-1].extend(ids)
        else:
            start = 0
            for j in cuts + [len(ids) - 1]:
                units.append(ids[start:j + 1])
                start = j + 1
        previous = (x0, y0, x1, y1)
    return units


def paint_words(shape: tuple[int, int], word_boxes: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """bool [H, W]: the boxes of the `relevant` words (bool [K]), grouped into blocks across gaps
    up to the page's median word height (the words of one paragraph), each block drawn as the
    box around its words."""
    out = np.zeros(shape, dtype=bool)
    boxes = pixel_boxes(word_boxes, shape)
    if not len(boxes) or not np.any(relevant):
        return out
    for x0, y0, x1, y1 in boxes[np.asarray(relevant, dtype=bool)]:
        out[y0:y1, x0:x1] = True
    gap = max(1, int(np.median(boxes[:, 3] - boxes[:, 1])))
    # A closing by a rectangle stays inside the painted words' bounding box: close that crop only.
    chosen = boxes[np.asarray(relevant, dtype=bool)]
    r0, c0 = chosen[:, 1].min(), chosen[:, 0].min()
    r1, c1 = chosen[:, 3].max(), chosen[:, 2].max()
    crop = out[r0:r1, c0:c1]
    if not crop.any():                                   # the relevant words lie off the frame
        return out
    closed = ndimage.binary_closing(np.pad(crop, gap), structure=np.ones((gap + 1, gap + 1), bool))
    blocks, _ = ndimage.label(closed[gap:-gap, gap:-gap] | crop, structure=_EIGHT_NEIGHBOURS)
    for rows, cols in ndimage.find_objects(blocks):      # a block of words is the box around them
        crop[rows, cols] = True
    return out
