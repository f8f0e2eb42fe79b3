"""One PDF in, labelled page records out: render, read the text layer, label, gate, ask questions.

Opening and rendering are `dociq.data.pdf`'s; pdfplumber reads the text layer and tag tree here
(fonts, marked-content ids, tables: more than the plain words `dociq.data.pdf` reads).

A page's labels come from the PDF's tag tree where it has one (`labels_tagged`), with page
headers, footers and numbers (untagged artifacts) found by repetition; otherwise from its visible
structure (`labels_structure`). Pages without a text layer are read by tesseract. A page the
quality gate rejects is counted by reason; a document that cannot be read at all is reported
with its reason (encrypted, broken, zero pages), never raised.
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS, BadSampleError, check_page_pixels
from dociq.data.pdf import PdfOpenError, open_pdf, render_page, render_size

from dociq.corpus.geometry import area, inside
from dociq.corpus.labels_structure import DocumentContext, document_context, label_from_structure
from dociq.corpus.labels_tagged import LabelledRegion, TableGrid, label_from_tags
from dociq.corpus.pdf_page import PdfPageContent, Word, document_tree, group_lines, read_page
from dociq.corpus.questions import page_questions
from dociq.data.datasets.corpus.record import RECORD_VERSION, encode_png

# classes that may contain others (a table its cells, a figure its labels); any other pair of
# regions overlapping by more than this fraction of the smaller one is a conflict
_CONTAINERS = {"table", "figure"}
_CONFLICT_OVERLAP = 0.3
# a page whose text layer leaves more of its words unmapped than this is not read right: its
# labels would be drawn around glyphs that carry no text (a songbook's chords, a broken font)
MAX_UNMAPPED_SHARE = 0.1


@dataclass
class LabelSettings:
    page_size: int = 1024  # longest side of the stored page image, pixels
    max_pages_per_doc: int = 20
    min_words: int = 15
    min_coverage: float = 0.85  # share of a page's characters inside some region
    max_conflicts: int = 0  # overlapping region pairs a page may have (containers aside)
    max_chars: int = 25_000  # denser pages (tables of numbers, indexes) are slow and rarely useful
    questions_per_page: int = 8
    max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS
    ocr_without_text: bool = True  # tesseract for pages without a text layer
    seed: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DocumentResult:
    pages: list[tuple[str, bytes, dict]] = field(default_factory=list)
    status: str = "ok"  # ok | bad
    reason: str | None = None
    dropped: Counter = field(default_factory=Counter)
    hashes: dict = field(default_factory=dict)
    labellers: Counter = field(default_factory=Counter)
    pages_total: int = 0


def choose_pages(n_pages: int, cap: int) -> list[int]:
    """At most `cap` pages spread evenly over the document, first page always in."""
    if n_pages <= cap:
        return list(range(n_pages))
    return sorted({int(round(i * (n_pages - 1) / (cap - 1))) for i in range(cap)}) if cap > 1 else [0]


def _open_checked(path):
    """pypdfium2 document, or a (reason, detail) pair for a PDF that cannot be used."""
    try:
        return open_pdf(path), None
    except PdfOpenError as err:
        if err.problem == "encrypted":
            return None, ("encrypted", err.reason)
        if err.problem == "empty":
            return None, ("zero_pages", err.reason)
        # pdfium refuses some PDFs without pages as if they were broken; pdfminer tells the two apart
        return None, ("zero_pages" if _pdfminer_page_count(path) == 0 else "broken", err.reason)


def _pdfminer_page_count(path) -> int | None:
    import pdfplumber

    try:
        with pdfplumber.open(str(path)) as pdf:
            return len(pdf.pages)
    except Exception:  # unreadable to pdfminer as well: broken
        return None


def label_pdf(path, doc_id: str, package: str, source: str, split: str, settings: LabelSettings,
              seen_hashes=None, tesseract=None) -> DocumentResult:
    """Labelled records of a PDF's pages (at most `settings.max_pages_per_doc`)."""
    import pdfplumber

    result = DocumentResult()
    doc, bad = _open_checked(path)
    if bad is not None:
        result.status, result.reason = "bad", bad[0]
        return result
    try:
        toc = _toc(doc)
        page_ids = choose_pages(len(doc), settings.max_pages_per_doc)
        result.pages_total = len(page_ids)
        try:
            plumber = pdfplumber.open(str(path))
        except Exception:  # pdfminer rejects some files pdfium reads
            result.status, result.reason = "bad", "broken"
            result.dropped["unreadable_text_layer"] += len(page_ids)
            return result
        with plumber:
            tree = document_tree(plumber)
            rendered = []
            for index in page_ids:
                got = _render_and_read(doc, plumber, tree, index, path, settings, tesseract, result)
                if got is not None:
                    rendered.append((index, *got))
        ctx = document_context([content for _, _, content, _ in rendered], toc)
        for index, image, content, text_layer in rendered:
            _finish_page(index, image, content, text_layer, ctx, doc_id, package, source, split,
                         settings, seen_hashes, result)
    finally:
        doc.close()
    if not result.pages and result.status == "ok" and result.dropped:
        result.reason = "no_page_passed"
    return result


