"""Issue 11 ("Reliability") for the data readers: duplicate COCO ids, a pixel cap on PDF rendering
and image decoding, hostile annotation fields, zero-area regions and unknown FUNSD labels.

Every broken field is a `BadSampleError` naming the file (and the annotation / word / entity) and
the fix: a page-level one is skipped and counted under on_bad_sample="skip"; a broken index (image
or category ids, the lists themselves) always raises when the data set is built."""
from __future__ import annotations

import copy
import json
import logging
import time
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from pycocotools import mask as mask_util

from dociq.data.datasets.coco import CocoDocuments
from dociq.io.rle import encode_rle as encode_mask, rle_string_counts
from dociq.data.errors import BadSampleError
from dociq.data.datasets.funsd import FUNSD_LABELS, FunsdDocuments
from dociq.data.image_io import load_page_image
from dociq.data.ocr import PdfTextLayer

H, W = 50, 100


def base_coco() -> dict:
    """One valid 100x50 page: a key (ann 100) and a value (ann 101), a question and a link."""
    return {
        "images": [{"id": 1, "file_name": "p.png", "width": W, "height": H,
                    "words": [{"text": "Total", "bbox": [12, 12, 20, 6]},
                              {"text": "12.50", "bbox": [60, 12, 20, 6]}],
                    "questions": [{"text": "where is the total?", "kind": "reading", "annotation_ids": [101]}],
                    "links": [[0, 1]]}],
        "annotations": [
            {"id": 100, "image_id": 1, "category_id": 1, "bbox": [10, 10, 30, 10],
             "segmentation": [[10, 10, 40, 10, 40, 20, 10, 20]], "area": 300, "iscrowd": 0},
            {"id": 101, "image_id": 1, "category_id": 2, "bbox": [55, 10, 30, 10],
             "segmentation": [], "area": 300, "iscrowd": 0},
        ],
        "categories": [{"id": 1, "name": "key"}, {"id": 2, "name": "value"}],
    }


def dump(tmp_path, data: dict, images=("p.png",)):
    for name in images:
        if not (tmp_path / name).exists():
            Image.fromarray(np.full((H, W, 3), 255, np.uint8)).save(tmp_path / name)
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(data))
    return path


def second_page(data: dict, ann_ids=(200,)) -> dict:
    data["images"].append(dict(copy.deepcopy(data["images"][0]), id=2, file_name="q.png", questions=[], links=[]))
    for k, aid in enumerate(ann_ids):
        data["annotations"].append({"id": aid, "image_id": 2, "category_id": 1,
                                    "bbox": [10 + 20 * k, 30, 15, 10], "segmentation": []})
    return data


def test_base_page_is_valid(tmp_path):
    page = CocoDocuments(dump(tmp_path, base_coco()), image_dir=tmp_path)[0]
    assert [r.label for r in page.regions] == ["key", "value"]
    assert page.questions[0].region_ids == [1] and page.links == [(0, 1)]


# ---------------------------------------------------------------------------------------------
# (4) duplicate ids


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_duplicate_image_id_is_an_error_naming_the_id_and_the_file(tmp_path, mode):
    data = second_page(base_coco())
    data["images"][1]["id"] = 1  # two pages' annotations would merge into one
    path = dump(tmp_path, data, images=("p.png", "q.png"))
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path, on_bad_sample=mode)
    msg = str(info.value)
    assert info.value.path == str(path)
    assert "image id 1" in msg and "p.png" in msg and "q.png" in msg and "Fix:" in msg


@pytest.mark.parametrize("mode", ["raise", "skip"])
def test_duplicate_category_id_is_an_error_naming_the_id_and_the_file(tmp_path, mode):
    data = base_coco()
    data["categories"].append({"id": 2, "name": "figure"})  # would rename every "value" to "figure"
    path = dump(tmp_path, data)
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path, on_bad_sample=mode)
    msg = str(info.value)
    assert info.value.path == str(path)
    assert "category id 2" in msg and "'value'" in msg and "'figure'" in msg and "Fix:" in msg


