"""Layout questions that name a text class are answered by the text units the unit classifier names
(dociq.inference.class_answers), through the Predictor's default snap="blocks"."""
import numpy as np
import pytest

from dociq.data.schema import REGION_CLASSES
from dociq.inference.class_answers import SHARE_OF_BEST, best_units, class_answer, named_class, text_units
from dociq.inference.predictor import Predictor

H, W = 120, 160
WORDS = ["Report", "Body", "text", "here.", "Other", "words", "7"]
WORD_BOXES = np.array([[10, 5, 70, 20],                                    # a title
                       [10, 40, 40, 50], [45, 40, 70, 50], [75, 40, 100, 50],   # a paragraph's line
                       [10, 70, 40, 80], [45, 70, 80, 80],                  # another paragraph, far below
                       [75, 105, 82, 113]], float)                           # a page number


def probs_for(classes: list[str]) -> np.ndarray:
    """Class probabilities: 0.7 on each unit's class, the rest spread evenly."""
    out = np.full((len(classes), len(REGION_CLASSES)), 0.3 / (len(REGION_CLASSES) - 1))
    for i, label in enumerate(classes):
        out[i, REGION_CLASSES.index(label)] = 0.7
    return out


@pytest.mark.parametrize("question, expected", [
    ("the page number", ("page_number", True)),
    ("Where is the page number?", ("page_number", True)),
    ("  ALL section headings ", ("section_heading", False)),
    ("the page numbers", ("page_number", False)),
    ("the page header", ("page_header", True)),          # in both of its lists: "the" asks for one
    ("segment the table", None),                         # drawn, not set by words: the decoder's mask
    ("all code listings", ("code", False)),              # a listing's lines are a unit
    ("where is the signature?", None),
    ("which paragraph mentions “Body”?", None),          # a reading question
    ("the number of the page", None),                    # a phrasing the model was not fine-tuned on
])
def test_the_questions_that_name_a_text_class(question, expected):
    assert named_class(question) == expected


def test_one_region_is_the_likeliest_unit_and_several_those_near_it():
    score = np.array([0.9, 0.3, SHARE_OF_BEST * 0.9 - 0.01, SHARE_OF_BEST * 0.9 + 0.01, 0.05])
    assert best_units(score, one=True) == [0]
    assert best_units(score, one=False) == [0, 1, 3]         # unit 2 just under the share, unit 3 just over
    assert best_units(np.zeros(0), one=True) == []


def test_a_page_without_units_has_no_class_answer():
    assert class_answer((H, W), np.zeros((0, 4)), [], np.zeros((0, len(REGION_CLASSES))), "title", True) is None


def test_the_answer_is_the_box_around_each_chosen_units_words():
    units = text_units([[0], [1, 2, 3], [4, 5], [6]], WORD_BOXES, WORDS)
    assert units == [[0], [1, 2, 3], [4, 5], [6]]
    probs = probs_for(["title", "paragraph", "paragraph", "page_number"])
    mask = class_answer((H, W), WORD_BOXES, units, probs, "paragraph", one=False)
    expected = np.zeros((H, W), bool)
    expected[40:50, 10:100] = True
    expected[70:80, 10:80] = True
    np.testing.assert_array_equal(mask, expected)
    number = class_answer((H, W), WORD_BOXES, units, probs, "page_number", one=True)
    assert number.sum() == 7 * 8 and number[105:113, 75:82].all()


class UnitsByFirstWord:
    """A unit classifier that calls a unit opening with "Report" the title, one that is "7" the
    page number and the rest paragraphs; it counts its calls."""

    classes = REGION_CLASSES

    def __init__(self):
        self.calls = 0

    def unit_probabilities(self, image, word_boxes, words, units, ocr=False):
        self.calls += 1
        self.ocr = ocr
        names = {"Report": "title", "7": "page_number"}
        return probs_for([names.get(words[unit[0]], "paragraph") for unit in units])


@pytest.fixture(scope="module")
def page():
    image = np.full((H, W, 3), 245, np.uint8)
    for x0, y0, x1, y1 in WORD_BOXES.astype(int):
        image[y0:y1, x0:x1] = 30
    return image


