"""Region labels from a PDF's visible structure, for PDFs without a tag tree (most LaTeX output).

Rules, each a fact a careful reader uses too, applied in this order (a word is labelled once):
  page furniture  lines in the top/bottom band repeated on many pages of the document, with no line
                  beyond them, are page headers/footers; a lone number (or "Page 3", "3 of 10",
                  roman) there is a page number, unless the same number is there on many pages
  tables          pdfplumber's ruled tables (cells from the ruling grid); booktabs-style tables from
                  three or more horizontal rules of one width with text between them
  figures         image objects; clusters of vector paths with little text inside
  headings        bookmarks (the PDF outline) matched to lines; lines set larger or bolder than the
                  document's body text; the largest line on a first page is the title
  code            lines set in a monospace font, consecutive lines joined; a column of line
                  numbers (1, 2, 3 ...) joins the rows it numbers into one block, code when they
                  read as code, whatever their font
  captions        blocks opening with "Figure 3", "Table 2:", "Listing 1."
  list items      a bullet or enumerator with a hanging indent, continuation lines joined
  paragraphs      the remaining lines, joined into blocks and split at vertical gaps, column
                  changes and first-line indents
"""
from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dociq.corpus.geometry import Box, area, inside, union
from dociq.corpus.labels_tagged import LabelledRegion, TableGrid
from dociq.corpus.pdf_page import Line, PdfPageContent
from dociq.data.text_blocks import paragraph_gap

BAND = 0.1  # top/bottom fraction of the page where running headers, footers and page numbers live
# front matter numbers its pages in lower-case roman numerals; an upper-case "C" or "I" alone at a
# page's edge is a change mark or a letter, and "civil" is a word
_ROMAN = r"(?-i:(?=[ivxlc])(xc|xl|l?x{0,3})(ix|iv|v?i{0,3}))"
_PAGE_NUMBER = re.compile(r"^(page|seite|p\.)?\s*([0-9]{1,4}|" + _ROMAN + r")(\s*(/|of|von)\s*[0-9]{1,4})?$", re.I)
_CAPTION = re.compile(r"^(figure|fig\.|table|tab\.|listing|algorithm|abbildung|abb\.|tabelle|example)"
                      r"\s*[0-9ivxA-Z]+(\.[0-9]+)*[.:\u2014-]?", re.I)
_BULLET = re.compile(r"^([\u2022\u25e6\u2023\u2043\u2219\u00b7\u25aa\u25cf\u25cb\u25a0\u25b6\u25ba\u2013\u2014*\u2212-]"
                     r"|\(?[0-9]{1,2}[.)]|\(?[a-z][.)]|\(?[ivx]{1,4}[.)]|\[[0-9]{1,3}\])$")
_SECTION_NUMBER = re.compile(r"^([0-9]+(\.[0-9]+)*\.?|[A-Z]\.([0-9]+\.?)*|[IVX]+\.)$")
_LINE_NUMBER = re.compile(r"^[0-9]{1,4}$")
_CODE_MARK = re.compile(r"[{}\\=;<>\[\]()#_$]")  # characters of program text, rare in prose


def exactly(text: str) -> str:
    """Text as a word-for-word repeated line is compared: case-folded, spaces collapsed."""
    return re.sub(r"\s+", " ", text.lower()).strip()


def normalise(text: str) -> str:
    """Text as repeated furniture is compared: as `exactly`, digits as #."""
    return exactly(re.sub(r"[0-9]+", "#", text))


@dataclass
class DocumentContext:
    """What one page's labels need from the whole document."""

    body_size: float = 10.0
    repeated: set = field(default_factory=set)  # normalised band lines seen on many pages
    # band lines seen word for word, numbers too, on many pages: a number in one ("March 2022") is the
    # head's, not the page's, whose number changes from page to page
    fixed: set = field(default_factory=set)
    bookmarks: dict = field(default_factory=dict)  # page index -> normalised outline titles


def band_of(line: Line, content: PdfPageContent) -> str | None:
    if line.box[3] <= BAND * content.height:
        return "top"
    if line.box[1] >= (1 - BAND) * content.height:
        return "bottom"
    return None