def test_duplicate_annotation_id_on_one_page_is_a_bad_page(tmp_path, caplog):
    data = base_coco()
    data["annotations"][0]["id"] = 101  # the question's annotation_ids [101] would be ambiguous
    path = dump(tmp_path, data)
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)[0]
    msg = str(info.value)
    assert info.value.path == str(path) and "annotation id 101" in msg and "Fix:" in msg
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        assert ds[0] is None
    assert [(b.index, b.path) for b in ds.bad_samples] == [(0, str(path))]
    assert "annotation id 101" in ds.bad_samples[0].reason


def test_duplicate_annotation_id_across_pages_makes_both_pages_bad(tmp_path):
    data = second_page(base_coco(), ann_ids=(100,))
    data["images"].append(dict(copy.deepcopy(data["images"][1]), id=3, file_name="r.png"))
    data["annotations"].append({"id": 300, "image_id": 3, "category_id": 1, "bbox": [10, 30, 15, 10]})
    path = dump(tmp_path, data, images=("p.png", "q.png", "r.png"))
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    assert ds[0] is None and ds[1] is None and ds[2] is not None  # the third page is untouched
    assert [b.index for b in ds.bad_samples] == [0, 1]
    for bad in ds.bad_samples:
        assert bad.path == str(path) and "annotation id 100" in bad.reason and "image ids [1, 2]" in bad.reason


# ---------------------------------------------------------------------------------------------
# (6) a pixel cap on rendering and decoding, checked before any pixels are allocated


def _pdf_page(tmp_path, text_pdf, width=300, height=200):
    path = tmp_path / "page.pdf"
    path.write_bytes(text_pdf([[(24, 20, 150, "Hello World")]], width=width, height=height))
    return path


def _pdf_coco(tmp_path, text_pdf, width, height):
    _pdf_page(tmp_path, text_pdf)
    data = {"images": [{"id": 1, "file_name": "page.pdf", "width": width, "height": height,
                        "words": [{"text": "Hello", "bbox": [1, 1, 5, 5]}]}],
            "annotations": [], "categories": []}
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(data))
    return path


def _fails_fast_without_allocating(load):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(BadSampleError) as info:
            load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 3.0
    assert peak < 20e6  # a 20000x30000 RGB page would be 1.8 GB
    return info.value


def test_huge_annotated_pdf_page_is_rejected_before_rendering(tmp_path, text_pdf, caplog):
    ann = _pdf_coco(tmp_path, text_pdf, width=20000, height=30000)
    err = _fails_fast_without_allocating(lambda: CocoDocuments(ann, image_dir=tmp_path)[0])
    msg = str(err)
    assert err.path.endswith("page.pdf") and "20000x30000" in msg and "max_page_pixels" in msg
    ds = CocoDocuments(ann, image_dir=tmp_path, on_bad_sample="skip")
    assert ds[0] is None and len(ds.bad_samples) == 1


def test_render_cap_is_configurable(tmp_path, text_pdf):
    ann = _pdf_coco(tmp_path, text_pdf, width=600, height=400)
    assert CocoDocuments(ann, image_dir=tmp_path)[0].image.shape == (400, 600, 3)
    with pytest.raises(BadSampleError, match=r"600x400.*max_page_pixels"):
        CocoDocuments(ann, image_dir=tmp_path, max_page_pixels=200_000)[0]


def test_render_cap_counts_the_intermediate_render_too(tmp_path, text_pdf):
    # 20000x10 is small, but the 3:2 page would be rendered 20000 px wide (13334 high) first
    ann = _pdf_coco(tmp_path, text_pdf, width=20000, height=10)
    err = _fails_fast_without_allocating(lambda: CocoDocuments(ann, image_dir=tmp_path)[0])
    assert "20000x13334" in str(err) and "max_page_pixels" in str(err)


def test_pdf_text_layer_caps_its_own_dpi_renders(tmp_path, text_pdf):
    pdf = _pdf_page(tmp_path, text_pdf, width=14400, height=14400)  # a 200-inch MediaBox
    err = _fails_fast_without_allocating(lambda: PdfTextLayer(dpi=144).render(pdf))
    assert err.path == str(pdf) and "28800x28800" in str(err) and "max_page_pixels" in str(err)
    assert PdfTextLayer(dpi=1).render(pdf).shape == (200, 200, 3)


