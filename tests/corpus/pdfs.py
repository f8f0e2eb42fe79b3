"""Small PDFs written byte by byte for the corpus tests: text in Helvetica / Helvetica-Bold /
Courier (standard-14 fonts, not embedded), ruling lines and filled rectangles, no tag tree."""
from __future__ import annotations

import io

from pdf_bytes import pdf_from_objects

FONTS = {"regular": "Helvetica", "bold": "Helvetica-Bold", "mono": "Courier"}


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def page_stream(ops) -> bytes:
    """ops: ("text", font, size, x, y, str) | ("line", x0, y0, x1, y1) | ("rect", x, y, w, h) |
    ("glyphs", size, x, y, [glyph ids]): glyphs of a font that maps them to no characters."""
    out = []
    for op in ops:
        if op[0] == "text":
            _, font, size, x, y, text = op
            out.append(f"BT /{font} {size} Tf {x} {y} Td ({_escape(text)}) Tj ET")
        elif op[0] == "glyphs":
            _, size, x, y, glyphs = op
            out.append(f"BT /unmapped {size} Tf {x} {y} Td <{''.join(f'{g:04x}' for g in glyphs)}> Tj ET")
        elif op[0] == "line":
            _, x0, y0, x1, y1 = op
            out.append(f"0.8 w {x0} {y0} m {x1} {y1} l S")
        elif op[0] == "rect":
            _, x, y, w, h = op
            out.append(f"0.3 0.4 0.8 rg {x} {y} {w} {h} re f 0 0 0 rg")
    return ("\n".join(out) + "\n").encode()


def write_pdf(pages, width: float = 612, height: float = 792) -> bytes:
    n = len(pages)
    font_objs = {key: 3 + i for i, key in enumerate(FONTS)}
    first_page = 3 + len(FONTS)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                b" ".join(b"%d 0 R" % (first_page + 2 * i) for i in range(n)), n)]
    objs += [f"<< /Type /Font /Subtype /Type1 /BaseFont /{name} >>".encode() for name in FONTS.values()]
    unmapped = first_page + 2 * n  # a CID font without a ToUnicode map, after the pages
    resources = " ".join(f"/{key} {num} 0 R" for key, num in font_objs.items()) + f" /unmapped {unmapped} 0 R"
    for i, ops in enumerate(pages):
        content = page_stream(ops)
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] "
                    f"/Resources << /Font << {resources} >> >> /Contents {first_page + 2 * i + 1} 0 R >>".encode())
        objs.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"endstream")
    objs.append(f"<< /Type /Font /Subtype /Type0 /BaseFont /Unmapped /Encoding /Identity-H "
                f"/DescendantFonts [{unmapped + 1} 0 R] >>".encode())
    objs.append(b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /Unmapped /CIDSystemInfo "
                b"<< /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> /DW 600 >>")
    return pdf_from_objects(objs)


LOREM = ("Document pages carry words whose layout tells a reader what each block is for and how "
         "the blocks relate to one another across the whole page").split()


def paragraph(x, y, lines=4, size=10, width_words=12, start=0):
    ops = []
    for k in range(lines):
        words = [LOREM[(start + k * width_words + j) % len(LOREM)] for j in range(width_words)]
        ops.append(("text", "regular", size, x, y - k * size * 1.25, " ".join(words)))
    return ops


def manual_pages(n_pages: int = 3, variant: int = 0) -> list[list]:
    """An untagged 'manual': running header, page numbers, title, headings, paragraphs, a list, code,
    a ruled table with a caption and a bar chart with a caption. Another `variant` words its text
    differently (a different document, not a near-duplicate)."""
    pages = []
    for p in range(n_pages):
        ops = [("text", "regular", 9, 72, 750, "Corpus Builder Reference Manual"),
               ("text", "regular", 10, 300, 40, str(p + 1))]
        y = 700
        if p == 0:
            ops.append(("text", "bold", 24, 72, y, "A Guide to Real Pages" + (f" {variant}" if variant else "")))
            y -= 50
        ops.append(("text", "bold", 14, 72, y, f"{p + 1} Section about pages {p + 1}"))
        y -= 28
        ops += paragraph(72, y, lines=4, start=p + 5 * variant)
        y -= 4 * 12.5 + 14
        if p == 0:
            for k in range(3):
                ops.append(("text", "regular", 10, 80, y, "-"))
                ops.append(("text", "regular", 10, 92, y, f"Item number {k + 1} of the list explains a point"))
                ops.append(("text", "regular", 10, 92, y - 12.5, "and continues on a hanging indented line"))
                y -= 32
            y -= 6
            for k, code in enumerate(["def build(src, out):", "    pages = label(src)", "    write(out, pages)"]):
                ops.append(("text", "mono", 10, 72, y - k * 12, code))
            y -= 3 * 12 + 16
            ops += paragraph(72, y, lines=3, start=7)
        if p == 1:
            top, rows, cols, cw, rh = y, 3, 3, 120, 18
            for r in range(rows + 1):
                ops.append(("line", 72, top - r * rh, 72 + cols * cw, top - r * rh))
            for c in range(cols + 1):
                ops.append(("line", 72 + c * cw, top, 72 + c * cw, top - rows * rh))
            cells = [["Run", "Pages", "Seconds"], ["first", "120", "41"], ["second", "480", "160"]]
            for r, row in enumerate(cells):
                for c, text in enumerate(row):
                    ops.append(("text", "regular", 10, 78 + c * cw, top - r * rh - 13, text))
            y = top - rows * rh - 18
            ops.append(("text", "regular", 10, 72, y, "Table 1: Pages labelled per run."))
            y -= 40
            for k, h in enumerate([60, 110, 85, 140, 40]):
                ops.append(("rect", 100 + k * 40, y - 150, 28, h))
            ops.append(("line", 90, y - 150, 320, y - 150))
            ops.append(("line", 90, y - 150, 90, y))
            y -= 170
            ops.append(("text", "regular", 10, 72, y, "Figure 1: Pages kept by package."))
            y -= 30
            ops += paragraph(72, y, lines=3, start=3 + 2 * variant)
        if p == 2:
            ops += paragraph(72, y, lines=5, start=11 + 3 * variant)
        pages.append(ops)
    return pages


def encrypted_pdf() -> bytes:
    """A one-page PDF locked with a password (pypdf, a dev dependency)."""
    import pypdf

    writer = pypdf.PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()
