"""A form field's value found from where the words sit: right of its label on its line, else the
nearest line below.

The rule needs no model, so it reads a scanned form whose layout no training page had the same way
it reads a synthetic one. The Predictor answers "which value belongs to the field ‘K’?" with the
value beside or below the label K that the decoder's mask lies on, and with the rule's value where
it lies elsewhere (`link_answer`); the detector baseline (dociq.evaluation.
detector_baseline) answers with the rule alone.

    words = PageWords(["Name:", "Ada", "Lovelace"], boxes)
    label = label_runs("Name", words)[0]           # word indices of the label's first occurrence
    field_value(label, words)                      # -> [1, 2]
"""
from __future__ import annotations

import re
from functools import cached_property
from typing import Sequence

import numpy as np

from dociq.data.lexical import FUZZY_MIN_LENGTH, normalise, within_one_edit
from dociq.data.text_blocks import skew_slope
from dociq.models.word_snap import fill_unit, pixel_boxes, word_members

# A gap wider than this x the word height ends a value (text_blocks' rule).
GAP_FACTOR = 1.5
# A label misread by OCR: at most one edit in five of its letters (at least one; labels of 3+ letters).
MISREAD_RATE, MISREAD_MIN_LETTERS = 1 / 5, 3
# The line under a label holds its value rather than the words right of it when it is much nearer:
# (at most this many label heights below, the right words at least this many away), either pair.
# On printed training forms this takes the stacked templates' values from under their labels and
# leaves every value that sits beside its label where it is.
BELOW_BEFORE_RIGHT = ((1.2, 20.0), (0.6, 4.0))
# A value wraps onto the next line when that line starts under it within this x its word height
# (printed training forms: wrapped lines 0.17-0.63 apart, the next field's line 0.67 or more).
WRAP_GAP = 0.6
# The phrasing of a field question (dociq.data.synthetic.questions) and its quoted label.
_LINK = re.compile(r"value\s+(?:that\s+)?(?:belongs\s+to|of|for)\s+the\s+field\s+"
                   r"(?:\u2018([^\u2019]+)\u2019|\u201c([^\u201d]+)\u201d|\"([^\"]+)\"|'([^']+)')", re.IGNORECASE)


