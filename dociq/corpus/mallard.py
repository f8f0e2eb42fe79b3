"""Mallard help pages (http://projectmallard.org/1.0/, e.g. GNOME's user docs) → plain HTML.

Chromium cannot print Mallard XML, so each page becomes semantic HTML (headings, paragraphs,
lists, tables, code, notes, figures) that the HTML printer turns into a tagged PDF. Metadata
(`info`), media, editorial comments and generated link lists are dropped; an element this
converter does not know keeps its text. Only the standard library is used.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

from dociq.io.atomic import atomic_write_text

MALLARD_NS = "http://projectmallard.org/1.0/"
_IF_NS = "http://projectmallard.org/if/1.0/"

# elements dropped with everything inside them (by local name, in any namespace)
_DROPPED = {"info", "media", "comment", "links", "include", "rules", "thumb", "desc"}
_INLINE = {
    "code": "code", "cmd": "code", "sys": "code", "file": "code", "input": "code",
    "output": "code", "var": "em", "em": "em", "app": "em", "cite": "em",
    "gui": "span", "key": "span", "link": "span", "span": "span", "hi": "span", "name": "span",
}
# an element whose children are blocks: a `code` directly inside one is a code block
_BLOCK_PARENTS = {"page", "section", "item", "note", "td", "figure", "example", "listing",
                  "quote", "synopsis", "when", "else", "if", "choose", "div"}
_SEQ_JOINERS = {"keyseq": "+", "guiseq": " \u25b8 "}


def _local(tag) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _ns(tag) -> str:
    return tag[1:].split("}", 1)[0] if isinstance(tag, str) and tag.startswith("{") else ""


def _text(s: str | None) -> str:
    return escape(s or "", quote=False)


def _children(el) -> list:
    return [c for c in el if isinstance(c.tag, str)]  # comments and processing instructions out


class _Converter:
    def __init__(self) -> None:
        self.section_depth = 0

    # -- dispatch ------------------------------------------------------------------------------

    def node(self, el, parent: str) -> str:
        """HTML of `el` followed by its tail text."""
        return self.element(el, parent) + _text(el.tail)

    def inner(self, el) -> str:
        """HTML of `el`'s text and children, without a wrapper."""
        name = _local(el.tag)
        return _text(el.text) + "".join(self.node(c, name) for c in _children(el))

    def element(self, el, parent: str) -> str:
        name = _local(el.tag)
        if name in _DROPPED and not (name == "desc" and parent == "figure"):
            return ""
        if _ns(el.tag) == _IF_NS and name == "choose":
            return self.choose(el)
        method = getattr(self, f"el_{name}", None) if _ns(el.tag) in ("", MALLARD_NS) else None
        if method is not None:
            return method(el, parent)
        if name in _SEQ_JOINERS:
            return _SEQ_JOINERS[name].join(self.element(c, name) for c in _children(el)) or _text(el.text)
        if name in _INLINE:
            if name == "code" and parent in _BLOCK_PARENTS:
                return self.el_screen(el, parent)
            tag = _INLINE[name]
            return f'<{tag} class="{name}">{self.inner(el)}</{tag}>'

        return self.inner(el)  # unknown: keep its text

    def choose(self, el) -> str:
        """Conditional content: the first branch only, so alternatives are not printed twice."""
        branches = _children(el)
        return self.inner(branches[0]) if branches else ""

    def titled(self, el, heading: str) -> str:
        """`el`'s title as `heading`, then its other children."""
        out = []
        for child in _children(el):
            if _local(child.tag) == "title" and heading == "p":  # a note's or quote's title
                out.append(f'<p class="title"><strong>{self.inner(child)}</strong></p>')
            elif _local(child.tag) == "title":
                out.append(f"<{heading}>{self.inner(child)}</{heading}>")
            elif _local(child.tag) != "subtitle":
                out.append(self.node(child, _local(el.tag)))
        return "".join(out)

    # -- blocks --------------------------------------------------------------------------------

    def el_section(self, el, parent):
        self.section_depth += 1
        heading = f"h{min(1 + self.section_depth, 6)}"
        try:
            return f"<section>{self.titled(el, heading)}</section>\n"
        finally:
            self.section_depth -= 1

    def el_title(self, el, parent):  # a title not consumed by its parent (note, list, table)
        return f'<p class="title"><strong>{self.inner(el)}</strong></p>'

    def el_subtitle(self, el, parent):
        return f'<p class="subtitle">{self.inner(el)}</p>'

    def el_p(self, el, parent):
        return f"<p>{self.inner(el)}</p>\n"

    def el_screen(self, el, parent):
        # text exactly as written: the XML parser already resolved entities; escape once
        return f"<pre><code>{self.inner(el)}</code></pre>\n"

    def el_note(self, el, parent):
        return f'<div class="note">{self.titled(el, "p")}</div>\n'

    def el_example(self, el, parent):
        return f'<div class="example">{self.inner(el)}</div>\n'

    def el_quote(self, el, parent):
        return f"<blockquote>{self.titled(el, 'p')}</blockquote>\n"

    def el_list(self, el, parent):
        return self.items(el, "ul")

    def el_steps(self, el, parent):
        return self.items(el, "ol")

    def items(self, el, tag: str) -> str:
        titles = "".join(f'<p class="title"><strong>{self.inner(c)}</strong></p>\n'
                         for c in _children(el) if _local(c.tag) == "title")
        items = "".join(f"<li>{self.inner(c)}</li>\n" for c in _children(el) if _local(c.tag) == "item")
        return f"{titles}<{tag}>\n{items}</{tag}>\n"

    def el_terms(self, el, parent):
        out = ["<dl>\n"]
        for item in _children(el):
            if _local(item.tag) != "item":
                continue
            for child in _children(item):
                if _local(child.tag) == "title":
                    out.append(f"<dt>{self.inner(child)}</dt>\n")
            body = "".join(self.node(c, "item") for c in _children(item) if _local(c.tag) != "title")
            out.append(f"<dd>{body}</dd>\n")
        out.append("</dl>\n")
        return "".join(out)

    def el_table(self, el, parent):
        rows = []
        for child in _children(el):
            name = _local(child.tag)
            if name in ("thead", "tbody", "tfoot"):
                rows += [(r, name == "thead") for r in _children(child) if _local(r.tag) == "tr"]
            elif name == "tr":
                rows.append((child, False))
        title = "".join(f"<caption>{self.inner(c)}</caption>" for c in _children(el) if _local(c.tag) == "title")
        body = "".join(self.row(tr, header) for tr, header in rows)
        return f"<table>{title}\n{body}</table>\n"

    def row(self, tr, header: bool) -> str:
        cell = "th" if header else "td"
        cells = "".join(f"<{cell}>{self.cell(td)}</{cell}>" for td in _children(tr) if _local(td.tag) in ("td", "th"))
        return f"<tr>{cells}</tr>\n"

    def cell(self, td) -> str:
        """A cell holding one paragraph is printed as that paragraph's text, as HTML tables are."""
        kids = _children(td)
        if len(kids) == 1 and _local(kids[0].tag) == "p" and not (td.text or "").strip():
            return self.inner(kids[0])
        return self.inner(td)

    def el_figure(self, el, parent):
        caption = "".join(self.inner(c) + " " for c in _children(el) if _local(c.tag) in ("title", "desc"))
        body = "".join(self.node(c, "figure") for c in _children(el) if _local(c.tag) not in ("title", "desc"))
        return f"<figure>{body}<figcaption>{caption.strip()}</figcaption></figure>\n"

    def el_listing(self, el, parent):
        return f'<div class="listing">{self.titled(el, "p")}</div>\n'

    def el_synopsis(self, el, parent):
        return f'<div class="synopsis">{self.titled(el, "p")}</div>\n'


