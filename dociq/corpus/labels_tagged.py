"""Region labels from a tagged PDF's structure tree (what Chromium, LibreOffice or tagpdf write).

Each structure element of a block type becomes a region: its box is the union of the words and
graphics whose marked-content ids it owns, and an element broken across columns becomes one
region per column piece. Inline elements (Span, Link, Em, inline Code) belong to the block around
them. Untagged content (page artifacts: running headers, page numbers) is left to the structure
labeller, which finds it by repetition.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dociq.corpus.geometry import union
from dociq.corpus.pdf_page import PdfPageContent

# structure type -> region class; the first block-type ancestor of a piece of content owns it
BLOCK_TYPES = {
    "Title": "title", "H1": "title", "H": "section_heading", "H2": "section_heading",
    "H3": "section_heading", "H4": "section_heading", "H5": "section_heading", "H6": "section_heading",
    "P": "paragraph", "BlockQuote": "paragraph", "Note": "paragraph",
    "LI": "list_item", "Caption": "caption", "Code": "code", "Figure": "figure", "Formula": "paragraph",
    "Table": "table", "TD": "table_cell", "TH": "table_cell", "TOCI": "list_item",
}
# inside these, further block types are parts of the same region (a P in a list item, a caption's P)
_ABSORBING = {"title", "section_heading", "paragraph", "list_item", "caption", "code", "table_cell"}


@dataclass
class LabelledRegion:
    label: str
    box: tuple[float, float, float, float]
    word_ids: list[int]
    source: str = "tags"


@dataclass
class TableGrid:
    """A table's cells by row (region indices into the page's region list; row 0 is the header)."""

    region: int
    cells: list[list[int]] = field(default_factory=list)


@dataclass
class _Element:
    label: str
    mcids: set
    rows: list[list["_Element"]] = field(default_factory=list)  # tables: TR -> cells


def _collect_mcids(node: dict, out: set) -> None:
    out.update(node.get("mcids") or [])
    for child in node.get("children") or []:
        _collect_mcids(child, out)


def _has_content(node: dict) -> bool:
    return bool(node.get("mcids")) or any(_has_content(c) for c in node.get("children") or [])


def _walk(nodes: list[dict], inside: str | None, out: list[_Element], table: _Element | None) -> None:
    # text beside a Code element (in a Div or NonStruct that no block type names) makes it inline
    running_text = any(n.get("type") != "Code" and _has_content(n) for n in nodes)
    for node in nodes:
        kind = node.get("type", "")
        label = BLOCK_TYPES.get(kind)
        if label == "code" and (inside is not None or running_text):
            label = None  # inline code is part of the text around it
        # a list item inside a list item (a nested list, a contents page's sub-entries) is an item of
        # its own, as an annotator marks it: the outer item keeps only its own lines
        if label and (inside not in _ABSORBING or (label == inside == "list_item")):
            mcids: set = set()
            _collect_mcids(node, mcids)
            element = _Element(label, mcids)
            out.append(element)
            # cells, a figure's caption and a nested list's items are regions of their own
            if label in ("table", "figure", "list_item"):
                first_child = len(out)
                parent_table = {"table": element, "figure": table}.get(label)   # a list item's rows are no table's
                _walk(node.get("children") or [], label, out, parent_table)
                if label != "table":
                    for nested in out[first_child:]:
                        element.mcids -= nested.mcids
                continue
            if label == "table_cell" and table is not None:
                if not table.rows:
                    table.rows.append([])
                table.rows[-1].append(element)
            continue
        if kind == "TR" and table is not None:
            table.rows.append([])
        _walk(node.get("children") or [], inside if not label else label, out, table)


def _pieces(content: PdfPageContent, word_ids: list[int]) -> list[list[int]]:
    """Split an element's words where they jump back up the page (a column or frame break) or leave a
    gap of more than a line and a half (an element the tags stretch over separate blocks)."""
    if not word_ids:
        return []
    ids = sorted(word_ids)  # content order within an element follows the text layer
    pieces, current = [], [ids[0]]
    for prev, nxt in zip(ids, ids[1:]):
        a, b = content.words[prev].box, content.words[nxt].box
        h = max(a[3] - a[1], b[3] - b[1], 1.0)
        # up the page (the next column or frame) or a gap of lines down: another visual block
        if b[1] < a[1] - 1.5 * h or b[1] > a[3] + 1.5 * h:
            pieces.append(current)
            current = []
        current.append(nxt)
    pieces.append(current)
    return pieces


def label_from_tags(content: PdfPageContent) -> tuple[list[LabelledRegion], list[TableGrid]]:
    """Regions (and table grids) from the page's structure tree; empty when the page is untagged."""
    elements: list[_Element] = []
    _walk(content.struct, None, elements, None)
    words_by_mcid: dict = {}
    for i, w in enumerate(content.words):
        if w.mcid is not None:
            words_by_mcid.setdefault(w.mcid, []).append(i)
    regions: list[LabelledRegion] = []
    index_of: dict[int, int] = {}
    for element in elements:
        word_ids = sorted(j for m in element.mcids for j in words_by_mcid.get(m, []))
        if element.label in ("figure", "table"):
            graphic = [b for b, m in zip(content.graphics + content.images,
                                         content.graphics_mcid + content.images_mcid) if m in element.mcids]
            box = union([content.words[j].box for j in word_ids] + graphic)
            if box is not None:
                index_of[id(element)] = len(regions)
                regions.append(LabelledRegion(element.label, box, word_ids))
            continue
        for piece in _pieces(content, word_ids):
            index_of.setdefault(id(element), len(regions))
            regions.append(LabelledRegion(element.label, union(content.words[j].box for j in piece), piece))
    grids = []
    for element in elements:
        if element.label == "table" and id(element) in index_of and element.rows:
            rows = [[index_of[id(c)] for c in row if id(c) in index_of] for row in element.rows]
            grids.append(TableGrid(index_of[id(element)], [r for r in rows if r]))
    return regions, grids
