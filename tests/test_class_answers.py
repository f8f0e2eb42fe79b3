"""Layout questions that name a text class are answered by the word-class head's text units
(dociq.inference.class_answers), through the Predictor's default snap="blocks"."""
import numpy as np
import pytest

from dociq.data.schema import REGION_CLASSES
from dociq.inference.class_answers import SHARE_OF_BEST, chosen_units, class_answer, named_class, text_units
from dociq.inference.predictor import Predictor

H, W = 120, 160
WORDS = ["Report", "Body", "text", "here.", "Other", "words", "7"]
WORD_BOXES = np.array([[10, 5, 70, 20],                                    # a title
                       [10, 40, 40, 50], [45, 40, 70, 50], [75, 40, 100, 50],   # a paragraph's line
                       [10, 70, 40, 80], [45, 70, 80, 80],                  # another paragraph, far below
                       [75, 105, 82, 113]], float)                           # a page number


def probs_for(classes: list[str]) -> np.ndarray:
    """Word-class probabilities: 0.7 on each word's class, the rest spread evenly."""
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
    ("all code listings", None),                         # a listing is its frame: the decoder's too
    ("where is the signature?", None),
    ("which paragraph mentions “Body”?", None),          # a reading question
    ("the number of the page", None),                    # a phrasing the model was not fine-tuned on
])
def test_the_questions_that_name_a_text_class(question, expected):
    assert named_class(question) == expected


def test_one_region_is_the_likeliest_unit_and_several_those_near_it():
    units = [[0], [1, 2], [3], [4]]
    k = REGION_CLASSES.index("section_heading")
    probs = np.zeros((5, len(REGION_CLASSES)))
    probs[:, REGION_CLASSES.index("paragraph")] = 1.0
    probs[[0, 1, 2, 3, 4], k] = [0.9, 0.5, 0.1, SHARE_OF_BEST * 0.9 - 0.01, SHARE_OF_BEST * 0.9 + 0.01]
    assert chosen_units(units, probs, "section_heading", one=True) == [0]
    # unit [1, 2] scores the mean 0.3 >= 0.27; unit [3] just under the share, unit [4] just over
    assert chosen_units(units, probs, "section_heading", one=False) == [0, 1, 3]


def test_words_the_model_did_not_read_do_not_count():
    probs = probs_for(["paragraph", "page_number", "paragraph"])
    probs[1] = 0.0                                   # the token budget left the page number's word out
    assert chosen_units([[0], [1], [2]], probs, "page_number", one=True) in ([0], [2])
    assert chosen_units([[1]], probs, "page_number", one=True) == []
    assert class_answer((H, W), WORD_BOXES[:1], [[0]], np.zeros((1, len(REGION_CLASSES))), "title", True) is None


def test_the_answer_is_the_box_around_each_chosen_units_words():
    units = text_units([[0], [1, 2, 3], [4, 5], [6]], WORD_BOXES, WORDS)
    probs = probs_for(["title", "paragraph", "paragraph", "paragraph", "paragraph", "paragraph", "page_number"])
    mask = class_answer((H, W), WORD_BOXES, units, probs, "paragraph", one=False)
    expected = np.zeros((H, W), bool)
    expected[40:50, 10:100] = True
    expected[70:80, 10:80] = True
    np.testing.assert_array_equal(mask, expected)
    number = class_answer((H, W), WORD_BOXES, units, probs, "page_number", one=True)
    assert number.sum() == 7 * 8 and number[105:113, 75:82].all()


@pytest.fixture(scope="module")
def page():
    image = np.full((H, W, 3), 245, np.uint8)
    for x0, y0, x1, y1 in WORD_BOXES.astype(int):
        image[y0:y1, x0:x1] = 30
    return image


@pytest.fixture
def predictor(finetune_checkpoint, page, monkeypatch):
    """The test checkpoint's Predictor on the page, with a word-class head that calls the last word
    the page number and the first the title (the small test model has none of its own)."""
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    calls = []
    classes = ["title"] + ["paragraph"] * 5 + ["page_number"]
    monkeypatch.setattr(predictor, "word_class_probabilities", lambda: calls.append(1) or probs_for(classes))
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    return predictor, calls


def test_the_predictor_answers_a_class_question_with_the_heads_units(predictor):
    predictor, calls = predictor
    masks, scores = predictor.predict(question=["where is the page number?", "segment the title", "all paragraphs"])
    assert masks.shape == (3, H, W) and scores.shape == (3,)
    np.testing.assert_array_equal(np.argwhere(masks[0]).min(0), [105, 75])
    np.testing.assert_array_equal(np.argwhere(masks[0]).max(0) + 1, [113, 82])
    assert masks[0].sum() == 7 * 8
    assert masks[1].sum() == 15 * 60 and masks[1][5:20, 10:70].all()
    assert masks[2][40:50, 10:100].all() and masks[2][70:80, 10:80].all() and not masks[2][:30].any()
    predictor.predict(question="the page number")
    assert len(calls) == 1                                   # the head is read once per page


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