def test_page_image_over_the_cap_is_rejected_from_its_header(tmp_path):
    path = tmp_path / "big.png"
    Image.new("L", (3000, 2000), 255).save(path)  # 6 MP, a few kB on disk
    err = _fails_fast_without_allocating(lambda: load_page_image(path, max_page_pixels=1_000_000))
    assert err.path == str(path) and "3000x2000" in str(err) and "max_page_pixels" in str(err)
    assert load_page_image(path, max_page_pixels=6_000_000).shape == (2000, 3000, 3)
    data = base_coco()
    data["images"][0].update(file_name="big.png", width=3000, height=2000)
    with pytest.raises(BadSampleError, match=r"big\.png.*3000x2000.*max_page_pixels"):
        CocoDocuments(dump(tmp_path, data, images=()), image_dir=tmp_path, max_page_pixels=1_000_000)[0]


def test_page_cap_replaces_pillows_bomb_warning_but_not_its_error(tmp_path, monkeypatch):
    path = tmp_path / "p.png"
    Image.new("L", (600, 400), 255).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200_000)  # 240 kP: Pillow warns, below 2x it errs
    with pytest.raises(BadSampleError, match="implausibly large"):
        load_page_image(path)  # no cap of ours: Pillow's warning is the limit
    assert load_page_image(path, max_page_pixels=300_000).shape == (400, 600, 3)
    with pytest.raises(BadSampleError, match="max_page_pixels"):
        load_page_image(path, max_page_pixels=100_000)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100_000)
    with pytest.raises(BadSampleError, match="implausibly large"):
        load_page_image(path, max_page_pixels=300_000)  # over twice Pillow's limit: still refused


# ---------------------------------------------------------------------------------------------
# (7) hostile annotation fields: a BadSampleError naming the file and the item, never a bare error


def _at(data, dotted):
    *parents, last = [int(k) if k.isdigit() else k for k in dotted.split(".")]
    node = data
    for k in parents:
        node = node[k]
    return node, last


def _set(dotted, value):
    def mutate(data):
        node, key = _at(data, dotted)
        node[key] = value
    return mutate