# how yelp (GNOME's help viewer) sets these apart, roughly; the printer adds page layout
_STYLE = """
.note { border-left: 3px solid #888; padding: 0.2em 0.8em; margin: 1em 0; background: #f4f4f4; }
.gui, .title strong { font-weight: bold; }
.key { border: 1px solid #aaa; border-radius: 3px; padding: 0 0.2em; font-size: 90%; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; }
td p, th p { margin: 0.2em 0; }
pre { background: #f4f4f4; padding: 0.5em; }
"""


def _parse(page_path: Path) -> ET.Element:
    try:
        root = ET.parse(page_path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{page_path}: malformed Mallard XML ({err})") from err
    if _local(root.tag) != "page":
        raise ValueError(f"{page_path}: not a Mallard page (root element <{_local(root.tag)}>, expected <page>)")
    return root


def _page_title(root: ET.Element) -> str:
    for child in _children(root):
        if _local(child.tag) == "title":
            return "".join(child.itertext()).strip()
    return ""


def mallard_to_html(page_path, out_html) -> Path:
    """Write `page_path` (a Mallard page) as HTML to `out_html` (atomically); returns `out_html`.

    Raises ValueError naming the file when it is not well-formed Mallard XML."""
    page_path, out_html = Path(page_path), Path(out_html)
    root = _parse(page_path)
    title = _page_title(root)
    body = _Converter().titled(root, "h1")
    html = ('<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
            f"<title>{_text(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")
    atomic_write_text(out_html, html)
    return out_html
