"""COCO mAP of layout detections: pycocotools' COCOeval, bbox and segm, overall and per class.

    from dociq.evaluation.coco_map import coco_map
    scores = coco_map("DocLayNet/COCO/val.json", results)        # results: COCO result dicts
    scores["segm"]["AP"], scores["segm"]["AP50"], scores["bbox"]["per_class"]["Table"]["AP"]

The field's metric for DocLayNet / PubLayNet: AP averaged over IoU 0.50:0.05:0.95 (`AP`), at 0.5
(`AP50`) and 0.75 (`AP75`), by object size (`APs`, `APm`, `APl`), with at most `max_dets`
detections per page (COCO's 100). Per-class AP is read from `COCOeval.eval["precision"]` as
detectron2's COCOEvaluator does. Values are fractions in [0, 1] (not x100); a class without ground
truth on the evaluated pages has AP None (COCOeval's -1). pycocotools' prints are captured and
returned as `summary` text instead of reaching stdout.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

IOU_TYPES = ("bbox", "segm")
# COCOeval.stats order for bbox/segm
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def load_coco(gt: str | Path | COCO) -> COCO:
    """A pycocotools COCO index of the ground truth (a path or an existing COCO, used as given).

    Annotations without `iscrowd` get 0 and without `area` get their mask's (or box's) area:
    COCOeval needs both, and hand-written or converted files often leave them out."""
    if isinstance(gt, COCO):
        return gt
    path = Path(gt)
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotation file {path} does not exist: pass the ground-truth JSON "
                                "(e.g. DocLayNet's COCO/val.json or make_synthetic.py's annotations.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"COCO annotation file {path} is not valid JSON ({err}): re-export it") from err
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise ValueError(f"COCO annotation file {path} has no '{key}' list: COCO mAP needs instance "
                             "annotations {'images', 'annotations', 'categories'}")
    images = {img["id"]: img for img in data["images"]}
    for ann in data["annotations"]:
        ann.setdefault("iscrowd", 0)
        if "area" not in ann:
            ann["area"] = _annotation_area(ann, images.get(ann.get("image_id"), {}), path)
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _annotation_area(ann: dict, image: dict, path: Path) -> float:
    segm = ann.get("segmentation")
    if segm and "height" in image and "width" in image:
        h, w = int(image["height"]), int(image["width"])
        if isinstance(segm, list):
            rle = mask_util.merge(mask_util.frPyObjects(segm, h, w))
        elif isinstance(segm.get("counts"), list):
            rle = mask_util.frPyObjects(segm, h, w)
        else:
            rle = {"size": segm["size"], "counts": segm["counts"]}
        return float(mask_util.area(rle))
    if "bbox" in ann:
        return float(ann["bbox"][2] * ann["bbox"][3])
    raise ValueError(f"{path}: annotation {ann.get('id')} has neither 'area', 'segmentation' nor 'bbox'")


def check_results(coco: COCO, results: Sequence[dict], iou_types: Iterable[str]) -> None:
    """Fail before pycocotools does (its asserts name nothing): every result must belong to an image
    and a category of the ground truth and carry what each IoU type needs."""
    image_ids, category_ids = set(coco.getImgIds()), set(coco.getCatIds())
    need = {"bbox": "bbox", "segm": "segmentation"}
    for i, r in enumerate(results):
        for key in ("image_id", "category_id", "score"):
            if key not in r:
                raise ValueError(f"result {i} has no '{key}': each result needs image_id, category_id, score "
                                 "and bbox [x, y, w, h] and/or segmentation (RLE)")
        if r["image_id"] not in image_ids:
            raise ValueError(f"result {i} has image_id {r['image_id']!r}, which is not an image of the "
                             "ground truth: use the annotation file's image ids")
        if r["category_id"] not in category_ids:
            raise ValueError(f"result {i} has category_id {r['category_id']!r}, which is not a category of the "
                             f"ground truth ({sorted(category_ids)}): map class names to the file's ids")
        for iou_type in iou_types:
            if need[iou_type] not in r:
                raise ValueError(f"result {i} has no '{need[iou_type]}', needed for iou_type {iou_type!r}")


def coco_map(gt: str | Path | COCO, results: Sequence[dict], iou_types: Sequence[str] = IOU_TYPES,
             max_dets: int = 100, image_ids: Sequence[Any] | None = None) -> dict:
    """{iou_type: {AP, AP50, AP75, APs, APm, APl, AR1, AR10, AR100, ..., per_class: {name: {AP, AP50,
    AP75}}, summary}, "num_results": n} for COCO result dicts against the ground truth `gt`.

    image_ids: evaluate only these pages (default: every page of the ground truth). Pages without
    results count as pages where nothing was found."""
    unknown = [t for t in iou_types if t not in IOU_TYPES]
    if unknown:
        raise ValueError(f"iou_types {unknown} not supported: use {IOU_TYPES}")
    coco_gt = load_coco(gt)
    check_results(coco_gt, results, iou_types)
    names = {c["id"]: c["name"] for c in coco_gt.loadCats(coco_gt.getCatIds())}
    out: dict[str, Any] = {"num_results": len(results)}
    for iou_type in iou_types:
        # loadRes writes into the result dicts (area, id, a box polygon): give it copies
        dets = copy.deepcopy(list(results))
        if iou_type == "segm":
            for d in dets:   # loadRes takes the box branch when a box is present: keep the mask's own area
                d.pop("bbox", None)
        summary = io.StringIO()
        with contextlib.redirect_stdout(summary):
            coco_dt = coco_gt.loadRes(dets) if dets else _empty_results(coco_gt)
            evaluator = COCOeval(coco_gt, coco_dt, iou_type)
            evaluator.params.maxDets = [1, 10, max_dets]
            if image_ids is not None:
                evaluator.params.imgIds = list(image_ids)
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        stats = {name: _value(v) for name, v in zip(STAT_NAMES, evaluator.stats)}
        stats["per_class"] = per_class_ap(evaluator, names)
        stats["summary"] = summary.getvalue()
        out[iou_type] = stats
    return out


def _empty_results(coco_gt: COCO) -> COCO:
    """A result set with no detections (pycocotools' loadRes refuses an empty list)."""
    coco_dt = COCO()
    coco_dt.dataset = {"images": list(coco_gt.dataset["images"]), "categories":
                       copy.deepcopy(coco_gt.dataset["categories"]), "annotations": []}
    coco_dt.createIndex()
    return coco_dt


def per_class_ap(evaluator: COCOeval, names: dict[Any, str]) -> dict[str, dict[str, float | None]]:
    """{class name: {AP, AP50, AP75}} from the accumulated precision [T, R, K, A, M] (all areas,
    the largest maxDets), as detectron2 computes it; None for a class without ground truth."""
    precision = evaluator.eval["precision"]
    iou_thrs = evaluator.params.iouThrs
    out = {}
    for k, cat_id in enumerate(evaluator.params.catIds):
        p = precision[:, :, k, 0, -1]
        row = {"AP": _mean_valid(p)}
        for name, thr in (("AP50", 0.5), ("AP75", 0.75)):
            t = int(np.argmin(np.abs(iou_thrs - thr)))
            row[name] = _mean_valid(p[t])
        out[names[cat_id]] = row
    return out


def _mean_valid(p: np.ndarray) -> float | None:
    valid = p[p > -1]
    return float(valid.mean()) if valid.size else None


def _value(v: float) -> float | None:
    return None if v < 0 else float(v)


def category_ids_by_name(gt: str | Path | COCO) -> dict[str, Any]:
    """lower-cased category name -> id of the ground truth (class names match case-insensitively)."""
    coco = load_coco(gt)
    return {c["name"].lower(): c["id"] for c in coco.loadCats(coco.getCatIds())}
