"""The corpus labellers on PDFs written here: an untagged manual (structure rules), bad PDFs
(reported, never raised), the quality gate and the questions a labelled page gets."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dociq.corpus.label_document import LabelSettings, choose_pages, label_pdf, page_hash, reading_order
from dociq.corpus.labels_tagged import LabelledRegion
from dociq.data.datasets.corpus.record import record_to_page

from pdfs import encrypted_pdf, manual_pages, write_pdf


@pytest.fixture(scope="module")
def manual(tmp_path_factory):
    path = tmp_path_factory.mktemp("pdf") / "manual.pdf"
    path.write_bytes(write_pdf(manual_pages(3)))
    result = label_pdf(path, "docs/manual.pdf", "docs", "docs/manual.pdf", "train",
                       LabelSettings(min_words=5, page_size=768), seen_hashes={})
    return result


def _labels(record):
    return [(r["label"], " ".join(record["words"][j] for j in r["word_ids"])) for r in record["regions"]]


def test_untagged_manual_gets_every_class_it_draws(manual):
    assert manual.status == "ok" and len(manual.pages) == 3 and not manual.dropped
    records = [rec for _, _, rec in manual.pages]
    assert all(rec["labeller"] == "structure" for rec in records)
    first, second, third = (_labels(r) for r in records)
    assert ("title", "A Guide to Real Pages") in first
    assert ("section_heading", "1 Section about pages 1") in first
    assert [t for label, t in first if label == "list_item"] == [
        f"- Item number {k} of the list explains a point and continues on a hanging indented line" for k in (1, 2, 3)]
    assert ("code", "def build(src, out): pages = label(src) write(out, pages)") in first
    assert ("table", "Run Pages Seconds first 120 41 second 480 160") in second
    assert sorted(t for label, t in second if label == "table_cell") == sorted(
        ["Run", "Pages", "Seconds", "first", "120", "41", "second", "480", "160"])
    assert ("caption", "Table 1: Pages labelled per run.") in second
    assert ("caption", "Figure 1: Pages kept by package.") in second
    assert any(label == "figure" for label, _ in second)
    for n, labels in enumerate((first, second, third), start=1):
        assert ("page_number", str(n)) in labels
        assert ("page_header", "Corpus Builder Reference Manual") in labels
        assert Counter(label for label, _ in labels)["paragraph"] >= 1


def test_boxes_match_the_words_in_rendered_pixels(manual):
    _, png, record = manual.pages[1]
    page = record_to_page(png, record)
    assert max(page.size) == 768
    table = next(r for r in page.regions if r.label == "table")
    x0, y0, x1, y1 = table.box
    # the ruled grid is 3 x 120 pt wide at 768/792 px per pt
    assert abs((x1 - x0) - 360 * 768 / 792) < 3
    for region in page.regions:
        for j in region.word_ids:
            wx0, wy0, wx1, wy1 = page.word_boxes[j]
            assert region.box[0] - 1 <= wx0 and wx1 <= region.box[2] + 1
            assert region.box[1] - 1 <= wy0 and wy1 <= region.box[3] + 1
    # the table's ink is inside its box
    crop = page.image[int(y0) + 2:int(y1) - 2, int(x0) + 2:int(x1) - 2]
    assert (crop < 128).any()


def test_words_are_in_reading_order_and_every_word_is_labelled(manual):
    _, _, record = manual.pages[0]
    words = record["words"]
    assert words[:4] == ["Corpus", "Builder", "Reference", "Manual"]
    assert words.index("Guide") < words.index("Section") < words.index("Item") < words.index("build(src,")
    covered = {j for r in record["regions"] for j in r["word_ids"]}
    assert covered == set(range(len(words)))


def test_questions_of_every_kind_the_page_supports(manual):
    kinds = Counter(q["kind"] for _, _, rec in manual.pages for q in rec["questions"])
    assert kinds["layout"] >= 3 and kinds["reading"] >= 2
    cells = [q for _, _, rec in manual.pages for q in rec["questions"] if q["kind"] == "cell"]
    assert cells, "the ruled table's grid gives cell questions"
    _, png, record = manual.pages[1]
    page = record_to_page(png, record)
    for q in page.questions:
        assert q.mask.any() and q.mask.shape == page.size
        if q.text == "what is the seconds of second?":
            assert page.regions[q.region_ids[0]].text == "160"


def test_labelling_is_deterministic(tmp_path, manual):
    path = tmp_path / "again.pdf"
    path.write_bytes(write_pdf(manual_pages(3)))
    again = label_pdf(path, "docs/manual.pdf", "docs", "docs/manual.pdf", "train",
                      LabelSettings(min_words=5, page_size=768), seen_hashes={})
    assert [rec for _, _, rec in again.pages] == [rec for _, _, rec in manual.pages]
    assert [png for _, png, _ in again.pages] == [png for _, png, _ in manual.pages]


@pytest.mark.parametrize("name, make, reason", [
    ("broken", lambda: b"%PDF-1.4\nthis is not a pdf at all", "broken"),
    ("zero_pages", lambda: write_pdf([]), "zero_pages"),
])
def test_unusable_pdfs_are_reported_by_reason(tmp_path, name, make, reason):
    path = tmp_path / f"{name}.pdf"
    path.write_bytes(make())
    result = label_pdf(path, name, "p", name, "train", LabelSettings(), seen_hashes={})
    assert (result.status, result.reason, result.pages) == ("bad", reason, [])


def test_encrypted_pdf_is_reported(tmp_path):
    path = tmp_path / "locked.pdf"
    path.write_bytes(encrypted_pdf())
    result = label_pdf(path, "locked", "p", "locked", "train", LabelSettings(), seen_hashes={})
    assert (result.status, result.reason) == ("bad", "encrypted")


def test_pages_too_large_to_render_are_dropped_not_rendered(tmp_path):
    path = tmp_path / "huge.pdf"
    path.write_bytes(write_pdf(manual_pages(1)))
    result = label_pdf(path, "huge", "p", "huge", "train", LabelSettings(max_page_pixels=10_000), seen_hashes={})
    assert result.pages == [] and result.dropped == {"too_large": 1}


def test_quality_gate_drops_pages_with_few_words_or_low_coverage(tmp_path):
    path = tmp_path / "sparse.pdf"
    path.write_bytes(write_pdf([[("text", "regular", 10, 72, 700, "only four words here")]]))
    result = label_pdf(path, "sparse", "p", "sparse", "train", LabelSettings(), seen_hashes={})
    assert result.dropped == {"too_few_words": 1}
    path = tmp_path / "manual.pdf"
    path.write_bytes(write_pdf(manual_pages(1)))
    strict = label_pdf(path, "m", "p", "m", "train", LabelSettings(min_words=5, min_coverage=1.01), seen_hashes={})
    assert strict.dropped == {"low_coverage": 1}


def test_glyphs_without_characters_are_no_words_and_many_drop_the_page(tmp_path):
    # pdfminer writes a glyph its font maps to no character as "(cid:N)": a music symbol, or the
    # letters of a broken font. A few on a page are left out of its words; many drop the page.
    page = manual_pages(1)[0]
    words_on_page = sum(len(op[-1].split()) for op in page if op[0] == "text")

    def build(n_glyph_words):
        ops = page + [("glyphs", 9, 72 + 30 * (k % 12), 90 - 12 * (k // 12), [36, 35, 21]) for k in range(n_glyph_words)]
        path = tmp_path / f"glyphs{n_glyph_words}.pdf"
        path.write_bytes(write_pdf([ops]))
        return label_pdf(path, path.name, "p", path.name, "train", LabelSettings(min_words=5), seen_hashes={})

    few = build(2)
    assert not few.dropped and len(few.pages) == 1
    words = few.pages[0][2]["words"]
    assert len(words) == words_on_page and not any("cid" in w for w in words)
    many = build(words_on_page // 4)
    assert many.pages == [] and many.dropped == {"unmapped_glyphs": 1}


def test_near_duplicates_are_dropped_within_a_document(tmp_path):
    ops = manual_pages(3)[2]
    renumbered = [op if op[-1] != "3" else op[:-1] + ("4",) for op in ops]
    path = tmp_path / "dup.pdf"
    path.write_bytes(write_pdf([ops, renumbered]))
    result = label_pdf(path, "dup", "p", "dup", "train", LabelSettings(min_words=5), seen_hashes={})
    assert len(result.pages) == 1 and result.dropped == {"near_duplicate": 1}


def test_page_hash_ignores_numbers_but_not_words():
    image = np.zeros((20, 20, 3), np.uint8)
    words = ["Chapter", "3", "is", "long"] * 60
    assert page_hash(words, image) == page_hash([w.replace("3", "4") for w in words], image)
    assert page_hash(words, image) != page_hash(words[:-1] + ["short"], image)


def test_choose_pages_spreads_over_the_document():
    assert choose_pages(5, 20) == [0, 1, 2, 3, 4]
    picked = choose_pages(100, 5)
    assert picked[0] == 0 and picked[-1] == 99 and len(picked) == 5


def test_reading_order_reads_columns_top_to_bottom():
    def region(x0, y0, x1, y1):
        return LabelledRegion("paragraph", (x0, y0, x1, y1), [])

    regions = [region(0, 0, 100, 10),    # full-width title
               region(55, 20, 100, 40),  # right column, top
               region(0, 20, 45, 40),    # left column, top
               region(0, 45, 45, 60),    # left column, bottom
               region(55, 45, 100, 60)]  # right column, bottom
    assert reading_order(regions, 100) == [0, 2, 3, 1, 4]


def test_a_line_repeated_under_the_running_header_is_not_a_header(tmp_path):
    """A table's head row (or a code line) that repeats near the top of every page lies under the
    running header, inside the body: only the page's outer row is its header."""
    pages = manual_pages(3)
    for ops in pages:
        ops.append(("text", "bold", 10, 72, 728, "Option Default Meaning"))
    path = tmp_path / "manual.pdf"
    path.write_bytes(write_pdf(pages))
    result = label_pdf(path, "docs/manual.pdf", "docs", "docs/manual.pdf", "train",
                       LabelSettings(min_words=5, page_size=768), seen_hashes={})
    for _, _, record in result.pages:
        labels = _labels(record)
        assert [t for label, t in labels if label == "page_header"] == ["Corpus Builder Reference Manual"]
        assert any(t == "Option Default Meaning" and label != "page_header" for label, t in labels)


