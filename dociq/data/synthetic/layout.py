"""Page layout: block builders (title, heading, paragraph, list, form, table, figure, stamp,
signatures, header/footer) and the column flow that places them on a page.

Every builder writes into a `Draft` from (x, y) within a column of `width` pixels and returns the
block's bottom y, or None after rolling the draft back when the block does not fit above `bottom`.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from faker import Faker

from dociq.data.synthetic import content
from dociq.data.synthetic.draft import Color, Draft, FormInfo, Shape, TableInfo
from dociq.data.synthetic.fonts import FontKey, line_height, space_width, word_width


@dataclass
class Style:
    body: FontKey
    bold: FontKey
    heading: FontKey
    title: FontKey
    small: FontKey
    caption: FontKey
    mono: FontKey
    ink: Color
    accent: Color
    gap: int  # vertical space between blocks


def page_style(rng: random.Random, height: int) -> Style:
    family = rng.choice(["sans", "serif"])
    head_family = rng.choice([family, "sans"])
    body = max(7, round(height * rng.uniform(0.016, 0.021)))
    ink = (rng.randint(0, 40),) * 3
    accent = rng.choice([ink, (20, 40, 110), (90, 20, 20), (10, 70, 60)])
    return Style(
        body=(family, "regular", body),
        bold=(family, "bold", body),
        heading=(head_family, "bold", round(body * rng.uniform(1.15, 1.35))),
        title=(head_family, "bold", round(body * rng.uniform(1.6, 2.1))),
        small=(family, "regular", max(6, round(body * 0.85))),
        caption=(family, "oblique", max(6, round(body * 0.9))),
        mono=("mono", rng.choice(["regular", "bold"]), body),
        ink=ink,
        accent=accent,
        gap=max(3, round(body * 0.7)),
    )


class Builder:
    """Block builders sharing one page's draft, style, random source and Faker."""

    def __init__(self, draft: Draft, style: Style, rng: random.Random, fake: Faker):
        self.d, self.s, self.rng, self.fake = draft, style, rng, fake
        self.heading_number = 0
        self.figure_number = 0

    def _fits(self, mark, y: int, bottom: int) -> int | None:
        if y > bottom:
            self.d.rollback(mark)
            return None
        return y

    # -- text blocks ----------------------------------------------------------------------------
    def title(self, x: int, y: int, width: int, bottom: int) -> int | None:
        mark = self.d.mark()
        lines = self.d.lines(content.title(self.fake, self.rng), self.s.title, width)[:2]
        ids, y = self.d.place_lines(lines, self.s.title, x, y, width, self.s.accent,
                                    align=self.rng.choice(["left", "center"]))
        self.d.region("title", ids)
        return self._fits(mark, y, bottom)

    def heading(self, x: int, y: int, width: int, bottom: int) -> int | None:
        # A heading needs room for two body lines after it: no orphan headings at a column foot.
        if y + line_height(self.s.heading) + 2 * line_height(self.s.body) > bottom:
            return None
        self.heading_number += 1
        lines = self.d.lines(content.heading(self.fake, self.rng, self.heading_number), self.s.heading, width)[:1]
        ids, y = self.d.place_lines(lines, self.s.heading, x, y, width, self.s.accent)
        self.d.region("section_heading", ids)
        return y

    def paragraph(self, x: int, y: int, width: int, bottom: int) -> int | None:
        lh = line_height(self.s.body)
        room = (bottom - y) // lh
        if room < 2:
            return None
        lines = self.d.lines(content.paragraph(self.fake, self.rng), self.s.body, width)[:room]
        ids, y = self.d.place_lines(lines, self.s.body, x, y, width, self.s.ink)
        self.d.region("paragraph", ids)
        return y

    def bullet_list(self, x: int, y: int, width: int, bottom: int) -> int | None:
        font, lh = self.s.body, line_height(self.s.body)
        indent = max(8, self.s.body[2])
        added = 0
        for item in content.list_items(self.fake, self.rng):
            lines = self.d.lines(item, font, width - indent)[:3]
            if y + lh * len(lines) > bottom:
                break
            ids, y_end = self.d.place_lines(lines, font, x + indent, y, width - indent, self.s.ink)
            # The bullet is a drawn dot, not an OCR word, centred on the first line's x-height.
            r = max(1, font[2] // 6)
            cy = y + int(font[2] * 0.55)
            self.d.shapes.append(Shape("ellipse", [(x + 2, cy - r), (x + 2 + 2 * r, cy + r)], self.s.ink, fill=self.s.ink))
            box = self.d.words_box(ids, 1)
            self.d.region("list_item", ids, box=(x, box[1], box[2], box[3]))
            y = y_end + max(1, lh // 5)
            added += 1
        return y if added else None

    # -- forms and tables -----------------------------------------------------------------------
    def form(self, x: int, y: int, width: int, bottom: int) -> int | None:
        mark = self.d.mark()
        data = content.form(self.fake, self.rng, max_fields=6)
        key_font, value_font = self.s.bold, self.rng.choice([self.s.body, self.s.mono])
        lh = line_height(self.s.body)
        keys = [label + ":" for label, _ in data.fields]
        space = space_width(key_font)
        key_w = min(max(sum(word_width(key_font, t) + space for t in k.split()) for k in keys), width // 2)
        value_x, value_w = x + key_w + max(4, lh // 2), width - key_w - max(4, lh // 2)
        if value_w < 4 * lh:
            return None
        fields: dict[str, tuple[int, int]] = {}
        for (label, value), key in zip(data.fields, keys):
            key_lines = self.d.lines(key, key_font, key_w)[:2]
            value_lines = self.d.lines(value, value_font, value_w)[:2]
            if y + lh * max(len(key_lines), len(value_lines)) > bottom:
                break
            key_ids, key_end = self.d.place_lines(key_lines, key_font, x, y, key_w, self.s.ink)
            value_ids, value_end = self.d.place_lines(value_lines, value_font, value_x, y, value_w, self.s.ink)
            k = self.d.region("form_key", key_ids)
            v = self.d.region("form_value", value_ids)
            self.d.links.append((k, v))
            fields[label] = (k, v)
            if self.rng.random() < 0.5:  # the fill-in line under the value
                line_y = min(bottom, self.d.regions[v].box[3] + 1)
                self.d.shapes.append(Shape("line", [(value_x, line_y), (x + width - 1, line_y)], (150, 150, 150)))
            y = max(key_end, value_end) + max(1, lh // 4)
        if len(fields) < 2:  # a form without a field beside the name is no form
            self.d.rollback(mark)
            return None
        # Questions quote the page as printed (a value too wide for its column is cut).
        self.d.forms.append(FormInfo(self.d.region_text(fields["Name"][1]), fields))
        return y

    def table(self, x: int, y: int, width: int, bottom: int) -> int | None:
        mark = self.d.mark()
        font, head_font = self.s.small, (self.s.small[0], "bold", self.s.small[2])
        pad = max(2, font[2] // 3)
        row_h = line_height(font) + 2 * pad
        n_rows = min(self.rng.randint(2, 6), (bottom - y) // row_h - 1)
        if n_rows < 2:
            return None
        data = content.table(self.fake, self.rng, n_rows, self.rng.randint(3, 4))
        # Drop columns from the right until the natural widths fit the column.
        while True:
            cols = len(data.header)
            natural = [max([word_width(head_font, data.header[c]) + 2 * pad + len(data.header[c].split()) * 3]
                           + [sum(word_width(font, t) for t in r[c].split()) + 3 * len(r[c].split()) + 2 * pad
                              for r in data.rows]) for c in range(cols)]
            if sum(natural) <= width or cols <= 2:
                break
            data.header, data.rows = data.header[:-1], [r[:-1] for r in data.rows]
        if sum(natural) > width:
            return None
        extra = (width - sum(natural)) // cols if self.rng.random() < 0.7 else 0
        widths = [w + extra for w in natural]
        xs = [x]
        for w in widths:
            xs.append(xs[-1] + w)
        ys = [y + r * row_h for r in range(len(data.rows) + 2)]
        if ys[-1] >= bottom:
            return None
        aligns = ["left"] + [self.rng.choice(["left", "right"]) for _ in widths[1:]]
        cells: list[list[int]] = []
        for r, row in enumerate([data.header] + data.rows):
            cells.append([])
            for c, text in enumerate(row):
                f = head_font if r == 0 else font
                lines = self.d.lines(text, f, widths[c] - 2 * pad)[:1]
                ids, _ = self.d.place_lines(lines, f, xs[c] + pad, ys[r] + pad, widths[c] - 2 * pad, self.s.ink,
                                            aligns[c])
                cells[-1].append(self.d.region("table_cell", ids, box=(xs[c], ys[r], xs[c + 1], ys[r + 1])))
        table_ids = [i for row in cells for c in row for i in self.d.regions[c].word_ids]
        table = self.d.region("table", table_ids, box=(xs[0], ys[0], xs[-1] + 1, ys[-1] + 1))
        grid = (120, 120, 120)
        if self.rng.random() < 0.3:
            self.d.shapes.append(Shape("rect", [(xs[0], ys[0]), (xs[-1], ys[1])], (230, 230, 230), fill=(230, 230, 230)))
        full_grid = self.rng.random() < 0.6
        for yy in ys if full_grid else (ys[0], ys[1], ys[-1]):
            self.d.shapes.append(Shape("line", [(xs[0], yy), (xs[-1], yy)], grid))
        if full_grid:
            for xx in xs:
                self.d.shapes.append(Shape("line", [(xx, ys[0]), (xx, ys[-1])], grid))
        printed = [[self.d.region_text(c) for c in row] for row in cells]
        self.d.tables.append(TableInfo(table, printed[0], [row[0] for row in printed[1:]], cells))
        return self._fits(mark, ys[-1] + 1, bottom)

    # -- graphics -------------------------------------------------------------------------------
    def figure(self, x: int, y: int, width: int, bottom: int) -> int | None:
        rng = self.rng
        w = int(width * rng.uniform(0.5, 0.95))
        h = min(int(w * rng.uniform(0.4, 0.7)), int(self.d.height * rng.uniform(0.15, 0.28)))  # not a whole page
        cap_lh = line_height(self.s.caption)
        if h < 30 or y + h + 3 * cap_lh > bottom:
            return None
        mark = self.d.mark()
        x0 = x + (width - w) // 2
        self._chart(x0, y, w, h)
        self.figure_number += 1
        lines = self.d.lines(content.caption(self.fake, rng, self.figure_number), self.s.caption, width)[:2]
        ids, end = self.d.place_lines(lines, self.s.caption, x, y + h + 3, width, self.s.ink, align="center")
        cap = self.d.words_box(ids)
        self.d.region("figure", ids, box=(min(x0, cap[0]), y, max(x0 + w, cap[2]), max(end, cap[3])))
        return self._fits(mark, end, bottom)

    def _chart(self, x: int, y: int, w: int, h: int) -> None:
        rng, shapes = self.rng, self.d.shapes
        shapes.append(Shape("rect", [(x, y), (x + w - 1, y + h - 1)], (90, 90, 90)))
        color = rng.choice([(70, 110, 180), (200, 120, 50), (90, 150, 90), (120, 120, 120)])
        left, base, top = x + w // 10, y + h - h // 8, y + h // 8
        shapes.append(Shape("line", [(left, top), (left, base), (x + w - w // 20, base)], (40, 40, 40)))
        kind = rng.choice(["bars", "line", "pie"])
        if kind == "bars":
            n = rng.randint(3, 8)
            step = (x + w - w // 20 - left) / n
            for i in range(n):
                bh = int((base - top) * rng.uniform(0.15, 1.0))
                bx = left + int(i * step + step * 0.2)
                shapes.append(Shape("rect", [(bx, base - bh), (bx + max(1, int(step * 0.6)), base)], color, fill=color))
        elif kind == "line":
            n = rng.randint(5, 12)
            pts = [(left + (x + w - w // 20 - left) * i / (n - 1), base - (base - top) * rng.uniform(0.1, 1.0))
                   for i in range(n)]
            shapes.append(Shape("polyline", pts, color, width=2))
        else:
            r = min(w, h) // 3
            cx, cy = x + w // 2, y + h // 2
            shapes.append(Shape("ellipse", [(cx - r, cy - r), (cx + r, cy + r)], color, fill=color))
            shapes.append(Shape("line", [(cx, cy), (cx + r, cy)], (255, 255, 255), width=2))
            a = rng.uniform(0.5, 5.5)
            shapes.append(Shape("line", [(cx, cy), (cx + r * math.cos(a), cy - r * math.sin(a))], (255, 255, 255), width=2))

    def stamp(self, x: int, y: int, width: int, bottom: int) -> int | None:
        rng = self.rng
        font = ("sans", "bold", max(8, round(self.s.body[2] * rng.uniform(1.0, 1.5))))
        color = rng.choice([(190, 30, 40), (30, 60, 170), (110, 40, 140)])
        lines = [[t for t in line.split()] for line in content.stamp_lines(self.fake, rng)]
        lh = line_height(font)
        text_w = max(sum(word_width(font, t) for t in line) + 4 * (len(line) - 1) for line in lines)
        text_h = lh * len(lines)
        ellipse = rng.random() < 0.5
        # An ellipse with semi-axes sqrt(2) times the text's half-sizes contains the text box.
        grow = 1.45 if ellipse else 1.0
        w, h = int(text_w * grow) + 12, int(text_h * grow) + 10
        if w > width or y + h > bottom:
            return None
        x0 = x + rng.randint(0, width - w)
        ids, _ = self.d.place_lines(lines, font, x0 + 6, y + (h - text_h) // 2, w - 12, color, align="center")
        box = (x0, y, x0 + w, y + h)
        kind = "ellipse" if ellipse else "rect"
        self.d.shapes.append(Shape(kind, [(box[0], box[1]), (box[2] - 1, box[3] - 1)], color, width=2))
        if not ellipse:
            self.d.shapes.append(Shape(kind, [(box[0] + 3, box[1] + 3), (box[2] - 4, box[3] - 4)], color))
        self.d.region("stamp", ids, box=box, shape="ellipse" if ellipse else "box")
        return y + h

    def signatures(self, x: int, y: int, width: int, bottom: int) -> int | None:
        rng = self.rng
        n = 2 if width > 300 and rng.random() < 0.6 else 1
        slot = width // n
        sig_h = max(18, self.s.body[2] * 3)
        lh = line_height(self.s.small)
        if y + sig_h + lh + 4 > bottom:
            return None
        end = y
        for i in range(n):
            name = self.fake.name()
            sx, sw = x + i * slot + 4, int(slot * 0.8) - 8
            pts = self._scribble(sx, y, sw, sig_h - 4)
            self.d.shapes.append(Shape("polyline", pts, rng.choice([(20, 30, 120), (30, 30, 30)]), width=rng.choice([1, 2])))
            line_y = y + sig_h
            self.d.shapes.append(Shape("line", [(sx, line_y), (sx + sw, line_y)], self.s.ink))
            lines = self.d.lines(name, self.s.small, sw)[:1]
            ids, end = self.d.place_lines(lines, self.s.small, sx, line_y + 3, sw, self.s.ink)
            words = self.d.words_box(ids)
            region = self.d.region("signature", ids, box=(sx - 2, y, max(sx + sw + 1, words[2]), max(end, words[3])))
            self.d.signatures.append((" ".join(w for line in lines for w in line), region))
        return end

    def _scribble(self, x: int, y: int, w: int, h: int) -> list[tuple[float, float]]:
        """A handwriting-like stroke: a left-to-right sweep with two random sinusoids."""
        rng = self.rng
        f1, f2, p1, p2 = rng.uniform(1.5, 4), rng.uniform(4, 9), rng.uniform(0, 6), rng.uniform(0, 6)
        n = 80
        pts = []
        for i in range(n):
            t = i / (n - 1)
            wobble = 0.35 * math.sin(2 * math.pi * f1 * t + p1) + 0.15 * math.sin(2 * math.pi * f2 * t + p2)
            pts.append((x + w * (t + 0.05 * math.sin(2 * math.pi * f2 * t)), y + h * (0.5 + wobble)))
        return [(min(max(px, x), x + w), min(max(py, y), y + h)) for px, py in pts]

    # -- running header and footer --------------------------------------------------------------
    def header(self, x: int, y: int, width: int) -> int:
        texts = content.header_text(self.fake, self.rng)
        end = y
        for text, align in zip(texts, ["left", "right"]):
            lines = self.d.lines(text, self.s.small, width // len(texts) - 4)[:1]
            ox = x if align == "left" else x + width // 2 + 4
            ids, end = self.d.place_lines(lines, self.s.small, ox, y, width // len(texts) - 4, self.s.ink, align)
            self.d.region("page_header", ids)
        if self.rng.random() < 0.5:
            self.d.shapes.append(Shape("line", [(x, end + 1), (x + width, end + 1)], (140, 140, 140)))
        return end + 3

    def footer(self, x: int, bottom: int, width: int, number: int) -> int:
        """Place footer text and page number so that they end at `bottom`; returns their top."""
        top = bottom - line_height(self.s.small)
        num_align = self.rng.choice(["right", "center"])
        if num_align == "right" or self.rng.random() < 0.5:
            lines = self.d.lines(content.footer_text(self.fake, self.rng), self.s.small, width // 2 - 8)[:1]
            ids, _ = self.d.place_lines(lines, self.s.small, x, top, width // 2 - 8, self.s.ink)
            self.d.region("page_footer", ids)
        lines = self.d.lines(content.page_number_text(self.rng, number), self.s.small, width // 4)
        nx = x + width - width // 4 if num_align == "right" else x + width // 2 - width // 8
        ids, _ = self.d.place_lines(lines[:1], self.s.small, nx, top, width // 4, self.s.ink, num_align)
        self.d.region("page_number", ids)
        return top - 3


# Relative odds that a page carries each optional block.
EXTRA_BLOCKS = (("form", 0.65), ("table", 0.6), ("figure", 0.5), ("form", 0.25), ("table", 0.2),
                ("stamp", 0.25), ("signatures", 0.2))


def block_plan(rng: random.Random) -> list[str]:
    """The order in which blocks are tried: sections of heading + text, with forms, tables and
    figures between sections, and stamp/signatures towards the end."""
    sections = []
    for _ in range(rng.randint(1, 3)):
        sections.append(["heading"] + rng.choices(["paragraph", "paragraph", "list"], k=rng.randint(1, 2)))
    for kind, p in EXTRA_BLOCKS:
        if rng.random() < p:
            sections.insert(rng.randint(0, len(sections)), [kind])
    plan = [b for section in sections for b in section]
    tail = [k for k, p in (("signatures", 0.35), ("stamp", 0.35)) if rng.random() < p]
    rng.shuffle(tail)
    return plan + tail + ["paragraph"] * 2  # trailing paragraphs fill what space is left


def layout_page(rng: random.Random, fake: Faker, height: int, width: int, page_number: int) -> Draft:
    draft = Draft(height, width)
    style = page_style(rng, height)
    b = Builder(draft, style, rng, fake)
    mx, my = round(width * rng.uniform(0.05, 0.08)), round(height * rng.uniform(0.04, 0.06))
    inner = width - 2 * mx
    top, bottom = my, height - my
    if rng.random() < 0.85:
        top = b.header(mx, top, inner) + style.gap
    if rng.random() < 0.9:
        bottom = b.footer(mx, bottom, inner, page_number) - style.gap
    if rng.random() < 0.9:
        top = (b.title(mx, top, inner, bottom) or top) + style.gap * 2
    n_cols = 2 if inner > 300 and rng.random() < 0.5 else 1
    gutter = max(10, inner // 25)
    col_w = (inner - gutter * (n_cols - 1)) // n_cols
    col, y = 0, top
    builders = {"heading": b.heading, "paragraph": b.paragraph, "list": b.bullet_list, "form": b.form,
                "table": b.table, "figure": b.figure, "stamp": b.stamp, "signatures": b.signatures}
    for kind in block_plan(rng):
        x = mx + col * (col_w + gutter)
        end = builders[kind](x, y, col_w, bottom)
        if end is None and col + 1 < n_cols:
            col, y = col + 1, top
            end = builders[kind](mx + col * (col_w + gutter), y, col_w, bottom)
        if end is not None:
            y = end + style.gap
    return draft
