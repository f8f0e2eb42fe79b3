"""Held-out office forms printed by a real browser, as a corpus folder `dociq eval --data corpus` reads.

    python scripts/make_form_pages.py [--out data/forms_html] [--pages 200] [--seed 0] [--templates ...]
    dociq eval CKPT --data corpus --corpus data/forms_html --split all --prompts question [--scan] \
        --baseline detector

Office forms laid out by a browser are a genre the synthetic generator never draws. Five templates
take turns: "inline" (label beside its value, underlined, boxed or plain), "stacked" (label above a
bordered value box), "grid" (two or three columns of fields), "table" (a ruled label | value table
with section header rows) and "memo" (TO:/FROM:/DATE:/RE: over paragraphs); a title, section
headings, an instruction paragraph, checkboxes and signatures are mixed in, in varied fonts, sizes,
spacing and paper. Each form is printed by headless Chromium (`HtmlPrinter`), its page read as the
corpus build reads one (`read_page`, 1024 px) and stored by `CorpusWriter` in split "all", under the
package `forms-html-<template>`. `--templates` draws a subset: training forms from some templates
(`fit_unit_classifier.py --extra`), held-out ones from the others (`dociq eval --packages`).

Region boxes are exact: each labelled element is printed in its own near-black colour, so every PDF
word names the element it came from; a region is the union of its words' boxes (a signature's also
takes its scribble). A form whose elements do not read back word for word is skipped, and its reason
is counted in corpus.json. Checkbox rows are left unlabelled. Questions: one link question per form
label whose text is unique on the page, and layout questions for the labels, the values, the title
and the signatures. A rerun with the same --out and --seed resumes (a larger --pages extends the set).
"""
from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np

from dociq.corpus.html_print import FONT_FAMILIES, HtmlPrinter, PrintError, PrintStyle
from dociq.corpus.label_document import page_hash
from dociq.corpus.pdf_page import read_page
from dociq.data.datasets.corpus.record import RECORD_VERSION, encode_png
from dociq.data.datasets.corpus.store import CorpusWriter
from dociq.data.pdf import open_pdf, render_page
from dociq.data.synthetic import content
from dociq.data.synthetic.content import page_faker
from dociq.data.synthetic.questions import LAYOUT_PHRASES

PACKAGE, SPLIT, LABELLER, PAGE_SIZE = "forms-html", "all", "html-forms", 1024
TEMPLATES = ("inline", "stacked", "grid", "table", "memo")
QUESTION_CLASSES = ("title", "form_key", "form_value", "signature")
N_FIELDS = {"inline": (7, 16), "stacked": (6, 14), "grid": (9, 21), "table": (8, 18)}  # fields a form (low, high)

_phone = lambda f, r: f.phone_number()  # noqa: E731
_name = lambda f, r: f.name()  # noqa: E731
_pick = lambda *options: (lambda f, r: r.choice(options))  # noqa: E731
DEPARTMENTS = ("Finance", "Human Resources", "Facilities", "Procurement", "Legal", "IT Services", "Operations")
FIELDS = {**content.FORM_FIELDS, "Name": _name, "Full name": _name, "Supervisor": _name, "Approved by": _name,
          "Requested by": _name, "Emergency contact": _name, "Mobile": _phone, "Fax": _phone,
          "Employee ID": lambda f, r: f"E-{r.randint(10000, 99999)}", "Department": _pick(*DEPARTMENTS),
          "Invoice number": lambda f, r: f"INV-{r.randint(1000, 99999)}", "Account number": lambda f, r: f.bban(),
          "Reference": lambda f, r: f"{r.choice('ABDRX')}{r.choice('CFKT')}/{r.randint(100, 9999)}/{r.randint(19, 26)}",
          "ZIP code": lambda f, r: f.postcode(), "State": lambda f, r: f.state(), "Tax ID": lambda f, r: f.ssn(),
          "Due date": lambda f, r: content.date(f, r), "Total": lambda f, r: content.amount(f, r),
          "Cost center": lambda f, r: f"CC-{r.randint(100, 999)}", "Company": lambda f, r: f.company(),
          "Relationship": _pick("Spouse", "Parent", "Sibling", "Friend", "Partner"),
          "Hours per week": _pick("16", "20", "24", "30", "37.5", "40"),
          "License plate": lambda f, r: f.license_plate(), "Country": _pick("United States", "Canada", "Ireland")}
