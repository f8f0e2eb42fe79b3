"""scripts/class_answer_ceiling.py: a class question's answer against the page's units chosen by their labels."""
import numpy as np
import pytest

from dociq.data.masks import mask_iou
from dociq.data.schema import Page, Question, Region
from script_module import load_script


def _script():
    return load_script("class_answer_ceiling")


def _box_mask(box, shape=(400, 300)) -> np.ndarray:
    out = np.zeros(shape, bool)
    x0, y0, x1, y1 = box
    out[y0:y1, x0:x1] = True
    return out


def _page() -> Page:
    """A paragraph of four 240-px lines and a page number centred at the foot, both labelled; the
    question asks for the page number."""
    boxes = [[30 + 60 * i, 40 + 16 * line, 84 + 60 * i, 50 + 16 * line] for line in range(4) for i in range(4)]
    boxes.append([145, 370, 155, 380])
    words = ["text"] * 16 + ["7"]
    paragraph = Region("paragraph", np.array([30, 40, 264, 98]), _box_mask((30, 40, 264, 98)), word_ids=list(range(16)))
    number = Region("page_number", np.array([145, 370, 155, 380]), _box_mask((145, 370, 155, 380)), word_ids=[16])
    question = Question("the page number", "layout", number.mask, region_ids=[1])
    return Page(image=np.full((400, 300, 3), 255, np.uint8), words=words, word_boxes=np.array(boxes, np.float32),
                regions=[paragraph, number], questions=[question], meta={"page_id": "p#0"})


@pytest.fixture(scope="module")
def predictor():
    return _script().stand_in_predictor(image_size=128)


def test_the_page_numbers_unit_is_the_right_unit_and_the_answer_is_scored_as_the_predictor_draws_it(predictor):
    script = _script()
    page = _page()
    (record,) = script.page_records(predictor, page)
    assert record["class"] == "page_number"
    assert record["right units"] == pytest.approx(1.0) and record["units inside"] == pytest.approx(1.0)
    predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
    answer = predictor.predict(question=["the page number"])[0][0]
    assert record["answer"] == pytest.approx(float(mask_iou(answer, page.questions[0].mask)))


def test_a_page_without_class_questions_gives_no_records(predictor):
    page = _page()
    page.questions = [Question("which paragraph mentions text?", "reading", page.regions[0].mask, [0])]
    assert _script().page_records(predictor, page) == []


def test_right_units_take_the_closest_unit_for_one_region_and_every_unit_for_several():
    script = _script()
    painted = [_box_mask(b, (20, 40)) for b in ((0, 0, 10, 5), (0, 10, 4, 12), (20, 0, 30, 5))]
    labels = np.array([script.CLASS_NAMES.index(c) for c in ("section_heading", "section_heading", "paragraph")])
    target = painted[1]
    assert np.array_equal(script.right_units(painted, labels, "section_heading", True, target), painted[1])
    assert np.array_equal(script.right_units(painted, labels, "section_heading", False, target), painted[0] | painted[1])
    assert not script.right_units(painted, labels, "code", False, target).any()


def test_the_table_gives_each_class_its_means_and_all_last():
    rows = {"scanned": [{"class": "code", "answer": 0.5, "right units": 1.0, "units inside": 1.0},
                        {"class": "code", "answer": 0.0, "right units": 0.5, "units inside": 1.0},
                        {"class": "title", "answer": 1.0, "right units": 1.0, "units inside": 1.0}]}
    lines = _script().table(rows).splitlines()
    assert lines[2] == "| scanned | code (2) | 25.0 | 75.0 | 100.0 |"
    assert lines[-1] == "| scanned | all (3) | 50.0 | 83.3 | 100.0 |"