@pytest.mark.parametrize("number_x, top", [
    (52, 300),  # the numbers a column of their own
    (64, 300),  # against the text, on its line
    (52, 770),  # on the page's first row, where a lone number is the page's number
])
def test_a_listings_line_numbers_belong_to_its_lines(tmp_path, number_x, top):
    """A listing set in a text font with its line numbers in a smaller size left of the lines (a
    blank line numbered too) is one code block, numbers included: no number is a paragraph."""
    listing = ["for i := 1 step 1 until 6:", "eyescale := i / 6;", "", "draw eye(i * 60) shifted (i, 0);",
               "endfor;"]
    ops = [op for op in manual_pages(1)[0] if top < 700 or op[-1] != "Corpus Builder Reference Manual"]
    for k, text in enumerate(listing):
        y = top - k * 11
        ops.append(("text", "regular", 6, number_x, y, str(k + 1)))
        if text:
            ops.append(("text", "regular", 9, 72 + 12 * (0 < k < 4), y, text))
    path = tmp_path / "listing.pdf"
    path.write_bytes(write_pdf([ops]))
    result = label_pdf(path, "listing", "p", "listing", "train", LabelSettings(min_words=5), seen_hashes={})
    labels = _labels(result.pages[0][2])
    listed = [(label, text) for label, text in labels if "endfor;" in text.split()]
    assert [label for label, _ in listed] == ["code"]
    assert sorted(listed[0][1].split()) == sorted(" ".join(f"{k + 1} {t}" for k, t in enumerate(listing)).split())
    assert not any(label == "paragraph" and text.isdigit() for label, text in labels)
    assert [text for label, text in labels if label == "page_number"] == ["1"]  # the page's, at its foot


