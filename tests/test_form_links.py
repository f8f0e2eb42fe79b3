"""A field question's value from the page's geometry (dociq.inference.form_links), and the
Predictor answering field questions with it where the decoder's mask lies elsewhere."""
import numpy as np
import pytest

from dociq.inference.form_links import PageWords, field_value, label_runs, link_answer, link_label
from dociq.inference.predictor import Predictor

H, W = 160, 240
# A scanned form as tesseract reads it: "Address:" misread as "Addross:", a value beside each
# label, and "Signature:" whose value is on the line below.
WORDS = ["Name:", "Ada", "Lovelace", "Addross:", "12", "St", "James's", "Square", "Signature:", "A.", "Lovelace"]
BOXES = np.array([[10, 10, 50, 22], [60, 10, 80, 22], [84, 10, 130, 22],
                  [10, 40, 62, 52], [72, 40, 84, 52], [88, 40, 100, 52], [104, 40, 146, 52], [150, 40, 190, 52],
                  [10, 80, 70, 92], [12, 100, 24, 112], [28, 100, 74, 112]], np.float64)


@pytest.fixture
def words():
    return PageWords(WORDS, BOXES)


def _box_mask(x0, y0, x1, y1):
    mask = np.zeros((H, W), bool)
    mask[y0:y1, x0:x1] = True
    return mask


@pytest.mark.parametrize("question, label", [
    ("which value belongs to the field \u2018Date of birth\u2019?", "Date of birth"),
    ("What is the value of the field \u201cName\u201d?", "Name"),
    ("which value belongs to the field 'Phone'?", "Phone"),
    ("which paragraph mentions \u201cfield\u201d?", None),
    ("what is the amount of Anna?", None),
])
def test_the_questions_that_ask_for_a_fields_value(question, label):
    assert link_label(question) == label


def test_the_value_is_right_of_the_label_else_on_the_line_below(words):
    assert field_value(label_runs("Name", words)[0], words) == [1, 2]
    assert field_value(label_runs("Signature", words)[0], words) == [9, 10]


def test_a_label_misread_by_one_letter_is_still_found(words):
    assert label_runs("Address", words) == [[3]]
    assert field_value([3], words) == [4, 5, 6, 7]
    assert label_runs("Note", words) == []          # two letters of four: another word, not a misread


def _page(rows):
    """PageWords from (text, x0, y0, x1) rows, 12 px tall."""
    return PageWords([r[0] for r in rows], np.array([[x0, y0, x1, y0 + 12] for _, x0, y0, x1 in rows], np.float64))


def test_a_label_that_ocr_misread_merged_or_wrapped_is_found():
    page = _page([("PAX:", 10, 10, 40), ("0113", 60, 10, 90),                          # "FAX:", F read as P
                  ("Hoursper", 10, 40, 70), ("week:", 74, 40, 100), ("37.5", 120, 40, 140),   # two words read as one
                  ("Date", 10, 70, 34), ("of", 38, 70, 48), ("1983-03-01", 120, 70, 180),     # a label wrapped in its cell
                  ("birth:", 10, 84, 40),
                  ("Tax", 10, 110, 30), ("1D:", 34, 110, 50), ("160-65", 120, 110, 160)])
    assert label_runs("FAX", page)[0] == [0] and field_value([0], page) == [1]     # "Tax" is one letter off too
    assert label_runs("Hours per week", page) == [[2, 3]] and field_value([2, 3], page) == [4]
    assert label_runs("Date of birth", page) == [[5, 6, 8]] and field_value([5, 6, 8], page) == [7]
    assert label_runs("Tax ID", page) == [[9, 10]] and field_value([9, 10], page) == [11]
    assert label_runs("Employer", page) == []


def test_a_label_that_ends_another_label_is_asked_last():
    # "Date:" is a label of its own; "Start date:" ends with the same word
    page = _page([("Start", 10, 10, 40), ("date:", 44, 10, 74), ("18", 120, 10, 132), ("Nov", 136, 10, 156),
                  ("Date:", 10, 40, 40), ("06", 120, 40, 132), ("Aug", 136, 40, 156)])
    assert label_runs("Date", page) == [[4], [1]]
    assert field_value(label_runs("Date", page)[0], page) == [5, 6]