class PageWords:
    """OCR words with their normalised, case-folded forms and box geometry (page pixels)."""

    def __init__(self, words: Sequence[str], boxes: np.ndarray, slope: float | None = None) -> None:
        self.words = list(words)
        self._slope = slope                          # the scan's skew, when the caller knows it
        self.boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        self.keys = [normalise(w).casefold() for w in self.words]
        self.centres = (self.boxes[:, :2] + self.boxes[:, 2:]) / 2
        self.heights = self.boxes[:, 3] - self.boxes[:, 1]
        # OCR reads a value box's border as "|" or "[": a word with no letter or digit holds no value
        self.inked = np.array([any(c.isalnum() for c in w) for w in self.words], bool)
        self.ends_label = np.array([w.endswith(":") for w in self.words], bool)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def slope(self) -> float:
        """The scan's skew as the slope (dy / dx) of its text lines (`skew_slope`; O(words^2), so
        found only for pages asked about a field)."""
        if self._slope is None:
            self._slope = skew_slope(self.boxes)
        return self._slope

    @cached_property
    def _rise(self) -> np.ndarray:
        # the skew's rise at each word, once: `tops` and `bottoms` are read in every line test
        return self.slope * self.centres[:, 0]

    @property
    def tops(self) -> np.ndarray:
        """The words' tops with the scan's skew taken out, so that a line is level across the page."""
        return self.boxes[:, 1] - self._rise

    @property
    def bottoms(self) -> np.ndarray:
        return self.boxes[:, 3] - self._rise

    def runs(self, phrase: str, fuzzy: bool = False) -> list[list[int]]:
        """Every run of consecutive words that spells `phrase` (normalised, case-folded); with
        `fuzzy`, a word of FUZZY_MIN_LENGTH letters or more may be one edit away (an OCR misread)."""
        tokens = [k for k in (normalise(t).casefold() for t in phrase.split()) if k]
        n = len(tokens)
        if not n:
            return []

        def same(key: str, token: str) -> bool:
            return key == token or (fuzzy and min(len(key), len(token)) >= FUZZY_MIN_LENGTH
                                    and within_one_edit(key, token))
        return [list(range(i, i + n)) for i in range(len(self.keys) - n + 1)
                if all(same(k, t) for k, t in zip(self.keys[i:i + n], tokens))]

    def matching(self, tokens: Sequence[str]) -> list[int]:
        """Words equal (case-folded) to any of the normalised tokens."""
        wanted = {normalise(t).casefold() for t in tokens} - {""}
        return [i for i, k in enumerate(self.keys) if k in wanted]

    def next_in_line(self, ids: Sequence[int]) -> int | None:
        """The word that continues the words `ids` as one phrase: the nearest right of the last on its
        line within a narrow gap, else the first of the line just below that starts under the first
        (a label wrapped in its cell); None when there is none."""
        last, first = ids[-1], ids[0]
        height = self.heights[last]
        right = np.flatnonzero(self.same_line([last]) & (self.boxes[:, 0] >= self.boxes[last, 2] - 1)
                               & (self.boxes[:, 0] - self.boxes[last, 2] <= GAP_FACTOR * height))
        right = np.setdiff1d(right, ids)
        if len(right):
            return int(right[np.argmin(self.boxes[right, 0])])
        below = np.flatnonzero((self.tops >= self.bottoms[last] - 0.5 * height)
                               & (self.tops <= self.bottoms[last] + height)
                               & (np.abs(self.boxes[:, 0] - self.boxes[first, 0]) <= height))
        below = np.setdiff1d(below, ids)
        return int(below[np.argmin(self.tops[below])]) if len(below) else None

    def continues_phrase(self, i: int) -> bool:
        """Whether word i follows another on its line within a narrow gap — a word that is no
        label's end (':'), so that i is inside a phrase, not at its start."""
        gap = self.boxes[i, 0] - self.boxes[:, 2]
        before = (self.same_line([i]) & (gap >= -1) & (gap <= GAP_FACTOR * self.heights[i]) & self.inked
                  & ~self.ends_label)
        before[i] = False
        return bool(before.any())

    def is_continued(self, i: int) -> bool:
        """Whether a word follows word i on its line within a narrow gap and i does not end in ':'
        — i ends no phrase (the "Date" of "Date of birth")."""
        gap = self.boxes[:, 0] - self.boxes[i, 2]
        after = self.same_line([i]) & (gap >= -1) & (gap <= GAP_FACTOR * self.heights[i]) & self.inked
        after[i] = False
        return bool(after.any()) and not self.ends_label[i]

    def printed_as(self, ids: Sequence[int], text: str) -> bool:
        """Whether the words `ids` spell `text` with the same capitals (a question quotes a label as
        the form prints it)."""
        return "".join(normalise(self.words[k]) for k in ids) == "".join(normalise(t) for t in text.split())

    def in_capitals(self, ids: Sequence[int]) -> bool:
        """Whether the words `ids` are letters in capitals, no digit among them ("ZIP CODE", not
        "994 9YI" or "Ada")."""
        text = "".join(self.words[k] for k in ids)
        return any(c.isalpha() for c in text) and text.isupper() and not any(c.isdigit() for c in text)

    def box(self, ids: Sequence[int]) -> np.ndarray:
        """[1, 4]: the box around the words `ids`."""
        boxes = self.boxes[list(ids)]
        return np.concatenate([boxes[:, :2].min(0), boxes[:, 2:].max(0)])[None]

    def mask(self, ids: Sequence[int], shape: tuple[int, int]) -> np.ndarray:
        """bool [H, W]: the words `ids` as one region, drawn along the scan's skew
        (`word_snap.fill_unit`), as a target region is drawn."""
        out = np.zeros(shape, bool)
        fill_unit(out, self.boxes[list(ids)], self.slope)
        return out

    def same_line(self, ids: Sequence[int]) -> np.ndarray:
        """bool [N]: words overlapping the band of `ids` vertically by half the shorter height."""
        y0, y1 = self.tops[list(ids)].min(), self.bottoms[list(ids)].max()
        overlap = np.minimum(self.bottoms, y1) - np.maximum(self.tops, y0)
        shorter = np.maximum(np.minimum(self.heights, y1 - y0), 1.0)
        return overlap / shorter >= 0.5


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions turning a into b."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def misread_runs(phrase: str, words: PageWords) -> list[list[int]]:
    """Where OCR misread the phrase's letters ("PAX:" for "FAX"), merged or split its words
    ("Hoursper week:") or its cell wrapped it onto a second line: runs of words that continue one
    another (`PageWords.next_in_line`) whose letters are within MISREAD_RATE edits of the phrase's,
    closest first."""
    tokens = [k for k in (normalise(t).casefold() for t in phrase.split()) if k]
    target = "".join(tokens)
    if len(target) < MISREAD_MIN_LETTERS:
        return []
    allowed = max(1, round(len(target) * MISREAD_RATE))
    found = []
    for start, key in enumerate(words.keys):
        if not key or edit_distance(key[:len(tokens[0])], tokens[0]) > allowed:
            continue
        run, letters, best = [start], key, None
        while len(letters) <= len(target) + allowed:
            distance = edit_distance(letters, target)
            if distance <= allowed and (best is None or distance < best[0]):
                best = (distance, list(run))
            following = words.next_in_line(run)
            if following is None or not words.keys[following]:
                break
            run.append(following)
            letters += words.keys[following]
        if best is not None:
            found.append(best)
    return [run for _, run in sorted(found, key=lambda f: f[0])]