def test_a_page_number_is_a_number_or_a_lower_case_roman_one(tmp_path):
    """Front matter numbers pages i, ii, xiv; a capital "C" at the page's top edge (a change mark in
    Knuth's WEB listings) is no page number."""
    ops = [op for op in manual_pages(1)[0] if op[-1] != "1"]  # the page's own number goes
    ops += [("text", "regular", 10, 540, 770, "C"), ("text", "regular", 10, 300, 40, "xiv")]
    path = tmp_path / "front.pdf"
    path.write_bytes(write_pdf([ops]))
    result = label_pdf(path, "front", "p", "front", "train", LabelSettings(min_words=5), seen_hashes={})
    labels = _labels(result.pages[0][2])
    assert [text for label, text in labels if label == "page_number"] == ["xiv"]


def _labels_under_head(tmp_path, head, drop_page_number: bool = False) -> list[list[tuple[str, str]]]:
    """Labels of three manual pages whose running header is replaced by `head(k)`'s text ops."""
    pages = []
    for k, ops in enumerate(manual_pages(3)):
        drop = {"Corpus Builder Reference Manual"} | ({str(k + 1)} if drop_page_number else set())
        pages.append([op for op in ops if op[-1] not in drop] + head(k))
    path = tmp_path / "head.pdf"
    path.write_bytes(write_pdf(pages))
    result = label_pdf(path, "head", "p", "head", "train", LabelSettings(min_words=5), seen_hashes={})
    assert len(result.pages) == 3
    return [_labels(record) for _, _, record in result.pages]