def test_a_value_boxs_border_read_as_a_word_is_not_the_value():
    # tesseract reads a boxed value's left border as "|" (beside the label) or "[" (the line below)
    words = PageWords(["Account", "number:", "|", "WFJR4045", "Total:", "[", "USD", "34.67"],
                      np.array([[10, 10, 60, 22], [64, 10, 120, 22], [150, 8, 152, 24], [156, 10, 220, 22],
                                [10, 40, 50, 52], [10, 58, 13, 74], [16, 60, 40, 72], [44, 60, 80, 72]], np.float64))
    assert field_value(label_runs("Account number", words)[0], words) == [3]
    assert field_value(label_runs("Total", words)[0], words) == [6, 7]


def test_a_stacked_forms_value_is_under_its_label_not_the_next_columns_label():
    # two columns of labels with their values underneath; OCR lost the right column's colons
    page = _page([("Department", 10, 10, 80), ("Amount", 400, 10, 444), ("due", 448, 10, 470),
                  ("Facilities", 10, 28, 70), ("34.67", 400, 28, 436),
                  ("Phone:", 10, 60, 50), ("0113", 60, 60, 90)])              # a value beside its label stays
    assert field_value(label_runs("Department", page)[0], page) == [3]
    assert field_value(label_runs("Phone", page)[0], page) == [6]


def test_a_label_in_capitals_takes_the_side_not_in_capitals():
    # a table of labels in capitals, rows 7 px apart: the line below is the next row's label
    page = _page([("ZIP", 10, 10, 30), ("CODE", 34, 10, 64), ("63905", 200, 10, 240),
                  ("TAX", 10, 29, 30), ("ID", 34, 29, 46), ("756-34-9287", 200, 29, 280),
                  # stacked: the next column's label in capitals beside, the value under it
                  ("NAME", 10, 80, 40), ("COMPANY", 500, 80, 560), ("Theodore", 10, 96, 70), ("Garcia", 74, 96, 110)])
    assert field_value(label_runs("ZIP CODE", page)[0], page) == [2]
    assert field_value(label_runs("NAME", page)[0], page) == [8, 9]


def test_a_value_wrapped_in_its_cell_is_read_to_its_last_line():
    page = _page([("Address:", 10, 10, 60), ("12", 120, 10, 132), ("Carlton", 136, 10, 180),
                  ("Leeds,", 120, 25, 160), ("LS1", 164, 25, 184),             # the address's second line
                  ("City:", 10, 46, 40), ("Leeds", 120, 46, 160),              # the next row, beside its label
                  ("Company:", 10, 80, 60), ("Mann,", 10, 95, 40), ("Williamson", 44, 95, 100),
                  ("and", 10, 110, 30), ("Ramsey", 34, 110, 80),               # a value under its label, wrapped
                  ("Job", 10, 135, 30), ("title", 34, 135, 60)])               # the next field, 13 px lower
    assert field_value(label_runs("Address", page)[0], page) == [1, 2, 3, 4]
    assert field_value(label_runs("City", page)[0], page) == [6]
    assert field_value(label_runs("Company", page)[0], page) == [8, 9, 10, 11]


def test_a_label_is_found_where_it_ends_its_phrase_with_the_questions_capitals():
    page = _page([("Date", 10, 10, 34), ("of", 38, 10, 48), ("birth", 52, 10, 80), ("1983-03-01", 200, 10, 260),
                  ("Date", 10, 40, 34), ("06/11/1984", 200, 40, 260)])
    assert label_runs("Date", page)[0] == [4]
    memo = _page([("DATE:", 10, 10, 44), ("06", 60, 10, 72), ("Aug", 76, 10, 96),
                  ("Date:", 10, 40, 40), ("July", 60, 40, 84), ("25,", 88, 40, 104)])
    assert label_runs("Date", memo)[0] == [3] and label_runs("DATE", memo)[0] == [0]


def test_a_skewed_scan_keeps_a_label_and_its_value_on_one_line():
    # a ruled two-column form turned 2 degrees: each value sits 8 px lower than its label 240 px to its left
    from dociq.data.text_blocks import skew_slope

    slope = np.tan(np.radians(2.0))
    labels = ["Email:", "Relationship:", "Amount:", "City:", "State:", "Phone:"]
    values = ["a@b.org", "Parent", "30.14", "Leeds", "Yorkshire", "0113"]
    words, boxes = [], []
    for k, (label, value) in enumerate(zip(labels, values)):
        for x0, x1, text in ((20, 120, label), (260, 330, value)):
            y0 = 100 + 24 * k + slope * (x0 + x1) / 2
            words.append(text)
            boxes.append([x0, y0, x1, y0 + 10])
    page = PageWords(words, np.array(boxes))
    assert abs(skew_slope(page.boxes) - slope) < 0.004
    assert [field_value(label_runs(label.rstrip(":"), page)[0], page) for label in labels] == [[1], [3], [5], [7], [9], [11]]
    assert skew_slope(BOXES) == 0.0                  # a level page stays level