# (mutation of base_coco(), a word the error must contain)
COCO_PAGE_CASES = {
    "bbox strings": (_set("annotations.0.bbox", ["a", "b", "c", "d"]), "annotation id 100"),
    "bbox two values": (_set("annotations.0.bbox", [1, 2]), "annotation id 100"),
    "bbox a string": (_set("annotations.0.bbox", "abcd"), "annotation id 100"),
    "bbox null": (_set("annotations.0.bbox", None), "annotation id 100"),
    "bbox a dict": (_set("annotations.0.bbox", {"x": 1}), "annotation id 100"),
    "bbox nested": (_set("annotations.0.bbox", [1, 2, 3, [4]]), "annotation id 100"),
    "bbox NaN text": (_set("annotations.0.bbox", [1, 2, "nan", 4]), "annotation id 100"),
    "polygon strings": (_set("annotations.0.segmentation", [["a", "b", "c", "d", "e", "f"]]), "annotation id 100"),
    "polygon mixed": (_set("annotations.0.segmentation", [[10, 10, 40, "x", 40, 20]]), "annotation id 100"),
    "polygon of dicts": (_set("annotations.0.segmentation", [{"x": 1}]), "annotation id 100"),
    "segmentation a string": (_set("annotations.0.segmentation", "abc"), "annotation id 100"),
    "RLE size strings": (_set("annotations.0.segmentation", {"size": ["a", "b"], "counts": "x"}), "annotation id 100"),
    "RLE size a number": (_set("annotations.0.segmentation", {"size": 5, "counts": "x"}), "annotation id 100"),
    "RLE counts strings": (_set("annotations.0.segmentation", {"size": [H, W], "counts": ["a", "b"]}),
                           "annotation id 100"),
    "RLE float runs": (_set("annotations.0.segmentation", {"size": [H, W], "counts": [0.5, H * W - 0.5]}),
                       "annotation id 100"),
    "RLE counts a number": (_set("annotations.0.segmentation", {"size": [H, W], "counts": 5}), "annotation id 100"),
    # runs summing to less than H*W: pycocotools fills the rest of the mask with uninitialised memory
    "RLE string too short": (_set("annotations.0.segmentation",
                                  encode_mask(np.ones((10, 10), bool))), "annotation id 100"),
    "RLE string of another size": (_set("annotations.0.segmentation",
                                        dict(encode_mask(np.ones((10, 10), bool)), size=[H, W])), "annotation id 100"),
    "RLE runs too short": (_set("annotations.0.segmentation", {"size": [H, W], "counts": [5, 10, 5]}),
                           "annotation id 100"),
    "RLE runs negative": (_set("annotations.0.segmentation", {"size": [H, W], "counts": [-5, H * W + 5]}),
                          "annotation id 100"),
    "category id a list": (_set("annotations.0.category_id", [1]), "annotation id 100"),
    "category id a dict": (_set("annotations.0.category_id", {"a": 1}), "annotation id 100"),
    "word_ids a string": (_set("annotations.0.word_ids", "ab"), "annotation id 100"),
    "word_ids a number": (_set("annotations.0.word_ids", 5), "annotation id 100"),
    "word_ids null entry": (_set("annotations.0.word_ids", [None]), "annotation id 100"),
    "word_ids nested": (_set("annotations.0.word_ids", [[0]]), "annotation id 100"),
    "words a string": (_set("images.0.words", "abc"), "words"),
    "words a number": (_set("images.0.words", 5), "words"),
    "word a number": (_set("images.0.words.0", 5), "word 0"),
    "word bbox strings": (_set("images.0.words.0.bbox", ["a", 1, 2, 3]), "word 0"),
    "word bbox two values": (_set("images.0.words.0.bbox", [1, 2]), "word 0"),
    "word without bbox": (_set("images.0.words.0", {"text": "a"}), "word 0"),
    "questions a number": (_set("images.0.questions", 5), "questions"),
    "question annotation_ids a number": (_set("images.0.questions.0.annotation_ids", 5), "question 0"),
    "question annotation_ids nested": (_set("images.0.questions.0.annotation_ids", [[101]]), "question 0"),
    "question region_ids strings": (_set("images.0.questions.0", {"text": "q", "region_ids": ["a"]}), "question 0"),
    "question region_ids a number": (_set("images.0.questions.0", {"text": "q", "region_ids": 5}), "question 0"),
    "question kind a list": (_set("images.0.questions.0.kind", ["x"]), "question 0"),
    "question segmentation strings": (_set("images.0.questions.0.segmentation", [["a"] * 6]), "question 0"),
    "links a number": (_set("images.0.links", 5), "link"),
    "link too short": (_set("images.0.links", [[0]]), "link"),
    "link strings": (_set("images.0.links", [["a", "b"]]), "link"),
    "link a string": (_set("images.0.links", ["ab"]), "link"),
    "link null": (_set("images.0.links", [None]), "link"),
    "link three ends": (_set("images.0.links", [[0, 1, 1]]), "link"),
    "width a string": (_set("images.0.width", "abc"), "width"),
    "height null": (_set("images.0.height", None), "height"),
    "file_name a number": (_set("images.0.file_name", 5), "file_name"),
    "file_name null": (_set("images.0.file_name", None), "file_name"),
    "meta a string": (_set("images.0.meta", "abc"), "meta"),
    "meta a list": (_set("images.0.meta", [1, 2]), "meta"),
}


@pytest.mark.parametrize("case", list(COCO_PAGE_CASES))
def test_hostile_coco_field_is_a_bad_page(tmp_path, case):
    mutate, names = COCO_PAGE_CASES[case]
    data = second_page(base_coco())
    mutate(data)
    path = dump(tmp_path, data, images=("p.png", "q.png"))
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)[0]
    assert info.value.path == str(path)
    assert names in info.value.reason and "Fix:" in str(info.value)
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    assert ds[0] is None and ds[1] is not None  # only the broken page is dropped
    assert [b.index for b in ds.bad_samples] == [0]


