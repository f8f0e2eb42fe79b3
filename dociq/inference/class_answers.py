"""Layout questions that name a text class, answered by the unit classifier.

"the page number", "all section headings", "segment the title", "all code listings": the page's
text units (the blocks, fields and cells that `snap_to_blocks` completes masks to) are named by
the unit classifier (`dociq.inference.unit_classifier`: boosted trees over what a reader sees of a
unit, fitted on the corpus's labelled pages), and ranked by their probability of the class; a
question that names one region ("the page number") gets the likeliest unit, one that names several
("all section headings") every unit within `SHARE_OF_BEST` of the likeliest. On held-out real pages
that names classes better than the mask decoder's answer to the question (which misses a page
number's few pixels on its stride-4 grid, and paints one heading of several) and than the model's
word-class head.

Only the phrasings the model is fine-tuned on name a class (`LAYOUT_PHRASES`, matched without case,
surrounding spaces or a final '?'); classes whose extent is drawn rather than set by their words
(figures, tables, stamps, signatures) are not the units': figures are the page's pictures
(`figure_answers`), the others keep the decoder's mask, as do questions with a click, a box or a
mask prompt beside them.
docs/finetune.md ("Naming a unit's class from what it looks like") has the measurements.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dociq.data.schema import REGION_CLASSES
from dociq.data.synthetic.questions import LAYOUT_PHRASES
from dociq.data.text_blocks import leader_words, level_boxes
from dociq.models.word_snap import field_units, field_values, fill_unit, form_page

# Regions whose extent is drawn, not set by their words: their answer stays the decoder's (a
# table's rules, a figure's picture). Code listings are units: the classifier's units scored 59-62
# against the decoder's 52-55 (held-out real pages, docs/finetune.md).
DRAWN_CLASSES = ("figure", "table", "stamp", "signature")
# A question naming several regions gets every unit whose class probability is at least this
# share of the best unit's: 0.2-0.4 scored alike on the recipe's held-out split, 0.5 and a rule
# without the singular/plural split 2-3 points lower (docs/finetune.md).
SHARE_OF_BEST = 0.3


def _normalise(question: str) -> str:
    return " ".join(question.casefold().strip().rstrip("?").split())


def phrased_classes(skip: Sequence[str] = DRAWN_CLASSES) -> dict[str, tuple[str, bool]]:
    """normalised phrasing -> (its class, whether it names one region), for every class of
    LAYOUT_PHRASES but `skip`. A phrasing in both of a class's lists ("the page header") names one:
    "the" asks for the likeliest."""
    out: dict[str, tuple[str, bool]] = {}
    for label, (singular, plural) in LAYOUT_PHRASES.items():
        if label in skip:
            continue
        for text in plural:
            out[_normalise(text)] = (label, False)
        for text in singular:
            out[_normalise(text)] = (label, True)
    return out


QUESTION_CLASSES = phrased_classes()


def named_class(question: str, phrasings: dict[str, tuple[str, bool]] = QUESTION_CLASSES) -> tuple[str, bool] | None:
    """(text class, names one region) of a layout question the model was fine-tuned on, or None
    for any other question (reading questions, free phrasings, DRAWN_CLASSES); `phrasings`
    (`phrased_classes`) says which classes count."""
    return phrasings.get(_normalise(question))


def text_units(blocks: Sequence[Sequence[int]], word_boxes: np.ndarray, words: Sequence[str],
               slope: float = 0.0) -> list[list[int]]:
    """The page's text units: each block cut into its fields and cells (`field_units`); on a form
    (`form_page`) every label is a unit of its own, apart from its value. `slope`: the page's skew
    (`text_blocks.skew_slope`), along which its lines are found (`level_boxes`)."""
    boxes = level_boxes(word_boxes, slope)
    values, leaders = field_values(boxes, words), leader_words(words, len(boxes))
    form = True if form_page(boxes, words) else None
    return [unit for block in blocks for unit in field_units(block, boxes, words, values, leaders, form)]


def best_units(score: np.ndarray, one: bool) -> list[int]:
    """Indices of the units a per-unit score (float [U], negative: not a candidate) picks: the
    highest (`one`), or every candidate within SHARE_OF_BEST of it."""
    if not len(score) or score.max() < 0:
        return []
    if one:
        return [int(score.argmax())]
    return np.flatnonzero((score >= 0) & (score >= SHARE_OF_BEST * score.max())).tolist()


def class_answer(shape: tuple[int, int], word_boxes: np.ndarray, units: Sequence[Sequence[int]],
                 unit_probs: np.ndarray, label: str, one: bool, slope: float = 0.0) -> np.ndarray | None:
    """bool [H, W]: the units that answer a question naming `label` (`best_units` of their
    probability of it, unit_probs float [U, len(REGION_CLASSES)]), each the box around its words
    (along the text lines of a page whose lines rise by `slope`: `word_snap.fill_unit`); None when
    the page has no unit."""
    probs = np.asarray(unit_probs, np.float64).reshape(-1, len(REGION_CLASSES))
    chosen = best_units(probs[:, REGION_CLASSES.index(label)], one)
    if not chosen:
        return None
    boxes = np.asarray(word_boxes, np.float64).reshape(-1, 4)
    out = np.zeros(shape, dtype=bool)
    for i in chosen:
        fill_unit(out, boxes[list(units[i])], slope)
    return out