def link_label(question: str) -> str | None:
    """The label a field question quotes ("which value belongs to the field ‘Name’?" -> "Name"),
    or None for any other question."""
    match = _LINK.search(question)
    return next(g for g in match.groups() if g) if match else None


def label_runs(label_text: str, words: PageWords) -> list[list[int]]:
    """The label's occurrences — spelled exactly, else with a long word one edit away (`PageWords.runs`
    fuzzy), else misread, merged, split or wrapped (`misread_runs`) — those ending in ':' (a form
    label, not e.g. a table header) first, and of those the ones that begin their phrase ("Date:",
    not the end of "Start date:"), then those that end it (not the start of "Date of birth"), then
    those printed with the question's capitals ("Date:", not a memo's "DATE:")."""
    runs = words.runs(label_text) or words.runs(label_text, fuzzy=True) or misread_runs(label_text, words)
    return sorted(runs, key=lambda run: (not words.ends_label[run[-1]], words.continues_phrase(run[0]),
                                         words.is_continued(run[-1]), not words.printed_as(run, label_text)))


def field_value(label: Sequence[int], words: PageWords) -> list[int]:
    """The value of a form label (word indices): the words right of it on its line up to a wide
    gap, else the nearest line below that overlaps its column — neither holding a word that ends
    in ':' (another field's label). Where there are both, the one not in capitals when the label
    is, else the line below when it is far nearer than the words right (`BELOW_BEFORE_RIGHT`: those
    are the next column's label, its colon lost to OCR, or a heading); [] when there is no value."""
    right, under = right_of(label, words), below(label, words)
    if right and under:
        if words.in_capitals(label) and words.in_capitals(right) != words.in_capitals(under):
            # a label printed in capitals: the other side in capitals is another label
            return right if words.in_capitals(under) else under
        if _below_nearer(label, right, under, words):
            return under
    return right or under


def _below_nearer(label: Sequence[int], right: list[int], under: list[int], words: PageWords) -> bool:
    """Whether the line `under` the label is far nearer to it than the words `right` of it."""
    height = words.heights[label[0]]
    gap_below = (words.tops[under].min() - words.bottoms[list(label)].max()) / height
    gap_right = (words.boxes[right, 0].min() - words.boxes[list(label), 2].max()) / height
    return any(gap_below <= most_below and gap_right >= least_right
               for most_below, least_right in BELOW_BEFORE_RIGHT)


def _chain(start: int, candidates: np.ndarray, words: PageWords) -> list[int]:
    """`start` and the candidates right of it while the gap to the next stays narrow."""
    right = [int(j) for j in candidates if words.boxes[j, 0] >= words.boxes[start, 0]]
    ids = [start]
    for j in sorted(right, key=lambda j: words.boxes[j, 0]):
        if j != start and words.boxes[j, 0] - words.boxes[ids[-1], 2] <= GAP_FACTOR * words.heights[start]:
            ids.append(j)
        elif j != start:
            break
    return ids


