"""OCR backends on inputs the tests write themselves: a hand-written born-digital PDF, its rendering
for tesseract, and the on-disk cache."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dociq.data.errors import BadSampleError
from dociq.data.ocr import DIGIT_ADVANCE, SIDE_BEARING, OcrCache, OcrWords, PdfTextLayer, TesseractOCR, make_ocr, read_surely
from script_module import load_script

PAGE_W, PAGE_H, FONT = 300, 200, 24  # points
LINES = [(20, 150, "Hello World"), (20, 80, "Invoice 2024")]  # (x, baseline y) in PDF points


@pytest.fixture
def pdf_path(tmp_path, text_pdf):
    path = tmp_path / "page.pdf"
    path.write_bytes(text_pdf([[(FONT, x, y, t) for x, y, t in LINES]], width=PAGE_W, height=PAGE_H))
    return path


def test_pdf_text_layer_words_and_boxes(pdf_path):
    dpi = 144
    s = dpi / 72
    image, words = PdfTextLayer(dpi=dpi).read(pdf_path)
    assert image.shape == (PAGE_H * s, PAGE_W * s, 3) and image.dtype == np.uint8
    assert image.flags.writeable
    assert words.words == ["Hello", "World", "Invoice", "2024"]
    assert words.size == image.shape[:2]
    # "Hello": starts at x=20pt, sits on the baseline y=150pt (PDF y grows upwards), cap height ~0.72em
    x0, y0, x1, y1 = words.boxes[0]
    assert abs(x0 - 20 * s) < 4
    assert abs(y1 - (PAGE_H - 150) * s) < 3
    assert abs((y1 - y0) - 0.72 * FONT * s) < 4
    # second line is 70pt lower; words on a line share a baseline and run left to right
    assert abs(words.boxes[2, 3] - (PAGE_H - 80) * s) < 3
    assert words.boxes[1, 0] > words.boxes[0, 2]
    # the rendered page is dark inside each word box and white far from the text
    for bx in words.boxes.astype(int):
        assert image[bx[1]:bx[3], bx[0]:bx[2]].min() < 80
    assert image[int(180 * s):, :].min() > 240


def test_pdf_words_map_onto_a_given_image_size(pdf_path):
    words = PdfTextLayer(dpi=144).words(pdf_path, size=(100, 150))  # a 0.5 pt/px image of the page
    assert words.size == (100, 150)
    assert abs(words.boxes[0, 0] - 20 * 0.5) < 2
    image = PdfTextLayer(dpi=144).render(pdf_path, size=(100, 150))
    assert image.shape == (100, 150, 3)


def test_pdf_errors_name_the_file(tmp_path, pdf_path):
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"not a pdf at all")
    with pytest.raises(BadSampleError, match="bad.pdf"):
        PdfTextLayer().words(bad)
    with pytest.raises(BadSampleError, match="not found"):
        PdfTextLayer().words(tmp_path / "missing.pdf")
    with pytest.raises(BadSampleError, match="page 3 requested but the PDF has 1 pages"):
        PdfTextLayer().words(pdf_path, page_index=3)


def test_cache_hit_returns_identical_words_without_rerunning(pdf_path, tmp_path, monkeypatch):
    backend = PdfTextLayer(dpi=144, cache=tmp_path / "cache")
    first = backend.words(pdf_path)
    files = list((tmp_path / "cache").rglob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["words"] == first.words

    def must_not_run(*a, **k):
        raise AssertionError("backend ran despite a cache hit")

    monkeypatch.setattr(PdfTextLayer, "_extract", must_not_run)
    again = PdfTextLayer(dpi=144, cache=tmp_path / "cache").words(pdf_path)
    assert again.words == first.words
    np.testing.assert_array_equal(again.boxes, first.boxes)
    assert again.size == first.size
    # other settings are another key: the backend must run (and here it fails loudly)
    with pytest.raises(AssertionError, match="cache hit"):
        PdfTextLayer(dpi=72, cache=tmp_path / "cache").words(pdf_path)


def test_cache_key_depends_on_content_backend_and_settings():
    k = OcrCache.key("abc", "tesseract", {"psm": 3})
    assert k == OcrCache.key("abc", "tesseract", {"psm": 3})
    assert len({k, OcrCache.key("abd", "tesseract", {"psm": 3}),
                OcrCache.key("abc", "pdf", {"psm": 3}), OcrCache.key("abc", "tesseract", {"psm": 6})}) == 4


def test_ocr_words_scale_and_json_round_trip():
    w = OcrWords(["a", "b"], np.array([[0, 0, 10, 10], [20, 5, 40, 15]]), (50, 100))
    half = w.scaled_to((25, 50))
    np.testing.assert_allclose(half.boxes, [[0, 0, 5, 5], [10, 2.5, 20, 7.5]])
    back = OcrWords.from_json(json.loads(json.dumps(w.to_json())))
    assert back.words == w.words and back.size == w.size
    np.testing.assert_array_equal(back.boxes, w.boxes)


def test_missing_tesseract_names_the_debian_package():
    with pytest.raises(RuntimeError, match="tesseract-ocr"):
        TesseractOCR(tesseract_cmd="/nonexistent/tesseract")


def test_make_ocr_rejects_unknown_names():
    assert make_ocr("groundtruth") is None
    assert isinstance(make_ocr("pdf"), PdfTextLayer)
    with pytest.raises(ValueError, match="ocr='easyocr'.*Fix"):
        make_ocr("easyocr")


needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract binary not found: install the Debian package tesseract-ocr (CI does)",
)


@needs_tesseract
@pytest.mark.parametrize("min_long_side", [None, 4000])     # read as given / enlarged first
def test_tesseract_reads_large_words_and_caches(pdf_path, tmp_path, monkeypatch, min_long_side):
    pdf = PdfTextLayer(dpi=144)
    image, truth = pdf.read(pdf_path)
    assert max(image.shape) < 4000
    backend = TesseractOCR(cache=tmp_path / "cache", psm=11, min_long_side=min_long_side)
    words = backend.recognise(image)
    assert words.words == truth.words
    assert words.size == image.shape[:2]
    assert (words.confidences > backend.min_conf).all()
    # tesseract's boxes agree with the text layer's to a few pixels
    assert np.abs(words.boxes - truth.boxes).max() < 6

    monkeypatch.setattr(TesseractOCR, "_run", lambda *a, **k: pytest.fail("tesseract ran on a cache hit"))
    cached = TesseractOCR(cache=tmp_path / "cache", psm=11, min_long_side=min_long_side).recognise(image)
    assert cached.words == words.words
    np.testing.assert_array_equal(cached.boxes, words.boxes)
    np.testing.assert_array_equal(cached.confidences, words.confidences)
    # the cache keeps every word read: another confidence threshold reads it without tesseract
    strict = TesseractOCR(cache=tmp_path / "cache", psm=11, min_long_side=min_long_side,
                          min_conf=float(words.confidences.min()), min_conf_digits=float(words.confidences.min())
                          ).recognise(image)
    assert strict.words == [w for w, c in zip(words.words, words.confidences) if c > words.confidences.min()]


def test_confident_keeps_the_words_above_the_threshold_and_codes_with_digits():
    read = OcrWords(["Total:", "PSFQ3585", "|", "inom"], np.array([[0, 0, 5, 5], [6, 0, 20, 5], [21, 0, 22, 5],
                                                                  [23, 0, 29, 5]]), (10, 30),
                    np.array([96.0, 48.0, 12.0, 34.0]))
    kept = read.confident(30.0)
    assert kept.words == ["Total:", "PSFQ3585", "inom"]
    np.testing.assert_array_equal(kept.boxes, [[0, 0, 5, 5], [6, 0, 20, 5], [23, 0, 29, 5]])
    np.testing.assert_array_equal(kept.confidences, [96.0, 48.0, 34.0])
    assert read.confident(-1.0) is read
    # a code tesseract's language model doubts is kept; a doubted word without a digit (a scribble) is not
    assert read.confident(50.0, min_conf_digits=-1.0).words == ["Total:", "PSFQ3585"]


def test_widened_pads_each_box_by_a_share_of_its_height_inside_the_page():
    read = OcrWords(["Total:", "42"], np.array([[0.5, 0, 20, 10], [30, 0, 39, 20]]), (20, 40), np.array([96.0, 40.0]))
    wide = read.widened(0.05)
    np.testing.assert_allclose(wide.boxes, [[0, 0, 20.5, 10], [29, 0, 40, 20]])    # 0.5 / 1 px a side, clipped
    assert wide.words == read.words and list(wide.confidences) == [96.0, 40.0]
    np.testing.assert_array_equal(read.boxes[0], [0.5, 0, 20, 10])                # a copy


def test_a_numbers_box_is_as_wide_as_its_digits_advances_about_its_ink():
    # a "1" whose ink is a 2-px stroke, a "10" already wide enough, a word of letters as narrow
    read = OcrWords(["1", "10", "l", "1a"], np.array([[20, 0, 22, 12], [40, 0, 53, 12], [60, 0, 62, 12],
                                                     [70, 0, 74, 12]]), (20, 80))
    wide = read.widened(0.04, digit_advance=0.5)
    np.testing.assert_allclose(wide.boxes[0], [18, 0, 24, 12])                     # 0.5 x 12 px, centred
    np.testing.assert_allclose(wide.boxes[1:, [0, 2]], [[39.52, 53.48], [59.52, 62.48], [69.52, 74.48]])
    np.testing.assert_allclose(read.widened(0.04).boxes[0], [19.52, 0, 22.48, 12])  # no advance asked: bearings only
    edge = OcrWords(["7"], np.array([[1, 0, 3, 12]]), (20, 80)).widened(0.0, digit_advance=0.5)
    np.testing.assert_allclose(edge.boxes[0], [0, 0, 5, 12])                       # inside the page


def test_read_surely_tells_the_words_tesseract_doubts_and_trusts_given_words():
    words = ["Total:", "PSFQ3585", "|", "inom"]
    np.testing.assert_array_equal(read_surely(words, np.array([96.0, 48.0, 12.0, 51.0])), [True, True, False, True])
    np.testing.assert_array_equal(read_surely(words, np.array([96.0, 48.0, 12.0, 51.0]), 50.0, None),
                                  [True, False, False, True])
    np.testing.assert_array_equal(read_surely(words, None), [True] * 4)     # a text layer's or a caller's words


FORM_FIELDS = [("Full name:", "Stacey Padilla"), ("Employer:", "Pearson Group"), ("Reference:", "AK/6749/25"),
               ("Start date:", "July 29, 2010"), ("Relationship:", "Friend"), ("Account number:", "HWWG98687021865710"),
               ("City:", "Richardmouth"), ("Approved by:", "Kyle Herrera"), ("Department:", "Human Resources"),
               ("Phone:", "416-396-7400"), ("State:", "Massachusetts"), ("Hours per week:", "37.5")]


def scanned_form(seed: int, boxes: bool = True) -> np.ndarray:
    """An office form at ~90 dpi (13-px DejaVu, values in ruled boxes) as a scanner hands it over:
    skewed 1.4 degrees, blurred, with sensor noise. boxes=False: the same words without their boxes."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.synthetic.fonts import font_path

    page = Image.new("L", (724, 1024), 255)
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(font_path("sans", "regular")), 13)
    for k, (label, value) in enumerate(FORM_FIELDS):
        y = 140 + 34 * k
        draw.text((75, y), label, font=font, fill=40)
        if boxes:
            draw.rectangle((320, y - 5, 660, y + 17), outline=60)
        draw.text((326, y), value, font=font, fill=30)
    return as_scanned(page, -1.4, 0.7, 5, seed)