@pytest.fixture
def predictor(finetune_checkpoint, page):
    """The test checkpoint's Predictor on the page, with a unit classifier that names the title and
    the page number by their words."""
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    predictor.unit_classifier = UnitsByFirstWord()
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    return predictor, predictor.unit_classifier


def test_the_predictor_answers_a_class_question_with_the_named_units(predictor):
    predictor, classifier = predictor
    masks, scores = predictor.predict(question=["where is the page number?", "segment the title", "all paragraphs"])
    assert masks.shape == (3, H, W) and scores.shape == (3,)
    np.testing.assert_array_equal(np.argwhere(masks[0]).min(0), [105, 75])
    np.testing.assert_array_equal(np.argwhere(masks[0]).max(0) + 1, [113, 82])
    assert masks[0].sum() == 7 * 8
    assert masks[1].sum() == 15 * 60 and masks[1][5:20, 10:70].all()
    assert masks[2][40:50, 10:100].all() and masks[2][70:80, 10:80].all() and not masks[2][:30].any()
    predictor.predict(question="the page number")
    assert classifier.calls == 1                             # the units are named once per page


def test_other_prompts_and_the_switch_keep_the_decoders_mask(predictor):
    predictor, _ = predictor
    named, _ = predictor.predict(question="the page number")
    predictor.class_answers = False
    decoder, _ = predictor.predict(question="the page number")
    assert not np.array_equal(named, decoder)
    predictor.class_answers = True
    with_box, _ = predictor.predict(question="the page number", boxes=[5, 30, 110, 90])
    assert not with_box[0, 100:].any()                       # a box says where: the number is outside it
    with predictor.snapping(None):
        raw, _ = predictor.predict(question="the page number")
    with predictor.snapping(None):
        predictor.class_answers = False
        raw_off, _ = predictor.predict(question="the page number")
    np.testing.assert_array_equal(raw, raw_off)              # snap=None: the decoder's masks as they are
    reading, _ = predictor.predict(question="which paragraph mentions “Other”?")
    predictor.class_answers = True
    np.testing.assert_array_equal(reading, predictor.predict(question="which paragraph mentions “Other”?")[0])


def test_a_class_the_classifier_never_saw_keeps_the_decoders_mask(predictor):
    predictor, classifier = predictor
    named, _ = predictor.predict(question="the page number")
    classifier.classes = tuple(c for c in REGION_CLASSES if c != "page_number")   # e.g. form labels
    unseen, _ = predictor.predict(question="the page number")
    predictor.class_answers = False
    decoder, _ = predictor.predict(question="the page number")
    np.testing.assert_array_equal(unseen, decoder)
    assert not np.array_equal(named, decoder)


def test_a_unit_of_words_the_ocr_doubts_answers_no_class_question(predictor, page):
    """Ink tesseract reads as letters it doubts (a signature's stroke read as "WINSTON") is no
    title, whatever the unit classifier makes of it; the words stay the page's."""
    from dociq.data.ocr import OcrWords

    predictor, _ = predictor
    confidences = np.full(len(WORDS), 95.0)
    predictor.set_image(page, words=OcrWords(WORDS, WORD_BOXES, (H, W), confidences))
    assert predictor.predict(question="segment the title")[0][0][5:20, 10:70].all()
    confidences[WORDS.index("Report")] = 20.0
    predictor.set_image(page, words=OcrWords(WORDS, WORD_BOXES, (H, W), confidences))
    assert not predictor.predict(question="segment the title")[0][0][5:20, 10:70].any()
    assert predictor.page.words == WORDS


def test_the_classifier_is_told_when_the_words_are_an_ocrs(predictor, page):
    """A bullet an OCR read as "e" counts as a bullet only on an OCR's words (`unit_features`' `ocr`):
    the Predictor says which words it has."""
    from dociq.data.ocr import OcrWords

    predictor, classifier = predictor
    predictor.predict(question="the page number")
    assert classifier.ocr is False                           # words given with their boxes: a text layer
    predictor.set_image(page, words=OcrWords(WORDS, WORD_BOXES, (H, W), np.full(len(WORDS), 95.0)))
    predictor.predict(question="the page number")
    assert classifier.ocr is True