def test_a_value_on_a_skewed_scan_is_drawn_along_its_line():
    """The value's region on a page turned 2 degrees is a slanted band: the answer follows it, where
    the box around the value's words would add the band's rise above and below."""
    slope = np.tan(np.radians(2.0))
    words, boxes = [], []
    for k, label in enumerate(["Name:", "Email:", "Address:", "City:", "Phone:"]):
        line = 40 + 30 * k
        for x0, x1, text in ((20, 90, label), (200, 260, "12"), (266, 330, "Carlton"), (336, 420, "House"),
                             (426, 500, "Terrace")):
            centre = line + slope * (x0 + x1) / 2            # OCR boxes a word level, at its centre's height
            words.append(text)
            boxes.append([x0, centre - 6, x1, centre + 6])
    page = PageWords(words, np.array(boxes))
    shape = (240, 560)
    rows, cols = np.mgrid[:shape[0], :shape[1]]
    band = (cols >= 200) & (cols < 500) & (np.abs(rows + 0.5 - 100 - slope * (cols + 0.5)) <= 6)   # "Address:"'s value
    answer = link_answer(np.zeros(shape, bool), "Address", page)
    iou = (answer & band).sum() / (answer | band).sum()
    box = np.zeros(shape, bool)
    box[int(np.floor(page.box(range(11, 15))[0, 1])):int(np.ceil(page.box(range(11, 15))[0, 3])), 200:500] = True
    assert iou > 0.9 > (box & band).sum() / (box | band).sum()
    level = PageWords(WORDS, BOXES)                                  # a level page: the words' box
    np.testing.assert_array_equal(level.mask([1, 2], (H, W)), _box_mask(60, 10, 130, 22))


def test_the_decoder_chooses_the_value_and_the_words_set_its_extent(words):
    """A mask on a value beside or below the label is answered with that value's box, a few
    pixels wider or narrower as the decoder paints it or not."""
    beside = _box_mask(58, 8, 100, 24)               # most of "Ada Lovelace"
    np.testing.assert_array_equal(link_answer(beside, "Name", words), _box_mask(60, 10, 130, 22))
    below = _box_mask(10, 98, 78, 115)               # the signature's value, on the line below its label
    np.testing.assert_array_equal(link_answer(below, "Signature", words), _box_mask(12, 100, 74, 112))


@pytest.mark.parametrize("mask", [
    _box_mask(8, 38, 192, 54),                       # another field's line
    _box_mask(8, 8, 52, 24),                         # the label itself
    _box_mask(8, 8, 192, 114),                       # the whole form: mostly not the value
    np.zeros((H, W), bool),                          # nothing
])
def test_a_decoder_mask_elsewhere_becomes_the_rules_value(words, mask):
    np.testing.assert_array_equal(link_answer(mask, "Name", words), _box_mask(60, 10, 130, 22))


def test_a_label_not_on_the_page_keeps_the_decoders_mask(words):
    mask = _box_mask(8, 38, 192, 54)
    np.testing.assert_array_equal(link_answer(mask, "Email", words), mask)


def test_the_predictor_answers_a_field_question_on_the_value(finetune_checkpoint):
    """The test checkpoint has never seen this form: whatever its decoder paints, the default
    Predictor's answer is the value beside the label, and the switch to the decoder's masks
    (snap=None) leaves the rule out."""
    image = np.full((H, W, 3), 250, np.uint8)
    for x0, y0, x1, y1 in BOXES.astype(int):
        image[y0 + 2:y1 - 2, x0:x1] = 20
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    predictor.set_image(image, words=WORDS, word_boxes=BOXES)
    masks, _ = predictor.predict(question=["which value belongs to the field \u2018Addross\u2019?",
                                           "which value belongs to the field \u2018Signature\u2019?"])
    held = [np.flatnonzero([mask[int(y0):int(y1), int(x0):int(x1)].mean() >= 0.5 for x0, y0, x1, y1 in BOXES])
            for mask in masks]
    assert held[0].tolist() == [4, 5, 6, 7] and held[1].tolist() == [9, 10]
    predictor.snap = None
    raw, _ = predictor.predict(question="which value belongs to the field \u2018Addross\u2019?")
    assert not np.array_equal(raw[0], masks[0])