def document_context(pages: list[PdfPageContent], toc: dict[int, list[str]] | None = None) -> DocumentContext:
    sizes: Counter = Counter()
    seen: Counter = Counter()
    seen_exactly: Counter = Counter()
    for content in pages:
        for w in content.words:
            sizes[round(w.size * 2) / 2] += len(w.text)
        band_lines = [content.line_text(line) for line in content.lines if band_of(line, content)]
        keys = {normalise(text) for text in band_lines}
        seen.update(k for k in keys if k and not _PAGE_NUMBER.match(k.replace("#", "1")))
        seen_exactly.update({exactly(text) for text in band_lines})
    need = max(3, int(0.3 * len(pages) + 0.5))
    repeated = {k for k, n in seen.items() if n >= need} if len(pages) >= 3 else set()
    fixed = {k for k, n in seen_exactly.items() if n >= need} if len(pages) >= 3 else set()
    body = sizes.most_common(1)[0][0] if sizes else 10.0
    return DocumentContext(body_size=float(body), repeated=repeated, fixed=fixed,
                           bookmarks={p: {normalise(t) for t in titles} for p, titles in (toc or {}).items()})


class _Labeller:
    def __init__(self, content: PdfPageContent, ctx: DocumentContext, page_index: int,
                 allowed_words: set[int] | None):
        self.c, self.ctx, self.page_index = content, ctx, page_index
        self.free = set(range(len(content.words))) if allowed_words is None else set(allowed_words)
        self.regions: list[LabelledRegion] = []
        self.grids: list[TableGrid] = []
        self.em = ctx.body_size * content.scale  # body font size in pixels

    def add(self, label: str, word_ids, box: Box | None = None) -> int:
        """The new region's index; -1, and no region, for one of no words and no box."""
        word_ids = sorted(set(word_ids))
        if box is None:
            box = union(self.c.words[i].box for i in word_ids)
            if box is None:
                return -1
        self.free -= set(word_ids)
        self.regions.append(LabelledRegion(label, box, word_ids, source="structure"))
        return len(self.regions) - 1

    def free_lines(self) -> list[Line]:
        return [line for line in self.c.lines if all(i in self.free for i in line.word_ids)]

    # -- page furniture -------------------------------------------------------------------------
    def furniture(self) -> None:
        # a listing's line number is no page number, at the top of a page too; nor is "§8"'s number
        not_page_numbers = {number for run in self.line_number_columns() for number, _ in run} | self.section_numbers()
        lines = self.free_lines()
        if lines:  # a lone number on the first or last row of the page is its number
            top, bottom = min(lines, key=lambda ln: ln.box[1]), max(lines, key=lambda ln: ln.box[3])
            for line in lines:
                edge = (_same_row(line, top) and line.box[3] <= 0.25 * self.c.height) or (
                    _same_row(line, bottom) and line.box[1] >= 0.75 * self.c.height)
                text = self.c.line_text(line)
                if edge and _PAGE_NUMBER.match(text.strip()) and line.word_ids[0] in self.free \
                        and line.word_ids[0] not in not_page_numbers and exactly(text) not in self.ctx.fixed:
                    self.add("page_number", line.word_ids)
        for line in self.free_lines():
            band = band_of(line, self.c)
            if band is None or line.word_ids[0] in not_page_numbers:
                continue
            text = self.c.line_text(line)
            words = line.word_ids
            if _PAGE_NUMBER.match(text.strip()) and exactly(text) not in self.ctx.fixed:
                self.add("page_number", words)
                continue
            if normalise(text) not in self.ctx.repeated or not self.on_edge(line, band):
                continue
            # "12 Chapter 2. Usage" / "Usage 13": the number is a region of its own, where it changes
            first, last = self.c.words[words[0]].text, self.c.words[words[-1]].text
            split = len(words) > 1 and exactly(text) not in self.ctx.fixed
            if split and _PAGE_NUMBER.match(first):
                self.add("page_number", [words[0]])
                words = words[1:]
            elif split and _PAGE_NUMBER.match(last) and words[-1] not in not_page_numbers:
                self.add("page_number", [words[-1]])
                words = words[:-1]
            self.add("page_header" if band == "top" else "page_footer", words)
        self.running_rows()

    def section_numbers(self) -> set[int]:
        """Words that follow a section mark ("§", "¶") on its row within an em: Knuth's running heads
        read "§8 The CTIE processor", the mark raised, the number a word (or a line) of its own."""
        words = self.c.words
        marks = [i for i, w in enumerate(words) if w.text.endswith(("§", "¶"))]
        return {j for i in marks for j in range(len(words)) if j != i and _boxes_share_row(words[i].box, words[j].box)
                and -0.5 * self.em <= words[j].box[0] - words[i].box[2] <= self.em}

    def running_rows(self) -> None:
        """A running head is often set in pieces along the page's outer row ("§77 BibTeX  THE HASH
        TABLE  27"): the section mark and the document's name repeat from page to page, the chapter's
        title does not. Once one piece of that row is furniture, its other pieces in body size or
        smaller are the header's (the footer's) too, and pieces closer than two ems are one region."""
        furniture = {"page_header", "page_footer", "page_number"}
        marked = {i for r in self.regions if r.label in furniture for i in r.word_ids}
        outer = [line for line in self.c.lines if band_of(line, self.c)]
        for line in self.free_lines():
            band = band_of(line, self.c)
            if band is None or line.size > 1.2 * self.ctx.body_size or not self.on_edge(line, band):
                continue
            if any(_same_row(line, other) and marked.intersection(other.word_ids) for other in outer):
                self.add("page_header" if band == "top" else "page_footer", line.word_ids)
        for label in ("page_header", "page_footer"):
            self._join_row_pieces(label)

    def _join_row_pieces(self, label: str) -> None:
        pieces = sorted((r for r in self.regions if r.label == label), key=lambda r: r.box[0])
        for a, b in zip(pieces, pieces[1:]):
            rows_meet = min(a.box[3], b.box[3]) - max(a.box[1], b.box[1]) > 0
            if rows_meet and b.box[0] - a.box[2] <= 2 * self.em:
                b.word_ids = sorted(set(a.word_ids) | set(b.word_ids))
                b.box = union([a.box, b.box])
                self.regions = [r for r in self.regions if r is not a]

    def on_edge(self, line: Line, band: str) -> bool:
        """Whether no line of the page lies wholly above (`band` "top") or below ("bottom") this one:
        running headers and footers are the page's outer rows. A table's head row or a code line
        that repeats near the top of many pages sits under the header, inside the body."""
        if band == "top":
            return not any(other.box[3] <= line.box[1] for other in self.c.lines)
        return not any(other.box[1] >= line.box[3] for other in self.c.lines)

    # -- tables ---------------------------------------------------------------------------------
    def words_in(self, box: Box, min_inside: float = 0.6) -> list[int]:
        return [i for i in sorted(self.free) if inside(self.c.words[i].box, box) >= min_inside]

    def ruled_tables(self) -> None:
        for grid in self.c.table_grids:
            rows = [[cell for cell in row if cell is not None] for row in grid["rows"]]
            rows = [row for row in rows if row]
            if len(rows) < 2 or max(len(r) for r in rows) < 2:
                continue
            cell_words = [[self.words_in(cell) for cell in row] for row in rows]
            if sum(1 for row in cell_words for ws in row if ws) < 4:
                continue
            table_words = self.words_in(grid["box"])
            table = self.add("table", table_words, grid["box"])
            self.free |= set(table_words)  # the cells take the words next
            grid_ids = []
            for row, row_words in zip(rows, cell_words):
                ids = [self.add("table_cell", ws, cell) for cell, ws in zip(row, row_words) if ws]
                grid_ids.append(ids)
            self.free -= set(table_words)
            self.grids.append(TableGrid(table, [r for r in grid_ids if r]))

    def booktabs_tables(self) -> list[Box]:
        """Three or more horizontal rules of one width, text between them: a table drawn without
        vertical rules (LaTeX booktabs). Returns the rules used, so they are not taken as figures."""
        rules = sorted((r for r in self.c.rules if r[2] - r[0] > 4 * (r[3] - r[1])), key=lambda r: r[1])
        used: list[Box] = []
        tol = 0.02 * self.c.width
        groups: list[list[Box]] = []
        for r in rules:
            for g in groups:
                if abs(g[-1][0] - r[0]) <= tol and abs(g[-1][2] - r[2]) <= tol and r[1] - g[-1][3] < 12 * self.em:
                    g.append(r)
                    break
            else:
                groups.append([r])
        for g in groups:
            if len(g) < 3 or g[-1][2] - g[-1][0] < 6 * self.em:
                continue
            box = (min(r[0] for r in g), g[0][1], max(r[2] for r in g), g[-1][3])
            words = self.words_in(box)
            lines = [ln for ln in self.c.lines if ln.word_ids[0] in words]
            rows = {round(ln.box[1] / max(ln.height, 1.0)) for ln in lines}
            mono = sum(1 for i in words if self.c.words[i].mono)
            # a table has rows of several cells; a framed listing has one text line per row
            if len(words) >= 4 and len(lines) >= 1.5 * len(rows) and mono < 0.5 * len(words):
                self.add("table", words, box)
                used.extend(g)
        return used

    # -- figures --------------------------------------------------------------------------------
    def figures(self, skip_rules: list[Box]) -> None:
        page_area = self.c.width * self.c.height
        for box in self.c.images:
            box = _clip(box, self.c)
            if area(box) >= 0.005 * page_area and not self._in_table(box):
                self.add("figure", self.words_in(box, 0.8), box)
        text_lines = [ln.box for ln in self.c.lines if len(ln.word_ids) >= 4]
        # a frame or shading behind a line of running text is a text box's background, not a picture
        shapes = [b for b in self.c.graphics if not self._in_table(b)
                  and not any(inside(t, b) > 0.9 for t in text_lines)]
        shapes += [r for r in self.c.rules if r not in skip_rules and not self._in_table(r)]
        for box in _clusters(shapes, gap=0.5 * self.em):
            box = _clip(box, self.c)
            if area(box) < 0.006 * page_area or min(box[2] - box[0], box[3] - box[1]) < 1.5 * self.em:
                continue
            if any(inside(box, r.box) > 0.8 for r in self.regions if r.label == "figure"):
                continue
            words = self.words_in(box, 0.8)
            text_area = sum(area(self.c.words[i].box) for i in words)
            mono = sum(1 for i in words if self.c.words[i].mono)
            if text_area > 0.3 * area(box) or (words and mono > 0.5 * len(words)):
                continue  # a frame around text or code, not a picture
            self.add("figure", words, box)

    def _in_table(self, box: Box) -> bool:
        return any(r.label == "table" and inside(box, r.box) > 0.8 for r in self.regions)

    # -- text blocks ----------------------------------------------------------------------------
    def headings(self) -> None:
        lines = self.free_lines()
        marks = self.ctx.bookmarks.get(self.page_index, set())
        heading_lines = []
        for line in lines:
            text = self.c.line_text(line)
            words = [self.c.words[i] for i in line.word_ids]
            key = normalise(text)
            bare = normalise(re.sub(r"^\S+\s+", "", text)) if _SECTION_NUMBER.match(words[0].text) else key
            by_mark = any(m and (key == m or bare == m or (key.endswith(m) and len(key) - len(m) <= 8))
                          for m in marks)
            short = len(words) <= 14 and not text.rstrip().endswith((".", ",", ";"))
            large = line.size >= 1.15 * self.ctx.body_size
            bold = sum(w.bold for w in words) >= 0.8 * len(words) and _SECTION_NUMBER.match(words[0].text)
            if by_mark or (short and (large or bold)):
                heading_lines.append(line)
        title_done = False
        for group in _consecutive(heading_lines, self.em):
            size = max(line.size for line in group)
            ids = [i for line in group for i in line.word_ids]
            is_title = (self.page_index == 0 and not title_done and size >= 1.35 * self.ctx.body_size
                        and group[0].box[1] < 0.45 * self.c.height
                        and size >= max((line.size for line in lines), default=0) - 0.5)
            if not is_title and title_done and self._title_block_line(group, marks):
                self.add("paragraph", ids)  # author, date, version under a title: not a section
                continue
            title_done |= is_title
            self.add("title" if is_title else "section_heading", ids)

    def _title_block_line(self, group: list[Line], marks: set) -> bool:
        """A centred, unnumbered, unbookmarked line in the upper half of a first page, below its title."""
        first = self.c.words[group[0].word_ids[0]].text
        centre = (min(ln.box[0] for ln in group) + max(ln.box[2] for ln in group)) / 2
        text = normalise(" ".join(self.c.line_text(ln) for ln in group))
        return (self.page_index == 0 and group[0].box[1] < 0.5 * self.c.height
                and abs(centre - self.c.width / 2) < 0.06 * self.c.width
                and not _SECTION_NUMBER.match(first) and text not in marks)

    def toc_entries(self) -> None:
        """A table of contents: three or more rows that end in a page number at the right (after a
        gap or a dot leader); each row is a list item, as a tagged PDF's TOCI is."""
        rows: list[list[Line]] = []
        for line in sorted(self.free_lines(), key=lambda ln: ((ln.box[1] + ln.box[3]) / 2, ln.box[0])):
            centre = (line.box[1] + line.box[3]) / 2
            if rows and abs(centre - (rows[-1][0].box[1] + rows[-1][0].box[3]) / 2) <= 0.35 * line.height:
                rows[-1].append(line)
            else:
                rows.append([line])
        entries = []
        for row in rows:
            row.sort(key=lambda ln: ln.box[0])
            words = [self.c.words[i].text for ln in row for i in ln.word_ids]
            last = words[-1].lstrip(".")
            leader = sum(1 for w in words if set(w) <= {".", "…"}) >= 2 or any("...." in w for w in words)
            number_right = row[-1].box[2] >= 0.6 * self.c.width and _PAGE_NUMBER.match(last) is not None
            if len(words) >= 2 and number_right and (len(row) >= 2 or leader):
                entries.append(row)
        if len(entries) >= 3:
            for row in entries:
                self.add("list_item", [i for ln in row for i in ln.word_ids])

    def code(self) -> None:
        self.numbered_listings()
        free = self.free_lines()
        code_lines = [line for line in free if self._monospace_share(line) >= 0.8]
        # listings number their lines in the text font, just left of the code
        numbers = [line for line in free if len(line.word_ids) == 1 and line not in code_lines
                   and self.c.words[line.word_ids[0]].text.isdigit()]
        for group in _consecutive(code_lines, self.em, max_gap=1.0):
            ids = [i for line in group for i in line.word_ids]
            for number in numbers:
                if any(_same_row(number, line) and 0 <= line.box[0] - number.box[2] <= 3 * self.em for line in group):
                    ids.extend(number.word_ids)
            self.add("code", ids)

    def numbered_listings(self) -> None:
        """A column of line numbers with text just right of it: the numbers belong to the lines
        they number, whatever their fonts and sizes, and the rows are one block, code when the
        lines read as code."""
        free = self.free_lines()
        for run in self.line_number_columns():
            ids = [i for number, rest in run for i in [number, *rest]]
            col_right = max(self.c.words[number].box[2] for number, _ in run)
            top, bottom = self.c.words[run[0][0]].box[1], self.c.words[run[-1][0]].box[3]
            text = union(self.c.words[i].box for _, rest in run for i in rest)
            for line in free:  # a long line wrapped onto an unnumbered row
                cy = (line.box[1] + line.box[3]) / 2
                if top < cy < bottom and line.box[0] >= col_right and line.box[0] < text[2]:
                    ids.extend(line.word_ids)
            ids = [i for i in set(ids) if i in self.free]
            texts = [" ".join(self.c.words[i].text for i in rest) for _, rest in run if rest]
            words = [self.c.words[i] for _, rest in run for i in rest]
            mono = sum(len(w.text) for w in words if w.mono) >= 0.5 * sum(len(w.text) for w in words)
            marked = sum(1 for t in texts if _CODE_MARK.search(t)) >= 0.5 * len(texts)
            self.add("code" if mono or marked else "paragraph", ids)

    def line_number_columns(self) -> list[list[tuple[int, list[int]]]]:
        """Listings' line numbers among the free lines: runs of (number word, the words of its row,
        none for a blank numbered row). A number is set apart from its row's text, by a smaller
        size or by a gap of its own."""
        free = sorted(self.free_lines(), key=lambda ln: ln.box[1] + ln.box[3])
        centres = [(ln.box[1] + ln.box[3]) / 2 for ln in free]
        rows = []
        for line in free:
            first = self.c.words[line.word_ids[0]]
            if not _LINE_NUMBER.match(first.text):
                continue
            rest = line.word_ids[1:]
            if rest and first.size >= 0.85 * min(self.c.words[i].size for i in rest):
                continue  # "1 Overview": a number set like its text is part of the text
            if not rest:  # a number with a gap of its own: the row's text is the next line right
                cy, tol = (line.box[1] + line.box[3]) / 2, 0.4 * max(line.height, 1.0)
                near = free[bisect_left(centres, cy - tol):bisect_right(centres, cy + tol)]
                right = [o for o in near if o is not line and _same_row(o, line)
                         and 0 <= o.box[0] - line.box[2] <= 12 * self.em]
                rest = min(right, key=lambda o: o.box[0]).word_ids if right else []
            rows.append((line.word_ids[0], rest))
        return self._number_columns(rows)

    def _number_columns(self, rows: list[tuple[int, list[int]]]) -> list[list[tuple[int, list[int]]]]:
        """Rows whose numbers stand in one column (left or right edges aligned) and count up by one
        from row to row down the page; runs of three or more, most of them with text."""
        def centre(i: int) -> float:
            return (self.c.words[i].box[1] + self.c.words[i].box[3]) / 2

        runs: list[list[tuple[int, list[int]]]] = []
        open_runs: list[list[tuple[int, list[int]]]] = []  # runs whose last row is near enough to go on
        for row in sorted(rows, key=lambda r: centre(r[0])):
            w, cy = self.c.words[row[0]], centre(row[0])
            open_runs = [run for run in open_runs if cy - centre(run[-1][0]) <= 3 * self.em]
            for run in open_runs:
                last = self.c.words[run[-1][0]]
                aligned = min(abs(w.box[0] - last.box[0]), abs(w.box[2] - last.box[2])) <= 0.5 * self.em
                if int(w.text) == int(last.text) + 1 and aligned and cy > centre(run[-1][0]):
                    run.append(row)
                    break
            else:
                runs.append([row])
                open_runs.append(runs[-1])
        return [run for run in runs if len(run) >= 3 and sum(1 for _, rest in run if rest) >= 0.6 * len(run)]

    def _monospace_share(self, line: Line) -> float:
        """Share of a line's characters set in a monospace font; a listing's line number aside."""
        words = [self.c.words[i] for i in line.word_ids]
        if len(words) > 1 and words[0].text.isdigit() and not words[0].mono:
            words = words[1:]
        total = sum(len(w.text) for w in words)
        return sum(len(w.text) for w in words if w.mono) / max(1, total)

    def blocks(self) -> None:
        """Captions, list items and paragraphs from the lines still free."""
        for block in _blocks(self.free_lines(), self.em):
            first_text = self.c.line_text(block[0])
            if _CAPTION.match(first_text):
                self.add("caption", [i for line in block for i in line.word_ids])
                continue
            for label, lines in _split_list_items(block, self.c, self.em):
                self.add(label, [i for line in lines for i in line.word_ids])

    def run(self) -> tuple[list[LabelledRegion], list[TableGrid]]:
        self.furniture()
        self.ruled_tables()
        rules = self.booktabs_tables()
        self.figures(rules)
        self.toc_entries()
        self.headings()
        self.code()
        self.blocks()
        self.merge_overlapping({"paragraph", "code"})
        return self.regions, self.grids

    def merge_overlapping(self, labels: set[str]) -> None:
        """Blocks of one class whose boxes overlap are one block (a formula's pieces, interleaved
        lines of a diagram in monospace). Only classes labelled after tables are merged, so the
        table grids' region indices stay valid."""
        changed = True
        while changed:
            changed = False
            for a in range(len(self.regions)):
                ra = self.regions[a]
                if ra.label not in labels:
                    continue
                for b in range(a + 1, len(self.regions)):
                    rb = self.regions[b]
                    if rb.label == ra.label and (inside(rb.box, ra.box) > 0.3 or inside(ra.box, rb.box) > 0.3):
                        ra.word_ids = sorted(set(ra.word_ids) | set(rb.word_ids))
                        ra.box = union([ra.box, rb.box])
                        del self.regions[b]
                        changed = True
                        break
                if changed:
                    break


