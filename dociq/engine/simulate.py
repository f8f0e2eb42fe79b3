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

Every target becomes an accepted annotation in the store, with its click count. The targets of a
page are corrected together: one model call per click round for all targets not yet done (the
model is the same; only the wall time differs from a one-by-one annotator).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
from scipy import ndimage

from dociq.data.masks import mask_iou
from dociq.data.schema import Page

IOU_TARGET = 0.85
MAX_CLICKS = 10
AUTHOR = "simulated"


class InteractivePredictor(Protocol):
    """What the annotator needs of `dociq.inference.predictor.Predictor` (tests pass a scripted one)."""

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
    ious: list[float] = field(default_factory=list)   # IoU after 0, 1, ... clicks

    def to_json(self) -> dict:
        return asdict(self)


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


def annotate_targets(predictor: InteractivePredictor, questions: list[str], targets: list[np.ndarray],
                     iou_target: float = IOU_TARGET, max_clicks: int = MAX_CLICKS) -> list[dict]:
    """Run the click loop for every target of the page set in `predictor`, all targets still being
    corrected in one model call per click (each has had the same number of clicks, so their point
    sets stack to [Q, n, 2]). -> per target {"mask" to save, "clicks", "ious" (IoU after 0, 1, ..
    clicks), "drawn"}."""
    targets = [np.asarray(t, bool) for t in targets]
    masks, _, low_res = predictor.predict_masks(question=list(questions))
    state = [{"mask": np.asarray(m, bool), "low": np.asarray(low_res)[i:i + 1, :1], "points": [], "labels": [],
              "ious": [mask_iou(np.asarray(m, bool), t)]} for i, (m, t) in enumerate(zip(masks, targets))]
    while True:
        active = []
        for i, (s, t) in enumerate(zip(state, targets)):
            if s["ious"][-1] >= iou_target or len(s["points"]) >= max_clicks:
                continue
            click = next_click(s["mask"], t)
            if click is None:
                continue
            s["points"].append(click[:2])
            s["labels"].append(click[2])
            active.append(i)
        if not active:
            break
        masks, _, low_res = predictor.predict_masks(
            question=[questions[i] for i in active],
            points=np.asarray([state[i]["points"] for i in active], np.float32),
            point_labels=np.asarray([state[i]["labels"] for i in active], np.int64),
            mask_input=np.concatenate([state[i]["low"] for i in active]))
        for j, i in enumerate(active):
            s = state[i]
            s["mask"], s["low"] = np.asarray(masks[j], bool), np.asarray(low_res)[j:j + 1, :1]
            s["ious"].append(mask_iou(s["mask"], targets[i]))
    out = []
    for s, t in zip(state, targets):
        drawn = s["ious"][-1] < iou_target
        out.append({"mask": t.copy() if drawn else s["mask"], "clicks": len(s["points"]), "ious": s["ious"],
                    "drawn": drawn})
    return out


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
    questions = [q for q in page.questions if q.mask.any()]   # nothing to draw: an annotator skips it
    if not questions:
        return []
    start = time.perf_counter()
    done = annotate_targets(predictor, [q.text for q in questions], [q.mask for q in questions],
                            iou_target, max_clicks)
    seconds = (time.perf_counter() - start) / len(questions)   # model time, shared out
    out = []
    for q, d in zip(questions, done):
        result = TargetResult(page_id, q.text, q.kind, d["clicks"], d["ious"][-1], d["ious"][0], d["drawn"],
                              ious=d["ious"])
        if save:
            result.annotation_id = store.save_annotation(
                page_id, d["mask"], q.text, status="accepted", clicks=d["clicks"], kind=q.kind, author=author,
                seconds=seconds)
        out.append(result)
    return out


def save_ground_truth(store, page_id: str, page: Page, author: str = "ground-truth") -> list[int]:
    """Store every non-empty question of `page` as accepted with its true mask (clicks=0): the
    held-out pages' reference annotations, which rounds are judged on."""
    return [store.save_annotation(page_id, q.mask, q.text, status="accepted", clicks=0, kind=q.kind, author=author)
            for q in page.questions if q.mask.any()]


def clicks_to(result: TargetResult, threshold: float, max_clicks: int = MAX_CLICKS) -> int:
    """Clicks the model needed to reach `threshold` (<= the annotator's target; the loop ran at
    least that far), `max_clicks` when it never did (NoC@threshold, capped)."""
    return next((n for n, iou in enumerate(result.ious) if iou >= threshold), max_clicks)


def summarise(results: list[TargetResult], thresholds: tuple[float, ...] = (0.75,)) -> dict:
    """Mean clicks per mask, the share drawn by hand, mean first/final IoU, and the mean clicks to
    reach lower IoU thresholds (`noc@75`: the interactive-segmentation NoC metric, capped)."""
    nocs = {f"noc@{round(100 * t)}": t for t in thresholds}
    if not results:
        return {"masks": 0, "clicks_per_mask": None, "drawn_fraction": None, "first_iou": None,
                "final_iou": None, **{k: None for k in nocs}, "per_kind": {}}
    return {"masks": len(results),
            "clicks_per_mask": float(np.mean([r.clicks for r in results])),
            "drawn_fraction": float(np.mean([r.drawn for r in results])),
            "first_iou": float(np.mean([r.first_iou for r in results])),
            "final_iou": float(np.mean([r.iou for r in results])),
            **{k: float(np.mean([clicks_to(r, t) for r in results])) for k, t in nocs.items()},
            "per_kind": {kind: {"masks": len(rs), "clicks_per_mask": float(np.mean([r.clicks for r in rs])),
                                "first_iou": float(np.mean([r.first_iou for r in rs]))}
                         for kind in sorted({r.kind for r in results})
                         for rs in [[r for r in results if r.kind == kind]]}}