def _unless_label(ids: list[int], words: PageWords) -> list[int]:
    """`ids`, or [] when they hold a word ending in ':' — the next field's label, not a value."""
    return [] if words.ends_label[list(ids)].any() else ids


def right_of(label: Sequence[int], words: PageWords) -> list[int]:
    """The words right of the label on its line, up to a wide gap; [] when they are a label."""
    x1 = words.boxes[list(label), 2].max()
    line = np.flatnonzero(words.same_line(label) & (words.boxes[:, 0] >= x1 - 1) & words.inked)
    line = np.setdiff1d(line, label)
    if not len(line):
        return []
    value = _unless_label(_chain(int(line[np.argmin(words.boxes[line, 0])]), line, words), words)
    return _wrapped(value, label, words)


def below(label: Sequence[int], words: PageWords) -> list[int]:
    """The nearest line piece below the label that overlaps its column; [] when it is a label."""
    box = words.box(label)[0]
    under = np.flatnonzero(words.inked & (words.tops >= words.bottoms[list(label)].max() - 1) & (words.boxes[:, 0] < box[2])
                           & (words.boxes[:, 2] > box[0]))
    if not len(under):
        return []
    first = int(under[np.argmin(words.tops[under])])
    line = np.flatnonzero(words.same_line([first]) & words.inked)
    start = min(_chain_left(first, line, words), key=lambda j: words.boxes[j, 0])
    return _wrapped(_unless_label(_chain(start, line, words), words), label, words)


def _wrapped(value: list[int], label: Sequence[int], words: PageWords) -> list[int]:
    """The value and the lines it wraps onto (an address in its cell): each next line that starts
    under the value's first word within WRAP_GAP heights, with nothing left of it back to the
    label's column (else it is the next row, beside its own label) and no word ending in ':'."""
    if not value:
        return value
    ids, height = list(value), words.heights[value[0]]
    x0, column = words.boxes[value, 0].min(), words.boxes[list(label), 0].min() - height
    while True:
        bottom = words.bottoms[ids].max()
        starts = np.flatnonzero(words.inked & (words.tops >= bottom - 1) & (words.tops - bottom <= WRAP_GAP * height)
                                & (np.abs(words.boxes[:, 0] - x0) <= height))
        starts = np.setdiff1d(starts, ids)
        if not len(starts):
            return ids
        first = int(starts[np.argmin(words.boxes[starts, 0])])
        line = np.flatnonzero(words.same_line([first]) & words.inked)
        beside = line[(words.boxes[line, 2] <= words.boxes[first, 0] + 1) & (words.boxes[line, 0] >= column)]
        piece = _chain(first, line, words)
        if len(beside) or words.ends_label[piece].any():
            return ids
        ids += piece


def _chain_left(start: int, line: np.ndarray, words: PageWords) -> list[int]:
    """`start` and the words left of it on its line while the gap stays narrow."""
    ids = [start]
    for j in sorted(line, key=lambda j: -words.boxes[j, 2]):
        if words.boxes[j, 2] <= words.boxes[ids[-1], 0] + 1 and j != start:
            if words.boxes[ids[-1], 0] - words.boxes[j, 2] > GAP_FACTOR * words.heights[start]:
                break
            ids.append(int(j))
    return ids


def link_answer(mask: np.ndarray, label_text: str, words: PageWords) -> np.ndarray:
    """The answer to "which value belongs to the field ‘label_text’?" given the decoder's mask
    (bool [H, W], snapped, in the words' pixels): the box of the value the mask's words lie mostly
    on — the rule's value (`field_value`) of any occurrence of the label — else the box of the
    rule's value of the label's first occurrence. The decoder chooses among the label's
    occurrences; the words set the side and the mask's extent. Unchanged when the page does not
    hold the label or the label has no value."""
    runs = label_runs(label_text, words)
    values = [(run, field_value(run, words)) for run in runs]
    if not any(value for _, value in values):
        return mask
    held = word_members(mask, pixel_boxes(words.boxes, mask.shape)) if mask.any() else np.zeros(len(words), bool)
    chosen = values[0][1]
    for run, value in values:
        on_value = held[value].sum()
        elsewhere = held.sum() - on_value - held[run].sum()
        if on_value and elsewhere <= on_value:
            chosen = value
            break
    return words.mask(chosen, mask.shape) if chosen else mask
