"""Questions that name figures are answered from the page's pictures (dociq.inference.figure_answers)."""
import numpy as np
import pytest

from dociq.inference.figure_answers import MIN_FIGURE_SHARE, figure_answer, picture_question, signature_boxes
from dociq.inference.predictor import Predictor

H, W = 200, 160


@pytest.mark.parametrize("question, expected", [
    ("segment the figure", ("figure", True)), ("Where is the chart?", ("figure", True)), ("all figures", ("figure", False)),
    ("segment every figure ", ("figure", False)), ("find the signature", ("signature", True)),
    ("all signatures", ("signature", False)), ("all paragraphs", None), ("which paragraph mentions “figure”?", None),
])
def test_the_questions_that_name_figures_or_signatures(question, expected):
    assert picture_question(question) == expected


PICTURES = np.array([[10, 10, 90, 70],       # 4,800 px: the largest
                     [20, 120, 70, 160],     # 2,000 px
                     [100, 150, 104, 154]])  # 16 px: a glyph-sized mark, under MIN_FIGURE_SHARE of the page


def test_several_figures_are_every_picture_large_enough():
    assert 16 < MIN_FIGURE_SHARE * H * W < 2_000
    mask = figure_answer((H, W), PICTURES, one=False)
    expected = np.zeros((H, W), bool)
    expected[10:70, 10:90] = expected[120:160, 20:70] = True
    np.testing.assert_array_equal(mask, expected)


def test_one_figure_is_the_largest_picture():
    largest = figure_answer((H, W), PICTURES, one=True)
    assert largest.sum() == 80 * 60 and largest[10:70, 10:90].all()


def test_a_page_without_a_large_picture_has_no_figure_answer():
    assert figure_answer((H, W), PICTURES[2:], one=False) is None
    assert figure_answer((H, W), np.zeros((0, 4)), one=True) is None


WORDS = ["Results", "The", "plot", "below", "shows", "it."]
WORD_BOXES = np.array([[10, 5, 60, 17], [10, 25, 28, 33], [31, 25, 50, 33], [53, 25, 80, 33],
                       [83, 25, 110, 33], [113, 25, 125, 33]], np.float32)


@pytest.fixture
def predictor(finetune_checkpoint):
    """The test checkpoint's Predictor on a page of two text lines, the first in a frame, above a
    drawn plot (axes, a curve)."""
    image = np.full((H, W, 3), 250, np.uint8)
    for x0, y0, x1, y1 in WORD_BOXES.astype(int):
        image[y0 + 2:y1 - 2, x0:x1] = 20
    image[2, 6:64] = image[20, 6:64] = image[2:21, 6] = image[2:21, 63] = 0     # a frame around text: no figure
    image[60:150, 30] = image[149, 30:140] = 0                            # the axes
    cols = np.arange(31, 140)
    image[(145 - 0.7 * (cols - 31)).astype(int), cols] = 0               # the curve
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    predictor.set_image(image, words=WORDS, word_boxes=WORD_BOXES)
    return predictor


def test_the_predictor_answers_figures_with_the_pages_picture(predictor):
    masks, scores = predictor.predict(question=["all figures", "segment the figure", "which paragraph mentions “plot”?"])
    assert masks.shape == (3, H, W) and scores.shape == (3,)
    for mask in masks[:2]:
        np.testing.assert_array_equal(np.argwhere(mask).min(0), [60, 30])
        np.testing.assert_array_equal(np.argwhere(mask).max(0) + 1, [150, 140])
        assert mask.sum() == 90 * 110
    predictor.class_answers = False                  # the switch keeps the decoder's mask
    decoder, _ = predictor.predict(question="all figures")
    assert not np.array_equal(decoder[0], masks[0])


def _form_with_a_signature():
    """A form's foot (400 x 300 px, 10-px words): a value in its frame, an empty frame, and a
    handwritten stroke over its line and the signer's printed name."""
    from dociq.data.text_blocks import page_ink

    words = ["Name:", "Ada", "Lovelace", "Date:", "Ada", "Lovelace"]
    boxes = np.array([[20, 30, 60, 40], [110, 30, 130, 40], [134, 30, 180, 40], [20, 90, 56, 100],
                      [30, 212, 50, 222], [54, 212, 100, 222]], np.float64)
    image = np.full((300, 400, 3), 255, np.uint8)
    for x0, y0, x1, y1 in boxes.astype(int):
        image[y0 + 1:y1 - 1, x0:x1] = 30
    image[22, 100:300] = image[48, 100:300] = image[22:49, 100] = image[22:49, 299] = 0      # the value's frame
    image[82, 100:300] = image[108, 100:300] = image[82:109, 100] = image[108:109, 299] = 0  # an empty frame
    image[82:109, 299] = 0
    xs = np.arange(32, 150)
    image[(185 + 12 * np.sin(xs / 6)).astype(int), xs] = 0                                 # the stroke
    image[205, 28:152] = 0                                                                   # its line
    return image, words, boxes, page_ink(image)


def test_a_signature_is_the_stroke_over_a_name_and_the_name():
    from dociq.models.word_snap import drawing_boxes, picture_boxes
    from dociq.inference.figure_answers import FIGURE_TEXT

    image, words, boxes, ink = _form_with_a_signature()
    pictures = picture_boxes(drawing_boxes(ink, boxes), boxes, FIGURE_TEXT)
    assert len(pictures) == 3                               # the frames are pictures too, without the words
    np.testing.assert_array_equal(signature_boxes(pictures, ink, boxes), [[28, 173, 152, 222]])
    # without the printed name under it a stroke is a drawing, not a signature
    assert not len(signature_boxes(pictures, ink, boxes[:4]))


def test_the_predictor_answers_a_signature_question_with_the_signature(finetune_checkpoint):
    image, words, boxes, _ = _form_with_a_signature()
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    predictor.set_image(image, words=words, word_boxes=boxes)
    masks, _ = predictor.predict(question=["find the signature", "all signatures"])
    for mask in masks:
        np.testing.assert_array_equal(np.argwhere(mask).min(0), [173, 28])
        np.testing.assert_array_equal(np.argwhere(mask).max(0) + 1, [222, 152])


def test_a_stroke_read_as_doubtful_words_is_still_a_signature(finetune_checkpoint):
    """Tesseract reads letters from a signature's stroke at a confidence it doubts: as given words
    they hide the stroke's ink; with the OCR's confidences the Predictor still sees the stroke."""
    from dociq.data.ocr import OcrWords

    image, words, boxes, _ = _form_with_a_signature()
    words, boxes = words + ["Aolbre"], np.concatenate([boxes, [[34, 174, 148, 198]]])
    confidences = np.array([96, 95, 93, 96, 91, 92, 21], np.float32)
    predictor = Predictor.from_checkpoint(finetune_checkpoint[0])
    predictor.set_image(image, words=OcrWords(words, boxes, image.shape[:2], confidences))
    masks, _ = predictor.predict(question=["find the signature"])
    np.testing.assert_array_equal(np.argwhere(masks[0]).min(0), [173, 28])
    np.testing.assert_array_equal(np.argwhere(masks[0]).max(0) + 1, [222, 152])
    assert len(predictor.page.words) == 7                  # the doubted word stays a word of the page
    predictor.set_image(image, words=words, word_boxes=boxes)     # the same words without confidences
    assert not np.array_equal(predictor.predict(question=["find the signature"])[0][0], masks[0])