def _toc(doc) -> dict[int, list[str]]:
    toc: dict[int, list[str]] = {}
    try:
        for item in doc.get_toc(max_depth=6):
            if item.page_index is not None and item.title:
                toc.setdefault(int(item.page_index), []).append(item.title)
    except Exception:  # a broken outline is no outline
        return {}
    return toc


def _render_and_read(doc, plumber, tree, index, path, settings, tesseract, result):
    page = doc[index]
    try:
        w_pt, h_pt = page.get_size()
        if w_pt <= 0 or h_pt <= 0:
            result.dropped["empty_page_box"] += 1
            return None
        scale = settings.page_size / max(w_pt, h_pt)
        height, width = render_size(page, scale)
        try:  # before the density check, which parses the page's text
            check_page_pixels(path, width, height, settings.max_page_pixels, f"PDF page {index}")
        except BadSampleError:
            result.dropped["too_large"] += 1
            return None
        plumber_page = plumber.pages[index]
        if len(plumber_page.chars) > settings.max_chars:
            result.dropped["too_dense"] += 1
            return None
        image = render_page(page, scale, max_page_pixels=settings.max_page_pixels, name=path,
                            what=f"PDF page {index}")
        height, width = image.shape[:2]
        # a tagged PDF names its tables; the ruling-line table finder is for untagged ones (and slow)
        content = read_page(plumber_page, scale, (height, width), struct=tree, image=image,
                            with_tables=not tree)
        text_layer = "pdf"
        if not content.words and settings.ocr_without_text and tesseract is not None:
            content = _ocr_content(image, scale, tesseract)
            text_layer = "tesseract"
        return image, content, text_layer
    except Exception as err:  # one unreadable page must not lose the document's others
        result.dropped[f"unreadable_page:{type(err).__name__}"] += 1
        return None
    finally:
        page.close()


def _ocr_content(image: np.ndarray, scale: float, tesseract) -> PdfPageContent:
    ocr = tesseract.recognise(image)
    words = [Word(t, tuple(float(v) for v in b), size=float(b[3] - b[1]) / scale * 0.75, font="", mcid=None)
             for t, b in zip(ocr.words, ocr.boxes)]
    h, w = image.shape[:2]
    return PdfPageContent(width=w, height=h, scale=scale, words=words, lines=group_lines(words), rules=[],
                          graphics=[], graphics_mcid=[], images=[], images_mcid=[], chars=sum(map(len, ocr.words)))


def label_page(content: PdfPageContent, ctx: DocumentContext, page_index: int
               ) -> tuple[list[LabelledRegion], list[TableGrid], str]:
    """Regions of one page, and which labeller made them ("tags" or "structure")."""
    if content.struct:
        regions, grids = label_from_tags(content)
        if regions:
            tagged = {i for r in regions for i in r.word_ids}
            # words outside every block element: artifacts (mcid None) and content the tags leave
            # in generic containers (NonStruct, Div) without a block type
            untagged = {i for i in range(len(content.words)) if i not in tagged}
            furniture, _ = label_from_structure(content, ctx, page_index, allowed_words=untagged,
                                                furniture_only=True)
            left = untagged - {i for r in furniture for i in r.word_ids}
            _attach_strays(content, regions, left)
            left -= {i for r in regions for i in r.word_ids}
            # what the tags miss entirely (Chromium leaves some code blocks and definition terms
            # unmarked) is read by the structure rules, text blocks only
            rest, _ = label_from_structure(content, ctx, page_index, allowed_words=left, text_only=True)
            labeller = "tags" if len(left) <= 0.2 * max(1, len(content.words)) else "tags+structure"
            return regions + furniture + rest, grids, labeller
    regions, grids = label_from_structure(content, ctx, page_index)
    return regions, grids, "structure"


