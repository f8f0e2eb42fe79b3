"""dociq.data.pdf on PDFs the tests write themselves (`text_pdf`): page count, render sizes, text-layer
words where the text was drawn, and one error naming the file for a PDF that cannot be read."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from dociq.data.errors import BadSampleError
from dociq.data.pdf import (PdfOpenError, load_page, open_page, open_pdf, page_count, render_page, render_size,
                            text_layer_words)

PAGE_W, PAGE_H, FONT = 300, 200, 24  # points
LINES = [(20, 150, "Hello World"), (20, 80, "Invoice 2024")]  # (x, baseline y) in PDF points, y grows up


@pytest.fixture
def pdf_path(tmp_path, text_pdf):
    path = tmp_path / "doc.pdf"
    path.write_bytes(text_pdf([[(FONT, x, y, t) for x, y, t in LINES], [(12, 20, 100, "Second page")]],
                              width=PAGE_W, height=PAGE_H))
    return path


def test_page_count_of_a_file_and_of_bytes(pdf_path):
    assert page_count(pdf_path) == 2
    assert page_count(str(pdf_path)) == 2
    assert page_count(pdf_path.read_bytes(), name="member.pdf") == 2


@pytest.mark.parametrize("dpi", [72, 144, 100])
def test_render_size_at_a_dpi(pdf_path, dpi):
    scale = dpi / 72
    with open_page(pdf_path, 0) as page:
        image = render_page(page, scale)
        assert render_size(page, scale) == image.shape[:2]
    # pdfium's bitmap: ceil(points * scale) on each side
    assert image.shape == (int(np.ceil(PAGE_H * scale)), int(np.ceil(PAGE_W * scale)), 3)
    assert image.dtype == np.uint8 and image.flags.c_contiguous and image.flags.writeable


def test_render_to_a_given_size_resizes(pdf_path):
    with open_page(pdf_path, 0) as page:
        assert render_page(page, 0.5, size=(90, 150)).shape == (90, 150, 3)  # 100x150 bitmap squeezed


def test_render_over_the_pixel_cap_names_the_file_before_rendering(pdf_path):
    with open_page(pdf_path, 0) as page, pytest.raises(BadSampleError) as info:
        render_page(page, 2.0, max_page_pixels=10_000, name=pdf_path, what="PDF page 0")
    assert info.value.path == str(pdf_path)
    assert "PDF page 0 rendered at 144 dpi is 600x400" in str(info.value) and "max_page_pixels" in str(info.value)


def test_words_and_boxes_land_where_the_text_was_drawn(pdf_path):
    s = 2.0  # 144 dpi
    with open_page(pdf_path, 0) as page:
        image = render_page(page, s)
        words, boxes = text_layer_words(page, image.shape[:2])
    assert words == ["Hello", "World", "Invoice", "2024"]
    assert boxes.dtype == np.float32 and boxes.shape == (4, 4)
    # "Hello" starts at x=20pt and sits on the baseline y=150pt, cap height ~0.72 em
    x0, y0, x1, y1 = boxes[0]
    assert abs(x0 - 20 * s) < 4 and abs(y1 - (PAGE_H - 150) * s) < 3
    assert abs((y1 - y0) - 0.72 * FONT * s) < 4
    # boxes are glyph-tight: "Invoice" starts a little right of x=20pt (the "I"'s side bearing)
    assert abs(boxes[2, 0] - 20 * s) < 6 and abs(boxes[2, 3] - (PAGE_H - 80) * s) < 3
    assert boxes[1, 0] > boxes[0, 2]  # a line's words run left to right
    # the ink of the render is inside the word boxes: each box is dark, and all ink is in some box
    for bx in boxes.astype(int):
        assert image[bx[1]:bx[3], bx[0]:bx[2]].min() < 80
    ink = np.argwhere(image.min(axis=2) < 128)
    inside = np.zeros(len(ink), bool)
    for x0, y0, x1, y1 in boxes:  # within 2 px: anti-aliased edges
        inside |= (ink[:, 1] >= x0 - 2) & (ink[:, 1] <= x1 + 2) & (ink[:, 0] >= y0 - 2) & (ink[:, 0] <= y1 + 2)
    assert inside.all()


def test_words_map_onto_any_canvas_size(pdf_path):
    with open_page(pdf_path, 0) as page:
        _, full = text_layer_words(page, (400, 600))
        _, half = text_layer_words(page, (100, 150))
    np.testing.assert_allclose(half, full / 4, atol=0.5)


def test_a_corrupt_file_is_one_error_naming_the_file(tmp_path):
    bad = tmp_path / "corrupt.pdf"
    bad.write_bytes(b"%PDF-1.4\nthis is not a pdf at all")
    for read in (lambda: page_count(bad), lambda: open_pdf(bad), lambda: open_page(bad, 0).__enter__()):
        with pytest.raises(PdfOpenError) as info:
            read()
        err = info.value
        assert isinstance(err, BadSampleError) and err.path == str(bad) and err.problem == "broken"
        assert str(err).startswith(f"{bad}: not a readable PDF (") and "Fix: re-export or re-download" in str(err)
    with pytest.raises(PdfOpenError, match=r"^zip!member\.pdf: not a readable PDF"):
        open_pdf(bad.read_bytes(), name="zip!member.pdf")
    with pytest.raises(PdfOpenError, match="missing.pdf: PDF file not found") as info:
        page_count(tmp_path / "missing.pdf")
    assert info.value.problem == "missing"


def test_a_page_out_of_range_names_the_file(pdf_path):
    with pytest.raises(BadSampleError, match=r"doc\.pdf: page 2 requested but the PDF has 2 pages"):
        with open_page(pdf_path, 2):
            pass
    doc = open_pdf(pdf_path)
    try:
        with pytest.raises(BadSampleError, match="page -1 requested"):
            load_page(doc, -1, pdf_path)
    finally:
        doc.close()


def test_encrypted_and_page_less_pdfs_are_told_apart(tmp_path, text_pdf):
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    locked, empty = tmp_path / "locked.pdf", tmp_path / "empty.pdf"
    locked.write_bytes(buf.getvalue())
    empty.write_bytes(text_pdf([], width=200, height=200))
    with pytest.raises(PdfOpenError, match="locked.pdf: not a readable PDF: it is password-protected") as info:
        open_pdf(locked)
    assert info.value.problem == "encrypted" and "qpdf --decrypt" in info.value.fix
    # right after the encrypted one: pdfium's stale "Incorrect password" must not be read as the cause
    with pytest.raises(PdfOpenError, match="empty.pdf: not a readable PDF: it has no pages") as info:
        open_pdf(empty)
    assert info.value.problem == "empty"


def test_the_error_survives_pickling(tmp_path):
    err = PdfOpenError(tmp_path / "x.pdf", "not a readable PDF", "re-export", "encrypted")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.problem) == (PdfOpenError, str(err), "encrypted")
