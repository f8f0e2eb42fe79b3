"""Masks snapped to the page's words or text blocks, for the Predictor and the ONNX runner (numpy)."""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable

import numpy as np

from dociq.data.ocr import read_surely
from dociq.data.text_blocks import page_blocks, page_ink, skew_slope
from dociq.inference.class_answers import class_answer, named_class, text_units
from dociq.inference.figure_answers import (SIGNATURE_CLASS, figure_answer, page_pictures, picture_question,
                                            signature_boxes)
from dociq.inference.form_links import PageWords, link_answer, link_label
from dociq.inference.prompts import Prompts
from dociq.inference.unit_classifier import UnitClassifier
from dociq.models.word_snap import drawing_boxes, keep_quoted, picture_boxes, snap_to_blocks, snap_to_words

# Predictor(snap=...): None (the decoder's masks), "words" or "blocks" (dociq.models.word_snap).
SNAP_MODES = (None, "words", "blocks")
# What a user gets without asking: the mode that scores best on every prompt kind of held-out real
# pages through this Predictor (docs/finetune.md, "The user's path").
DEFAULT_SNAP = "blocks"
# Every training prompt has an answer, so a mask the threshold leaves empty is the model unsure,
# not the model saying "there is none": such a prompt gets its best guess, the pixels whose logit
# is within this margin of its highest (None: empty masks stay empty). 3 scored best of 1, 3, 6, 10
# and 20 on the recipe's held-out split (docs/finetune.md, "Documents it has never seen").
DEFAULT_BEST_GUESS_MARGIN: float | None = 3.0


def check_snap(value: str | None) -> str | None:
    """A `snap=` setting of the Predictor or the ONNX runner, or a ValueError naming the modes."""
    if value not in SNAP_MODES:
        raise ValueError(f"snap={value!r}: use one of {SNAP_MODES} (None: the decoder's masks as they are)")
    return value


def best_guess(logits, masks: np.ndarray, margin: float) -> np.ndarray:
    """masks bool [..., H, W] with each empty one replaced by the pixels of its logits [..., H, W]
    (numpy or a CPU tensor) within `margin` of their maximum."""
    empty = np.argwhere(~masks.any((-2, -1)))
    if not len(empty):
        return masks
    out = masks.copy()
    for index in (tuple(int(i) for i in row) for row in empty):
        logit = np.asarray(logits[index])
        out[index] = logit >= logit.max() - margin
    return out


def clicks_innermost(prompts: Prompts, multimask_output: bool, return_logits: bool, snap: str | None) -> bool:
    """Whether a lone click's one mask is `innermost_candidate` of its snapped candidates: masks
    snapped to blocks ("blocks"), one asked for (not `multimask_output`), not raw logits."""
    return prompts.lone_click and snap == "blocks" and not multimask_output and not return_logits


def innermost_candidate(snapped: np.ndarray, scores: np.ndarray,
                        low_res: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A lone click's answer: of its 3 candidates snapped to blocks (bool [Q, 3, H, W], predicted
    IoUs [Q, 3], logits [Q, 3, h, w]), the smallest that is not empty — the innermost unit the
    click is in (a paragraph, a list item, a cell), as a click selects in a document viewer; a
    larger candidate is one `multimask_output=True` away. The IoU head ranks the decoder's raw
    masks, not the snapped ones: on the recipe's held-out clicks its choice scored 71.5 / 71.6
    mIoU (own split / unseen packages), the smallest 74.7 / 73.4 (docs/finetune.md).
    Returns (masks [Q, H, W], scores [Q], low_res [Q, 1, h, w]), a prompt with only empty
    candidates getting its highest-scored one."""
    area = snapped.reshape(*snapped.shape[:2], -1).sum(-1).astype(np.float64)
    area[area == 0] = np.inf
    pick = np.where(np.isfinite(area).any(1), area.argmin(1), scores.argmax(1))
    rows = np.arange(len(pick))
    return snapped[rows, pick], scores[rows, pick], low_res[rows, pick][:, None]


def page_masks(logits: np.ndarray, scores: np.ndarray, low_res: np.ndarray, prompts: Prompts, page, *,
               multimask_output: bool, return_logits: bool, threshold: float, snap: str | None,
               best_guess_margin: float | None, use_ocr: bool,
               unit_classifier: UnitClassifier | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The masks a user gets from the decoder's candidates, the same for every backend.

    logits float [Q, C, H, W] at the page's size: the 3 multimask candidates (`multimask_output`
    or a lone click's innermost choice), else the 1 chosen; `scores` and `low_res` are passed
    through as the backend shaped them (predicted IoUs [Q, 3] / [Q], decoder logits [Q, C, h, w]).
    Thresholds the logits (or keeps them with `return_logits`), gives an empty mask its best guess,
    snaps to words or blocks (`snap_masks` on the backend's set `page`) and picks a lone click's
    innermost candidate. `unit_classifier` names the page's text units for class answers (None: no
    class answers). Returns (masks, scores, low_res), the masks' C dropped unless
    `multimask_output`."""
    innermost = clicks_innermost(prompts, multimask_output, return_logits, snap)
    out = logits if return_logits else logits > threshold
    if not multimask_output and not innermost:
        out, logits = out[:, 0], logits[:, 0]
    if not return_logits and best_guess_margin is not None:
        out = best_guess(logits, out, best_guess_margin)
    reads_words = use_ocr and len(page.words) > 0
    if not return_logits and (snap == "blocks" or (snap == "words" and reads_words)):
        out = snap_masks(out, prompts, page, page.word_boxes if reads_words else np.zeros((0, 4)), snap, unit_classifier)
    if innermost:
        return innermost_candidate(out, scores, low_res)
    return out, scores, low_res