def test_rle_string_counts_match_pycocotools():
    rng = np.random.default_rng(0)
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(1, 60, 2))
        mask = rng.random((h, w)) < rng.random()
        runs = rle_string_counts(mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"])
        assert sum(runs) == h * w and min(runs) >= 0
        np.testing.assert_array_equal(np.repeat(np.arange(len(runs)) % 2, runs).reshape(w, h).T, mask)


@pytest.mark.parametrize("field,value", [("area", "big"), ("area", None), ("iscrowd", "x"), ("text", {"a": 1})])
def test_fields_dociq_does_not_use_are_ignored(tmp_path, field, value):
    data = base_coco()
    data["annotations"][0][field] = value
    assert CocoDocuments(dump(tmp_path, data), image_dir=tmp_path)[0].regions[0].label == "key"


# (mutation, a word the error must contain): the index itself is broken, so even "skip" raises
COCO_INDEX_CASES = {
    "images entry a string": (_set("images.0", "abc"), "image entry 0"),
    "image id a list": (_set("images.0.id", [1]), "image entry 0"),
    "annotations a string": (_set("annotations", "abc"), "'annotations'"),
    "categories a string": (_set("categories", "abc"), "'categories'"),
    "category a number": (_set("categories.0", 5), "category entry"),
    "category id a list": (_set("categories.0.id", [1]), "category entry"),
    "category without name": (_set("categories.0", {"id": 1}), "category entry"),
}


@pytest.mark.parametrize("case", list(COCO_INDEX_CASES))
def test_hostile_coco_index_is_a_whole_file_error(tmp_path, case):
    mutate, names = COCO_INDEX_CASES[case]
    data = base_coco()
    mutate(data)
    path = dump(tmp_path, data)
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    assert info.value.path == str(path) and names in info.value.reason and "Fix:" in str(info.value)


@pytest.mark.parametrize("value", ["abc", 5, {"id": 7, "image_id": [1], "category_id": 1, "bbox": [1, 1, 2, 2]}])
def test_annotation_that_belongs_to_no_page_is_reported_against_the_file(tmp_path, value):
    data = base_coco()
    data["annotations"].append(value)
    path = dump(tmp_path, data)
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)
    assert info.value.path == str(path) and "annotation" in info.value.reason
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    assert [b.index for b in ds.bad_samples] == [None]
    assert [r.label for r in ds[0].regions] == ["key", "value"]


def funsd_form():
    return [
        {"id": 0, "label": "question", "text": "Date:", "box": [10, 10, 40, 20],
         "words": [{"text": "Date:", "box": [10, 10, 40, 20]}], "linking": [[0, 1]]},
        {"id": 1, "label": "answer", "text": "12/03/98", "box": [50, 10, 95, 20],
         "words": [{"text": "12/03/98", "box": [50, 10, 95, 20]}], "linking": [[0, 1]]},
        {"id": 2, "label": "other", "text": "x", "box": [10, 30, 20, 40],
         "words": [{"text": "x", "box": [10, 30, 20, 40]}], "linking": []},
    ]


def write_funsd(root, forms: dict):
    (root / "training_data" / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "training_data" / "images").mkdir(parents=True, exist_ok=True)
    for name, form in forms.items():
        (root / "training_data" / "annotations" / f"{name}.json").write_text(json.dumps({"form": form}))
        Image.new("L", (W, H), 255).save(root / "training_data" / "images" / f"{name}.png")
    return root


FUNSD_PAGE_CASES = {
    "entity a string": (_set("0", "abc"), "entity 0"),
    "entity id a list": (_set("0.id", [0]), "entity 0"),
    "box a string": (_set("0.box", "abc"), "entity id 0"),
    "box two values": (_set("0.box", [1, 2]), "entity id 0"),
    "box strings": (_set("0.box", ["a", "b", "c", "d"]), "entity id 0"),
    "box null": (_set("0.box", None), "entity id 0"),
    "box nested": (_set("0.box", [1, 2, [3], 4]), "entity id 0"),
    "label a number": (_set("0.label", 5), "entity id 0"),
    "words a string": (_set("0.words", "abc"), "entity id 0"),
    "words a number": (_set("0.words", 5), "entity id 0"),
    "word a number": (_set("0.words.0", 5), "word 0"),
    "word box a string": (_set("0.words.0.box", "abc"), "word 0"),
    "word box two values": (_set("0.words.0.box", [1, 2]), "word 0"),
    "linking a number": (_set("0.linking", 5), "entity id 0"),
    "link too short": (_set("0.linking", [[0]]), "entity id 0"),
    "link a string": (_set("0.linking", ["ab"]), "entity id 0"),
    "link end a list": (_set("0.linking", [[[0], 1]]), "entity id 0"),
}