def label_from_structure(content: PdfPageContent, ctx: DocumentContext, page_index: int,
                         allowed_words: set[int] | None = None, furniture_only: bool = False,
                         text_only: bool = False) -> tuple[list[LabelledRegion], list[TableGrid]]:
    """Regions of a page from its visible structure. `allowed_words` limits the words considered
    (a tagged page passes its untagged words); `furniture_only` stops after headers and numbers;
    `text_only` labels text blocks (headings, code, captions, lists, paragraphs) and nothing else."""
    labeller = _Labeller(content, ctx, page_index, allowed_words)
    if furniture_only:
        labeller.furniture()
        return labeller.regions, []
    if text_only:
        labeller.toc_entries()
        labeller.headings()
        labeller.code()
        labeller.blocks()
        labeller.merge_overlapping({"paragraph", "code"})
        return labeller.regions, []
    return labeller.run()


# -- geometry helpers ---------------------------------------------------------------------------

def _clip(b: Box, c: PdfPageContent) -> Box:
    return (max(0.0, b[0]), max(0.0, b[1]), min(float(c.width), b[2]), min(float(c.height), b[3]))


def _clusters(boxes: list[Box], gap: float) -> list[Box]:
    """Boxes merged while any two lie within `gap` of each other (repeated union)."""
    merged = [tuple(b) for b in boxes]
    changed = True
    while changed and len(merged) > 1:
        changed = False
        out: list[Box] = []
        for b in sorted(merged, key=lambda b: (b[1], b[0])):
            for k, o in enumerate(out):
                if b[0] <= o[2] + gap and o[0] <= b[2] + gap and b[1] <= o[3] + gap and o[1] <= b[3] + gap:
                    out[k] = union([o, b])
                    changed = True
                    break
            else:
                out.append(b)
        merged = out
    return merged