def _attach_strays(content: PdfPageContent, regions: list[LabelledRegion], strays: set[int]) -> None:
    """Words a tagged PDF left unmarked inside running text (Chromium drops the marks of some wrapped
    lines) join the text region they sit in or against: within half a line above or below it, or
    on one of its lines within an em of its edge."""
    text_regions = [r for r in regions if r.label not in _CONTAINERS and r.word_ids]
    for i in sorted(strays):
        b = content.words[i].box
        h = max(b[3] - b[1], 1.0)
        cy = (b[1] + b[3]) / 2
        best, best_d = None, None
        for r in text_regions:
            x0, y0, x1, y1 = r.box
            dx = max(x0 - b[2], b[0] - x1, 0.0)
            dy = max(y0 - cy, cy - y1, 0.0)
            if dx <= h and dy <= 0.8 * h and (best_d is None or dx + dy < best_d):
                best, best_d = r, dx + dy
        if best is not None:
            best.word_ids = sorted(best.word_ids + [i])
            best.box = (min(best.box[0], b[0]), min(best.box[1], b[1]), max(best.box[2], b[2]), max(best.box[3], b[3]))


def quality(content: PdfPageContent, regions: list[LabelledRegion], settings: LabelSettings) -> str | None:
    """Why a page is dropped, or None when its labels can be trusted."""
    if content.unmapped_words > MAX_UNMAPPED_SHARE * (len(content.words) + content.unmapped_words):
        return "unmapped_glyphs"
    if len(content.words) < settings.min_words:
        return "too_few_words"
    chars = sum(len(w.text) for w in content.words)
    covered_ids = {i for r in regions for i in r.word_ids}
    covered = sum(len(content.words[i].text) for i in covered_ids)
    if covered < settings.min_coverage * chars:
        return "low_coverage"
    conflicts = 0
    for a in range(len(regions)):
        for b in range(a + 1, len(regions)):
            ra, rb = regions[a], regions[b]
            if ra.label in _CONTAINERS or rb.label in _CONTAINERS:
                continue
            small = ra.box if area(ra.box) <= area(rb.box) else rb.box
            big = rb.box if small is ra.box else ra.box
            if area(small) > 0 and inside(small, big) > _CONFLICT_OVERLAP:
                conflicts += 1
    if conflicts > settings.max_conflicts:
        return "overlap_conflict"
    return None


def page_hash(words: list[str], image: np.ndarray) -> str:
    """Near-duplicate key: the page's text with numbers masked (the same page re-printed with another
    page number or date), or a coarse picture of an almost wordless page."""
    text = " ".join(words).lower()
    text = "".join("#" if ch.isdigit() else ch for ch in text)
    if len(text) >= 200:
        return "t:" + hashlib.sha1(" ".join(text.split()).encode()).hexdigest()[:20]
    from PIL import Image

    small = np.asarray(Image.fromarray(image).convert("L").resize((9, 8), Image.BILINEAR), dtype=np.int16)
    bits = (small[:, 1:] > small[:, :-1]).flatten()
    return "i:" + "".join("1" if b else "0" for b in bits) + ":" + str(len(words))


def reading_order(regions: list[LabelledRegion], width: float) -> list[int]:
    """Region indices in reading order: recursive XY-cut (split at the widest horizontal gap, else at
    a vertical gap between columns), regions inside containers right after them."""
    top_level = [i for i, r in enumerate(regions) if not any(
        j != i and regions[j].label in _CONTAINERS and r.label not in _CONTAINERS
        and inside(r.box, regions[j].box) > 0.8 for j in range(len(regions)))]
    order = _xy_cut(top_level, regions)
    out: list[int] = []
    for i in order:
        out.append(i)
        if regions[i].label in _CONTAINERS:
            inner = [j for j in range(len(regions)) if j not in top_level and j not in out
                     and inside(regions[j].box, regions[i].box) > 0.8]
            out.extend(sorted(inner, key=lambda j: (regions[j].box[1], regions[j].box[0])))
    out.extend(i for i in range(len(regions)) if i not in out)
    return out


