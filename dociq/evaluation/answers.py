"""Held-out scores of what a user runs: the `Predictor` (or a baseline with its interface) asked
the held-out prompts page by page, its masks scored at the page's own size.

    dociq eval CKPT --data corpus --corpus data/corpus --split val [--snap] [--baseline detector]

An *answerer* is anything with the Predictor's `set_image(image, words=, word_boxes=)` and
`predict(question=, points=, point_labels=, boxes=) -> (masks bool [Q, H, W], scores [Q])`: the
Predictor with its settings as the user has them, or a baseline that needs no model of ours
(dociq.evaluation.detector_baseline). Every page's prompts are drawn from the page alone (a seed
and its page id), so each answerer is asked exactly the same prompts:

- `question`: up to `max_questions` of the page's questions (text only), target its mask;
- `box`: the tight box of each of those questions' targets (with `box_margin` px more on every
  side, clipped to the page: a box drawn loose, as a user's hand draws it);
- `question_no_ocr`: the questions with the page's words withheld (how much comes from reading);
- `box_region`: the box of one annotated region (`dociq.data.scoring.regions_as_prompts`; as loose as
  `box`), target that region;
- `point_region`: one positive click inside each of those regions, target that region;
  `point_region_oracle` (a Predictor only) scores the best of its three candidates (SAM's oracle).

`compare_snap` scores a Predictor's sets once per snap mode (`<set>_raw`: the decoder's masks,
`<set>_snap`: snapped to the words, `<set>_blocks`: completed to text blocks), besides `<set>`,
its own setting. Masks are compared with their targets at the page's resolution — what the user
gets back — so models of any input size compare on the same frame. The training task's path
(`dociq.training.heldout.evaluate`: batched, in the model's input frame, with the diagnostics that need the model's
internals) stays for the validation loop.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import torch

from dociq.data.collate import choose_questions, sample_points
from dociq.data.masks import mask_boxes
from dociq.data.ocr import OcrWords
from dociq.data.schema import QUESTION_KINDS, Page
from dociq.data.scoring import (REGION_SIZES, VAL_SEED, MeanByName, SegmentationMetrics, layout_class,
                                metric_results, per_prompt_iou_dice, regions_as_prompts)
from dociq.io.track import track

ANSWER_SETS = ("question", "box", "question_no_ocr", "box_region", "point_region")
# Predictor(snap=...) modes and the suffix their scores carry.
SNAP_SUFFIXES = {None: "raw", "words": "snap", "blocks": "blocks"}


def word_inputs(page: Page) -> dict[str, Any]:
    """A page's words as an answerer's `set_image(image, **...)` takes them: with the OCR's
    confidences where the page has them (a scan's), so the answerer can tell the words it doubts."""
    if page.word_confidences is None:
        return {"words": list(page.words), "word_boxes": np.asarray(page.word_boxes)}
    return {"words": OcrWords(list(page.words), np.asarray(page.word_boxes), page.size, page.word_confidences)}


def page_seed(page: Page, seed: int) -> int:
    """The seed of one page's prompts: the same page gets the same prompts, in any order or batch."""
    return seed + zlib.crc32(str(page.meta.get("page_id", "")).encode())


def tight_boxes(masks: Sequence[np.ndarray]) -> np.ndarray:
    """float32 [Q, 4] x0, y0, x1, y1 (x1, y1 exclusive) of each mask; zeros for an empty one.
    A pixel counts when it is > 0.5 (bool masks as they are), as the collator's prompts do."""
    if not len(masks):
        return np.zeros((0, 4), np.float32)
    return mask_boxes(np.stack([np.asarray(m) > 0.5 for m in masks]))


def loose_boxes(masks: Sequence[np.ndarray], margin: float) -> np.ndarray:
    """`tight_boxes` grown by `margin` px on every side, within the masks' page."""
    boxes = tight_boxes(masks)
    if not margin or not len(boxes):
        return boxes
    h, w = np.asarray(masks[0]).shape[-2:]
    return np.clip(boxes + np.float32(margin) * np.array([-1, -1, 1, 1], np.float32), 0, [w, h, w, h]).astype(np.float32)


def one_click_each(masks: Sequence[np.ndarray], generator: torch.Generator) -> np.ndarray:
    """float [Q, 1, 2]: one pixel centre drawn uniformly inside each mask."""
    return np.stack([sample_points(torch.from_numpy(m), 1, generator).numpy() for m in masks]).astype(np.float32)


def is_predictor(answerer: Any) -> bool:
    return hasattr(answerer, "snapping") and hasattr(answerer, "predict_masks")


class _Scores:
    """The metrics of every scored set, created as sets appear."""

    def __init__(self) -> None:
        self.sets: dict[str, SegmentationMetrics] = {}
        self.by_class = MeanByName()

    def add(self, name: str, masks: np.ndarray, targets: Sequence[np.ndarray], kinds: Sequence[str]) -> torch.Tensor:
        if name not in self.sets:
            region = name.startswith(("box_region", "point_region"))
            self.sets[name] = SegmentationMetrics(kinds=tuple(n for n, _ in REGION_SIZES) if region else QUESTION_KINDS)
        pred = torch.from_numpy(np.asarray(masks, dtype=bool))
        target = torch.from_numpy(np.stack(targets).astype(bool))
        iou, _ = self.sets[name].update(pred, target, list(kinds))
        return iou

    def results(self) -> dict:
        return metric_results(self.sets, self.by_class)


def _ask(answerer: Any, modes: Sequence[str | None], **prompt) -> dict[str | None, np.ndarray]:
    """The answerer's masks bool [Q, H, W] for one batch of prompts, per snap mode (key None:
    the answerer as it is set; other keys only for a Predictor)."""
    if not modes:
        return {None: answerer.predict(**prompt)[0]}
    out = {}
    for mode in modes:
        with answerer.snapping(mode):
            out[SNAP_SUFFIXES[mode]] = answerer.predict(**prompt)[0]
    out[None] = out[SNAP_SUFFIXES[answerer.snap]] if answerer.snap in modes else answerer.predict(**prompt)[0]
    return out


def _oracle(answerer: Any, points: np.ndarray, targets: Sequence[np.ndarray]) -> np.ndarray:
    """Per click, of the Predictor's three candidate masks the one closest to its target."""
    candidates = answerer.predict(points=points, point_labels=np.ones(points.shape[:2], np.int64),
                                  multimask_output=True)[0]                   # [Q, 3, H, W]
    target = torch.from_numpy(np.stack(targets).astype(bool))
    ious = torch.stack([per_prompt_iou_dice(torch.from_numpy(candidates[:, c]), target)[0]
                        for c in range(candidates.shape[1])], 1)
    return candidates[np.arange(len(candidates)), ious.argmax(1).numpy()]


@torch.no_grad()
def evaluate_answers(answerer: Any, pages: Sequence[Page], max_pages: int | None = None,
                     max_questions: int = 8, seed: int = VAL_SEED, prompt_sets: Sequence[str] = ANSWER_SETS,
                     compare_snap: bool = False, box_margin: float = 0.0) -> dict:
    """{prompt set: {miou, dice, miou_<kind>, ..., count_<kind>}} of `answerer` on the first
    `max_pages` of `pages` (None: all), and `question_layout_by_class`; see the module doc."""
    unknown = sorted(set(prompt_sets) - set(ANSWER_SETS))
    if unknown:
        raise ValueError(f"unknown prompt sets {unknown}: choose from {ANSWER_SETS}")
    predictor = is_predictor(answerer)
    if compare_snap and not predictor:
        raise ValueError(f"compare_snap compares Predictor(snap=...) modes; {type(answerer).__name__} has none")
    modes = tuple(SNAP_SUFFIXES) if compare_snap else ()
    scores = _Scores()
    count = len(pages) if max_pages is None else min(max_pages, len(pages))
    for i in track(range(count), desc="held-out pages"):
        page = pages[i]
        if page is None:                                   # a bad page, skipped and listed by its data set
            continue
        g = torch.Generator().manual_seed(page_seed(page, seed))
        questions = [page.questions[k] for k in choose_questions(page, max_questions, g)]
        regions = regions_as_prompts(page, max_questions, seed).questions
        answerer.set_image(page.image, **word_inputs(page))
        asks = []
        if questions:
            q_targets, q_kinds = [q.mask for q in questions], [q.kind for q in questions]
            asks += [("question", dict(question=[q.text for q in questions]), q_targets, q_kinds),
                     ("box", dict(boxes=loose_boxes(q_targets, box_margin)), q_targets, q_kinds)]
        if regions:
            r_targets, r_kinds = [r.mask for r in regions], [r.kind for r in regions]
            clicks = one_click_each(r_targets, g)
            asks += [("box_region", dict(boxes=loose_boxes(r_targets, box_margin)), r_targets, r_kinds),
                     ("point_region", dict(points=clicks, point_labels=np.ones(clicks.shape[:2], np.int64)),
                      r_targets, r_kinds)]
        for name, prompt, targets, kinds in asks:
            if name not in prompt_sets:
                continue
            for suffix, masks in _ask(answerer, modes, **prompt).items():
                iou = scores.add(name if suffix is None else f"{name}_{suffix}", masks, targets, kinds)
                if name == "question" and suffix is None:
                    scores.by_class.add(iou, [layout_class(page, q) for q in questions])
            if name == "point_region" and predictor:
                scores.add("point_region_oracle", _oracle(answerer, prompt["points"], targets), targets, kinds)
        if "question_no_ocr" in prompt_sets and questions:
            # last: it replaces the page's embedding with one made without the words
            answerer.set_image(page.image, words=[], word_boxes=np.zeros((0, 4), np.float32))
            masks = answerer.predict(question=[q.text for q in questions])[0]
            scores.add("question_no_ocr", masks, [q.mask for q in questions], [q.kind for q in questions])
    return scores.results()
