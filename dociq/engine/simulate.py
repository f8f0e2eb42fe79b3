"""A simulated annotator: how many clicks does the current model need per mask?

SAM measured its data engine by clicks per mask falling round over round. Without people at hand,
an annotator is simulated on pages whose ground truth is known (synthetic pages from a seed the
model never trained on):

    results = annotate_page(predictor, store, page_id, page)   # page: a dociq.data.schema.Page

For each question of the page the annotator
  1. asks the question (0 clicks) and looks at the model's mask;
  2. while IoU with the truth < `iou_target` and fewer than `max_clicks` clicks were made: clicks at
     the centre of the largest error region (the pixel farthest from its border — SAM's and RITM's
     evaluation protocol), positive where the model missed, negative where it spilled; the model
     answers with the question, every click so far and its previous low-res logits as `mask_input`;
  3. accepts the model's mask when IoU >= `iou_target` (the saved mask is the model's, as in SAM's
     assisted-manual stage: training data carries the annotator's tolerance), otherwise "draws" the
     region by hand: the ground-truth mask is saved with clicks = max_clicks and `drawn` set.

Every target becomes an accepted annotation in the store, with its click count.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
from scipy import ndimage

from dociq.data.schema import Page

IOU_TARGET = 0.85
MAX_CLICKS = 10
AUTHOR = "simulated"


class InteractivePredictor(Protocol):
    """What the annotator needs of `dociq.predict.Predictor` (tests pass a scripted one)."""

    def set_image(self, image: np.ndarray, words=None, word_boxes=None) -> None: ...

    def predict_masks(self, question=None, points=None, point_labels=None, boxes=None,
                      mask_input=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


@dataclass
class TargetResult:
    """One annotated target: what it cost and how good the model's last mask was."""
    page_id: str
    question: str
    kind: str
    clicks: int            # corrective clicks (the question itself is free)
    iou: float             # IoU of the model's last mask with the truth
    first_iou: float       # IoU of the answer to the question alone (0 clicks)
    drawn: bool            # the model never reached iou_target: the annotator drew the mask
    annotation_id: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


def mask_iou(pred: np.ndarray, target: np.ndarray) -> float:
    union = np.logical_or(pred, target).sum()
    return float(np.logical_and(pred, target).sum() / union) if union else 1.0


def next_click(pred: np.ndarray, target: np.ndarray) -> tuple[float, float, int] | None:
    """(x, y, label) at the centre of the largest error region, or None when there is no error.

    label 1 (positive) when that region was missed (in the truth, not in the prediction), 0 when it
    was spilled. The centre is the pixel farthest from the region's border (distance transform), so
    the click is never on an ambiguous edge pixel."""
    pred, target = np.asarray(pred, bool), np.asarray(target, bool)
    best = None   # (area, label, component mask)
    for label, error in ((1, target & ~pred), (0, pred & ~target)):
        if not error.any():
            continue
        components, count = ndimage.label(error)
        areas = np.bincount(components.ravel(), minlength=count + 1)[1:]
        k = int(areas.argmax())
        if best is None or areas[k] > best[0]:
            best = (int(areas[k]), label, components == k + 1)
    if best is None:
        return None
    _, label, region = best
    # pad so the page edge counts as the region's border too
    distance = ndimage.distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]
    y, x = np.unravel_index(int(distance.argmax()), distance.shape)
    return float(x) + 0.5, float(y) + 0.5, label


def annotate_target(predictor: InteractivePredictor, question: str, target: np.ndarray,
                    iou_target: float = IOU_TARGET, max_clicks: int = MAX_CLICKS
                    ) -> tuple[np.ndarray, int, float, float, bool]:
    """Run the click loop on the page set in `predictor`.
    -> (mask to save, clicks, final model IoU, first IoU, drawn)."""
    masks, _, low_res = predictor.predict_masks(question=question)
    mask = np.asarray(masks[0], bool)
    first = iou = mask_iou(mask, target)
    points: list[tuple[float, float]] = []
    labels: list[int] = []
    while iou < iou_target and len(points) < max_clicks:
        click = next_click(mask, target)
        if click is None:
            break
        points.append(click[:2])
        labels.append(click[2])
        masks, _, low_res = predictor.predict_masks(question=question, points=np.asarray(points, np.float32),
                                                    point_labels=np.asarray(labels, np.int64),
                                                    mask_input=np.asarray(low_res)[:1, :1])
        mask = np.asarray(masks[0], bool)
        iou = mask_iou(mask, target)
    drawn = iou < iou_target
    return (np.asarray(target, bool).copy() if drawn else mask), len(points), iou, first, drawn


def annotate_page(predictor: InteractivePredictor, store, page_id: str, page: Page,
                  iou_target: float = IOU_TARGET, max_clicks: int = MAX_CLICKS,
                  author: str = AUTHOR, save: bool = True) -> list[TargetResult]:
    """Annotate every question of `page` (the ground truth of the store's page `page_id`) with the
    model in `predictor`; save each as an accepted annotation with its clicks (unless save=False)."""
    image = store.page_image(page_id)
    if image.shape[:2] != page.size:
        raise ValueError(f"page {page_id} is {image.shape[:2]} in the store but its ground truth is "
                         f"{page.size}: pass the Page the store's page was made from")
    words, boxes = store.page_words(page_id)
    predictor.set_image(image, words=list(words), word_boxes=boxes)
    out = []
    for q in page.questions:
        if not q.mask.any():
            continue   # nothing to draw: an annotator would skip the question
        start = time.perf_counter()
        mask, clicks, iou, first, drawn = annotate_target(predictor, q.text, q.mask, iou_target, max_clicks)
        result = TargetResult(page_id, q.text, q.kind, clicks, iou, first, drawn)
        if save:
            result.annotation_id = store.save_annotation(
                page_id, mask, q.text, status="accepted", clicks=clicks, kind=q.kind, author=author,
                seconds=time.perf_counter() - start)
        out.append(result)
    return out


def save_ground_truth(store, page_id: str, page: Page, author: str = "ground-truth") -> list[int]:
    """Store every non-empty question of `page` as accepted with its true mask (clicks=0): the
    held-out pages' reference annotations, which rounds are judged on."""
    return [store.save_annotation(page_id, q.mask, q.text, status="accepted", clicks=0, kind=q.kind, author=author)
            for q in page.questions if q.mask.any()]


def summarise(results: list[TargetResult]) -> dict:
    """Mean clicks per mask, the share drawn by hand, mean first/final IoU."""
    if not results:
        return {"masks": 0, "clicks_per_mask": None, "drawn_fraction": None, "first_iou": None, "final_iou": None}
    return {"masks": len(results),
            "clicks_per_mask": float(np.mean([r.clicks for r in results])),
            "drawn_fraction": float(np.mean([r.drawn for r in results])),
            "first_iou": float(np.mean([r.first_iou for r in results])),
            "final_iou": float(np.mean([r.iou for r in results]))}
