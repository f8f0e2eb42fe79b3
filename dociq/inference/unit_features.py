"""What a reader sees of a text unit without reading it: its place on the page, its size against
the page's body text, its first and last words, its characters, its spacing and the paper under it.

The unit classifier (`dociq.inference.unit_classifier`) names a unit's layout class from these
numbers. Every feature is a ratio of the page (its size, its body text's height, its grey), so a
page rendered at another resolution gives the same numbers.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from dociq.data.text_blocks import item_openers

BULLETS = frozenset("\u2022\u00b7\u25aa\u25e6\u2023\u2219\u25cb\u25cf\u25a0\u25a1\u2013-*\u25ba\u25b8")
ENUMERATOR = re.compile(r"^(\(?[0-9]{1,3}[.)]|\(?[a-zA-Z][.)]|\(?[ivxlcIVXLC]{1,5}[.)])$")
NUMBER = re.compile(r"^([0-9]{1,4}|[ivxlcdm]{1,7}|[IVXLCDM]{1,7})$")
CODE_CHARACTERS = frozenset("{}()[];=<>_/\\#$%&|~^`\"'@*+")
# a unit with nothing above or below it in its column: the gap, in line heights, that says so
NO_NEIGHBOUR = 50.0
PAPER_MARGIN = 4          # pixels of paper around a unit that its background is read from

FEATURE_NAMES = (
    "x0", "y0", "x1", "y1", "width", "height", "centre_x",
    "below_text_top", "above_text_bottom",
    "words", "lines", "characters_per_line", "log_characters",
    "height_vs_body", "indent_vs_margin",
    "opens_with_bullet", "opens_with_enumerator", "all_numbers", "ends_with_number",
    "digit_share", "upper_share", "code_character_share", "ends_with_period",
    "ends_with_colon", "opens_upper",
    "character_width", "character_width_spread",
    "gap_above", "gap_below", "units_beside",
    "paper_median", "paper_p90", "grey_mean",
    "topmost", "bottommost",
)


def unit_features(image: np.ndarray, word_boxes: np.ndarray, words: Sequence[str],
                  units: Sequence[Sequence[int]], ocr: bool = False) -> np.ndarray:
    """float32 [U, len(FEATURE_NAMES)]: the features of each text unit (word indices into
    `words` / `word_boxes` [N, 4] pixels of `image` uint8 [H, W, 3]), as named in FEATURE_NAMES.
    `ocr`: the words are an OCR engine's, so a first word read from a bullet ("e", "«", "©"), or a
    short marker the unit's next line hangs right of ("w -"), opens the unit with a bullet, as it
    opens a block in `page_blocks` (`text_blocks.item_openers`)."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not len(units):
        return np.zeros((0, len(FEATURE_NAMES)), np.float32)
    height, width = image.shape[:2]
    grey = image.mean(-1) if image.ndim == 3 else image.astype(np.float64)
    opens_item = item_openers(image, boxes, words, ocr)
    body = float(np.median(boxes[:, 3] - boxes[:, 1]))
    frames = np.array([[*boxes[list(u), :2].min(0), *boxes[list(u), 2:].max(0)] for u in units])
    text_top, text_bottom = frames[:, 1].min(), frames[:, 3].max()
    margin = np.percentile(frames[:, 0], 10)
    rows = []
    for i, unit in enumerate(units):
        unit = list(unit)
        x0, y0, x1, y1 = frames[i]
        wb = boxes[unit]
        texts = [str(words[k]) for k in unit]
        text = " ".join(texts)
        characters = max(len(text.replace(" ", "")), 1)
        line_height = float(np.median(wb[:, 3] - wb[:, 1]))
        centres = np.sort((wb[:, 1] + wb[:, 3]) / 2)
        lines = 1 + int((np.diff(centres) > 0.5 * line_height).sum())
        character_widths = np.array([(b[2] - b[0]) / max(len(t), 1) for b, t in zip(wb, texts)])
        others = np.delete(frames, i, 0)
        column = np.minimum(others[:, 2], x1) > np.maximum(others[:, 0], x0)
        above, below = others[column & (others[:, 3] <= y0 + 1)], others[column & (others[:, 1] >= y1 - 1)]
        gap_above = (y0 - above[:, 3].max()) / line_height if len(above) else NO_NEIGHBOUR
        gap_below = (below[:, 1].min() - y1) / line_height if len(below) else NO_NEIGHBOUR
        beside = (np.minimum(others[:, 3], y1) - np.maximum(others[:, 1], y0)) > 0.5 * line_height
        c0, r0 = int(x0), int(y0)
        c1, r1 = max(int(x1), c0 + 1), max(int(y1), r0 + 1)
        paper = grey[max(r0 - PAPER_MARGIN, 0):r1 + PAPER_MARGIN, max(c0 - PAPER_MARGIN, 0):c1 + PAPER_MARGIN]
        first = texts[0]
        rows.append([
            x0 / width, y0 / height, x1 / width, y1 / height, (x1 - x0) / width, (y1 - y0) / height,
            (x0 + x1) / 2 / width,
            (y0 - text_top) / height, (text_bottom - y1) / height,
            len(unit), lines, characters / lines, np.log(characters),
            line_height / body, (x0 - margin) / body,
            float(first in BULLETS or bool(opens_item[unit[0]])), float(bool(ENUMERATOR.match(first))),
            float(all(NUMBER.match(t) for t in texts)), float(bool(NUMBER.match(texts[-1]))),
            sum(c.isdigit() for c in text) / characters, sum(c.isupper() for c in text) / characters,
            sum(c in CODE_CHARACTERS for c in text) / characters, float(text.rstrip().endswith(".")),
            float(text.rstrip().endswith(":")), float(first[:1].isupper()),
            np.median(character_widths) / line_height, np.std(character_widths) / (np.mean(character_widths) + 1e-6),
            min(gap_above, NO_NEIGHBOUR), min(gap_below, NO_NEIGHBOUR), int(beside.sum()),
            float(np.median(paper)) / 255, float(np.percentile(paper, 90)) / 255,
            float(grey[r0:r1, c0:c1].mean()) / 255,
            float(y0 <= text_top + 1), float(y1 >= text_bottom - 1),
        ])
    return np.asarray(rows, np.float32)
