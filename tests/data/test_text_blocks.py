"""Blocks on pages that set their lines wide apart: the page's own leading, measured from its
justified paragraphs, decides where a paragraph ends."""
from __future__ import annotations

import numpy as np

from dociq.data.text_blocks import group_blocks, line_spacing, paragraph_gap


def _paragraph_lines(top: float, lines: int, pitch: float, height: float = 10.0, width: float = 460.0):
    """Line spans x0, y0, x1, y1 of a justified paragraph: full lines, then a short last one."""
    spans = [[72.0, top + k * pitch, 72.0 + width, top + k * pitch + height] for k in range(lines)]
    spans[-1][2] = 72.0 + width / 3
    return spans


def _words(spans) -> np.ndarray:
    """Word boxes: each line cut into words 40 px wide with 6 px spaces, the last word to its end."""
    boxes = []
    for x0, y0, x1, y1 in spans:
        x = x0
        while x + 40 < x1:
            boxes.append([x, y0, x + 40, y1])
            x += 46
        boxes.append([x, y0, x1, y1])
    return np.array(boxes)


def test_one_and_a_half_spacing_is_measured_and_keeps_paragraphs_whole():
    # lines 10 px tall, 18 px apart (gap 0.8 of a line); the paragraphs 30 px apart (gap 2.0)
    first = _paragraph_lines(100, 4, pitch=18)
    second = _paragraph_lines(first[-1][3] + 20, 4, pitch=18)
    spans = np.array(first + second)
    assert abs(line_spacing(spans) - 0.8) < 1e-6
    assert abs(paragraph_gap(spans, default=0.6) - (0.8 + 0.25)) < 1e-6
    boxes = _words(spans)
    blocks = group_blocks(boxes)
    assert len(blocks) == 2
    tops = sorted(boxes[b, 1].min() for b in blocks)
    assert tops == [100.0, second[0][1]]


def test_single_spacing_keeps_the_default_gap():
    spans = np.array(_paragraph_lines(100, 5, pitch=12) + _paragraph_lines(170, 5, pitch=12))
    assert abs(line_spacing(spans) - 0.2) < 1e-6
    assert paragraph_gap(spans, default=0.6) == 0.6
    assert len(group_blocks(_words(spans))) == 2


def test_lines_that_merely_end_alike_measure_nothing():
    # two spaced list items whose single lines happen to reach the same margin: no run of three
    spans = np.array([[72.0, 100.0, 532.0, 110.0], [72.0, 124.0, 532.0, 134.0], [72.0, 150.0, 300.0, 160.0]])
    assert line_spacing(spans) is None
    assert paragraph_gap(spans, default=0.6) == 0.6
    assert len(group_blocks(_words(spans))) == 3
    # ragged lines (a page of code or single-line items) measure nothing either
    ragged = np.array([[72.0, 100.0 + 14 * k, 300.0 + 37 * (k % 4), 110.0 + 14 * k] for k in range(8)])
    assert line_spacing(ragged) is None


def test_a_ragged_right_page_measures_its_leading_from_an_ocrs_words():
    """An OCR's words are shorter than a text layer's font boxes: a ragged-right page's ordinary
    leading is a gap of 0.8 of their height. Measured on its lines that start under a wide line,
    the page keeps its paragraphs whole; with the text layer's rule (same right edge) it cannot."""
    paragraphs = [_paragraph_lines(100 + 96 * k, 4, pitch=18) for k in range(3)]
    for k, span in enumerate(span for p in paragraphs for span in p[:-1]):
        span[2] -= 23 * (k % 3)                    # ragged right: lines end up to two words apart
    spans = np.array([span for p in paragraphs for span in p])
    assert line_spacing(spans) is None
    assert abs(line_spacing(spans, ragged=True) - 0.8) < 1e-6
    assert line_spacing(spans[:8], ragged=True) is None        # six pairs: too few to measure
    boxes = _words(spans)
    assert len(group_blocks(boxes)) == 12                      # every line a block of its own
    blocks = group_blocks(boxes, word_heights=True)
    assert sorted(boxes[b, 1].min() for b in blocks) == [100.0, 196.0, 292.0]


def test_a_page_with_justified_runs_keeps_their_leading_when_measured_as_ragged():
    # a justified paragraph at a gap of 0.9, then ten wide ragged code lines set at 0.3
    spans = _paragraph_lines(100, 5, pitch=19) + [[72.0, 200.0 + 13 * k, 400.0 + 9 * (k % 3), 210.0 + 13 * k]
                                                  for k in range(10)]
    spans = np.array(spans)
    assert abs(line_spacing(spans) - 0.9) < 1e-6
    assert abs(line_spacing(spans, ragged=True) - 0.9) < 1e-6


def test_a_frame_side_read_as_a_tall_word_joins_no_lines():
    """A code frame's side that an OCR read as "|" (40 px tall beside 10-px lines) would join the
    three lines of both columns beside it into one; it stands apart and the columns stay apart."""
    from dociq.data.text_blocks import group_lines

    boxes = []
    for k in range(3):
        y = 100.0 + 14 * k
        boxes += [[80, y, 140, y + 10], [146, y, 220, y + 10],        # left column
                  [380, y, 440, y + 10], [446, y, 520, y + 10]]       # right column
    boxes.append([372, 98, 376, 140])                                 # the frame's side
    lines = group_lines(np.array(boxes, float))
    assert sorted(map(sorted, lines)) == sorted([[4 * k, 4 * k + 1] for k in range(3)]
                                                + [[4 * k + 2, 4 * k + 3] for k in range(3)] + [[12]])


def test_a_word_boxed_two_lines_tall_joins_one_line_and_merges_none():
    """An OCR's garbled word boxed across two lines (24 px beside 12-px words, 16 px apart) joins
    the line it overlaps most; the line below stays a line of its own."""
    from dociq.data.text_blocks import group_lines

    top = [[20, 100, 80, 112], [86, 100, 150, 112], [156, 100, 220, 112]]
    below = [[20, 116, 80, 128], [86, 116, 150, 128], [156, 116, 220, 128]]
    garbled = [[222, 101, 240, 125]]                  # 13 px over the top line, 9 over the one below
    lines = group_lines(np.array(top + below + garbled, float))
    assert sorted(map(sorted, lines)) == [[0, 1, 2, 6], [3, 4, 5]]
    # a word a little taller than its line (a capital, a bracket) changes nothing
    lines = group_lines(np.array(top + below + [[222, 99, 240, 115]], float))
    assert sorted(map(sorted, lines)) == [[0, 1, 2, 6], [3, 4, 5]]