FORM_TITLES = ("Expense Reimbursement Form", "Leave Request", "New Employee Information", "Change of Address",
               "Purchase Requisition", "Incident Report", "Travel Authorization", "Direct Deposit Authorization",
               "Equipment Loan Agreement", "Membership Application", "Vendor Registration Form")
SECTIONS = ("Personal details", "Contact information", "Employment", "Payment details", "Approval",
            "Applicant", "Office use only", "Request details", "Account information")
INSTRUCTIONS = ("Please complete all sections in block capitals.", "Fields marked with an asterisk are mandatory.",
                "Return the completed form to the {d} office within ten working days.",
                "Incomplete forms will be returned to the applicant.", "Attach copies of all receipts.",
                "Keep a copy of this form for your records.", "Sign and date the form before submitting it.")
CHECKBOXES = (("Employment type", "Full-time", "Part-time", "Contractor"),
              ("Payment by", "Cash", "Cheque", "Bank transfer"),
              ("Marital status", "Single", "Married", "Other"), ("First application", "Yes", "No"))
MEMO_TITLES = ("MEMORANDUM", "Memo", "Interoffice Memorandum", "INTERNAL MEMO")


class FormSkipped(Exception):
    """A printed form whose ground truth cannot be trusted (the reason says why)."""


def colour(i: int) -> str:
    """The near-black printing colour of region `i` (green 1 marks a region; red and blue its id)."""
    return f"rgb({2 + i % 24},1,{2 + i // 24})"


def region_of(rgb) -> int | None:
    if not isinstance(rgb, (tuple, list)) or len(rgb) != 3:
        return None
    r, g, b = (round(float(v) * 255) for v in rgb)
    return (b - 2) * 24 + (r - 2) if g == 1 and r >= 2 and b >= 2 else None


@dataclass
class Form:
    template: str
    regions: list[tuple[str, str]] = field(default_factory=list)  # (label, text as written)
    links: list[tuple[int, int]] = field(default_factory=list)

    def add(self, label: str, text: str, tag: str = "span", style: str = "", mono: bool = False) -> str:
        self.regions.append((label, text))
        inner = f"<code>{escape(text)}</code>" if mono else escape(text)
        return f'<{tag} style="color:{colour(len(self.regions) - 1)};{style}">{inner}</{tag}>'

    def pair(self, key: str, value: str, kstyle: str = "", vstyle: str = "overflow-wrap:anywhere",
              mono: bool = False) -> tuple[str, str]:
        k = self.add("form_key", key, style=kstyle)
        v = self.add("form_value", value, style=vstyle, mono=mono)
        self.links.append((len(self.regions) - 2, len(self.regions) - 1))
        return k, v