@pytest.mark.parametrize("case", list(FUNSD_PAGE_CASES))
def test_hostile_funsd_field_is_a_bad_page(tmp_path, case):
    mutate, names = FUNSD_PAGE_CASES[case]
    form = funsd_form()
    mutate(form)
    root = write_funsd(tmp_path, {"a_bad": form, "b_ok": funsd_form()})
    bad_file = root / "training_data" / "annotations" / "a_bad.json"
    with pytest.raises(BadSampleError) as info:
        FunsdDocuments(root)[0]
    assert info.value.path == str(bad_file)
    assert names in info.value.reason and "Fix:" in str(info.value)
    ds = FunsdDocuments(root, on_bad_sample="skip")
    assert ds[0] is None and ds[1] is not None
    assert [b.index for b in ds.bad_samples] == [0]


# a little random fuzzing on top of the cases above: any JSON value in any field of a page
HOSTILE_VALUES = [None, True, 0, -1, 1.5, float("nan"), 1e308, "", "abc", "1", [], [1], [1, 2], ["a"], [[1]],
                  [None], {}, {"a": 1}, [1, 2, 3, 4], [[1, 2, 3, 4, 5, 6]], [[0, 1]], [[0, 99]], [-1, -1, 5, 5],
                  {"size": [H, W], "counts": "abc"}, {"size": [H, W], "counts": []}, [{"text": "x"}]]


def _field_paths(node, prefix=()):
    if prefix:
        yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in children:
        yield from _field_paths(v, prefix + (k,))


def _fuzzed(base, rng):
    paths = list(_field_paths(base))
    data = copy.deepcopy(base)
    for _ in range(int(rng.integers(1, 4))):
        node, path = data, paths[int(rng.integers(len(paths)))]
        try:
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = copy.deepcopy(HOSTILE_VALUES[int(rng.integers(len(HOSTILE_VALUES)))])
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation replaced a parent of this path
    return data


def test_random_hostile_values_are_bad_samples_never_bare_errors(tmp_path):
    rng = np.random.default_rng(11)
    coco = second_page(base_coco())
    coco["annotations"][0].update(word_ids=[0], text="Total")
    coco["images"][0].update(meta={"source": "scan"}, pdf_page=0)
    coco["images"][0]["questions"].append({"text": "cell", "kind": "cell", "region_ids": [0],
                                           "segmentation": encode_mask(np.eye(H, W, dtype=bool))})
    dump(tmp_path, coco, images=("p.png", "q.png"))
    root = write_funsd(tmp_path / "funsd", {"x": funsd_form()})
    outcomes = {"loaded": 0, "bad": 0}
    for _ in range(150):
        path = dump(tmp_path, _fuzzed(coco, rng), images=())
        try:
            ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
            pages = [ds[i] for i in range(len(ds))]
            outcomes["loaded"] += sum(p is not None for p in pages)
            outcomes["bad"] += len(ds.bad_samples)
        except BadSampleError as err:  # a broken index
            assert err.path == str(path)
            outcomes["bad"] += 1
        form_file = root / "training_data" / "annotations" / "x.json"
        form_file.write_text(json.dumps({"form": _fuzzed(funsd_form(), rng)}))
        ds = FunsdDocuments(root, on_bad_sample="skip")
        outcomes["loaded" if ds[0] is not None else "bad"] += 1
        assert all(b.path in (str(form_file), str(ds.image_path(0))) for b in ds.bad_samples)
    assert outcomes["bad"] > 100 and outcomes["loaded"] > 50  # the fuzzing hit both outcomes


# ---------------------------------------------------------------------------------------------
# (9) zero-area regions are dropped (with the questions and links that need them), warned once
# and counted; the rest of the page is kept