def _same_row(a: Line, b: Line) -> bool:
    return abs((a.box[1] + a.box[3]) / 2 - (b.box[1] + b.box[3]) / 2) <= 0.4 * max(min(a.height, b.height), 1.0)


def _boxes_share_row(a: Box, b: Box) -> bool:
    """A raised mark ("§" set above the baseline) and the word after it share half a line's height."""
    return min(a[3], b[3]) - max(a[1], b[1]) >= 0.5 * min(a[3] - a[1], b[3] - b[1])


def _consecutive(lines: list[Line], em: float, max_gap: float = 0.6) -> list[list[Line]]:
    """Runs of lines stacked directly under each other (gap below `max_gap` em, x-overlapping)."""
    groups: list[list[Line]] = []
    for line in sorted(lines, key=lambda ln: (ln.box[1], ln.box[0])):
        for g in groups:
            last = g[-1]
            gap = line.box[1] - last.box[3]
            overlap = min(line.box[2], last.box[2]) - max(line.box[0], last.box[0])
            if -0.3 * em <= gap <= max_gap * em + 0.3 * last.height and overlap > 0 \
                    and abs(line.size - last.size) <= 0.6:
                g.append(line)
                break
        else:
            groups.append([line])
    return groups


def _blocks(lines: list[Line], em: float) -> list[list[Line]]:
    """Lines into text blocks: directly under the block's last line, overlapping it, same size; a
    new block at a vertical gap (wider than 0.45 line, or than the page's own leading where it sets
    its lines further apart: `paragraph_gap`) and at a first-line indent."""
    max_gap = paragraph_gap(np.array([ln.box for ln in lines]).reshape(-1, 4), default=0.45)
    blocks: list[list[Line]] = []
    for line in sorted(lines, key=lambda ln: (ln.box[1], ln.box[0])):
        target = None
        for b in blocks:
            last = b[-1]
            gap = line.box[1] - last.box[3]
            overlap = min(line.box[2], last.box[2]) - max(line.box[0], last.box[0])
            width = min(line.box[2] - line.box[0], last.box[2] - last.box[0])
            if -0.3 * last.height <= gap <= max_gap * max(last.height, line.height) \
                    and overlap > 0.3 * width and abs(line.size - last.size) <= 1.0:
                target = b
                break
        if target is not None:
            left = min(ln.box[0] for ln in target)
            indent = line.box[0] - left
            if 0.8 * em < indent < 4 * em and len(line.word_ids) > 2 and target[-1].box[0] - left < 0.3 * em \
                    and target[-1].box[2] < max(ln.box[2] for ln in target) - 2 * em:
                target = None  # indented first line after a short last line: a new paragraph
        if target is None:
            blocks.append([line])
        else:
            target.append(line)
    return blocks


def _split_list_items(block: list[Line], c: PdfPageContent, em: float):
    """A block as paragraph pieces and list items: a line opening with a bullet or enumerator starts
    an item; lines indented past the bullet continue it."""
    out: list[tuple[str, list[Line]]] = []
    for line in block:
        first = c.words[line.word_ids[0]].text
        if _BULLET.match(first) and len(line.word_ids) > 1:
            out.append(("list_item", [line]))
            continue
        if out and out[-1][0] == "list_item":
            bullet_x = out[-1][1][0].box[0]
            text_x = c.words[out[-1][1][0].word_ids[1]].box[0]
            if line.box[0] >= min(text_x, bullet_x + 0.5 * em) - 0.3 * em:
                out[-1][1].append(line)
                continue
        if out and out[-1][0] == "paragraph":
            out[-1][1].append(line)
        else:
            out.append(("paragraph", [line]))
    return out