def _sections(fake, rng, n_fields: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """Fields under 1-3 section names, at least three fields a section."""
    labels = rng.sample(sorted(FIELDS), k=n_fields)
    n = rng.randint(1, min(3, n_fields // 3))
    cuts = sorted(rng.sample(range(3, n_fields - 2), k=n - 1)) if n > 1 else []
    while any(b - a < 3 for a, b in zip([0] + cuts, cuts + [n_fields])):
        cuts = sorted(rng.sample(range(3, n_fields - 2), k=n - 1))
    groups = [labels[a:b] for a, b in zip([0] + cuts, cuts + [n_fields])]
    return [(name, [(lab, FIELDS[lab](fake, rng)) for lab in g]) for name, g in zip(rng.sample(SECTIONS, k=n), groups)]


def _heading(F: Form, text: str, number: int, look: dict) -> str:
    text = {0: text, 1: f"{number}. {text}", 2: f"Section {'ABCD'[number - 1]}: {text}"}[look["numbering"]]
    return F.add("section_heading", text.upper() if look["upper"] else text, tag="div",
                 style=f"font-weight:bold;margin:{look['gap'] * 2:.2f}em 0 {look['gap']:.2f}em 0;{look['band']}")


def _fields_html(F: Form, rng, fake, look: dict) -> str:
    """The form's fields in its template's layout; section headings between groups."""
    key = lambda t: (t.upper() if look["upper"] else t) + (":" if look["colon"] else "")  # noqa: E731
    mono = rng.random() < 0.25
    kb = "font-weight:bold;" if look["bold"] else ""
    out = []
    if F.template == "memo":
        names = ["TO", "FROM"] + (["CC"] if rng.random() < 0.4 else []) + ["DATE", rng.choice(["RE", "SUBJECT"])]
        makers = {"TO": lambda: f"{fake.name()}, {rng.choice(DEPARTMENTS)}", "FROM": fake.name, "CC": fake.name,
                  "DATE": lambda: content.date(fake, rng), "RE": lambda: fake.catch_phrase().capitalize(),
                  "SUBJECT": lambda: fake.bs().capitalize()}
        for n in names:
            k, v = F.pair(n + ":", makers[n](), kstyle=kb)
            out.append(f'<div style="display:flex;margin:{look["gap"]:.2f}em 0"><div style="width:6.5em">{k}</div>'
                       f'<div style="flex:1;min-width:0">{v}</div></div>')
        out.append('<hr style="border:0;border-top:2px solid #000;margin:1em 0">')
        for _ in range(rng.randint(1, 3)):
            out.append(F.add("paragraph", content.paragraph(fake, rng), tag="p", style="margin:0 0 .8em 0"))
        return "\n".join(out)
    cols = rng.choice((2, 3)) if F.template == "grid" else 2 if F.template == "stacked" and rng.random() < .5 else 1
    pairs = F.template == "table" and rng.random() < 0.5
    if F.template == "table":
        widths = [look["key_width"], 100 - look["key_width"]] * (1 + pairs)
        out.append('<table style="width:99%;border-collapse:collapse;table-layout:fixed"><colgroup>'
                   + "".join(f'<col style="width:{w / (1 + pairs):.1f}%">' for w in widths[:-1]) + "<col></colgroup>")
    n_fields = rng.randint(*N_FIELDS[F.template])
    if F.template == "stacked" and cols == 1:  # three lines a field: more would not fit on one page
        n_fields = min(n_fields, 10)
    for number, (section, fields) in enumerate(_sections(fake, rng, n_fields), start=1):
        if F.template == "table":
            h = F.add("section_heading", section.upper() if look["upper"] else section)
            out.append(f'<tr><th colspan="{4 if pairs else 2}" style="text-align:left;background:#ddd;'
                       f'border:1px solid #000;padding:3px 5px">{h}</th></tr>')
        elif look["sections"]:
            out.append(_heading(F, section, number, look))
        cells = []
        for label, value in fields:
            k, v = F.pair(key(label), value, kstyle=kb, mono=mono)
            if F.template == "inline":
                line = {"underline": "border-bottom:1px solid #444", "box": "border:1px solid #666;padding:1px 4px",
                        "plain": ""}[look["value_look"]]
                cells.append(f'<div style="display:flex;align-items:baseline;margin:{look["gap"]:.2f}em 0">'
                             f'<div style="width:{look["key_width"]}%;text-align:{look["key_align"]};'
                             f'padding-right:.7em">'
                             f'{k}</div><div style="flex:1;min-width:0;{line}">{v}</div></div>')
            elif F.template == "stacked":
                cells.append(f'<div style="margin:{look["gap"]:.2f}em 0"><div style="font-size:.8em">{k}</div>'
                             f'<div style="border:1px solid #555;padding:3px 5px;min-height:1.2em">{v}</div></div>')
            elif F.template == "grid":
                cells.append(f'<div style="display:flex;flex-wrap:wrap;align-items:baseline;column-gap:.5em;'
                             f'padding:{look["gap"]:.2f}em 0">{k} {v}</div>')  # a long value wraps under its label
            else:
                td = 'style="border:1px solid #000;padding:3px 5px;vertical-align:top"'
                cells.append(f'<td {td}>{k}</td><td {td}>{v}</td>')
        if F.template == "table":
            step = 2 if pairs else 1
            out += [f"<tr>{''.join(cells[i:i + step])}</tr>" for i in range(0, len(cells), step)]
        else:
            out.append(f'<div style="display:grid;grid-template-columns:repeat({cols},minmax(0,1fr));column-gap:1.5em">'
                       + "\n".join(cells) + "</div>")
    if F.template == "table":
        out.append("</table>")
    return "\n".join(out)


def _checkboxes(rng) -> str:
    question, *options = rng.choice(CHECKBOXES)
    ticked = rng.randrange(len(options))
    box = ('<span style="display:inline-block;width:.9em;height:.9em;line-height:.9em;border:1px solid #000;'
           'text-align:center;margin:0 .3em 0 1em;font-size:.9em">{}</span>')
    mark = rng.choice(("X", "\u2713"))
    return (f'<div style="margin:.8em 0">{escape(question)}' + "".join(
        box.format(mark if i == ticked else "&nbsp;") + escape(o) for i, o in enumerate(options)) + "</div>")


def _signatures(F: Form, rng, fake, look: dict) -> str:
    out, n = [], rng.choice((1, 1, 2))
    for _ in range(n):
        f1, f2, p1, p2 = rng.uniform(1.5, 4), rng.uniform(4, 9), rng.uniform(0, 6), rng.uniform(0, 6)
        t = np.linspace(0, 1, 60)  # a handwriting-like sweep, as the synthetic signatures draw
        xs, ys = 6 + 150 * t + 5 * np.cos(f2 * 6 * t + p2), 19 + 9 * np.sin(f1 * 6 * t + p1) + 5 * np.sin(f2 * 6 * t)
        pts = [f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys)]
        name, i = fake.name(), len(F.regions)
        F.regions.append(("signature", name))
        out.append(f'<div style="width:38%;margin-right:6%">'
                   f'<svg width="170" height="38" fill="none" stroke="{colour(i)}">'
                   f'<polyline points="{" ".join(pts)}" stroke-width="1.4"/><line x1="0" y1="37" x2="170" y2="37"/>'
                   f'</svg><div style="color:{colour(i)};font-size:.85em">{escape(name)}</div></div>')
    row, date = '<div style="display:flex;align-items:flex-end;margin-top:1.5em">', ""
    if rng.random() < 0.6:  # the date beside a single signature, on a row of its own below two
        k, v = F.pair(("DATE" if look["upper"] else "Date") + (":" if look["colon"] else ""), content.date(fake, rng))
        date = f'<div style="white-space:nowrap;margin-top:.8em">{k} &nbsp;{v}</div>'
    return row + "".join(out) + (date + "</div>" if n == 1 else "</div>" + date)


def make_form(index: int, seed: int, templates: tuple[str, ...] = TEMPLATES) -> tuple[str, Form, PrintStyle]:
    """The HTML, regions and page style of form `index` of the set drawn with `seed` from `templates`
    (which take turns)."""
    form_seed = int(hashlib.sha1(f"forms:{seed}:{index}".encode()).hexdigest()[:8], 16)
    rng, fake = random.Random(form_seed), page_faker(form_seed)
    F = Form(templates[index % len(templates)])
    look = dict(upper=rng.random() < 0.3, colon=rng.random() < 0.7, bold=rng.random() < 0.6,
                gap=rng.uniform(0.2, 0.7), key_width=rng.choice((25, 30, 35, 40)),
                key_align=rng.choice(("left", "left", "right")), value_look=rng.choice(("underline", "box", "plain")),
                numbering=rng.randrange(3), sections=rng.random() < 0.8,
                band=rng.choice(("", "background:#e4e4e4;padding:2px 4px", "border-bottom:1px solid #000")))
    parts = []
    if F.template == "memo" or rng.random() < 0.9:
        text = rng.choice(MEMO_TITLES if F.template == "memo" else FORM_TITLES + (content.title(fake, rng),))
        parts.append(F.add("title", text, tag="h1", style=f"font-size:{rng.uniform(1.4, 2.0):.2f}em;margin:0 0 .6em 0;"
                                                              f"text-align:{rng.choice(('left', 'center'))}"))
    if F.template != "memo" and rng.random() < 0.6:
        text = " ".join(rng.sample(INSTRUCTIONS, k=rng.randint(1, 3))).format(d=rng.choice(DEPARTMENTS))
        parts.append(F.add("paragraph", text, tag="p", style="font-size:.9em;font-style:italic;margin:0 0 .8em 0"))
    parts.append(_fields_html(F, rng, fake, look))
    if F.template != "memo" and rng.random() < 0.5:
        parts.append(_checkboxes(rng))
    if rng.random() < (0.3 if F.template == "memo" else 0.6):
        parts.append(_signatures(F, rng, fake, look))
    style = PrintStyle(columns=1, font_family=rng.choice(FONT_FAMILIES),
                       font_size_pt=round(rng.uniform(8.5, 11.5) * 2) / 2,
                       line_height=round(rng.uniform(1.15, 1.6), 2), margin_mm=float(rng.randint(12, 25)),
                       paper=rng.choice(("A4", "A4", "Letter")), header=None, page_number=None)
    html = ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>form</title></head><body>'
            + "\n".join(parts) + "</body></html>")
    return html, F, style


def _ordered_lines(words, ids: list[int]) -> list[int]:
    """Word ids in reading order: rows (by vertical centre), left to right within a row."""
    rows: list[list[int]] = []
    for i in sorted(ids, key=lambda i: (words[i].box[1] + words[i].box[3]) / 2):
        b = words[i].box
        if rows and abs((b[1] + b[3]) / 2 - np.mean([(words[j].box[1] + words[j].box[3]) / 2 for j in rows[-1]])) \
                <= 0.4 * (b[3] - b[1]):
            rows[-1].append(i)
        else:
            rows.append([i])
    return [i for row in rows for i in sorted(row, key=lambda i: words[i].box[0])]


def label_form(pdf: Path, F: Form, doc_id: str, rng: random.Random) -> tuple[str, bytes, dict, str]:
    """(sample key, PNG, record, page hash) of the printed form; FormSkipped when it does not read back."""
    import pdfplumber

    doc = open_pdf(pdf)
    try:
        if len(doc) != 1:
            raise FormSkipped(f"overflow: printed on {len(doc)} pages")
        page = doc[0]
        scale = PAGE_SIZE / max(page.get_size())
        image = render_page(page, scale)
    finally:
        doc.close()
    with pdfplumber.open(str(pdf)) as plumber:
        pp = plumber.pages[0]
        content_ = read_page(pp, scale, image.shape[:2], image=image, with_tables=False)
        ox, oy = pp.bbox[0], pp.bbox[1]
        chars = [c for c in pp.chars if c["text"].strip()]
        centres = np.array([[((c["x0"] + c["x1"]) / 2 - ox) * scale, ((c["top"] + c["bottom"]) / 2 - oy) * scale]
                            for c in chars]).reshape(-1, 2)
        owners = [region_of(c.get("non_stroking_color")) for c in chars]
        strokes = [(region_of(o.get("stroking_color")), o) for o in list(pp.curves) + list(pp.lines)]
    words = content_.words
    owner_of = []
    for w in words:
        x0, y0, x1, y1 = w.box
        inside = np.flatnonzero((centres[:, 0] >= x0) & (centres[:, 0] <= x1)
                                & (centres[:, 1] >= y0) & (centres[:, 1] <= y1))
        found = {owners[k] for k in inside}
        if len(found) > 1:
            raise FormSkipped(f"mixed_word: {w.text!r} joins the text of elements {sorted(found, key=str)}")
        owner_of.append(found.pop() if found else None)
    order, regions = [], []
    for rid, (label, text) in enumerate(F.regions):
        ids = _ordered_lines(words, [i for i, o in enumerate(owner_of) if o == rid])
        got = "".join(words[i].text for i in ids)
        if got != "".join(text.split()):
            raise FormSkipped(f"region_text: {label} {rid} reads {got!r}, written {text!r}")
        boxes = [words[i].box for i in ids]
        if label == "signature":
            boxes += [((o["x0"] - ox) * scale, (o["top"] - oy) * scale, (o["x1"] - ox) * scale,
                       (o["bottom"] - oy) * scale) for r, o in strokes if r == rid]
        b = np.array(boxes)
        regions.append((label, [b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max()], ids))
        order += ids
    for a in range(len(regions)):
        for b in range(a + 1, len(regions)):
            (la, ba, _), (lb, bb, _) = regions[a], regions[b]
            if min(ba[2], bb[2]) > max(ba[0], bb[0]) and min(ba[3], bb[3]) > max(ba[1], bb[1]):
                raise FormSkipped(f"overlap: {la} {a} and {lb} {b}")
    order += _ordered_lines(words, [i for i in range(len(words)) if owner_of[i] is None])
    new = {old: k for k, old in enumerate(order)}
    texts = [words[i].text for i in order]
    region_json = [{"label": label, "box": [round(float(v), 2) for v in box], "word_ids": [new[i] for i in ids]}
                   for label, box, ids in regions]
    page_id = f"{doc_id}#p0"
    record = {"version": RECORD_VERSION, "page_id": page_id, "doc_id": doc_id, "package": package_of(F.template),
              "source": f"{doc_id}.html", "page_index": 0, "split": SPLIT,
              "size": [int(image.shape[0]), int(image.shape[1])],
              "words": texts, "word_boxes": [[round(float(v), 2) for v in words[i].box] for i in order],
              "text_layer": "pdf", "regions": region_json, "questions": questions(region_json, texts, F.links, rng),
              "links": [[k, v] for k, v in F.links], "labeller": LABELLER}
    return hashlib.sha1(page_id.encode()).hexdigest()[:16], encode_png(image), record, page_hash(texts, image)


def questions(regions: list[dict], words: list[str], links, rng: random.Random) -> list[dict]:
    """Link questions of form labels unique on the page; layout questions of the form classes."""
    text = lambda r: " ".join(words[j] for j in regions[r]["word_ids"])  # noqa: E731
    keys = Counter(text(k) for k, _ in links)
    out = [{"text": f"which value belongs to the field \u2018{text(k).rstrip(':')}\u2019?", "kind": "link",
            "region_ids": [v]} for k, v in links if keys[text(k)] == 1]
    for label in QUESTION_CLASSES:
        ids = [i for i, r in enumerate(regions) if r["label"] == label]
        if ids:
            singular, plural = LAYOUT_PHRASES[label]
            out.append({"text": rng.choice(singular if len(ids) == 1 else plural), "kind": "layout", "region_ids": ids})
    return out


def package_of(template: str) -> str:
    """The corpus package a template's forms are stored under (`dociq eval --packages` picks templates)."""
    return f"{PACKAGE}-{template}"


def build(out: Path, pages: int, seed: int, templates: tuple[str, ...] = TEMPLATES, progress=print) -> dict:
    """Write `pages` printed forms drawn from `templates` into the corpus folder `out` (resuming one
    built with the same seed and templates)."""
    skipped, start, made = Counter(), time.time(), 0
    with HtmlPrinter() as printer, tempfile.TemporaryDirectory(prefix="dociq-forms-") as work, \
            CorpusWriter(out, shard_pages=256, settings={"generator": "make_form_pages", "seed": seed,
                                                         "templates": list(templates), "page_size": PAGE_SIZE}) as writer:
        done = writer.done_documents
        kept = sum(int(r.get("pages_kept", 0)) for r in done.values())
        index = 0
        while kept < pages:
            if index >= 3 * pages + 20:
                raise RuntimeError(f"{index} forms drawn, only {kept} printed cleanly (skipped: {dict(skipped)})")
            doc_id = f"form-{index:04d}-{templates[index % len(templates)]}"
            index += 1
            if doc_id in done:
                continue
            html, F, style = make_form(index - 1, seed, templates)
            src, pdf = Path(work) / f"{doc_id}.html", Path(work) / f"{doc_id}.pdf"
            src.write_text(html, encoding="utf-8")
            report = {"package": package_of(F.template), "kind": "html", "template": F.template, "labellers": {LABELLER: 1}}
            try:
                printer.print_pdf(src, pdf, style, max_pages=2)
                key, png, record, digest = label_form(pdf, F, doc_id, random.Random(f"{seed}:{doc_id}"))
            except (FormSkipped, PrintError) as err:
                reason = str(err) if isinstance(err, FormSkipped) else f"print_failed: {err.reason}"
                skipped[reason.split(":")[0]] += 1
                progress(f"[forms] skipped {doc_id}: {reason}")
                writer.add_document(doc_id, SPLIT, [], {**report, "status": "bad", "reason": reason.split(":")[0],
                                                        "detail": reason, "pages_kept": 0, "labellers": {}})
                continue
            writer.add_document(doc_id, SPLIT, [(key, png, record)],
                                {**report, "status": "ok", "pages_kept": 1, "pages_dropped": {},
                                 "hashes": {key: digest}})
            kept, made = kept + 1, made + 1
            if made % 20 == 0:
                progress(f"[forms] {kept}/{pages} forms, {(time.time() - start) / made:.2f} s a form")
        summary = writer.close()
    summary["seconds_per_form"] = round((time.time() - start) / max(made, 1), 2)
    summary["skipped"] = dict(skipped)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/forms_html", help="the corpus folder to write (default data/forms_html)")
    p.add_argument("--pages", type=int, default=200, help="forms to print (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--templates", nargs="+", choices=TEMPLATES, default=list(TEMPLATES),
                   help="draw only these templates, in turn (default: all five); e.g. training forms from three "
                        "and held-out ones from the other two")
    args = p.parse_args(argv)
    if args.pages < 1:
        p.error("--pages must be >= 1")
    try:
        summary = build(Path(args.out), args.pages, args.seed, tuple(dict.fromkeys(args.templates)))
    except PrintError as err:  # no Chromium or no playwright: the message carries the fix
        print(f"make_form_pages: {err}", file=sys.stderr)
        return 2
    print(f"[forms] {summary['pages']} forms in {args.out} ({summary['seconds_per_form']} s a form; "
          f"skipped: {summary['skipped'] or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
