"""Questions about a laid-out page, each answered by a set of regions.

Kinds (see schema.QUESTION_KINDS):
  layout  - "segment the table", "all section headings": the union of a class's regions
  reading - need the text: "where is the date of birth of <name>?", "which paragraph mentions
            <word>?" (a word in exactly one paragraph; likewise bullet points), "where does the
            section <heading> start?", "where did <name> sign?"
  cell    - "what is the <column header> of <row key>?": one table cell
  link    - "which value belongs to the field '<key>'?": the value linked to a unique form key
"""
from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

from dociq.data.synthetic.draft import Draft

# class -> (singular phrasings, plural phrasings)
LAYOUT_PHRASES = {
    "title": (["segment the title", "where is the document title?"], ["segment the titles"]),
    "section_heading": (["the section heading", "segment the section heading"],
                        ["all section headings", "segment every section heading"]),
    "paragraph": (["the paragraph"], ["all paragraphs", "segment the body text"]),
    "list_item": (["the list item", "the bullet point"], ["all list items", "every bullet point"]),
    "form_key": (["the form label"], ["all form labels", "every field name of the form"]),
    "form_value": (["the filled-in value"], ["all filled-in form values", "every form field value"]),
    "table": (["segment the table", "where is the table?"], ["segment all tables", "every table"]),
    "table_cell": (["the table cell"], ["all table cells"]),
    "page_header": (["the page header"], ["the page header", "all running header text"]),
    "page_footer": (["the page footer"], ["the page footer"]),
    "page_number": (["the page number", "where is the page number?"], ["the page numbers"]),
    "figure": (["segment the figure", "where is the chart?"], ["all figures", "segment every figure"]),
    "stamp": (["where is the stamp?", "segment the stamp"], ["all stamps"]),
    "signature": (["find the signature", "where is the signature?"], ["all signatures", "find every signature"]),
    # classes of real documents (the corpus labels them; the generator does not draw them)
    "caption": (["the caption", "where is the figure caption?"], ["all captions", "every caption"]),
    "code": (["the code listing", "where is the code?"], ["all code listings", "every code block"]),
}

# A word a question quotes: a run of five or more Latin letters, accented ones included ("Einrückung"),
# whole — not bordered by another letter or by a spacing accent, where a text layer spells a
# typeset accent apart ("espec´ıficas", "Titula¸c˜ao") and a run would be a word's fragment.
_LETTER = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_SPACING_ACCENTS = "\u00b4\u00b8\u02dc\u00a8\u02c6\u0060\u02d8\u02d9\u02da\u02dd\u02c7\u00af"
_WORD = re.compile(rf"(?<![{_LETTER}{_SPACING_ACCENTS}])[{_LETTER}]{{5,}}(?![{_LETTER}{_SPACING_ACCENTS}])")


def _layout(draft: Draft, rng: random.Random) -> list[tuple[str, list[int]]]:
    by_class: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(draft.regions):
        by_class[r.label].append(i)
    out = []
    for label, ids in by_class.items():
        singular, plural = LAYOUT_PHRASES[label]
        out.append((rng.choice(singular if len(ids) == 1 else plural), ids))
    if len(draft.tables) == 1:
        out.append(("the header row of the table", list(draft.tables[0].cells[0])))
    return out


def _reading(draft: Draft, rng: random.Random) -> list[tuple[str, list[int]]]:
    out = []
    people = Counter(f.person for f in draft.forms)
    for form in draft.forms:
        if people[form.person] > 1:
            continue
        for label, (_key, value) in form.fields.items():
            if label != "Name":
                out.append((f"where is the {label.lower()} of {form.person}?", [value]))
    # A word that occurs in exactly one paragraph (or bullet point) identifies it.
    for label, noun in (("paragraph", "paragraph"), ("list_item", "bullet point")):
        out.extend(_mentions(draft, rng, label, noun))
    headings = [i for i, r in enumerate(draft.regions) if r.label == "section_heading"]
    titles = Counter(_strip_number(draft.region_text(i)) for i in headings)
    for i in headings:
        text = _strip_number(draft.region_text(i))
        if titles[text] == 1 and len(text) > 3:
            out.append((f"where does the section \u201c{text}\u201d start?", [i]))
    signers = Counter(name for name, _ in draft.signatures)
    for name, region in draft.signatures:
        if signers[name] == 1 and name:
            out.append((f"where did {name} sign?", [region]))
    return out


def _strip_number(heading: str) -> str:
    return re.sub(r"^\d+\.\s*", "", heading)


def _mentions(draft: Draft, rng: random.Random, label: str, noun: str) -> list[tuple[str, list[int]]]:
    """'which <noun> mentions <word>?' for up to three words found in exactly one region of `label`
    (case-insensitive, whole words)."""
    seen_in: dict[str, set[int]] = defaultdict(set)
    spelling: dict[str, str] = {}
    for i, r in enumerate(draft.regions):
        if r.label == label:
            for token in _WORD.findall(draft.region_text(i)):
                seen_in[token.lower()].add(i)
                spelling.setdefault(token.lower(), token)
    unique = sorted(w for w, ids in seen_in.items() if len(ids) == 1)
    return [(f"which {noun} mentions \u201c{spelling[w]}\u201d?", sorted(seen_in[w]))
            for w in rng.sample(unique, k=min(3, len(unique)))]


def _cells(draft: Draft) -> list[tuple[str, list[int]]]:
    # (row key, column header) must name one cell on the whole page.
    counts = Counter((key, head) for t in draft.tables for key in t.row_keys for head in t.header[1:])
    out = []
    for t in draft.tables:
        for r, key in enumerate(t.row_keys, start=1):
            for c, head in enumerate(t.header[1:], start=1):
                if counts[(key, head)] == 1 and draft.regions[t.cells[r][c]].word_ids:
                    out.append((f"what is the {head.lower()} of {key}?", [t.cells[r][c]]))
    return out


def _links(draft: Draft) -> list[tuple[str, list[int]]]:
    keys = Counter(draft.region_text(k) for k, _ in draft.links)
    return [(f"which value belongs to the field \u2018{draft.region_text(k).rstrip(':')}\u2019?", [v])
            for k, v in draft.links if keys[draft.region_text(k)] == 1 and draft.regions[v].word_ids]


def make_questions(draft: Draft, rng: random.Random, n: int) -> list[tuple[str, str, list[int]]]:
    """Up to `n` distinct (text, kind, region ids), mixing kinds: round-robin over the kinds that
    have candidates, in an order where layout, reading and cell come first."""
    pools = {"layout": _layout(draft, rng), "reading": _reading(draft, rng), "cell": _cells(draft),
             "link": _links(draft)}
    for pool in pools.values():
        rng.shuffle(pool)
    kinds = ["layout", "reading", "cell"]
    rng.shuffle(kinds)
    kinds.append("link")
    chosen: list[tuple[str, str, list[int]]] = []
    texts: set[str] = set()
    while len(chosen) < n and any(pools[k] for k in kinds):
        for kind in kinds:
            while pools[kind]:
                text, ids = pools[kind].pop()
                if text not in texts:
                    texts.add(text)
                    chosen.append((text, kind, sorted(ids)))
                    break
            if len(chosen) >= n:
                break
    return chosen