def _xy_cut(ids: list[int], regions: list[LabelledRegion]) -> list[int]:
    if len(ids) <= 1:
        return list(ids)
    best = None
    for axis in (1, 0):  # rows (horizontal cuts) win ties over columns
        groups, widest = _gaps(ids, regions, axis)
        if len(groups) > 1 and (best is None or widest > best[1]):
            best = (groups, widest)
    if best is None:
        return sorted(ids, key=lambda i: (regions[i].box[1], regions[i].box[0]))
    return [j for g in best[0] for j in _xy_cut(g, regions)]


def _gaps(ids: list[int], regions: list[LabelledRegion], axis: int) -> tuple[list[list[int]], float]:
    """Regions split in two at the widest gap between their projections on `axis` (1: y, 0: x)."""
    spans = sorted((regions[i].box[axis], regions[i].box[axis + 2], i) for i in ids)
    reach, widest, cut = spans[0][1], 0.0, None
    for k, (start, end, _) in enumerate(spans[1:], start=1):
        if start >= reach - 1 and (cut is None or start - reach > widest):
            widest, cut = start - reach, k
        reach = max(reach, end)
    if cut is None:
        return [list(ids)], 0.0
    return [[i for _, _, i in spans[:cut]], [i for _, _, i in spans[cut:]]], widest


def _finish_page(index, image, content, text_layer, ctx, doc_id, package, source, split, settings,
                 seen_hashes, result: DocumentResult) -> None:
    regions, grids, labeller = label_page(content, ctx, index)
    reason = quality(content, regions, settings)
    if reason is not None:
        result.dropped[reason] += 1
        return
    order = reading_order(regions, content.width)
    new_index: dict[int, int] = {}
    for r in order:  # words in the reading order of their regions, then any stray words
        for j in sorted(regions[r].word_ids, key=lambda j: (content.words[j].box[1], content.words[j].box[0])):
            new_index.setdefault(j, len(new_index))
    for j in range(len(content.words)):
        new_index.setdefault(j, len(new_index))
    words = [None] * len(content.words)
    for old, new in new_index.items():
        words[new] = content.words[old]
    region_pos = {old: k for k, old in enumerate(order)}
    ordered = [regions[i] for i in order]
    for r in ordered:
        r.word_ids = sorted(new_index[j] for j in r.word_ids)
    for g in grids:
        g.region = region_pos[g.region]
        g.cells = [[region_pos[c] for c in row] for row in g.cells]
    texts = [w.text for w in words]
    key = page_hash(texts, image)
    if seen_hashes is not None and key in seen_hashes:
        result.dropped["near_duplicate"] += 1
        return
    if seen_hashes is not None:
        seen_hashes[key] = f"{doc_id}#p{index}"
    page_id = f"{doc_id}#p{index}"
    rng = random.Random(f"{settings.seed}:{page_id}")
    boxes = [[round(float(v), 2) for v in w.box] for w in words]
    region_json = [{"label": r.label, "box": [round(float(v), 2) for v in r.box], "word_ids": r.word_ids}
                   for r in ordered]
    questions = page_questions(texts, boxes, region_json, grids, content.height, content.width, rng,
                               settings.questions_per_page)
    record = {
        "version": RECORD_VERSION, "page_id": page_id, "doc_id": doc_id, "package": package,
        "source": source, "page_index": int(index), "split": split, "size": [content.height, content.width],
        "words": texts, "word_boxes": boxes, "text_layer": text_layer, "regions": region_json,
        "questions": questions, "labeller": labeller,
    }
    sample_key = hashlib.sha1(page_id.encode()).hexdigest()[:16]
    result.pages.append((sample_key, encode_png(image), record))
    result.hashes[sample_key] = key
    result.labellers[labeller] += 1
