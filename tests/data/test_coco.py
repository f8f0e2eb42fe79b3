"""COCO reading (polygons, RLE compressed and uncompressed, category questions, dociq's extra
fields) and the write_coco -> CocoDocuments round trip."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_util

from dociq.data.datasets.coco import CocoDocuments, category_question_text, write_coco
from dociq.io.rle import encode_rle as encode_mask
from dociq.data.schema import Page, Question, Region


def hand_built_page(seed: int, h: int = 48, w: int = 64) -> Page:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    words = ["Invoice", "No.", "4711", "Total:", "12.50"]
    word_boxes = np.array([[2.25, 3.5, 20.75, 9], [22, 3.5, 30, 9], [32, 3.5, 44.5, 9],
                           [2, 30, 18, 36], [40, 30, 55.5, 36]], np.float32)
    title = np.zeros((h, w), bool)
    title[2:10, 1:46] = True
    key = np.zeros((h, w), bool)
    key[29:37, 1:19] = True
    value = np.zeros((h, w), bool)
    value[29:37, 39:57] = True
    value[37, 45] = True  # not a rectangle: masks must survive exactly, not as boxes
    figure = np.zeros((h, w), bool)
    yy, xx = np.mgrid[:h, :w]
    figure[(yy - 20) ** 2 + (xx - 50) ** 2 < 25] = True
    regions = [
        Region("title", np.array([1, 2, 46, 10], np.float32), title, "Invoice No. 4711", [0, 1, 2]),
        Region("form_key", np.array([1, 29, 19, 37], np.float32), key, "Total:", [3]),
        Region("form_value", np.array([39, 29, 57, 38], np.float32), value, "12.50", [4]),
        Region("figure", np.array([45.5, 15.5, 54.5, 24.5], np.float32), figure, "", []),
    ]
    cell = np.zeros((h, w), bool)
    cell[30:34, 41:50] = True  # a target that is no union of regions
    questions = [
        Question("segment the title", "layout", title.copy(), [0]),
        Question("what is the total?", "reading", value.copy(), [2]),
        Question("which cell holds the amount?", "cell", cell, []),
        Question("segment every form key", "category", key.copy(), [1]),
    ]
    return Page(image, words, word_boxes, regions, questions, links=[(1, 2)],
                meta={"page_id": f"hand-{seed}", "seed": seed, "not_json": object()})


def assert_same_page(a: Page, b: Page):
    np.testing.assert_array_equal(a.image, b.image)
    assert a.words == b.words
    np.testing.assert_allclose(a.word_boxes, b.word_boxes, atol=1e-4)
    assert len(a.regions) == len(b.regions)
    for ra, rb in zip(a.regions, b.regions):
        assert (ra.label, ra.text, list(ra.word_ids)) == (rb.label, rb.text, list(rb.word_ids))
        np.testing.assert_allclose(ra.box, rb.box, atol=1e-4)
        np.testing.assert_array_equal(ra.mask, rb.mask)
        assert rb.mask.dtype == bool
    assert [(q.text, q.kind, list(q.region_ids)) for q in a.questions] == \
        [(q.text, q.kind, list(q.region_ids)) for q in b.questions]
    for qa, qb in zip(a.questions, b.questions):
        np.testing.assert_array_equal(qa.mask, qb.mask)
    assert [tuple(x) for x in a.links] == [tuple(x) for x in b.links]


def test_round_trip_hand_built_pages(tmp_path):
    pages = [hand_built_page(0), hand_built_page(1, h=40, w=72)]
    path = write_coco(pages, tmp_path / "ds")
    assert path == tmp_path / "ds" / "annotations.json"
    assert sorted(p.name for p in (tmp_path / "ds" / "images").iterdir()) == ["1.png", "2.png"]
    data = json.loads(path.read_text())
    assert isinstance(data["annotations"][0]["segmentation"]["counts"], str)  # JSON-safe RLE

    ds = CocoDocuments(path)
    assert len(ds) == 2
    for original, page in zip(pages, (ds[0], ds[1])):
        assert_same_page(original, page)
        assert page.meta["page_id"] == original.meta["page_id"]
        assert page.meta["seed"] == original.meta["seed"]
        assert page.meta["source"].endswith(".png")
    assert [c["name"] for c in data["categories"]] == ["title", "form_key", "form_value", "figure"]


def test_round_trip_synthetic_pages(tmp_path):
    from dociq.data.synthetic.generator import SyntheticDocuments

    # degraded pages too: their rotated masks are no rectangles and their boxes not integers
    pages = [SyntheticDocuments(num_pages=2, image_size=160, seed=3, degrade=d)[i]
             for d in (False, True) for i in range(2)]
    assert sum(len(p.questions) for p in pages) > 0 and sum(len(p.words) for p in pages) > 0
    ds = CocoDocuments(write_coco(pages, tmp_path / "syn"))
    assert len(ds) == 4
    for original, page in zip(pages, ds):
        assert_same_page(original, page)


def test_crash_while_writing_keeps_the_previous_annotations(tmp_path):
    path = write_coco([hand_built_page(0)], tmp_path / "ds")
    before = path.read_bytes()

    def pages_then_crash():
        yield hand_built_page(1)
        raise KeyboardInterrupt("killed mid-export")

    with pytest.raises(KeyboardInterrupt):
        write_coco(pages_then_crash(), tmp_path / "ds")
    assert path.read_bytes() == before
    assert not [p for p in (tmp_path / "ds").rglob("*.tmp")]


def _doclaynet_style(tmp_path, words=True):
    """One 100x80 page in the shape DocLayNet/PubLayNet ship: polygons, plus RLE variants."""
    h, w = 80, 100
    Image.fromarray(np.full((h, w, 3), 255, np.uint8)).save(tmp_path / "p1.png")
    table = np.zeros((h, w), np.uint8)
    table[40:70, 10:90] = 1
    uncompressed = {"size": [h, w], "counts": _uncompressed_counts(table)}
    caption = np.zeros((h, w), np.uint8)
    caption[72:78, 10:50] = 1
    rle = mask_util.encode(np.asfortranarray(caption))
    data = {
        "images": [{"id": 7, "file_name": "p1.png", "width": w, "height": h,
                    "doc_category": "scientific_articles", "page_no": 3}],
        "categories": [{"id": 1, "name": "Section-header"}, {"id": 2, "name": "Table"},
                       {"id": 3, "name": "Caption"}, {"id": 4, "name": "Text"}],
        "annotations": [
            {"id": 11, "image_id": 7, "category_id": 1, "bbox": [10, 5, 40, 10],
             "segmentation": [[10, 5, 50, 5, 50, 15, 10, 15]], "area": 400, "iscrowd": 0},
            {"id": 12, "image_id": 7, "category_id": 2, "bbox": [10, 40, 80, 30],
             "segmentation": uncompressed, "area": 2400, "iscrowd": 0},
            {"id": 13, "image_id": 7, "category_id": 3, "bbox": [10, 72, 40, 6],
             "segmentation": {"size": [h, w], "counts": rle["counts"].decode()}, "area": 240, "iscrowd": 0},
            {"id": 14, "image_id": 7, "category_id": 1, "bbox": [10, 20, 30, 8],
             "segmentation": [[10, 20, 40, 20, 40, 28, 10, 28]], "area": 240, "iscrowd": 0},
        ],
    }
    if words:
        data["images"][0]["words"] = [{"text": "Results", "bbox": [12, 6, 20, 8]},
                                      {"text": "Methods", "bbox": [12, 21, 20, 6]},
                                      {"text": "cell", "bbox": [20, 45, 10, 5]}]
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    return tmp_path / "annotations.json", table.astype(bool), caption.astype(bool)


def _uncompressed_counts(mask: np.ndarray) -> list[int]:
    flat = mask.flatten(order="F")  # COCO RLE runs over columns
    counts, current, run = [], 0, 0
    for v in flat:
        if v != current:
            counts.append(run)
            current, run = v, 0
        run += 1
    counts.append(run)
    return counts


def test_doclaynet_style_polygons_and_rle(tmp_path):
    ann, table, caption = _doclaynet_style(tmp_path)
    ds = CocoDocuments(ann, image_dir=tmp_path)
    page = ds[0]
    assert [r.label for r in page.regions] == ["Section-header", "Table", "Caption", "Section-header"]
    header = page.regions[0]
    np.testing.assert_allclose(header.box, [10, 5, 50, 15])
    assert header.mask[5:15, 10:50].all() and header.mask.sum() <= 11 * 41  # polygon filled, not more
    assert not header.mask[20:].any()
    np.testing.assert_array_equal(page.regions[1].mask, table)      # uncompressed RLE
    np.testing.assert_array_equal(page.regions[2].mask, caption)    # compressed RLE
    # words without stored word_ids are assigned to the region holding their centre
    assert page.regions[0].word_ids == [0] and page.regions[0].text == "Results"
    assert page.regions[1].word_ids == [2]
    assert page.meta["page_id"] == "p1" and page.meta["image_id"] == 7
    assert page.meta["doc_category"] == "scientific_articles" and page.meta["page_no"] == 3


def test_category_questions_union_their_regions(tmp_path):
    ann, table, _ = _doclaynet_style(tmp_path)
    page = CocoDocuments(ann, image_dir=tmp_path)[0]
    by_text = {q.text: q for q in page.questions}
    assert sorted(by_text) == ["segment every caption", "segment every section header", "segment every table"]
    assert all(q.kind == "category" for q in page.questions)
    headers = by_text["segment every section header"]
    assert headers.region_ids == [0, 3]
    np.testing.assert_array_equal(headers.mask, page.regions[0].mask | page.regions[3].mask)
    np.testing.assert_array_equal(by_text["segment every table"].mask, table)
    assert "segment every text" not in by_text  # categories absent from the page ask nothing
    assert category_question_text("List-item") == "segment every list item"


def test_stored_questions_by_annotation_id_and_region_masks(tmp_path):
    ann, table, caption = _doclaynet_style(tmp_path)
    data = json.loads(ann.read_text())
    data["images"][0]["questions"] = [
        {"text": "where is the table and its caption?", "kind": "layout", "annotation_ids": [12, 13]},
        {"text": "first header", "kind": "reading", "region_ids": [0],
         "segmentation": encode_mask(np.pad(np.ones((2, 2), bool), ((0, 78), (0, 98))))},
    ]
    data["images"][0]["links"] = [[2, 1]]
    ann.write_text(json.dumps(data))
    page = CocoDocuments(ann, image_dir=tmp_path)[0]
    assert [q.text for q in page.questions] == ["where is the table and its caption?", "first header"]
    assert page.questions[0].region_ids == [1, 2]
    np.testing.assert_array_equal(page.questions[0].mask, table | caption)
    assert page.questions[1].mask.sum() == 4  # the stored mask wins over the region's
    assert page.links == [(2, 1)]
    both = CocoDocuments(ann, image_dir=tmp_path, category_questions=True)[0]
    assert len(both.questions) == 2 + 3


def test_default_image_dir_is_images_beside_the_json(tmp_path):
    path = write_coco([hand_built_page(5)], tmp_path / "ds")
    assert CocoDocuments(path).image_dir == tmp_path / "ds" / "images"


def test_page_without_questions_stays_without_questions(tmp_path):
    page = hand_built_page(6)
    page.questions = []
    back = CocoDocuments(write_coco([page], tmp_path / "ds"))[0]
    assert back.questions == []  # an explicit empty list is not replaced by category questions


def test_dataset_pickles_for_spawned_workers(tmp_path):
    import pickle

    ds = CocoDocuments(write_coco([hand_built_page(7)], tmp_path / "ds"), on_bad_sample="skip")
    clone = pickle.loads(pickle.dumps(ds))
    assert_same_page(ds[0], clone[0])


def test_questions_are_written_as_annotation_ids(tmp_path):
    path = write_coco([hand_built_page(0), hand_built_page(1)], tmp_path / "ds")
    data = json.loads(path.read_text())
    ids_of = {img["id"]: [a["id"] for a in data["annotations"] if a["image_id"] == img["id"]]
              for img in data["images"]}
    assert ids_of == {1: [1, 2, 3, 4], 2: [5, 6, 7, 8]}  # unique in the file, in writing order
    second = data["images"][1]["questions"]
    assert all("region_ids" not in q for img in data["images"] for q in img["questions"])
    assert [q["annotation_ids"] for q in second] == [[5], [7], [], [6]]


def test_an_old_file_with_region_ids_still_loads(tmp_path):
    """Files written before the one writer name a question's targets by `region_ids` (indices of
    the page's annotations in file order): they read back as the same pages."""
    pages = [hand_built_page(0), hand_built_page(1, h=40, w=72)]
    path = write_coco(pages, tmp_path / "ds")
    data = json.loads(path.read_text())
    for img in data["images"]:
        order = [a["id"] for a in data["annotations"] if a["image_id"] == img["id"]]
        for q in img["questions"]:
            q["region_ids"] = [order.index(a) for a in q.pop("annotation_ids")]
    path.write_text(json.dumps(data))
    ds = CocoDocuments(path)
    for original, page in zip(pages, (ds[0], ds[1])):
        assert_same_page(original, page)


def test_pycocotools_reads_the_written_file(tmp_path):
    from pycocotools.coco import COCO

    page = hand_built_page(3)
    path = write_coco([page], tmp_path / "ds")
    coco = COCO(str(path))
    anns = coco.loadAnns(coco.getAnnIds(imgIds=[1]))
    assert [coco.loadCats(a["category_id"])[0]["name"] for a in anns] == [r.label for r in page.regions]
    for ann, region in zip(anns, page.regions):
        np.testing.assert_array_equal(coco.annToMask(ann).astype(bool), region.mask)


def test_write_coco_refuses_a_question_about_a_missing_region(tmp_path):
    page = hand_built_page(4)
    page.questions[0].region_ids = [9]
    with pytest.raises(ValueError, match=r"region_ids \[9\] but the page has 4 regions"):
        write_coco([page], tmp_path / "ds")