def _then_quoted(mask: np.ndarray, snap, word_boxes: np.ndarray, words, question: str, blocks,
                 slope: float) -> np.ndarray:
    return keep_quoted(snap(mask), word_boxes, words, question, blocks, slope)


def _then_linked(mask: np.ndarray, snap, label: str, form_words: PageWords) -> np.ndarray:
    return link_answer(snap(mask), label, form_words)


def page_slope(page, word_boxes: np.ndarray) -> float:
    """How the page's text lines rise (`text_blocks.skew_slope`: 0 on a level page), found once per page."""
    if page.slope is None:
        page.slope = skew_slope(word_boxes) if len(word_boxes) else 0.0
    return page.slope


def page_sure(page) -> np.ndarray | None:
    """bool [N]: the words the OCR read surely (`ocr.read_surely`), found once per page; None where
    the words came without confidences (all sure)."""
    if page.sure is None and page.word_confidences is not None:
        page.sure = read_surely(page.words, page.word_confidences)
    return page.sure


def printed_boxes(page, word_boxes: np.ndarray) -> np.ndarray:
    """The boxes of the words the OCR read surely (`page_sure`; all of them without confidences):
    what the page's pictures are told from. A word read from a signature's stroke or a plot's
    marks, at a confidence tesseract doubts, stays a word for the model and the text, but its ink
    is still a drawing."""
    sure = page_sure(page) if len(word_boxes) else None
    return word_boxes if sure is None else word_boxes[sure]


def snap_masks(masks: np.ndarray, prompts: Prompts, page, word_boxes: np.ndarray, mode: str,
               unit_classifier: UnitClassifier | None = None) -> np.ndarray:
    """masks bool [Q, (C,) H, W] at the page's size -> the same, snapped (`mode` "words" or
    "blocks") to `word_boxes`: the page's own, or none when the model does not read the words (a
    box prompt's mask is still kept inside its box). page: the Predictor's or the ONNX runner's set
    page (its `words` and `image`; its `text_blocks`, `text_units` and `unit_probs`, found here on
    the first prompt that needs them). With a `unit_classifier` and "blocks", a question alone that
    names a text class (`class_answers.named_class`) and asks for one mask [Q, H, W] is answered by
    the units it names (`class_answers.class_answer`), one that names figures or signatures by the
    page's pictures (`figure_answers.figure_answer`). A field question ("which value belongs to the field ‘K’?")
    is the box of the value of K (beside or below it) the mask lies on, else of the value the
    geometric rule finds (`form_links.link_answer`)."""
    words = page.words if len(word_boxes) else None
    if mode == "blocks" and len(word_boxes) and page.text_blocks is None:
        page.text_blocks = page_blocks(page.image, word_boxes, words, page_slope(page, word_boxes),
                                       ocr=page.word_confidences is not None)  # once per page
    if mode == "blocks" and words is not None and unit_classifier is not None and masks.ndim == 3 \
            and prompts.boxes is None and prompts.points is None and prompts.masks is None:
        return _answer_classes(masks, prompts, page, word_boxes, unit_classifier,
                               partial(snap_masks, page=page, word_boxes=word_boxes, mode=mode))
    blocks = (page.text_blocks if len(word_boxes) else []) if mode == "blocks" else None
    slope = page_slope(page, word_boxes) if mode == "blocks" else 0.0
    if mode == "blocks" and page.ink is None:
        page.ink = page_ink(page.image)                    # once per page, for all of its prompts
    if mode == "blocks" and prompts.points is not None and page.drawings is None:
        printed = printed_boxes(page, word_boxes)
        page.drawings = picture_boxes(drawing_boxes(page.ink, printed), printed)   # for clicks
    out = np.empty_like(masks)
    form_words = None                                      # the page's words for field questions, once
    for q in range(masks.shape[0]):
        if mode == "words":
            snap = partial(snap_to_words, word_boxes=word_boxes)
        else:
            pick = (lambda a: None if a is None else a[min(q, len(a) - 1)])   # [1 or Q, ...] broadcast
            snap = partial(snap_to_blocks, word_boxes=word_boxes, words=words, blocks=blocks,
                           clicks=pick(prompts.points), click_labels=pick(prompts.labels), box=pick(prompts.boxes),
                           ink=page.ink, drawings=page.drawings, slope=slope)
        if mode == "blocks" and prompts.questions and words is not None and prompts.boxes is None and prompts.points is None:
            # text the question quotes is in its answer (`keep_quoted`); a click or a box says where, itself
            question = prompts.questions[min(q, len(prompts.questions) - 1)]
            snap = partial(_then_quoted, snap=snap, word_boxes=word_boxes, words=words, blocks=blocks,
                           question=question, slope=slope)
            label = link_label(question)
            if label is not None:        # the label's value the decoder's mask lies on, else the rule's
                form_words = PageWords(words, word_boxes, slope) if form_words is None else form_words
                snap = partial(_then_linked, snap=snap, label=label, form_words=form_words)
        flat = masks[q].reshape(-1, *masks.shape[-2:])
        out[q] = np.stack([snap(m) for m in flat]).reshape(masks[q].shape)
    return out


