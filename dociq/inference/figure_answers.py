"""Layout questions that name figures, answered from the page's own pictures.

"segment the figure", "all figures": a figure's extent is drawn, not set by words, so the word-class
head cannot answer it, and the mask decoder paints a few blobs of a plot or none (five packages no
training page comes from: figures 6 mIoU from the decoder, 42 from a layout detector). The page itself
says where its pictures are: ink off every word (`word_snap.drawing_boxes`) with little text inside
(`word_snap.picture_boxes`, words covering under `FIGURE_TEXT` of the box: a diagram's labels
count, a frame around a paragraph does not). A question naming several figures gets every picture
of at least `MIN_FIGURE_SHARE` of the page; one naming one figure gets the largest (letting the
decoder's mask choose among them scored lower, on training pages and unseen ones alike: it does not
know where figures are). A page with no such picture keeps the decoder's answer.
docs/finetune.md ("Figures from the page's pictures") has the measurements.
"""
from __future__ import annotations

import numpy as np

from dociq.inference.class_answers import named_class, phrased_classes

# Pictures smaller than this share of the page are glyphs, icons or rules, not figures; a drawing
# whose box words cover this share or more is a frame around text. Chosen on the recipe corpus's
# training pages (65 figure questions: 0.3 and 0.4 alike, 0.05 -30 points; 0.2-0.5 % alike, 1 % -4).
MIN_FIGURE_SHARE = 0.005
FIGURE_TEXT = 0.3
FIGURE_CLASS = "figure"
# The phrasings the model is fine-tuned on that name figures ("segment the figure", "all figures").
FIGURE_PHRASINGS = {text: name for text, name in phrased_classes(skip=()).items() if name[0] == FIGURE_CLASS}


def figure_question(question: str) -> bool | None:
    """Whether a question naming figures names one ("segment the figure": True, "all figures":
    False), or None for any other question."""
    name = named_class(question, FIGURE_PHRASINGS)
    return None if name is None else name[1]


def figure_answer(shape: tuple[int, int], pictures: np.ndarray, one: bool,
                  min_share: float = MIN_FIGURE_SHARE) -> np.ndarray | None:
    """bool [H, W]: the answer to a question naming figures (`one`: a single figure, the largest)
    from the page's pictures (int [D, 4] x0, y0, x1, y1 exclusive, in the page's pixels:
    `word_snap.picture_boxes`), or None when no picture is large enough (the caller keeps the
    decoder's answer)."""
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