def as_scanned(page, angle: float, blur: float, noise: float, seed: int) -> np.ndarray:
    """uint8 [H, W, 3]: a grey PIL page turned `angle` degrees, blurred and given sensor noise."""
    from PIL import Image, ImageFilter

    page = page.rotate(angle, resample=Image.BILINEAR, fillcolor=255).filter(ImageFilter.GaussianBlur(blur))
    grey = np.asarray(page, np.float32) + np.random.default_rng(seed).normal(0, noise, page.size[::-1])
    return np.repeat(np.clip(grey, 0, 255).astype(np.uint8)[..., None], 3, axis=2)


def scanned_table_form(seed: int, rules: bool = True) -> np.ndarray:
    """The same fields as a ruled label | value table (serif, bold labels, 23-px rows, a grey header
    row), skewed 1 degree and blurred: the table tesseract reads as a picture unless its rules go."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.synthetic.fonts import font_path

    page = Image.new("L", (724, 1024), 255)
    draw = ImageDraw.Draw(page)
    regular, bold = (ImageFont.truetype(str(font_path("serif", style)), 11) for style in ("regular", "bold"))
    top, row = 140, 23
    draw.rectangle((52, top - row, 666, top), fill=220, outline=0 if rules else None)
    draw.text((58, top - row + 5), "Employment", font=bold, fill=0)
    for k, (label, value) in enumerate(FORM_FIELDS):
        draw.text((58, top + row * k + 5), label, font=bold, fill=0)
        draw.text((272, top + row * k + 5), value, font=regular, fill=0)
        if rules:
            draw.line((52, top + row * (k + 1), 666, top + row * (k + 1)), fill=0)
    for x in (52, 266, 666) if rules else ():
        draw.line((x, top - row, x, top + row * len(FORM_FIELDS)), fill=0)
    return as_scanned(page, -1.0, 0.5, 4, seed)


@needs_tesseract
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scan", [
    "scanned_form",            # tesseract's own global threshold reads 14-22 % of its words; the default ~90 %
    "scanned_table_form",      # with the rules left in, tesseract reads 6-7 of its 37 words
])
def test_tesseract_reads_a_blurred_noisy_scan_of_a_form(scan, seed):
    truth = " ".join(label + " " + value for label, value in FORM_FIELDS).split()
    read = TesseractOCR().recognise(globals()[scan](seed)).words
    assert sum(word in read for word in truth) >= 0.8 * len(truth), read
    assert not [word for word in read if word[0] in "|[]" or word[-1] in "|[]"], read     # no box side read as text


def test_unread_pieces_are_the_text_sized_ink_no_word_covers():
    from dociq.data.unread_ink import unread_pieces

    grey = np.full((400, 300), 255, np.uint8)
    grey[50:62, 50:120] = 0                  # a word that was read
    grey[350:360, 200:206] = 0               # a lone digit at the margin
    grey[300:302, 20:22] = 0                 # a speck
    grey[200:202, 20:280] = 0                # a rule
    grey[100:160, 100:160] = 0               # a blot far taller than a line
    np.testing.assert_array_equal(unread_pieces(grey, np.array([[50, 50, 120, 62]])), [[200, 350, 206, 360]])
    assert unread_pieces(grey, np.zeros((0, 4))).shape == (0, 4)      # no words to size the text by


def page_with_a_lone_number(seed: int) -> np.ndarray:
    """A scanned page of form lines and, alone at the bottom margin, its page number "7"."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.synthetic.fonts import font_path

    page = Image.new("L", (724, 1024), 255)
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(font_path("serif", "regular")), 13)
    for k, (label, value) in enumerate(FORM_FIELDS):
        draw.text((75, 140 + 20 * k), label + " " + value, font=font, fill=30)
    draw.text((358, 980), "7", font=font, fill=30)
    return as_scanned(page, -0.8, 0.7, 5, seed)


