"""COCO mAP (dociq.evaluation.coco_map): perfect and shifted predictions, agreement with pycocotools itself."""
import contextlib
import io
import json

import numpy as np
import pytest
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from dociq.evaluation.coco_map import category_ids_by_name, coco_map

H, W = 120, 160


def _rect(x, y, w, h):
    return [[x, y, x + w, y, x + w, y + h, x, y + h]]


@pytest.fixture
def gt_file(tmp_path):
    """3 pages, 2 categories with objects (boxes 40 or 80 wide, a triangle) and one without."""
    shapes = {  # image id -> [(category, polygon)]
        1: [(1, _rect(10, 10, 40, 30)), (2, _rect(60, 50, 80, 40))],
        2: [(1, _rect(20, 60, 80, 40)), (1, _rect(100, 10, 40, 20))],
        3: [(2, [[30, 20, 90, 20, 60, 80]]), (1, _rect(100, 70, 40, 40))],
    }
    images, anns = [], []
    for image_id, objs in shapes.items():
        images.append({"id": image_id, "file_name": f"{image_id}.png", "width": W, "height": H})
        for cat, poly in objs:
            xy = np.asarray(poly[0], float).reshape(-1, 2)
            x0, y0 = xy.min(0)
            x1, y1 = xy.max(0)
            rle = mask_util.merge(mask_util.frPyObjects(poly, H, W))
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "segmentation": poly,
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float(mask_util.area(rle)), "iscrowd": 0})
    cats = [{"id": 1, "name": "Table"}, {"id": 2, "name": "Figure"}, {"id": 3, "name": "Caption"}]
    path = tmp_path / "gt.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def _as_results(path, dx=0.0, score=1.0):
    """The ground truth as detections, boxes (and masks) moved right by dx * width (IoU (1-dx)/(1+dx))."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(path))
    out = []
    for ann in coco.loadAnns(coco.getAnnIds()):
        x, y, w, h = ann["bbox"]
        shift = int(round(dx * w))
        mask = np.roll(coco.annToMask(ann), shift, axis=1)
        rle = mask_util.encode(np.asfortranarray(mask))
        rle["counts"] = rle["counts"].decode("ascii")
        out.append({"image_id": ann["image_id"], "category_id": ann["category_id"], "score": score,
                    "bbox": [x + shift, y, w, h], "segmentation": rle})
    return out


def test_perfect_predictions_score_one_overall_and_per_class(gt_file):
    scores = coco_map(gt_file, _as_results(gt_file))
    for iou_type in ("bbox", "segm"):
        s = scores[iou_type]
        assert s["AP"] == pytest.approx(1.0) and s["AP50"] == pytest.approx(1.0) and s["AP75"] == pytest.approx(1.0)
        assert s["per_class"]["Table"]["AP"] == pytest.approx(1.0)
        assert s["per_class"]["Figure"]["AP"] == pytest.approx(1.0)
        assert s["per_class"]["Caption"]["AP"] is None          # no ground truth: not a zero
        assert "Average Precision" in s["summary"]
    assert scores["num_results"] == 6


def test_shifted_boxes_match_at_half_but_not_at_three_quarters(gt_file, capsys):
    # dx = 9/40 of the width: IoU = 31/49 = 0.63 for every box
    scores = coco_map(gt_file, _as_results(gt_file, dx=9 / 40), iou_types=("bbox",))
    assert scores["bbox"]["AP50"] == pytest.approx(1.0)
    assert scores["bbox"]["AP75"] == pytest.approx(0.0)
    assert 0.0 < scores["bbox"]["AP"] < 0.5
    assert "segm" not in scores
    assert capsys.readouterr().out == ""                          # pycocotools' prints are captured


def test_numbers_equal_pycocotools_run_directly(gt_file):
    rng = np.random.default_rng(0)
    results = _as_results(gt_file, dx=0.1)[:5] + _as_results(gt_file, dx=0.3)[2:]
    for r in results:
        r["score"] = float(rng.uniform(0.1, 1.0))
    results[0]["category_id"] = 2                                 # one wrong class
    ours = coco_map(gt_file, results)
    for iou_type in ("bbox", "segm"):
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(str(gt_file))
            dets = [dict(r) for r in results]
            if iou_type == "segm":
                dets = [{k: v for k, v in r.items() if k != "bbox"} for r in dets]
            ev = COCOeval(gt, gt.loadRes(dets), iou_type)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        for name, value in zip(("AP", "AP50", "AP75", "APs", "APm", "APl"), ev.stats[:6]):
            expected = None if value < 0 else value
            assert ours[iou_type][name] == pytest.approx(expected), (iou_type, name)
        table = ev.eval["precision"][:, :, 0, 0, -1]                # category id 1 = Table
        assert ours[iou_type]["per_class"]["Table"]["AP"] == pytest.approx(table[table > -1].mean())
    assert 0.0 < ours["bbox"]["AP"] < 1.0


def test_no_results_score_zero_and_bad_results_are_named(gt_file):
    assert coco_map(gt_file, [])["bbox"]["AP"] == 0.0
    good = _as_results(gt_file)
    with pytest.raises(ValueError, match="image_id 99.*not an image of the ground truth"):
        coco_map(gt_file, [dict(good[0], image_id=99)])
    with pytest.raises(ValueError, match="category_id 7.*map class names"):
        coco_map(gt_file, [dict(good[0], category_id=7)])
    with pytest.raises(ValueError, match="no 'segmentation'"):
        coco_map(gt_file, [{k: v for k, v in good[0].items() if k != "segmentation"}])
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        coco_map(gt_file.parent / "missing.json", good)


def test_missing_area_and_iscrowd_are_filled(gt_file, tmp_path):
    data = json.loads(gt_file.read_text())
    for ann in data["annotations"]:
        del ann["area"], ann["iscrowd"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    assert coco_map(bare, _as_results(gt_file))["segm"]["AP"] == pytest.approx(1.0)
    assert category_ids_by_name(bare) == {"table": 1, "figure": 2, "caption": 3}