def test_zero_area_coco_regions_are_dropped_with_their_questions_and_links(tmp_path, caplog):
    data = base_coco()
    anns = data["annotations"]
    anns.append({"id": 102, "image_id": 1, "category_id": 1, "bbox": [10, 30, 0, 10]})  # zero width
    anns.append({"id": 103, "image_id": 1, "category_id": 1, "bbox": [50, 30, 10, 10],  # empty mask
                 "segmentation": encode_mask(np.zeros((H, W), bool))})
    anns.append({"id": 104, "image_id": 1, "category_id": 2, "bbox": [70.2, 30.2, 0.2, 0.3]})  # sub-pixel
    anns.append({"id": 105, "image_id": 1, "category_id": 2, "bbox": [70, 30, 20, 10]})
    data["images"][0]["questions"] = [
        {"text": "only the empty one", "kind": "layout", "annotation_ids": [102]},
        {"text": "key and an empty one", "kind": "layout", "annotation_ids": [100, 103]},
        {"text": "last value by index", "kind": "layout", "region_ids": [5]},
        {"text": "a stored target survives", "kind": "cell", "region_ids": [4],
         "segmentation": encode_mask(np.pad(np.ones((2, 2), bool), ((0, H - 2), (0, W - 2))))},
    ]
    data["images"][0]["links"] = [[0, 1], [1, 2], [0, 5]]
    path = dump(tmp_path, data)
    ds = CocoDocuments(path, image_dir=tmp_path, category_questions=True)
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        page = ds[0]
        ds[0]  # a second epoch neither warns nor counts again
    assert [r.label for r in page.regions] == ["key", "value", "value"]
    assert all(r.mask.any() for r in page.regions)
    stored = [q for q in page.questions if q.kind != "category"]
    assert [(q.text, q.region_ids) for q in stored] == [
        ("key and an empty one", [0]), ("last value by index", [2]), ("a stored target survives", [])]
    np.testing.assert_array_equal(stored[0].mask, page.regions[0].mask)
    assert stored[2].mask.sum() == 4
    assert all(q.mask.any() for q in page.questions)
    assert page.links == [(0, 1), (0, 2)]
    assert [(d.index, d.path, d.what) for d in ds.dropped_regions] == [
        (0, str(path), f"annotation id {a} of image 'p.png' (id 1)") for a in (102, 103, 104)]
    warnings = [r.getMessage() for r in caplog.records if "zero area" in r.getMessage()]
    assert len(warnings) == 3
    assert all(str(path) in m for m in warnings) and any("annotation id 103" in m for m in warnings)
    assert ds.bad_samples == []


def test_zero_area_funsd_entity_is_dropped_with_its_links_and_question(tmp_path, caplog):
    form = funsd_form()
    form[1]["box"] = [50, 10, 50, 20]  # the only answer has no width
    form.append({"id": 3, "label": "header", "text": "", "box": [0, 0, 0, 0], "words": [], "linking": []})
    root = write_funsd(tmp_path, {"f": form})
    ds = FunsdDocuments(root)
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        page = ds[0]
    assert [r.label for r in page.regions] == ["question", "other"]
    assert page.words == ["Date:", "12/03/98", "x"]  # the words stay: the text encoder still reads them
    assert page.links == [] and page.questions == []
    ann = str(root / "training_data" / "annotations" / "f.json")
    assert [(d.index, d.path, d.what) for d in ds.dropped_regions] == [(0, ann, "entity id 1"), (0, ann, "entity id 3")]
    assert sum("zero area" in r.getMessage() and "entity id 1" in r.getMessage() and ann in r.getMessage()
               for r in caplog.records) == 1


# ---------------------------------------------------------------------------------------------
# (10) FUNSD labels


def test_unknown_funsd_label_names_file_entity_and_allowed_labels(tmp_path):
    form = funsd_form()
    form[2]["label"] = "Signature"
    root = write_funsd(tmp_path, {"f": form})
    with pytest.raises(BadSampleError) as info:
        FunsdDocuments(root)[0]
    msg = str(info.value)
    assert info.value.path.endswith("f.json") and "entity id 2" in msg and "'Signature'" in msg
    assert all(label in msg for label in FUNSD_LABELS) and "Fix:" in msg
    ds = FunsdDocuments(root, on_bad_sample="skip")
    assert ds[0] is None and len(ds.bad_samples) == 1
