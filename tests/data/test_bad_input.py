"""Odd and broken page images: every Pillow mode becomes uint8 RGB with the right pixel values,
and unreadable files raise a BadSampleError that names the file and the fix."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from PIL import Image

from dociq.data.errors import BadSampleError, BadSamplePolicy, check_box_in_page
from dociq.data.image_io import load_page_image, load_page_image_bytes


def _save(img: Image.Image, path, **kw):
    img.save(path, **kw)
    return path


def test_rgb_png_is_returned_unchanged(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (12, 17, 3), dtype=np.uint8)
    out = load_page_image(_save(Image.fromarray(arr), tmp_path / "p.png"))
    assert out.dtype == np.uint8 and out.shape == (12, 17, 3)
    assert out.flags.writeable and out.flags.c_contiguous  # torch.from_numpy warns on read-only arrays
    np.testing.assert_array_equal(out, arr)


def test_grayscale_page_becomes_three_equal_channels(tmp_path):
    arr = np.array([[0, 37, 255]], dtype=np.uint8).repeat(4, 0)
    out = load_page_image(_save(Image.fromarray(arr, "L"), tmp_path / "g.png"))
    assert out.shape == (4, 3, 3)
    np.testing.assert_array_equal(out[..., 0], arr)
    np.testing.assert_array_equal(out[..., 1], arr)
    np.testing.assert_array_equal(out[..., 2], arr)


def test_one_bit_page_is_black_and_white(tmp_path):
    img = Image.new("1", (8, 4), 1)  # white
    img.putpixel((2, 1), 0)
    out = load_page_image(_save(img, tmp_path / "b.png"))
    assert out[1, 2].tolist() == [0, 0, 0]
    assert out[0, 0].tolist() == [255, 255, 255]


def test_palette_page_maps_through_palette(tmp_path):
    img = Image.new("P", (5, 5), 0)
    img.putpalette([255, 255, 255, 200, 10, 30] + [0] * (256 * 3 - 6))
    img.putpixel((3, 2), 1)
    out = load_page_image(_save(img, tmp_path / "p.png"))
    assert out[2, 3].tolist() == [200, 10, 30]
    assert out[0, 0].tolist() == [255, 255, 255]


def test_palette_transparent_index_is_white_paper(tmp_path):
    img = Image.new("P", (4, 4), 0)
    img.putpalette([0, 0, 0, 10, 20, 30] + [0] * (256 * 3 - 6))
    img.putpixel((1, 1), 1)
    out = load_page_image(_save(img, tmp_path / "pt.png", transparency=0))
    assert out[0, 0].tolist() == [255, 255, 255]  # index 0 is black but transparent
    assert out[1, 1].tolist() == [10, 20, 30]


def test_rgba_composites_on_white(tmp_path):
    arr = np.zeros((2, 3, 4), dtype=np.uint8)
    arr[0, 0] = (0, 0, 0, 0)          # fully transparent black -> white paper
    arr[0, 1] = (200, 0, 0, 255)      # opaque red stays red
    arr[0, 2] = (0, 0, 0, 128)        # half-transparent black -> mid grey
    out = load_page_image(_save(Image.fromarray(arr, "RGBA"), tmp_path / "a.png"))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [200, 0, 0]
    assert all(abs(v - 127) <= 1 for v in out[0, 2].tolist())


def test_la_composites_on_white(tmp_path):
    arr = np.array([[[0, 0], [50, 255]]], dtype=np.uint8)
    out = load_page_image(_save(Image.fromarray(arr, "LA"), tmp_path / "la.png"))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [50, 50, 50]


def test_cmyk_converts_to_rgb(tmp_path):
    img = Image.new("CMYK", (3, 1))
    img.putpixel((0, 0), (0, 0, 0, 0))       # no ink: white
    img.putpixel((1, 0), (0, 0, 0, 255))     # full black
    img.putpixel((2, 0), (255, 0, 0, 0))     # cyan
    out = load_page_image(_save(img, tmp_path / "c.tif"))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [0, 0, 0]
    assert out[0, 2].tolist() == [0, 255, 255]


def test_16bit_page_is_rescaled_by_range_not_clipped(tmp_path):
    arr = np.array([[0, 1000, 32896, 65535]], dtype=np.uint16)
    img = Image.fromarray(arr)  # Pillow picks a 16-bit grey mode
    assert img.mode.startswith("I;16")
    out = load_page_image(_save(img, tmp_path / "d.png"))
    assert out[0, :, 0].tolist() == [0, 4, 128, 255]  # clipping would give [0, 255, 255, 255]
    assert out.dtype == np.uint8


def test_32bit_int_page_uses_its_value_range(tmp_path):
    arr = np.array([[0, 30000, 60000]], dtype=np.int32)
    out = load_page_image(_save(Image.fromarray(arr, "I"), tmp_path / "i.tif"))
    assert out[0, :, 0].tolist() == [0, 117, 233]  # 16-bit range: v * 255 / 65535


def test_exif_orientation_is_applied(tmp_path):
    arr = np.full((2, 4, 3), 255, dtype=np.uint8)
    arr[0, 0] = (255, 0, 0)  # red at the top-left of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    out = load_page_image(_save(Image.fromarray(arr), tmp_path / "o.png", exif=exif))
    assert out.shape == (4, 2, 3)  # portrait after rotation
    assert out[0, 1].tolist() == [255, 0, 0]  # top-left moves to the top-right


def test_missing_file_names_the_file_and_fix(tmp_path):
    path = tmp_path / "nope.png"
    with pytest.raises(BadSampleError) as info:
        load_page_image(path)
    msg = str(info.value)
    assert str(path) in msg and "not found" in msg and "Fix:" in msg
    assert info.value.path == str(path)


def test_non_image_file_is_rejected(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("this is not an image")
    with pytest.raises(BadSampleError, match="not an image") as info:
        load_page_image(path)
    assert str(path) in str(info.value) and "Fix:" in str(info.value)


def test_truncated_png_is_rejected(tmp_path):
    full = tmp_path / "full.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(full)
    cut = tmp_path / "cut.png"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(BadSampleError, match="truncated or corrupt") as info:
        load_page_image(cut)
    assert str(cut) in str(info.value)


def test_truncated_jpeg_is_rejected(tmp_path):
    full = tmp_path / "full.jpg"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(full)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(full.read_bytes()[:400])
    with pytest.raises(BadSampleError) as info:
        load_page_image(cut)
    assert str(cut) in str(info.value)


def test_bytes_loader_names_the_upload():
    with pytest.raises(BadSampleError, match="upload.png"):
        load_page_image_bytes(b"garbage", name="upload.png")


def test_box_overshoot_within_one_percent_is_clipped():
    box = check_box_in_page([-0.5, 2, 100.9, 50], (50, 100), "f.json", "annotation id 1")
    np.testing.assert_allclose(box, [0, 2, 100, 50])


def test_box_far_outside_names_file_annotation_and_box():
    with pytest.raises(BadSampleError) as info:
        check_box_in_page([10, 10, 150, 40], (50, 100), "f.json", "annotation id 7")
    msg = str(info.value)
    assert "f.json" in msg and "annotation id 7" in msg and "150.0" in msg and "outside" in msg


def test_policy_skip_records_once_and_warns(caplog):
    policy = BadSamplePolicy("skip")

    def bad():
        raise BadSampleError("x.png", "broken", "fix it")

    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        assert policy.run(3, bad) is None
        assert policy.run(3, bad) is None  # second epoch: not recorded or logged twice
    assert [(b.index, b.path, b.reason) for b in policy.bad_samples] == [(3, "x.png", "broken")]
    assert sum("x.png" in r.getMessage() and "broken" in r.getMessage() for r in caplog.records) == 1
    assert BadSamplePolicy("raise").run(0, lambda: 5) == 5
    with pytest.raises(BadSampleError):
        BadSamplePolicy("raise").run(0, bad)
    with pytest.raises(ValueError, match="on_bad_sample"):
        BadSamplePolicy("ignore")


# ---------------------------------------------------------------------------------------------
# bad pages in a COCO data set: each raises naming the file, or with on_bad_sample="skip" reads
# as None, is logged with file + reason and listed in dataset.bad_samples

from dociq.data.datasets.coco import CocoDocuments  # noqa: E402


def _coco(tmp_path, pages):
    """Write a COCO JSON with one image entry per dict in `pages` (keys: file, image, words, anns)."""
    images, anns = [], []
    for i, p in enumerate(pages, 1):
        if p.get("image") is not None:
            Image.fromarray(p["image"]).save(tmp_path / p["file"])
        images.append({"id": i, "file_name": p["file"], "width": 100, "height": 50,
                       "words": p.get("words", [{"text": "word", "bbox": [5, 5, 20, 8]}])})
        for a in p.get("anns", [{"bbox": [10, 10, 30, 20]}]):
            anns.append({"id": len(anns) + 100, "image_id": i, "category_id": a.get("cat", 1),
                         "bbox": a["bbox"], "segmentation": a.get("seg", []), "area": 1, "iscrowd": 0})
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 1, "name": "table"}]}))
    return path


WHITE = np.full((50, 100, 3), 255, np.uint8)


def _assert_skipped(path, tmp_path, caplog, index, file_part, reason_part):
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        assert ds[index] is None
    assert len(ds.bad_samples) == 1
    bad = ds.bad_samples[0]
    assert bad.index == index and file_part in bad.path and reason_part in bad.reason
    assert any(file_part in r.getMessage() and reason_part in r.getMessage() for r in caplog.records)
    return ds


def test_coco_missing_image_file(tmp_path, caplog):
    path = _coco(tmp_path, [{"file": "ok.png", "image": WHITE}, {"file": "gone.png", "image": None}])
    ds = CocoDocuments(path, image_dir=tmp_path)
    assert ds[0] is not None
    with pytest.raises(BadSampleError, match=r"gone\.png: image file not found\. Fix: check"):
        ds[1]
    ds = _assert_skipped(path, tmp_path, caplog, 1, "gone.png", "not found")
    assert ds[0] is not None and len(ds.bad_samples) == 1  # good pages still load


def test_coco_box_outside_the_page_names_file_annotation_and_box(tmp_path, caplog):
    path = _coco(tmp_path, [{"file": "p.png", "image": WHITE, "anns": [{"bbox": [60, 10, 80, 20]}]}])
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)[0]
    msg = str(info.value)
    assert "annotations.json" in msg and "p.png" in msg and "annotation id 100" in msg
    assert "[60.0, 10.0, 140.0, 30.0]" in msg and "outside the 100x50 page" in msg
    _assert_skipped(path, tmp_path, caplog, 0, "annotations.json", "annotation id 100")


def test_coco_small_overshoot_is_clipped(tmp_path):
    path = _coco(tmp_path, [{"file": "p.png", "image": WHITE,
                             "anns": [{"bbox": [-0.8, 10, 100.9 - -0.8, 20],
                                       "seg": [[-0.8, 10, 100.9, 10, 100.9, 30, -0.8, 30]]}]}])
    region = CocoDocuments(path, image_dir=tmp_path)[0].regions[0]
    np.testing.assert_allclose(region.box, [0, 10, 100, 30])
    assert region.mask.shape == (50, 100) and region.mask[15].all()


def test_coco_polygon_outside_the_page(tmp_path):
    path = _coco(tmp_path, [{"file": "p.png", "image": WHITE,
                             "anns": [{"bbox": [10, 10, 20, 20], "seg": [[10, 10, 30, 10, 30, 90, 10, 90]]}]}])
    with pytest.raises(BadSampleError, match=r"annotation id 100 .*polygon extent.*outside"):
        CocoDocuments(path, image_dir=tmp_path)[0]


def test_coco_page_without_words(tmp_path, caplog):
    path = _coco(tmp_path, [{"file": "blank.png", "image": WHITE, "words": []}])
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)[0]
    msg = str(info.value)
    assert "blank.png" in msg and "no words" in msg and "ocr='tesseract'" in msg
    _assert_skipped(path, tmp_path, caplog, 0, "blank.png", "no words")
    assert CocoDocuments(path, image_dir=tmp_path, require_words=False)[0].words == []


def test_coco_truncated_and_non_image_files(tmp_path, caplog):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 100, 3), dtype=np.uint8)).save(tmp_path / "f.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "f.png").read_bytes()[:300])
    (tmp_path / "text.png").write_text("hello")
    path = _coco(tmp_path, [{"file": "cut.png"}, {"file": "text.png"}])
    ds = CocoDocuments(path, image_dir=tmp_path)
    with pytest.raises(BadSampleError, match=r"cut\.png: image file is truncated or corrupt"):
        ds[0]
    with pytest.raises(BadSampleError, match=r"text\.png: not an image"):
        ds[1]
    ds = CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING, logger="dociq.data"):
        assert ds[0] is None and ds[1] is None
    assert [(b.index, b.path.endswith(n)) for b, n in zip(ds.bad_samples, ["cut.png", "text.png"])] == \
        [(0, True), (1, True)]


def test_coco_unknown_category_id(tmp_path, caplog):
    path = _coco(tmp_path, [{"file": "p.png", "image": WHITE, "anns": [{"bbox": [1, 1, 5, 5], "cat": 9}]}])
    with pytest.raises(BadSampleError) as info:
        CocoDocuments(path, image_dir=tmp_path)[0]
    msg = str(info.value)
    assert "annotation id 100" in msg and "category id 9" in msg and "known ids: [1]" in msg
    _assert_skipped(path, tmp_path, caplog, 0, "annotations.json", "category id 9")


def test_coco_size_mismatch_and_annotation_for_unknown_image(tmp_path):
    path = _coco(tmp_path, [{"file": "p.png", "image": np.full((60, 100, 3), 255, np.uint8)}])
    with pytest.raises(BadSampleError, match=r"p\.png: image is 100x60 \(WxH\) but annotations.json says 100x50"):
        CocoDocuments(path, image_dir=tmp_path)[0]
    data = json.loads(path.read_text())
    data["annotations"].append({"id": 555, "image_id": 42, "category_id": 1, "bbox": [0, 0, 1, 1]})
    path.write_text(json.dumps(data))
    with pytest.raises(BadSampleError, match="annotation id 555 refers to image id 42"):
        CocoDocuments(path, image_dir=tmp_path)
    assert [b.index for b in CocoDocuments(path, image_dir=tmp_path, on_bad_sample="skip").bad_samples] == [None]


def test_coco_broken_annotation_file_names_it(tmp_path):
    with pytest.raises(BadSampleError, match="annotation file not found"):
        CocoDocuments(tmp_path / "missing.json")
    half = tmp_path / "half.json"
    half.write_text('{"images": [{"id": 1, "file_')
    with pytest.raises(BadSampleError, match=r"half\.json: annotation file is not valid JSON"):
        CocoDocuments(half)


def test_coco_validate_lists_every_bad_page(tmp_path):
    path = _coco(tmp_path, [{"file": "ok.png", "image": WHITE}, {"file": "gone.png", "image": None},
                            {"file": "blank.png", "image": WHITE, "words": []}])
    bad = CocoDocuments(path, image_dir=tmp_path).validate()
    assert [(b.index, b.path.rsplit("/", 1)[-1]) for b in bad] == [(1, "gone.png"), (2, "blank.png")]


def test_many_boxes_check_clips_and_names_the_first_bad_one():
    from dociq.data.errors import check_boxes_in_page

    ok = check_boxes_in_page([[-0.5, 0, 10, 10], [5, 5, 100.5, 50.2]], (50, 100), "f.json", str)
    np.testing.assert_allclose(ok, [[0, 0, 10, 10], [5, 5, 100, 50]])
    assert ok.dtype == np.float32
    with pytest.raises(BadSampleError, match=r"f\.json: word 2 has a box with negative size"):
        check_boxes_in_page([[0, 0, 1, 1], [0, 0, 1, 1], [5, 5, 2, 9], [0, 0, 500, 1]], (50, 100),
                            "f.json", lambda i: f"word {i}")