@needs_tesseract
@pytest.mark.parametrize("seed", [0, 1])
def test_a_lone_page_number_tesseract_drops_is_read_from_its_ink(seed):
    image = page_with_a_lone_number(seed)
    assert "7" not in TesseractOCR(read_unread_ink=False).recognise(image).words
    read = TesseractOCR().recognise(image)
    assert read.words[-1] == "7"                                    # in reading order: last on the page
    x0, y0, x1, y1 = read.boxes[-1]
    assert 345 <= (x0 + x1) / 2 <= 370 and 975 <= (y0 + y1) / 2 <= 1000
    assert [w for w in read.words[:-1] if w == "7"] == []


def test_ruling_lines_are_the_rules_not_the_letters():
    from dociq.data.ruling_lines import erase_ruling_lines, ruling_lines

    grey = scanned_table_form(0)[..., 0]
    lines = ruling_lines(grey)
    # the rotated grid: its 13 rules across and 3 down hold the line pixels
    ys, xs = np.nonzero(lines)
    assert lines.sum() > 13 * 500 and xs.min() >= 40 and xs.max() <= 680 and ys.min() >= 100 and ys.max() <= 450
    # no letter is a line: the ink of the same table drawn without its rules is almost all left
    letters = scanned_table_form(0, rules=False)[..., 0] < 128
    assert (lines & letters).sum() < 0.02 * letters.sum()
    erased = erase_ruling_lines(grey)
    assert (erased[lines] == 255).all()
    # a page of words only has no rule at all
    assert not ruling_lines(scanned_form(0)[..., 0][:, :300]).any()


