"""Layout questions that name figures or signatures, answered from the page's own pictures.

"segment the figure", "all figures": a figure's extent is drawn, not set by words, so the word-class
head cannot answer it, and the mask decoder paints a few blobs of a plot or none (five packages no
training page comes from: figures 6 mIoU from the decoder, 42 from a layout detector). The page itself
says where its pictures are: ink off every word (`word_snap.drawing_boxes`) with little text inside
(`word_snap.picture_boxes`, words covering under `FIGURE_TEXT` of the box: a diagram's labels
count, a frame around a paragraph does not). A question naming several figures gets every picture
of at least `MIN_FIGURE_SHARE` of the page; one naming one figure gets the largest (letting the
decoder's mask choose among them scored lower, on training pages and unseen ones alike: it does not
know where figures are). A page with no such picture keeps the decoder's answer.

"find the signature", "all signatures": a signature is a handwritten stroke over a printed name —
a picture without text, a few lines tall and wider than that (`signature_boxes`), with the
name's line right under it, which its answer includes.
docs/finetune.md has the measurements ("Figures from the page's pictures"; signatures in "Word boxes
as tall as the font, masks drawn as targets are, labels OCR misread, signatures").
"""
from __future__ import annotations

import numpy as np

from dociq.inference.class_answers import named_class, phrased_classes
from dociq.models.word_snap import drawing_boxes, ink_off_words, picture_boxes

# Pictures smaller than this share of the page are glyphs, icons or rules, not figures; a drawing
# whose box words cover this share or more is a frame around text. Chosen on the recipe corpus's
# training pages (65 figure questions: 0.3 and 0.4 alike, 0.05 -30 points; 0.2-0.5 % alike, 1 % -4).
MIN_FIGURE_SHARE = 0.005
FIGURE_TEXT = 0.3
FIGURE_CLASS, SIGNATURE_CLASS = "figure", "signature"
# The phrasings the model is fine-tuned on that name figures ("segment the figure", "all figures")
# or signatures ("find the signature").
PICTURE_PHRASINGS = {text: name for text, name in phrased_classes(skip=()).items()
                     if name[0] in (FIGURE_CLASS, SIGNATURE_CLASS)}
# A signature's stroke: 1.5 to 6 text lines tall, at least twice as wide as tall and at most 0.7 of the
# page's width, ink inside its box besides any words (not a frame around a field's value), its
# name's line starting within a line's height of its bottom.
SIGNATURE_LINES = (1.5, 6.0)
SIGNATURE_ASPECT, SIGNATURE_WIDTH = 2.0, 0.7          # width: at least 2x its height, at most 0.7 of the page
SIGNATURE_INK = 0.01
# A box whose left and right edges are inked along this share of its height (their mean) is a frame
# (a field's box), not a stroke: 0.0-0.15 for signatures, 0.3-0.6 for most frames on 300 scanned
# training forms (`make_form_pages.py --seed 1`).
FRAME_SIDES = 0.25


def picture_question(question: str) -> tuple[str, bool] | None:
    """(FIGURE_CLASS or SIGNATURE_CLASS, whether it names one) of a question naming figures or
    signatures ("segment the figure": ("figure", True), "all signatures": ("signature", False)),
    or None for any other question."""
    return named_class(question, PICTURE_PHRASINGS)


def page_pictures(ink: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """int [D, 4]: the page's pictures that may be figures or signatures — its drawings
    (`word_snap.drawing_boxes`) with words covering under FIGURE_TEXT of their box."""
    return picture_boxes(drawing_boxes(ink, word_boxes), word_boxes, FIGURE_TEXT)


def signature_boxes(pictures: np.ndarray, ink: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """int [S, 4] x0, y0, x1, y1 (exclusive): the pictures (`word_snap.picture_boxes`) that are
    signatures — a stroke with ink across its box, a few text lines tall and wider than that, over
    a line of words (the signer's name) — each with that name's words."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not len(boxes):
        return np.zeros((0, 4), np.int64)
    line = float(np.median(boxes[:, 3] - boxes[:, 1]))
    drawn = ink_off_words(ink, boxes)                          # a value's words in a frame are no stroke
    out = []
    for x0, y0, x1, y1 in np.asarray(pictures, dtype=np.int64).reshape(-1, 4):
        height, width = y1 - y0, x1 - x0
        inner = drawn[y0 + 3:y1 - 3, x0 + 3:x1 - 3]
        sides = drawn[y0:y1, x0:x0 + 4].any(1).mean() + drawn[y0:y1, x1 - 4:x1].any(1).mean()
        framed = sides / 2 >= FRAME_SIDES                                  # a field's box, not a stroke
        if not (SIGNATURE_LINES[0] * line <= height <= SIGNATURE_LINES[1] * line and width >= SIGNATURE_ASPECT * height
                and width <= SIGNATURE_WIDTH * drawn.shape[1] and inner.size and inner.mean() >= SIGNATURE_INK and not framed):
            continue
        name = ((boxes[:, 1] >= y1 - line) & (boxes[:, 1] <= y1 + line)
                & (boxes[:, 0] >= x0 - line) & (boxes[:, 0] < x1))
        if not name.any():
            continue
        top = boxes[name, 1].min()
        name &= boxes[:, 1] <= top + line / 2                      # the first line under the stroke only
        out.append([min(x0, boxes[name, 0].min()), y0, max(x1, boxes[name, 2].max()), max(y1, boxes[name, 3].max())])
    return np.ceil(np.array(out, np.float64)).astype(np.int64).reshape(-1, 4)


def figure_answer(shape: tuple[int, int], pictures: np.ndarray, one: bool,
                  min_share: float = MIN_FIGURE_SHARE) -> np.ndarray | None:
    """bool [H, W]: the answer to a question naming figures or signatures (`one`: a single one,
    the largest) from the page's pictures of that kind (int [D, 4] x0, y0, x1, y1 exclusive, in the
    page's pixels: `word_snap.picture_boxes`, `signature_boxes`), or None when no picture is large
    enough (the caller keeps the decoder's answer)."""
    h, w = shape
    boxes = np.asarray(pictures, dtype=np.int64).reshape(-1, 4).clip(min=0, max=[w, h, w, h])
    area = (boxes[:, 2] - boxes[:, 0]).clip(min=0) * (boxes[:, 3] - boxes[:, 1]).clip(min=0)
    boxes, area = boxes[area >= min_share * h * w], area[area >= min_share * h * w]
    if not len(boxes):
        return None
    if one:
        boxes = boxes[[int(area.argmax())]]
    out = np.zeros((h, w), bool)
    for x0, y0, x1, y1 in boxes:
        out[y0:y1, x0:x1] = True
    return out
