"""The page being laid out: placed words, drawn shapes and regions, before anything is rendered.

Block builders write into a `Draft` and roll it back when a block does not fit, so layout is
pure bookkeeping (boxes from the fonts' `getbbox`) and rendering happens once at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dociq.data.synthetic.fonts import FontKey, line_height, space_width, word_bbox, word_width

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x1/y1 exclusive
Color = tuple[int, int, int]


@dataclass
class PlacedWord:
    text: str
    font: FontKey
    origin: tuple[int, int]  # draw origin (left, ascender top)
    box: Box  # origin + font.getbbox(text): the word's tight box
    color: Color


@dataclass
class Shape:
    """A non-text mark: kind is 'rect', 'line', 'ellipse' or 'polyline'."""

    kind: str
    xy: list[tuple[float, float]]
    color: Color
    width: int = 1
    fill: Color | None = None


@dataclass
class DraftRegion:
    label: str
    box: Box
    word_ids: list[int]
    shape: str = "box"  # 'box' or 'ellipse': how the mask fills the box


@dataclass
class FormInfo:
    person: str
    fields: dict[str, tuple[int, int]]  # label -> (key region id, value region id)


@dataclass
class TableInfo:
    region: int
    header: list[str]
    row_keys: list[str]
    cells: list[list[int]]  # cells[r][c] region id; row 0 is the header row


@dataclass
class Draft:
    height: int
    width: int
    words: list[PlacedWord] = field(default_factory=list)
    shapes: list[Shape] = field(default_factory=list)
    regions: list[DraftRegion] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    forms: list[FormInfo] = field(default_factory=list)
    tables: list[TableInfo] = field(default_factory=list)
    signatures: list[tuple[str, int]] = field(default_factory=list)  # (printed name, region id)

    # -- undo: a block that does not fit is removed again ---------------------------------------
    def mark(self) -> tuple[int, ...]:
        return tuple(len(x) for x in self._lists())

    def rollback(self, mark: tuple[int, ...]) -> None:
        for items, n in zip(self._lists(), mark):
            del items[n:]

    def _lists(self):
        return (self.words, self.shapes, self.regions, self.links, self.forms, self.tables, self.signatures)

    # -- text -----------------------------------------------------------------------------------
    def word(self, text: str, font: FontKey, x: int, y: int, color: Color) -> int:
        bbox = word_bbox(font, text)
        self.words.append(PlacedWord(text, font, (x, y), (x + bbox[0], y + bbox[1], x + bbox[2], y + bbox[3]), color))
        return len(self.words) - 1

    def lines(self, text: str, font: FontKey, width: int, first_indent: int = 0) -> list[list[str]]:
        """Greedy line breaking of `text` into lines no wider than `width`; a word wider than a
        line is cut to fit (long emails and URLs)."""
        space = space_width(font)
        lines: list[list[str]] = [[]]
        used = first_indent
        for token in text.split():
            w = word_width(font, token)
            if w > width:
                while token and word_width(font, token) > width:
                    token = token[:-1]
                if not token:
                    continue
                w = word_width(font, token)
            if lines[-1] and used + space + w > width:
                lines.append([])
                used = 0
            used += (space if lines[-1] else 0) + w
            lines[-1].append(token)
        return [line for line in lines if line]

    def place_lines(self, lines: list[list[str]], font: FontKey, x: int, y: int, width: int, color: Color,
                    align: str = "left") -> tuple[list[int], int]:
        """Draw wrapped lines from top `y`; returns (word ids, bottom y)."""
        space, lh = space_width(font), line_height(font)
        ids: list[int] = []
        for line in lines:
            widths = [word_width(font, t) for t in line]
            total = sum(widths) + space * (len(line) - 1)
            cx = x + {"left": 0, "center": (width - total) // 2, "right": width - total}[align]
            for token, w in zip(line, widths):
                ids.append(self.word(token, font, cx, y, color))
                cx += w + space
            y += lh
        return ids, y

    # -- regions --------------------------------------------------------------------------------
    def words_box(self, ids: list[int], pad: int = 0) -> Box:
        boxes = [self.words[i].box for i in ids]
        return self.clip((min(b[0] for b in boxes) - pad, min(b[1] for b in boxes) - pad,
                          max(b[2] for b in boxes) + pad, max(b[3] for b in boxes) + pad))

    def clip(self, box: Box) -> Box:
        return (max(0, box[0]), max(0, box[1]), min(self.width, box[2]), min(self.height, box[3]))

    def region(self, label: str, word_ids: list[int], box: Box | None = None, pad: int = 1,
               shape: str = "box") -> int:
        if box is None:
            box = self.words_box(word_ids, pad)
        self.regions.append(DraftRegion(label, self.clip(box), list(word_ids), shape))
        return len(self.regions) - 1

    def region_text(self, region_id: int) -> str:
        return " ".join(self.words[i].text for i in self.regions[region_id].word_ids)