def test_a_field_box_is_erased_with_its_short_sides_and_its_value_is_not():
    """A value's box is two long rules and two sides a text line tall: tesseract reads a side left
    in as "|" or glues it to the value, so the sides go too — and only they, not the letters."""
    from scipy import ndimage

    from dociq.data.ruling_lines import erase_ruling_lines, ruling_lines

    grey, unboxed = scanned_form(0)[..., 0], scanned_form(0, boxes=False)[..., 0]
    letters = unboxed < 128
    box = unboxed.astype(int) - grey > 40                            # the same scan's noise: only the boxes differ
    sides = ndimage.binary_opening(box, np.ones((9, 1), bool))     # the boxes' parts that run down
    assert sides.sum() > 12 * 2 * 15                                 # two sides of each of the 12 boxes
    erased = erase_ruling_lines(grey)
    assert (erased[sides] == 255).mean() > 0.97
    assert (ruling_lines(grey) & letters).sum() < 0.02 * letters.sum()


def test_letters_standing_on_an_underline_are_not_box_sides():
    """A stem that touches the rule it stands on is a letter: a side meets a rule at both ends."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.ruling_lines import ruling_lines
    from dociq.data.synthetic.fonts import font_path

    page = Image.new("L", (724, 300), 255)
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype(str(font_path("sans", "regular")), 20)
    draw.text((80, 100), "Signed: lily hill", font=font, fill=0)
    bottom = draw.textbbox((80, 100), "Signed: lily hill", font=font)[3] - 5    # the stems' feet, under the baseline
    draw.line((60, bottom, 660, bottom), fill=0, width=2)
    draw.line((60, 40, 660, 40), fill=0, width=2)                  # a rule above, far from the stems' tops
    grey = np.asarray(page)
    lines = ruling_lines(grey)
    above = (grey[:bottom - 3] < 128)
    assert above[40 + 4:].any() and not lines[44:bottom - 3].any()


def test_a_strip_of_large_text_has_no_ruling_line():
    """In a cropped line of text a letter's stem is taller than a tenth of the strip: still no rule."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.ruling_lines import ruling_lines
    from dociq.data.synthetic.fonts import font_path

    strip = Image.new("L", (600, 120), 255)
    ImageDraw.Draw(strip).text((40, 50), "NAME  2024  gladly", font=ImageFont.truetype(str(font_path("sans", "regular")), 24), fill=0)
    assert not ruling_lines(np.asarray(strip)).any()