def _answer_classes(masks: np.ndarray, prompts: Prompts, page, word_boxes: np.ndarray,
                    unit_classifier: UnitClassifier, snap: Callable) -> np.ndarray:
    """`snap_masks` of question prompts, with the questions that name a text class answered by the
    units `unit_classifier` names, those that name figures or signatures by the page's pictures
    (`figure_answers`), and the others snapped as `snap` (snap_masks without them) does."""
    # a class the classifier never saw (form labels on a corpus of manuals) keeps the decoder's mask
    named = [name if name is not None and name[0] in unit_classifier.classes else None
             for name in map(named_class, prompts.questions)]
    pictures = [picture_question(q) for q in prompts.questions]       # None, or (figure / signature, names one)
    if not any(named) and not any(pictures):
        return snap(masks, prompts)
    if any(named) and page.unit_probs is None:                                   # once per page
        page.text_units = text_units(page.text_blocks, word_boxes, page.words, page_slope(page, word_boxes))
        page.unit_probs = unit_classifier.unit_probabilities(page.image, word_boxes, page.words, page.text_units,
                                                             ocr=page.word_confidences is not None)
        sure = page_sure(page)
        if sure is not None and len(page.text_units):
            # a unit of words the OCR only doubts is ink read as letters (a signature's stroke read
            # as "WINSTON", a stamp), not a title or a paragraph: it answers no class
            read = np.array([sure[list(unit)].any() for unit in page.text_units])
            page.unit_probs = np.where(read[:, None], page.unit_probs, -1.0)
    answers = [None if name is None else class_answer(masks.shape[-2:], word_boxes, page.text_units,
                                                      page.unit_probs, *name, slope=page_slope(page, word_boxes))
               for name in named]
    out = masks.copy()
    rest = [q for q, answer in enumerate(answers) if answer is None]
    if rest:                     # only the questions the units do not answer are snapped (question prompts alone)
        out[rest] = snap(masks[rest], replace(prompts, count=len(rest), questions=[prompts.questions[q] for q in rest]))
    for q, answer in enumerate(answers):
        if answer is not None:
            out[q] = answer
    for q, asked in enumerate(pictures):
        if asked is None:
            continue
        if page.figures is None:                                                  # once per page
            page.ink = page_ink(page.image) if page.ink is None else page.ink
            page.figures = page_pictures(page.ink, printed_boxes(page, word_boxes))
        kind, one = asked
        if kind == SIGNATURE_CLASS:
            if page.signatures is None:
                page.signatures = signature_boxes(page.figures, page.ink, printed_boxes(page, word_boxes))
            answer = figure_answer(masks.shape[-2:], page.signatures, one, min_share=0.0)
        else:
            answer = figure_answer(masks.shape[-2:], page.figures, one)
        if answer is not None:
            out[q] = answer
    return out
