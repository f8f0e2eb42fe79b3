"""FUNSD reading on a tiny FUNSD-format folder the tests write: entities become regions, links
are deduplicated, question entities ask for their linked answers."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from PIL import Image

from dociq.data.errors import BadSampleError
from dociq.data.datasets.funsd import FunsdDocuments, link_question_text


def _entity(eid, label, text, box, words, linking=()):
    return {"id": eid, "label": label, "text": text, "box": box,
            "words": [{"text": t, "box": b} for t, b in words], "linking": [list(l) for l in linking]}


FORM = [
    _entity(0, "header", "REPORT", [10, 5, 60, 15], [("REPORT", [10, 5, 60, 15])], [(0, 1)]),
    _entity(1, "question", "Date:", [10, 30, 40, 40], [("Date:", [10, 30, 40, 40])], [(0, 1), (1, 2)]),
    _entity(2, "answer", "12/03/98", [50, 30, 95, 40], [("12/03/98", [50, 30, 95, 40])], [(1, 2)]),
    _entity(3, "question", "Name:", [10, 50, 40, 60], [("Name:", [10, 50, 40, 60])], [(4, 3), (3, 5)]),
    _entity(4, "answer", "John Smith", [50, 50, 110, 60],
            [("John", [50, 50, 75, 60]), ("Smith", [80, 50, 110, 60])], [(4, 3)]),
    _entity(5, "answer", "Jr.", [115, 50, 130, 60], [("Jr.", [115, 50, 130, 60]), ("", [0, 0, 0, 0])], [(3, 5)]),
    _entity(6, "question", "Signature:", [10, 70, 60, 80], [("Signature:", [10, 70, 60, 80])]),  # unanswered
    _entity(7, "other", "", [100, 80, 140, 90], []),
]


def write_funsd(root, forms: dict, split="training_data", size=(100, 150), mode="L"):
    (root / split / "annotations").mkdir(parents=True, exist_ok=True)
    (root / split / "images").mkdir(parents=True, exist_ok=True)
    for name, form in forms.items():
        (root / split / "annotations" / f"{name}.json").write_text(json.dumps({"form": form}))
        Image.new(mode, (size[1], size[0]), 255).save(root / split / "images" / f"{name}.png")
    return root


def test_entities_words_links_and_questions(tmp_path):
    root = write_funsd(tmp_path, {"0001": FORM, "0002": FORM[:3]})
    write_funsd(tmp_path, {"9999": FORM[:2]}, split="testing_data")
    ds = FunsdDocuments(root)
    assert len(ds) == 2 and len(FunsdDocuments(root, split="testing_data")) == 1
    page = ds[0]
    assert page.image.shape == (100, 150, 3)  # grayscale scan -> RGB
    assert [r.label for r in page.regions] == ["header", "question", "answer", "question", "answer",
                                               "answer", "question", "other"]
    assert page.words == ["REPORT", "Date:", "12/03/98", "Name:", "John", "Smith", "Jr.", "Signature:"]
    np.testing.assert_allclose(page.word_boxes[4], [50, 50, 75, 60])
    assert page.regions[4].word_ids == [4, 5] and page.regions[4].text == "John Smith"
    assert page.regions[7].word_ids == []
    # masks match boxes exactly
    for r in page.regions:
        x0, y0, x1, y1 = r.box.astype(int)
        assert r.mask.sum() == (x1 - x0) * (y1 - y0) and r.mask[y0:y1, x0:x1].all()
    # links as FUNSD lists them (from, to), each once although both ends list it
    assert page.links == [(0, 1), (1, 2), (4, 3), (3, 5)]
    assert [q.text for q in page.questions] == [link_question_text("Date:"), link_question_text("Name:")]
    assert page.questions[0].text == "what is the answer to 'Date:'?"
    assert all(q.kind == "link" for q in page.questions)
    assert page.questions[0].region_ids == [2]
    np.testing.assert_array_equal(page.questions[0].mask, page.regions[2].mask)
    # a reversed link (answer -> question) still counts; two answers make a union
    assert page.questions[1].region_ids == [4, 5]
    np.testing.assert_array_equal(page.questions[1].mask, page.regions[4].mask | page.regions[5].mask)
    assert page.meta["page_id"] == "0001" and page.meta["dataset"] == "funsd"


def test_unknown_split_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="split='train'"):
        FunsdDocuments(tmp_path, split="train")
    with pytest.raises(BadSampleError, match="no FUNSD annotation files.*Fix: pass root="):
        FunsdDocuments(tmp_path)


def test_bad_funsd_pages_raise_or_skip(tmp_path, caplog):
    outside = [dict(FORM[2], box=[50, 30, 190, 40])]
    dangling = [dict(FORM[1], linking=[[1, 42]])]
    no_words = [FORM[7]]
    root = write_funsd(tmp_path, {"a_ok": FORM, "b_outside": outside, "c_dangling": dangling,
                                  "d_nowords": no_words, "e_noimage": FORM})
    (root / "training_data" / "images" / "e_noimage.png").unlink()
    (root / "training_data" / "annotations" / "f_broken.json").write_text("{not json")
    ds = FunsdDocuments(root)
    expect = {
        1: ("b_outside.json", r"entity id 2 .*\[50.0, 30.0, 190.0, 40.0\] outside the 150x100 page"),
        2: ("c_dangling.json", "links to entity id 42, which does not exist"),
        3: ("d_nowords.png", "page has no words"),
        4: ("e_noimage.png", "image file not found"),
        5: ("f_broken.json", "not a readable FUNSD JSON"),
    }
    assert ds[0] is not None
    for index, (file, reason) in expect.items():
        with pytest.raises(BadSampleError, match=reason) as info:
            ds[index]
        assert file in str(info.value) and "Fix:" in str(info.value)
    skipping = FunsdDocuments(root, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        pages = [skipping[i] for i in range(len(skipping))]
    assert [p is None for p in pages] == [False, True, True, True, True, True]
    assert [b.index for b in skipping.bad_samples] == [1, 2, 3, 4, 5]
    assert all(file in b.path for b, (file, _) in zip(skipping.bad_samples, expect.values()))
    assert sum("skipping bad sample" in r.getMessage() for r in caplog.records) == 5


def test_funsd_with_an_ocr_backend_assigns_words_to_entities(tmp_path):
    from dociq.data.ocr import OcrWords

    class Fixed:
        name = "fixed"

        def settings(self):
            return {}

        def recognise(self, image):
            return OcrWords(["12/03/98", "Name"], np.array([[52, 31, 90, 39], [12, 51, 38, 59]]), image.shape[:2])

    page = FunsdDocuments(write_funsd(tmp_path, {"x": FORM}), ocr=Fixed())[0]
    assert page.words == ["12/03/98", "Name"]
    assert page.regions[2].word_ids == [0] and page.regions[3].word_ids == [1]
    assert page.regions[0].word_ids == []
