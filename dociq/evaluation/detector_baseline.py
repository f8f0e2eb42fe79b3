"""A peer baseline with no model of ours: an off-the-shelf layout detector plus text search.

`DetectorTextSearch` answers the prompts dociq's Predictor answers (`set_image` once per page,
then `predict`), so every held-out table can read against it. The detector is PP-PicoDet trained
on CDLA (dociq.evaluation.layout_detector); the rest are rules on the OCR words. Masks are filled
rectangles at the page's size; a detection's answer scores the detection's score, a rule's 1.0, an
empty answer 0.0.

    baseline = DetectorTextSearch()                  # or DetectorTextSearch(detector=callable)
    baseline.set_image(page.image, page.words, page.word_boxes)
    masks, scores = baseline.predict(question=["the page footer", "which paragraph mentions “Lawyer”?"])

The question's kind is read from its text (the corpus asks with dociq.data.synthetic.questions'
phrasings), first match wins:

- layout: a phrasing of LAYOUT_PHRASES -> its dociq class -> the detections of the CDLA classes in
  CDLA_CLASSES. CDLA's `title` covers the title and the section headings: the title is the title
  detection whose words are tallest (the largest font; ties -> the top-most), the section headings
  the other title detections. A page number is the number-like word (digits, roman numerals) in a
  footer / header detection, else number-like words in the page's top / bottom tenth. Classes CDLA
  lacks: form labels are the words up to a word ending in ':' (the line's start or a wide gap
  before it), form values the link rule's value of each label, table cells the line pieces
  (dociq.data.text_blocks.group_lines splits lines at wide gaps) of the words in table
  detections, "the header row of the table" the top line of each table detection's words;
  signatures the Predictor's rule (`figure_answers.signature_boxes`: a stroke over a printed name);
  stamps are drawn, not written: empty. Code listings -> CDLA's `equation` (its only non-prose
  text class).
- link ("which value belongs to the field ‘K’?"): the label K's words (found as the Predictor's
  rule finds them, OCR misreads and wrapped labels too: `form_links.label_runs`); the value is the
  words right of the label on its line, up to the next wide gap; if none, the nearest line below
  that overlaps the label's column (dociq.inference.form_links, the rule the Predictor falls back
  on). Mask: the value words' box.
- cell ("what is the <column> of <row>?"): the row key's words give a line band, the column header
  (the occurrence nearest above the row key) an x-band; the answer is the words in both bands.
- reading (anything else that names page words): the named words are the quoted text (“…”, ‘…’,
  "…", as a phrase; else its words one by one), else the question's content words
  (dociq.data.lexical), matched exactly or case-folded. "where is the <field> of <name>?" is the
  link rule on the <field> label nearest below <name>. Otherwise the answer is the text-like
  detection holding the most matched words' centres (ties -> the smallest); none holds one -> the
  matched words' box.
- box prompt: the detection with the highest IoU with the box when that IoU >= 0.5, else the box.
- click: the smallest detection holding every positive point and no negative one; none -> empty.

One prompt, one rule: a question wins over a box, a box over points.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np

from dociq.data.lexical import normalise, question_content_words
from dociq.data.ocr import OcrWords, read_surely
from dociq.data.synthetic.questions import LAYOUT_PHRASES
from dociq.data.text_blocks import group_lines, page_ink
from dociq.evaluation.layout_detector import LayoutDetector, iou_one_to_many
from dociq.inference.figure_answers import page_pictures, signature_boxes
from dociq.inference.form_links import GAP_FACTOR, PageWords, field_value, label_runs, link_label
from dociq.inference.page_inputs import read_page_words

# dociq class -> the CDLA classes whose detections answer it (CDLA has no form, cell, stamp,
# signature or code class: those are text rules or empty, see the module docstring).
CDLA_CLASSES = {
    "title": ("title",), "section_heading": ("title",),
    "paragraph": ("text",), "list_item": ("text",),       # synthetic bullets are drawn dots, not words
    "table": ("table",), "figure": ("figure",),
    "caption": ("figure_caption", "table_caption"),
    "page_header": ("header",), "page_footer": ("footer",), "page_number": ("footer", "header"),
    "code": ("equation",),
}
# Detections that hold words, for reading questions.
TEXT_LIKE = ("text", "title", "reference", "figure_caption", "table_caption", "header", "footer", "equation")
PHRASE_TO_CLASS = {p.casefold(): label for label, (one, many) in LAYOUT_PHRASES.items() for p in one + many}
HEADER_ROW = "the header row of the table"
BOX_IOU = 0.5                    # a box prompt takes a detection from this IoU on
EDGE_BAND = 0.1                  # top / bottom fraction of the page where a page number may sit

_QUOTED = re.compile(r"\u201c([^\u201d]+)\u201d|\u2018([^\u2019]+)\u2019|\"([^\"]+)\"")
# greedy first group: split at the last " of " ("the date of birth of Walter Young")
_CELL = re.compile(r"^what is the (.+) of (.+?)\??$", re.IGNORECASE)
_FIELD_OF = re.compile(r"^where is the (.+) of (.+?)\??$", re.IGNORECASE)
_ROMAN = re.compile(r"^[ivxlcdm]{1,6}$", re.IGNORECASE)


@dataclass
class Detections:
    boxes: np.ndarray          # float [N, 4] x0, y0, x1, y1 page pixels
    scores: np.ndarray         # float [N]
    labels: list[str]
    image: np.ndarray | None = None           # the page and its surely read words' boxes, for the signature rule
    word_boxes: np.ndarray | None = None

    @cached_property
    def signatures(self) -> np.ndarray:
        """float [S, 4]: the page's signatures by the Predictor's rule (computed when first asked)."""
        if self.image is None or self.word_boxes is None:
            return np.zeros((0, 4))
        ink = page_ink(self.image)
        return signature_boxes(page_pictures(ink, self.word_boxes), ink, self.word_boxes).astype(np.float64)

    def of(self, classes: Sequence[str]) -> np.ndarray:
        """Indices of the detections of `classes`."""
        return np.array([i for i, label in enumerate(self.labels) if label in classes], dtype=np.int64)


# An answer: the rectangles to paint and the answer's score.
Answer = tuple[np.ndarray, float]
EMPTY: Answer = (np.zeros((0, 4)), 0.0)


class DetectorTextSearch:
    """The Predictor's `set_image` / `predict`, answered by a layout detector and text rules.
    `detector`: a callable image -> (boxes, scores, labels); default the CDLA LayoutDetector."""

    def __init__(self, detector: Callable[[np.ndarray], tuple] | None = None, threads: int | None = None) -> None:
        self.detector = detector if detector is not None else LayoutDetector(threads=threads)
        self._page: tuple | None = None

    def set_image(self, image: np.ndarray, words: Sequence[str] | OcrWords | None = None,
                  word_boxes: Any = None) -> None:
        """Detect the page's layout once and keep its OCR words (pixels of the page; an OcrWords
        brings its confidences, and the signature rule sees the words read surely, as the Predictor's)."""
        image = np.asarray(image)
        words, word_boxes, confidences = read_page_words(image, [] if words is None else words, word_boxes, ocr=None)
        word_boxes = np.asarray(word_boxes, np.float64)
        boxes, scores, labels = self.detector(image)
        detections = Detections(np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64),
                                list(labels), image, word_boxes[read_surely(words, confidences)])
        self._page = (image.shape[:2], PageWords(words, word_boxes), detections)

    @property
    def is_image_set(self) -> bool:
        return self._page is not None

    def predict(self, question: str | Sequence[str] | None = None, points: Any = None, point_labels: Any = None,
                boxes: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(masks bool [Q, H, W], scores float [Q]) for Q questions, else Q boxes, else Q point sets."""
        if self._page is None:
            raise RuntimeError("no page is set: call set_image(image, words, word_boxes) first")
        size, words, detections = self._page
        if question is not None:
            questions = [question] if isinstance(question, str) else list(question)
            answers = [answer_question(q, words, detections, size) for q in questions]
        elif boxes is not None:
            answers = [answer_box(b, detections) for b in np.asarray(boxes, np.float64).reshape(-1, 4)]
        elif points is not None:
            answers = [answer_click(p, l, detections) for p, l in zip(*_point_sets(points, point_labels))]
        else:
            raise ValueError("give a question, boxes or points")
        masks = np.stack([paint(rects, size) for rects, _ in answers]) if answers else np.zeros((0, *size), bool)
        return masks, np.array([score for _, score in answers], dtype=np.float32)


def _point_sets(points: Any, point_labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """points [P, 2] or [Q, P, 2], labels [P] / [Q, P] (default 1) -> [Q, P, 2], [Q, P]."""
    pts = np.asarray(points, np.float64)
    pts = pts[None] if pts.ndim == 2 else pts
    labels = np.ones(pts.shape[:2]) if point_labels is None else np.asarray(point_labels).reshape(-1, pts.shape[1])
    return pts, np.broadcast_to(labels, pts.shape[:2])


def paint(rects: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """bool [H, W] with each x0, y0, x1, y1 rectangle filled (pixels it touches)."""
    mask = np.zeros(size, dtype=bool)
    for x0, y0, x1, y1 in np.asarray(rects).reshape(-1, 4):
        c0, r0 = max(int(np.floor(x0)), 0), max(int(np.floor(y0)), 0)
        c1, r1 = min(int(np.ceil(x1)), size[1]), min(int(np.ceil(y1)), size[0])
        mask[r0:r1, c0:c1] = True
    return mask


def area(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes).reshape(-1, 4)
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def holds(boxes: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """bool [N, M]: box n holds point m."""
    return ((boxes[:, None, 0] <= xy[None, :, 0]) & (xy[None, :, 0] <= boxes[:, None, 2])
            & (boxes[:, None, 1] <= xy[None, :, 1]) & (xy[None, :, 1] <= boxes[:, None, 3]))


# ---- questions -----------------------------------------------------------------------------------

def question_kind(question: str) -> str:
    """The kind the question's wording implies (dociq.data.schema.QUESTION_KINDS)."""
    text = question.strip().casefold()
    if text in PHRASE_TO_CLASS or text == HEADER_ROW:
        return "layout"
    if link_label(question) is not None:
        return "link"
    if _CELL.match(text):
        return "cell"
    return "reading"


def answer_question(question: str, words: PageWords, det: Detections, size: tuple[int, int]) -> Answer:
    kind = question_kind(question)
    if kind == "layout":
        text = question.strip().casefold()
        return answer_header_row(words, det) if text == HEADER_ROW else answer_layout(PHRASE_TO_CLASS[text],
                                                                                       words, det, size)
    if kind == "link":
        return answer_link(link_label(question), words)
    if kind == "cell":
        column, row = _CELL.match(question.strip()).groups()
        return answer_cell(column, row, words)
    return answer_reading(question, words, det)


def quoted_text(question: str) -> str | None:
    match = _QUOTED.search(question)
    return next(g for g in match.groups() if g) if match else None


def _rects(det: Detections, ids: np.ndarray) -> Answer:
    """The detections `ids` as an answer scored by their best score."""
    ids = np.asarray(ids, np.int64)
    return (det.boxes[ids], float(det.scores[ids].max())) if len(ids) else EMPTY


def _words_answer(words: PageWords, ids: Sequence[int]) -> Answer:
    return (words.box(ids), 1.0) if len(ids) else EMPTY


# ---- layout questions ----------------------------------------------------------------------------

def answer_layout(label: str, words: PageWords, det: Detections, size: tuple[int, int]) -> Answer:
    if label in ("title", "section_heading"):
        title, others = split_titles(words, det)
        return _rects(det, title if label == "title" else others)
    if label == "page_number":
        return page_number(words, det, size)
    if label in CDLA_CLASSES:
        return _rects(det, det.of(CDLA_CLASSES[label]))
    if label == "form_key":
        return _stack([(words.box(ids), 1.0) for ids in form_labels(words)])
    if label == "form_value":
        return _stack([link_value(ids, words) for ids in form_labels(words)])
    if label == "table_cell":
        return _stack([(words.box(ids), 1.0) for ids in table_cells(words, det)])
    if label == "signature":
        return (det.signatures, 1.0) if len(det.signatures) else EMPTY
    return EMPTY                                        # stamp: drawn, and no CDLA class


def _stack(answers: list[Answer]) -> Answer:
    rects = [r for r, _ in answers if len(r)]
    return (np.concatenate(rects), 1.0) if rects else EMPTY


def split_titles(words: PageWords, det: Detections) -> tuple[np.ndarray, np.ndarray]:
    """(the title, the section headings) among CDLA's title detections: the title has the tallest
    words (its own box's height when it holds none), ties going to the top-most."""
    ids = det.of(("title",))
    if not len(ids):
        return ids, ids
    inside = holds(det.boxes[ids], words.centres)
    height = [np.median(words.heights[row]) if row.any() else det.boxes[i, 3] - det.boxes[i, 1]
              for i, row in zip(ids, inside)]
    best = max(range(len(ids)), key=lambda k: (round(float(height[k]), 1), -det.boxes[ids[k], 1]))
    return ids[best:best + 1], np.delete(ids, best)


def is_page_number(word: str) -> bool:
    w = normalise(word)
    return bool(w) and (w.isdigit() or bool(_ROMAN.match(w)))


def page_number(words: PageWords, det: Detections, size: tuple[int, int]) -> Answer:
    """Number-like words in footer / header detections, else in the page's top / bottom band."""
    numbers = np.array([is_page_number(w) for w in words.words], dtype=bool)
    edges = det.boxes[det.of(("footer", "header"))]
    in_edges = holds(edges, words.centres).any(0) if len(edges) else np.zeros(len(words), bool)
    chosen = np.flatnonzero(numbers & in_edges)
    if not len(chosen):
        y = words.centres[:, 1] if len(words) else np.zeros(0)
        chosen = np.flatnonzero(numbers & ((y < EDGE_BAND * size[0]) | (y > (1 - EDGE_BAND) * size[0])))
    return (words.boxes[chosen], 1.0) if len(chosen) else EMPTY


def form_labels(words: PageWords) -> list[list[int]]:
    """Each word ending in ':' with the words before it on its line up to a wide gap (a form label)."""
    out = []
    for end in np.flatnonzero(words.ends_label):
        line = np.flatnonzero(words.same_line([end]) & (words.boxes[:, 2] <= words.boxes[end, 0] + 1))
        ids = [end]
        for j in sorted(line, key=lambda j: -words.boxes[j, 2]):
            if j != end and words.boxes[ids[-1], 0] - words.boxes[j, 2] <= GAP_FACTOR * words.heights[end]:
                ids.append(int(j))
        out.append(sorted(ids, key=lambda j: words.boxes[j, 0]))
    return out


def _words_in(words: PageWords, boxes: np.ndarray) -> list[np.ndarray]:
    """Per box, the indices of the words whose centres it holds."""
    return [np.flatnonzero(row) for row in holds(boxes, words.centres)] if len(words) else []


def table_cells(words: PageWords, det: Detections) -> list[list[int]]:
    """The line pieces (split at wide gaps) of the words inside each table detection."""
    out = []
    for ids in _words_in(words, det.boxes[det.of(("table",))]):
        out.extend([[int(ids[k]) for k in line] for line in group_lines(words.boxes[ids])] if len(ids) else [])
    return out


def answer_header_row(words: PageWords, det: Detections) -> Answer:
    """The top line of the words in each table detection."""
    rows = []
    for ids in _words_in(words, det.boxes[det.of(("table",))]):
        if len(ids):
            top = ids[np.argmin(words.centres[ids, 1])]
            rows.append(words.box(ids[words.same_line([top])[ids]]))
    return (np.concatenate(rows), 1.0) if rows else EMPTY


# ---- link and cell questions ---------------------------------------------------------------------

def link_value(label: Sequence[int], words: PageWords) -> Answer:
    """The box of a form label's value (`form_links.field_value`)."""
    return _words_answer(words, field_value(label, words))


def answer_link(label_text: str, words: PageWords) -> Answer:
    runs = label_runs(label_text, words)
    return link_value(runs[0], words) if runs else EMPTY


def answer_cell(column: str, row: str, words: PageWords) -> Answer:
    """Words in the row key's line band and in the x-band of its column header (the header
    occurrence nearest above the row key)."""
    rows, heads = words.runs(row), words.runs(column)
    if not rows or not heads:
        return EMPTY
    pairs = [(r, h) for r in rows for h in heads if words.box(h)[0, 3] <= words.box(r)[0, 1] + 1]
    if not pairs:
        return EMPTY
    r, h = min(pairs, key=lambda p: words.box(p[0])[0, 1] - words.box(p[1])[0, 3])
    hx0, hx1 = words.box(h)[0, [0, 2]]
    hits = np.flatnonzero(words.same_line(r) & (words.boxes[:, 0] < hx1) & (words.boxes[:, 2] > hx0))
    return _words_answer(words, np.setdiff1d(hits, r))


# ---- reading questions ---------------------------------------------------------------------------

def named_words(question: str, words: PageWords) -> list[int]:
    """The page words a question names: its quoted text as a phrase (else its words one by one),
    else its content words."""
    quoted = quoted_text(question)
    if quoted:
        runs = words.runs(quoted)
        return sorted({i for run in runs for i in run}) if runs else words.matching(quoted.split())
    return words.matching([w for _, w in question_content_words(question)])


def field_of_person(question: str, words: PageWords) -> Answer | None:
    """"where is the <field> of <name>?": the link value of the <field> label nearest below <name>."""
    match = _FIELD_OF.match(question.strip())
    if not match:
        return None
    labels, names = label_runs(match.group(1), words), words.runs(match.group(2))
    labels = [lab for lab in labels if words.ends_label[lab[-1]]] or labels
    if not labels:
        return None
    if names:
        top = min(words.box(n)[0, 1] for n in names)
        below_name = [lab for lab in labels if words.box(lab)[0, 1] >= top - 1] or labels
        labels = sorted(below_name, key=lambda lab: words.box(lab)[0, 1] - top)
    return link_value(labels[0], words)


def answer_reading(question: str, words: PageWords, det: Detections) -> Answer:
    found = field_of_person(question, words)
    if found is not None and len(found[0]):
        return found
    named = named_words(question, words)
    if not named:
        return EMPTY
    ids = det.of(TEXT_LIKE)
    if len(ids):
        counts = holds(det.boxes[ids], words.centres[named]).sum(1)
        if counts.max() > 0:
            best = min(np.flatnonzero(counts == counts.max()), key=lambda k: area(det.boxes[ids[k]])[0])
            return _rects(det, ids[best:best + 1])
    return _words_answer(words, named)


# ---- visual prompts ------------------------------------------------------------------------------

def answer_box(box: np.ndarray, det: Detections) -> Answer:
    """The detection best overlapping the box when IoU >= BOX_IOU, else the box itself."""
    if len(det.boxes):
        iou = iou_one_to_many(box, det.boxes)
        best = int(iou.argmax())
        if iou[best] >= BOX_IOU:
            return _rects(det, [best])
    return box[None], 1.0


def answer_click(points: np.ndarray, labels: np.ndarray, det: Detections) -> Answer:
    """The smallest detection holding every positive point and no negative one (label -1: padding)."""
    if not len(det.boxes):
        return EMPTY
    inside = holds(det.boxes, points)
    ok = inside[:, labels == 1].all(1) & ~inside[:, labels == 0].any(1)
    if not (labels == 1).any() or not ok.any():
        return EMPTY
    candidates = np.flatnonzero(ok)
    return _rects(det, candidates[[np.argmin(area(det.boxes[candidates]))]])