def test_a_running_head_set_in_pieces_is_one_header_row(tmp_path):
    """Knuth's WEB listings head each page "§77 BibTeX   THE HASH TABLE   27": the section mark and
    the name repeat, the chapter's title does not. The title is the header's too (no paragraph), and
    pieces set side by side are one region."""
    titles = ["THE HASH TABLE", "READING THE DATABASE", "SORTING THE ENTRIES"]
    for labels in _labels_under_head(tmp_path, lambda k: [
            ("text", "regular", 9, 72, 750, f"[{10 * k + 17}]"), ("text", "regular", 9, 102, 750, "BibTeX"),
            ("text", "regular", 9, 260, 750, titles[k])]):
        k = next(i for i, t in enumerate(titles) if any(t == text for _, text in labels))
        assert sorted(t for label, t in labels if label == "page_header") == sorted([f"[{10 * k + 17}] BibTeX", titles[k]])
        assert [t for label, t in labels if label == "page_number"] == [str(k + 1)]


@pytest.mark.parametrize("raised", [3, 4])  # the mark and its number one line, or two lines
def test_a_section_number_in_the_running_head_is_no_page_number(tmp_path, raised):
    """Knuth's "§8 The CTIE processor ... 3", the mark raised above the number: the number after the
    section mark is the header's, the page's number is the one at the row's end."""
    titles = ["INPUT AND OUTPUT", "FILE HANDLING", "REPORTING ERRORS"]
    for labels in _labels_under_head(tmp_path, lambda k: [
            ("text", "regular", 9, 72, 750 + raised, "§"), ("text", "regular", 9, 78, 750, str(10 * k + 8)),
            ("text", "regular", 9, 120, 750, "The CTIE processor"), ("text", "regular", 9, 260, 750, titles[k]),
            ("text", "regular", 9, 530, 750, str(k + 3))], drop_page_number=True):
        k = next(i for i, t in enumerate(titles) if any(t == text for _, text in labels))
        assert [t for label, t in labels if label == "page_number"] == [str(k + 3)]
        headers = [t for label, t in labels if label == "page_header"]
        assert any(h.endswith(f"§ {10 * k + 8}") for h in headers)  # the mark raised above the number
        assert "The CTIE processor" in headers and titles[k] in headers


@pytest.mark.parametrize("number_at", [72, 530])   # an even page's head opens with its number, an odd one's ends
@pytest.mark.parametrize("year_apart", [False, True])  # the year in the head's line, or set apart from it
def test_a_number_the_running_head_repeats_on_every_page_is_no_page_number(tmp_path, number_at, year_apart):
    """TUGboat's "TUGboat Authors' Guide, March 2022 ... 3": the year ends the head on every page,
    word for word; the page's number is the one that changes."""
    head_at = 300 if number_at == 72 else 72
    head = [("text", "regular", 9, head_at, 750, "TUGboat Authors Guide, March"),
            ("text", "regular", 9, head_at + 150, 750, "2022")] if year_apart else [
            ("text", "regular", 9, head_at, 750, "TUGboat Authors Guide, March 2022")]
    for k, labels in enumerate(_labels_under_head(tmp_path, lambda k: head + [
            ("text", "regular", 9, number_at, 750, str(k + 3))], drop_page_number=True)):
        assert [t for label, t in labels if label == "page_number"] == [str(k + 3)]
        assert "2022" in " ".join(t for label, t in labels if label == "page_header")