def test_tesseract_rejects_an_unknown_binarization():
    with pytest.raises(ValueError, match="binarize='adaptive'.*sauvola"):
        TesseractOCR(binarize="adaptive")


HOCR = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" "http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">
<html xmlns="http://www.w3.org/1999/xhtml"><body><div class='ocr_page' title='image ""; bbox 0 0 400 200; ppageno 0'>
 <span class='ocr_line' title="bbox 10 20 200 44; baseline 0.01 -6; x_size 30; x_descenders 6; x_ascenders 7">
  <span class='ocrx_word' title='bbox 10 22 60 38; x_wconf 96'>NAME</span>
  <span class='ocrx_word' title='bbox 70 20 200 44; x_wconf 91'><strong>Ada&amp;Co</strong></span>
 </span>
 <span class='ocr_caption' title="bbox 10 60 90 70">
  <span class='ocrx_word' title='bbox 10 60 90 70; x_wconf 40'>tiny</span>
 </span></div></body></html>"""


def test_hocr_words_are_as_tall_as_their_lines_font():
    from dociq.data.ocr import hocr_words

    name, ada, tiny = hocr_words(HOCR)
    assert [w.text for w in (name, ada, tiny)] == ["NAME", "Ada&Co", "tiny"]
    assert [w.confidence for w in (name, ada, tiny)] == [96, 91, 40]
    assert name.ink == [10, 22, 60, 38] and name.line == [10, 20, 60, 44]
    # baseline at the word's centre: the line's bottom 44, offset -6, slope 0.01 over 25 px -> 38.25;
    # the font reaches 6 below it and 30 up from there, whatever the letters ("NAME" has no descender)
    np.testing.assert_allclose(name.font, [10, 14.25, 60, 44.25])
    np.testing.assert_allclose(ada.font, [70, 15.25, 200, 45.25])
    assert tiny.font == tiny.ink                         # a line without font metrics keeps the ink box


def test_tesseract_rejects_an_unknown_word_box():
    with pytest.raises(ValueError, match="word_boxes='tight'.*font"):
        TesseractOCR(word_boxes="tight")


@needs_tesseract
def test_tesseract_font_boxes_span_the_lines_ascenders_and_descenders():
    """A word without ascenders or descenders ("NAME", "2024") gets the height of the font on its
    line, as a text layer's boxes span the font's ascent and descent whatever the letters."""
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.synthetic.fonts import font_path

    font = ImageFont.truetype(str(font_path("sans", "regular")), 40)
    page = Image.new("RGB", (900, 160), "white")
    ImageDraw.Draw(page).text((40, 50), "NAME  2024  gladly", fill="black", font=font)
    ascent, descent = font.getmetrics()
    layer = (50, 50 + ascent + descent)                    # the text layer's top and bottom
    image = np.asarray(page)
    ink = TesseractOCR(word_boxes="ink", min_long_side=None).recognise(image)
    tall = TesseractOCR(min_long_side=None).recognise(image)
    assert tall.words == ink.words == ["NAME", "2024", "gladly"]
    # as wide as the ink and its letters' side bearings, a number at least as its digits' advances
    height = tall.boxes[:, 3] - tall.boxes[:, 1]
    bearing = np.maximum(SIDE_BEARING * height, (np.array([0, 4, 0]) * DIGIT_ADVANCE * height
                                                 - (ink.boxes[:, 2] - ink.boxes[:, 0])) / 2)
    np.testing.assert_allclose(tall.boxes[:, 0], ink.boxes[:, 0] - bearing, atol=1e-4)
    np.testing.assert_allclose(tall.boxes[:, 2], ink.boxes[:, 2] + bearing, atol=1e-4)
    assert (ink.boxes[:2, 3] < ink.boxes[2, 3] - 6).all()    # glyph-tight: caps end above the descender
    # one top and one bottom for the line, holding its ink, nearer the text layer's than the ink's
    assert np.ptp(tall.boxes[:, 1]) == 0 and np.ptp(tall.boxes[:, 3]) == 0
    assert tall.boxes[0, 1] <= ink.boxes[:, 1].min() and tall.boxes[0, 3] >= ink.boxes[:, 3].max() - 1

    def overlap(box) -> float:
        return (min(box[3], layer[1]) - max(box[1], layer[0])) / (max(box[3], layer[1]) - min(box[1], layer[0]))
    assert all(overlap(t) > overlap(k) + 0.1 for t, k in zip(tall.boxes[:2], ink.boxes[:2]))


# ---------------------------------------------------------------------------------------------
# the backends behind CocoDocuments(ocr=...)

from dociq.data.datasets.coco import CocoDocuments  # noqa: E402


def _coco_for(tmp_path, file_name, width, height):
    ann = {"images": [{"id": 1, "file_name": file_name, "width": width, "height": height}],
           "categories": [{"id": 1, "name": "Text"}],
           # the first line's area in pixels of the annotated size (pdf points x width/PAGE_W)
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1,
                            "bbox": [15 * width / PAGE_W, 20 * height / PAGE_H,
                                     200 * width / PAGE_W, 40 * height / PAGE_H]}]}
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(ann))
    return path


def test_coco_pages_that_are_pdfs_use_the_text_layer(tmp_path, pdf_path):
    ann = _coco_for(tmp_path, pdf_path.name, width=450, height=300)  # 1.5 px per point
    page = CocoDocuments(ann, image_dir=tmp_path, ocr="pdf")[0]
    assert page.image.shape == (300, 450, 3)
    assert page.words == ["Hello", "World", "Invoice", "2024"]
    assert abs(page.word_boxes[0, 0] - 20 * 1.5) < 3
    assert page.regions[0].word_ids == [0, 1] and page.regions[0].text == "Hello World"
    with pytest.raises(BadSampleError, match="no words.*ocr='tesseract'"):
        CocoDocuments(ann, image_dir=tmp_path)[0]  # groundtruth: the annotation has no words


def test_coco_png_pages_find_their_pdf_in_pdf_dir(tmp_path, pdf_path):
    from PIL import Image

    images = tmp_path / "png"
    images.mkdir()
    rendered = PdfTextLayer(dpi=72).render(pdf_path)  # 300 x 200 pixels
    Image.fromarray(rendered).save(images / "page.png")
    ann = _coco_for(tmp_path, "page.png", width=PAGE_W, height=PAGE_H)
    page = CocoDocuments(ann, image_dir=images, pdf_dir=tmp_path, ocr="pdf")[0]
    assert page.words == ["Hello", "World", "Invoice", "2024"]
    assert abs(page.word_boxes[0, 0] - 20) < 2 and abs(page.word_boxes[0, 3] - 50) < 2
    with pytest.raises(BadSampleError, match=r"page\.pdf: ocr='pdf' needs the page's PDF"):
        CocoDocuments(ann, image_dir=images, ocr="pdf")[0]


@needs_tesseract
def test_coco_with_tesseract(tmp_path, pdf_path):
    from PIL import Image

    Image.fromarray(PdfTextLayer(dpi=144).render(pdf_path)).save(tmp_path / "scan.png")
    ann = _coco_for(tmp_path, "scan.png", width=600, height=400)
    page = CocoDocuments(ann, image_dir=tmp_path, ocr="tesseract",
                         ocr_options={"psm": 11}, ocr_cache_dir=tmp_path / "cache")[0]
    assert page.words == ["Hello", "World", "Invoice", "2024"]
    assert page.regions[0].text == "Hello World"


def test_coco_with_a_custom_backend_rescales_its_boxes(tmp_path):
    from PIL import Image

    Image.fromarray(np.full((400, 600, 3), 255, np.uint8)).save(tmp_path / "scan.png")
    ann = _coco_for(tmp_path, "scan.png", width=600, height=400)

    class Fixed:
        name = "fixed"

        def settings(self):
            return {}

        def recognise(self, image):  # boxes at half resolution: the data set rescales them
            return OcrWords(["x"], np.array([[10, 10, 20, 20]]), (image.shape[0] // 2, image.shape[1] // 2))

    page = CocoDocuments(ann, image_dir=tmp_path, ocr=Fixed())[0]
    assert page.words == ["x"]
    np.testing.assert_allclose(page.word_boxes, [[20, 20, 40, 40]])


def test_the_word_box_bench_pairs_each_read_word_with_its_text_layer_box():
    bench = load_script("bench_word_boxes")
    read, truth, texts = bench.matched_boxes(["Total:", "42", "zzz", "7"],
                                             np.array([[10, 0, 40, 10], [50, 0, 60, 10], [0, 0, 5, 5], [0, 50, 5, 60]]),
                                             ["total:", "42", "42", "7"],
                                             [[9, 0, 41, 11], [100, 0, 110, 10], [49, 0, 61, 10], [30, 50, 35, 60]])
    np.testing.assert_array_equal(read, [[10, 0, 40, 10], [50, 0, 60, 10]])
    np.testing.assert_array_equal(truth, [[9, 0, 41, 11], [49, 0, 61, 10]])    # the "42" it overlaps; "7" none
    assert texts == ["Total:", "42"]
    np.testing.assert_allclose(bench.box_iou(read, truth), [300 / 352, 100 / 120])


@needs_tesseract
def test_sharpening_is_in_the_cache_key_and_a_page_read_without_it_keeps_its_key():
    from dociq.data.ocr import UNSHARP

    plain, sharp = TesseractOCR(sharpen=False), TesseractOCR(sharpen=True)
    assert "sharpen" not in plain.settings() and sharp.settings()["sharpen"] == UNSHARP
    assert OcrCache.key("abc", "tesseract", plain.settings()) != OcrCache.key("abc", "tesseract", sharp.settings())
    # the default reads both ways, under the two keys above
    surer = TesseractOCR()
    assert surer.sharpen == "surer"
    assert surer.settings(False) == plain.settings() and surer.settings(True) == sharp.settings()
    with pytest.raises(ValueError, match="surer"):
        TesseractOCR(sharpen="blurred")


@needs_tesseract
@pytest.mark.parametrize("sure_when_sharpened, kept", [([90, 90, 60], "sharpened"), ([90, 30, 20], "plain"),
                                                      ([90, 90, 20], "plain")])      # a tie keeps the plain reading
def test_the_default_keeps_the_reading_with_more_sure_words_and_caches_both(tmp_path, monkeypatch,
                                                                           sure_when_sharpened, kept):
    def read(self, image, sharpened):
        words, confidences = ([f"sharpened{k}" for k in range(3)], sure_when_sharpened) if sharpened else \
            ([f"plain{k}" for k in range(3)], [95, 60, 10])            # plain: two sure words
        return OcrWords(words, np.zeros((3, 4)), image.shape[:2], np.array(confidences, np.float32))

    monkeypatch.setattr(TesseractOCR, "_run", read)
    image = np.full((40, 60, 3), 255, np.uint8)
    got = TesseractOCR(cache=tmp_path, word_boxes="ink").recognise(image)
    assert got.words == [f"{kept}{k}" for k in range(3)]
    assert len(list(tmp_path.rglob("*.json"))) == 2
    monkeypatch.setattr(TesseractOCR, "_run", lambda *a, **k: pytest.fail("tesseract ran on a cache hit"))
    assert TesseractOCR(cache=tmp_path, word_boxes="ink", sharpen=True).recognise(image).words[0] == "sharpened0"


def _lone_words_page() -> OcrWords:
    """A text line, a page number the page's reading took for letters ("wo"), one it read right, and a
    short word inside the line."""
    boxes = [[20, 20, 60, 32], [64, 20, 90, 32], [94, 20, 140, 32],      # "See", "it", "here"
             [200, 180, 212, 192], [20, 180, 32, 192]]                     # "wo" and "12", each alone
    return OcrWords(["See", "it", "here", "wo", "12"], np.array(boxes, np.float32), (200, 240),
                    np.array([95.0, 93.0, 96.0, 38.0, 91.0], np.float32))


def test_lone_short_words_are_the_short_words_alone_on_their_line_piece_not_yet_numbers():
    from dociq.data.ocr import lone_short_words

    assert lone_short_words(_lone_words_page()) == [3]       # not "it" (in a line), not "12" (a number)


@needs_tesseract
@pytest.mark.parametrize("again, expected", [
    ((["2"], 90.0), ("2", 90.0)),       # read alone as a number, surer: the number
    ((["2"], 20.0), ("wo", 38.0)),      # a number, but less sure than the page's reading: kept
    ((["we"], 90.0), ("wo", 38.0)),     # letters again: kept
    (([], 0.0), ("wo", 38.0)),          # nothing read: kept
])
def test_a_lone_word_read_alone_as_a_surer_number_becomes_that_number(monkeypatch, again, expected):
    ocr = TesseractOCR(min_long_side=None)
    crops = []

    def alone(crop):
        crops.append(crop.shape)
        words, conf = again
        return OcrWords(words, np.zeros((len(words), 4)), crop.shape, np.full(len(words), conf, np.float32))
    monkeypatch.setattr(ocr, "_alone", alone)
    page = _lone_words_page()
    read = ocr._numbers_read_alone(np.full((200, 240, 3), 255, np.uint8), page)
    assert crops == [(32, 36)]              # the word's box and a line's height round it, cut at the page's foot
    assert (read.words[3], float(read.confidences[3])) == expected
    assert read.words[:3] + read.words[4:] == ["See", "it", "here", "12"]
    np.testing.assert_array_equal(read.boxes, page.boxes)


@needs_tesseract
def test_tesseract_reads_a_lone_figure_alone_and_caches_the_reading(tmp_path):
    from PIL import Image, ImageDraw, ImageFont

    from dociq.data.synthetic.fonts import font_path

    crop = Image.new("L", (40, 48), 255)
    ImageDraw.Draw(crop).text((12, 8), "2", fill=0, font=ImageFont.truetype(str(font_path("serif", "regular")), 26))
    ocr = TesseractOCR(min_long_side=None, cache=tmp_path)
    read = ocr._alone(np.asarray(crop))
    assert read.words == ["2"] and read.confidences[0] > 50
    assert len(list(tmp_path.rglob("*.json"))) == 1
    assert ocr._alone(np.asarray(crop)).words == ["2"]       # from the cache