def test_a_nested_lists_items_are_items_of_their_own():
    """A contents page's tag tree: an entry (LI) holding its sub-entries (L > LI). An annotator marks
    each entry; the outer one keeps only its own line."""
    from dociq.corpus.labels_tagged import label_from_tags
    from dociq.corpus.pdf_page import PdfPageContent, Word

    texts = ["1.", "Ensemble", "methods", "1.1.", "Bagging", "1.2.", "Boosting", "2.", "Clustering"]
    rows = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    mcids = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    words = [Word(t, (20.0 + 40 * (i % 3), 10.0 + 20 * r, 55.0 + 40 * (i % 3), 22.0 + 20 * r), 10.0, "Serif", m)
             for i, (t, r, m) in enumerate(zip(texts, rows, mcids))]
    li = lambda mcid, *children: {"type": "LI", "children": [{"type": "LBody", "mcids": [mcid]}, *children]}
    struct = [{"type": "L", "children": [li(0, {"type": "L", "children": [li(1), li(2)]}), li(3)]}]
    content = PdfPageContent(width=200, height=100, scale=1.0, words=words, lines=[], rules=[], graphics=[],
                             graphics_mcid=[], images=[], images_mcid=[], struct=struct)
    regions, _ = label_from_tags(content)
    assert sorted((r.label, " ".join(texts[j] for j in r.word_ids)) for r in regions) == [
        ("list_item", "1. Ensemble methods"), ("list_item", "1.1. Bagging"), ("list_item", "1.2. Boosting"),
        ("list_item", "2. Clustering")]


def test_a_region_of_no_words_is_not_made_and_merging_passes_over_it():
    from types import SimpleNamespace

    from dociq.corpus.labels_structure import _Labeller

    words = [SimpleNamespace(box=(10, 10, 50, 20)), SimpleNamespace(box=(30, 12, 90, 22))]
    labeller = _Labeller(SimpleNamespace(words=words, scale=1.0), SimpleNamespace(body_size=10.0), 0, None)
    assert labeller.add("code", []) == -1 and labeller.regions == []
    labeller.add("code", [0])
    labeller.add("code", [1])
    labeller.merge_overlapping({"code"})
    assert [(r.label, r.word_ids, r.box) for r in labeller.regions] == [("code", [0, 1], (10, 10, 90, 22))]


@pytest.mark.parametrize("pitch", [12.5, 18.0, 25.0])
def test_a_thesis_set_wide_apart_keeps_its_paragraphs_whole(pitch):
    """Single, one-and-a-half and double spacing (10 pt lines, 12.5 / 18 / 25 pt apart): each of
    two justified paragraphs is one block, however far apart the page sets its lines, and the two
    stay apart where the gap exceeds the leading by a line."""
    from dociq.corpus.labels_structure import _blocks
    from dociq.corpus.pdf_page import Line

    lines, y = [], 100.0
    for paragraph in range(2):
        for k in range(4):
            right = 532.0 if k < 3 else 300.0                       # a short last line
            lines.append(Line(word_ids=[len(lines)], box=(72.0, y, right, y + 10.0), size=10.0))
            y += pitch
        y += 10.0                                                   # the paragraph's own space
    blocks = _blocks(lines, em=10.0)
    assert [[ln.word_ids[0] for ln in block] for block in blocks] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_questions_quote_whole_words_accented_ones_included_never_fragments():
    """A text layer spells "Einrückung" whole but a typeset accent apart ("espec´ıficas"): the
    questions quote the first whole, and no fragment of the second ("ficas" is no word a reader
    would ask for)."""
    import random

    from dociq.corpus.questions import page_questions

    words = ["Die", "Einrückung", "der", "Zeilen.", "Encorajamos", "espec´ıficas", "P´os-graduac¸˜ao"]
    boxes = [[20 + 60 * k, 20, 70 + 60 * k, 32] for k in range(4)] + [[20 + 80 * k, 60, 90 + 80 * k, 72] for k in range(3)]
    regions = [{"label": "paragraph", "box": [20, 20, 260, 32], "word_ids": [0, 1, 2, 3]},
               {"label": "paragraph", "box": [20, 60, 250, 72], "word_ids": [4, 5, 6]}]
    quoted = set()
    for seed in range(20):
        for q in page_questions(words, boxes, regions, [], 100, 300, random.Random(seed), 12):
            if "mentions" in q["text"]:
                quoted.add((q["text"].split("\u201c")[1].rstrip("\u201d?"), tuple(q["region_ids"])))
    assert quoted == {("Einrückung", (0,)), ("Zeilen", (0,)), ("Encorajamos", (1,))}
