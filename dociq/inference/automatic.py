"""Segment everything on a page: SAM's automatic mask generator for documents, plus a layout class
per region.

    from dociq.inference.automatic import PageSegmenter
    from dociq.inference.predictor import Predictor
    segmenter = PageSegmenter(Predictor.from_checkpoint(CKPT))
    regions = segmenter.segment("page.png", ocr="tesseract")     # or words=..., word_boxes=...
    results = to_coco_results(regions, image_id=1, category_ids={"table": 1, "figure": 2})

    dociq segment-page CKPT page.png --out overlay.png --coco-json regions.json [--words words.json]
    dociq segment-page CKPT --pdf paper.pdf --page 3 --out overlay.png       # pages from 1 (dociq/cli/segment_page.py)

The overlay of the regions is dociq.inference.overlay.draw_overlay; masks are kept as RLE with dociq.io.rle.

How (segment_anything/automatic_mask_generator.py, rewritten for pages):
1. seeds (`seeds`, default all three): "grid", a `points_per_side`² grid of clicks; "ocr_lines",
   one click per OCR text line (words grouped into lines by vertical overlap, split at wide gaps
   such as column gutters), on the middle word of the line; "class_boxes", the box of every part
   of every class question's answer (step 5) as a box prompt. The fine-tuned models of this
   repository answer single clicks poorly (predicted IoU ~0.25) and boxes well, so on them the
   class boxes find nearly all regions (docs/automatic.md has the numbers);
2. the page (image + OCR words) is embedded once; the seeds are decoded `points_per_batch` at a
   time as single positive clicks, with the decoder's 3 multimask outputs (all 3 kept, or the one
   with the highest predicted IoU when `multimask="best"`), seed boxes as box prompts (one mask);
3. each candidate must pass `pred_iou_thresh` (the IoU head) and `stability_score_thresh` (IoU of
   the masks thresholded at logit +offset and -offset, SAM's stability score) and cover at least
   `min_region_area` pixels; candidates are kept as RLE until the end;
4. duplicates go by box NMS (`nms`, IoU `box_nms_thresh`, ranked by predicted IoU);
5. classify: the model is asked each layout class's question ("all paragraphs", "segment all
   tables", ... — the phrasings it was fine-tuned on, dociq.data.synthetic.questions); the
   answer is split into connected parts (the instances) and each region takes the class whose
   part it overlaps best (mask IoU), if that IoU reaches `min_class_iou`, else "region".
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import ndimage

from dociq.data.masks import mask_box, mask_boxes, mask_iou_matrix
from dociq.data.schema import REGION_CLASSES
from dociq.data.synthetic.questions import LAYOUT_PHRASES
from dociq.io.rle import decode_rle, encode_rle
from dociq.data.text_blocks import block_boxes, line_points, page_blocks
from dociq.models.word_snap import snap_to_words

log = logging.getLogger(__name__)

SEEDS = ("grid", "ocr_lines", "ocr_blocks", "class_boxes")
# Text regions from the OCR blocks, figures and other regions without text from the class answers:
# on held-out real and synthetic pages this beats SAM's grid + line clicks (docs/automatic.md).
DEFAULT_SEEDS = ("ocr_blocks", "class_boxes")
# layout class -> the question asked for it: the first plural phrasing the model was trained on
LAYOUT_QUESTIONS: dict[str, str] = {name: plural[0] for name, (_singular, plural) in LAYOUT_PHRASES.items()}
UNCLASSIFIED = "region"
# With word blocks as the text regions, another seed's region is kept only when at most this share
# of it is text (figures and stamps, even with a few labels inside).
MAX_TEXT_SHARE = 0.5


@dataclass
class SegmentedRegion:
    """One region found on the page."""
    mask: np.ndarray                  # bool [H, W] at the page's size
    box: np.ndarray                   # float32 [4] x0, y0, x1, y1 pixels (x1, y1 exclusive)
    score: float                      # the predicted IoU of the mask, clipped to [0, 1] (a word block: its class probability)
    stability: float                  # SAM's stability score of the mask's logits
    category: str = UNCLASSIFIED      # layout class, or "region" when no class answer matches
    category_score: float = 0.0       # overlap with the class answer, or the words' class probability
    seed: str = "grid"                # "grid", "ocr_lines", "ocr_blocks" or "class_boxes": which seed found it
    point: tuple[float, float] = (0.0, 0.0)   # the seed click (or seed box centre), page pixels (x, y)

    @property
    def area(self) -> int:
        return int(self.mask.sum())


# ---- seeds -------------------------------------------------------------------------------------

def grid_points(points_per_side: int, size: tuple[int, int]) -> np.ndarray:
    """float [n*n, 2] pixel (x, y): cell centres of an n x n grid over the page (SAM's build_point_grid)."""
    if points_per_side < 1:
        raise ValueError(f"points_per_side={points_per_side}: need at least 1 point per side")
    h, w = size
    centres = (np.arange(points_per_side) + 0.5) / points_per_side
    xs, ys = np.meshgrid(centres * w, centres * h)
    return np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float32)


# ---- mask quality, boxes, NMS ------------------------------------------------------------------

def stability_score(logits: np.ndarray, threshold: float = 0.0, offset: float = 1.0) -> np.ndarray:
    """[..., H, W] logits -> float32 [...]: IoU of the masks at `threshold + offset` and
    `threshold - offset` (the first lies inside the second, so IoU = area ratio; SAM's
    calculate_stability_score). An empty low-threshold mask scores 0."""
    logits = np.asarray(logits)
    inner = np.count_nonzero(logits > threshold + offset, axis=(-2, -1))
    outer = np.count_nonzero(logits > threshold - offset, axis=(-2, -1))
    return np.where(outer > 0, inner / np.maximum(outer, 1), 0.0).astype(np.float32)


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """float [K]: IoU of one box x0, y0, x1, y1 with each of `boxes` [K, 4]."""
    w = (np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])).clip(min=0)
    h = (np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])).clip(min=0)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """int64 indices of the boxes kept by class-agnostic greedy NMS, best score first (SAM's box
    dedup, as torchvision's `nms`: a box goes when its IoU with a kept, better box exceeds the threshold)."""
    boxes, scores = np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64).reshape(-1)
    suppressed = np.zeros(len(boxes), dtype=bool)
    keep = []
    for i in np.argsort(-scores, kind="stable"):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= box_iou(boxes[i], boxes) > iou_threshold
    return np.asarray(keep, dtype=np.int64)


def remove_small_regions(mask: np.ndarray, min_area: int) -> tuple[np.ndarray, bool]:
    """Fill holes and drop islands smaller than `min_area` pixels (8-connected; SAM's
    remove_small_regions, with scipy instead of OpenCV). The largest island stays even when it is
    small. Returns the mask and whether it changed.

    Only the mask's box (with a one-pixel margin) is labelled: a hole lies inside it, and the
    background that reaches the margin continues outside the box, so it is never a hole."""
    box = mask_box(mask)
    if box is None:
        return mask.copy(), False
    x0, y0, x1, y1 = box.astype(int).tolist()
    h, w = mask.shape
    top, bottom, left, right = y0 > 0, y1 < h, x0 > 0, x1 < w      # sides with a margin
    y0, y1, x0, x1 = y0 - top, y1 + bottom, x0 - left, x1 + right
    crop = mask[y0:y1, x0:x1].copy()
    structure = np.ones((3, 3), dtype=bool)
    holes, count = ndimage.label(~crop, structure=structure)
    if count:
        sizes = np.bincount(holes.ravel(), minlength=count + 1)
        margin = np.zeros_like(crop)
        margin[0, :], margin[-1, :] = top, bottom
        margin[:, 0] |= left
        margin[:, -1] |= right
        small = np.setdiff1d(np.nonzero(sizes < min_area)[0], np.unique(holes[margin]))
        small = small[small > 0]
        crop |= np.isin(holes, small)
    islands, count = ndimage.label(crop, structure=structure)
    if count > 1:
        sizes = np.bincount(islands.ravel(), minlength=count + 1)
        sizes[0] = 0
        drop = [k for k in range(1, count + 1) if sizes[k] < min_area and k != int(sizes.argmax())]
        crop &= ~np.isin(islands, drop)
    out = mask.copy()
    changed = bool((out[y0:y1, x0:x1] != crop).any())
    out[y0:y1, x0:x1] = crop
    return out, changed


def instance_parts(mask: np.ndarray, min_area: int = 1) -> np.ndarray:
    """bool [H, W] union mask (e.g. every table of the page) -> bool [K, H, W] its connected parts
    of at least `min_area` pixels (8-connected)."""
    labels, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if count == 0:
        return np.zeros((0, *mask.shape), dtype=bool)
    areas = np.bincount(labels.ravel(), minlength=count + 1)
    keep = [k for k in range(1, count + 1) if areas[k] >= min_area]
    return labels[None] == np.asarray(keep, dtype=labels.dtype).reshape(-1, 1, 1)


def part_boxes(answers: Iterable[np.ndarray], min_area: int = 1) -> np.ndarray:
    """float [P, 4] pixel boxes x0, y0, x1, y1 (exclusive) of every connected part of every answer."""
    out = []
    for answer in answers:
        box = mask_box(answer)                    # labelled inside the answer's box: most answers are small
        if box is None:
            continue
        x0, y0, x1, y1 = box.astype(int).tolist()
        labels, _count = ndimage.label(answer[y0:y1, x0:x1], structure=np.ones((3, 3), dtype=bool))
        for k, (rows, cols) in enumerate(ndimage.find_objects(labels), start=1):
            if np.count_nonzero(labels[rows, cols] == k) >= min_area:
                out.append((x0 + cols.start, y0 + rows.start, x0 + cols.stop, y0 + rows.stop))
    return np.asarray(out, dtype=np.float32).reshape(-1, 4)


def box_text_share(boxes: np.ndarray, text: np.ndarray) -> np.ndarray:
    """float [K]: the share of each pixel box x0, y0, x1, y1 (exclusive) covered by `text`, bool [H, W]."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    h, w = text.shape
    out = np.zeros(len(boxes), np.float64)
    for k, (x0, y0, x1, y1) in enumerate(boxes):
        x0, y0 = int(np.clip(np.floor(x0), 0, w)), int(np.clip(np.floor(y0), 0, h))
        x1, y1 = int(np.clip(np.ceil(x1), 0, w)), int(np.clip(np.ceil(y1), 0, h))
        out[k] = np.count_nonzero(text[y0:y1, x0:x1]) / max((x1 - x0) * (y1 - y0), 1)
    return out


def assign_categories(region_masks: Sequence[np.ndarray], class_masks: Mapping[str, np.ndarray],
                      min_iou: float = 0.5, min_part_area: int = 1, measure: str = "iou") -> list[tuple[str, float]]:
    """Per region, (class, overlap) of the class answer it matches best; ("region", best overlap)
    when none reaches `min_iou`. class_masks: class name -> bool [H, W] answer to its question.

    measure "iou": the mask IoU with the best connected part of the answer (the part stands for
    one instance); "coverage": the share of the region inside the answer, which still names a
    region when the answer merges touching instances ("all paragraphs" as one blob)."""
    if measure not in ("iou", "coverage"):
        raise ValueError(f"measure={measure!r}: use 'iou' or 'coverage'")
    best = np.zeros(len(region_masks), dtype=np.float32)
    best_name = [UNCLASSIFIED] * len(region_masks)
    for name, answer in class_masks.items():
        if len(region_masks) == 0:
            break
        if measure == "coverage":
            score = np.array([np.count_nonzero(m & answer) / max(np.count_nonzero(m), 1) for m in region_masks],
                             dtype=np.float32)
        else:
            parts = instance_parts(answer, min_part_area)
            if len(parts) == 0:
                continue
            score = mask_iou_matrix(region_masks, list(parts)).max(1)
        for i in np.nonzero(score > best)[0]:
            best[i], best_name[i] = score[i], name
    return [(name if iou >= min_iou else UNCLASSIFIED, float(iou)) for name, iou in zip(best_name, best)]


def region_words(region_masks: Sequence[np.ndarray], word_boxes: np.ndarray) -> list[np.ndarray]:
    """Per region bool [H, W], the indices of the words whose box centre lies in it."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    cx, cy = ((boxes[:, 0] + boxes[:, 2]) / 2).astype(np.int64), ((boxes[:, 1] + boxes[:, 3]) / 2).astype(np.int64)
    out = []
    for mask in region_masks:
        h, w = mask.shape
        out.append(np.flatnonzero(mask[cy.clip(0, h - 1), cx.clip(0, w - 1)]))
    return out


def classes_from_units(region_masks: Sequence[np.ndarray], image: np.ndarray, word_boxes: np.ndarray,
                       words: Sequence[str], classifier, ocr: bool = False) -> list[tuple[str, float] | None]:
    """Per region, (class, probability) by the unit classifier (`UnitClassifier.unit_probabilities`;
    `ocr`: the words are an OCR engine's) with the region's words (`region_words`) as one text unit;
    None for a region without words."""
    inside = region_words(region_masks, word_boxes)
    named = [i for i, ids in enumerate(inside) if len(ids)]
    out: list[tuple[str, float] | None] = [None] * len(inside)
    if named:
        probs = classifier.unit_probabilities(image, word_boxes, words, [inside[i].tolist() for i in named], ocr=ocr)
        for i, p in zip(named, probs):
            k = int(p.argmax())
            out[i] = (REGION_CLASSES[k], float(p[k]))
    return out


def classes_from_words(region_masks: Sequence[np.ndarray], word_boxes: np.ndarray, word_probs: np.ndarray,
                       class_names: Sequence[str]) -> list[tuple[str, float] | None]:
    """Per region, (class, probability) by the word-class head: the mean class probabilities of
    the words whose box centre lies in the region, argmax; None for a region without such words
    (a figure, a stamp). word_probs float [N, C] (rows of zeros: words the model did not read)."""
    probs = np.asarray(word_probs, dtype=np.float64)
    read = probs.sum(1) > 0
    out: list[tuple[str, float] | None] = []
    for ids in region_words(region_masks, word_boxes):
        ids = ids[read[ids]]
        if not len(ids):
            out.append(None)
            continue
        mean = probs[ids].mean(0)
        k = int(mean.argmax())
        out.append((class_names[k], float(mean[k])))
    return out


# ---- the segmenter -----------------------------------------------------------------------------

@dataclass
class _Candidates:
    """Candidates that passed the filters, masks as RLE until NMS has chosen (SAM's MaskData)."""
    rles: list[dict | None] = field(default_factory=list)     # None: the mask is its box (a word block)
    boxes: list[np.ndarray] = field(default_factory=list)     # float32 [4] each
    scores: list[float] = field(default_factory=list)
    stability: list[float] = field(default_factory=list)
    seeds: list[str] = field(default_factory=list)
    points: list[np.ndarray] = field(default_factory=list)

    def subset(self, keep: Sequence[int]) -> "_Candidates":
        return _Candidates(*([getattr(self, f.name)[i] for i in keep] for f in fields(self)))

    def mask(self, i: int, size: tuple[int, int]) -> np.ndarray:
        """bool [H, W] of candidate i."""
        if self.rles[i] is not None:
            return decode_rle(self.rles[i])
        x0, y0, x1, y1 = (int(v) for v in self.boxes[i])
        mask = np.zeros(size, dtype=bool)
        mask[y0:y1, x0:x1] = True
        return mask


class PageSegmenter:
    """Every region of a page, with a layout class each (see the module docstring).

    predictor:        a `dociq.inference.predictor.Predictor` (set_image once, predict_masks per batch of seeds).
    points_per_side:  grid seeds per side (None or 0: no grid).
    seeds:            which seeds: "grid", "ocr_lines" (one click per OCR text line), "ocr_blocks"
                      (each block of OCR lines, `group_blocks`: see `block_masks`),
                      "class_boxes" (the box of each part of each class question's answer, as a
                      box prompt).
    multimask:        "all" (SAM: each of the 3 outputs is a candidate) or "best" (the one with
                      the highest predicted IoU per seed).
    pred_iou_thresh, stability_score_thresh, stability_score_offset, box_nms_thresh: as SAM's;
                      the defaults are lower than SAM's ViT-H ones (0.88 / 0.95) for small models.
    min_region_area:  candidates (and class-answer parts) smaller than this many pixels are dropped;
                      with `remove_small_regions`, the kept masks' holes and islands smaller than
                      this are filled / removed (SAM's min_mask_region_area) and NMS runs again.
    classify:         ask the class questions and name each region (else all are "region").
    categories:       class name -> question (default: the layout classes the model was trained on).
    min_class_iou:    a region takes a class when its overlap with the answer reaches this.
    class_match:      how a region is matched to a class answer: "iou" (with the answer's best
                      connected part) or "coverage" (the share of the region inside the answer);
                      see `assign_categories`.
    snap:             snap each region's text parts to the box around its OCR words
                      (dociq.models.word_snap), as layout labels are drawn.
    block_masks:      "words": an OCR block's region is the box around its words, named from its
                      words (`class_source`) and scored by that class's probability, and the other seeds
                      only add regions mostly outside the blocks (figures, stamps); "model": the block's box is
                      a box prompt and the decoder draws the mask, as for class boxes.
    class_source:     "answers" (the class questions' answers, `class_match`), "units" (the
                      predictor's unit classifier names the region's words as one text unit,
                      `classes_from_units`), "words" (the word-class head: the mean class of the
                      region's words, `classes_from_words`) — regions without words fall back to
                      the answers —, or "auto": "units" when `categories` is the default and the
                      predictor has a unit classifier (the Predictor's default), else "words" when
                      the model has a word-class head, else "answers".
    """

    def __init__(self, predictor, points_per_side: int | None = 16, seeds: Sequence[str] = DEFAULT_SEEDS,
                 points_per_batch: int = 16, multimask: str = "all", pred_iou_thresh: float = 0.5,
                 stability_score_thresh: float = 0.8, stability_score_offset: float = 1.0,
                 box_nms_thresh: float = 0.7, min_region_area: int = 64, classify: bool = True,
                 categories: Mapping[str, str] | None = None, min_class_iou: float = 0.5,
                 mask_threshold: float = 0.0, remove_small_regions: bool = True, class_match: str = "iou",
                 snap: bool = False, class_source: str = "auto", block_masks: str = "words") -> None:
        unknown = [s for s in seeds if s not in SEEDS]
        if unknown or not seeds:
            raise ValueError(f"seeds={tuple(seeds)!r}: choose one or more of {SEEDS}")
        if "grid" in seeds and not points_per_side:
            raise ValueError("seeds include 'grid' but points_per_side is 0/None: give points_per_side >= 1 "
                             "or seeds=('ocr_lines',)")
        if multimask not in ("all", "best"):
            raise ValueError(f"multimask={multimask!r}: use 'all' (SAM) or 'best'")
        if block_masks not in ("words", "model"):
            raise ValueError(f"block_masks={block_masks!r}: use 'words' or 'model'")
        if class_source not in ("auto", "answers", "units", "words"):
            raise ValueError(f"class_source={class_source!r}: use 'auto', 'answers', 'units' or 'words'")
        if class_match not in ("iou", "coverage"):
            raise ValueError(f"class_match={class_match!r}: use 'iou' or 'coverage'")
        if points_per_batch < 1:
            raise ValueError(f"points_per_batch={points_per_batch}: need at least 1")
        for name, value in (("pred_iou_thresh", pred_iou_thresh), ("stability_score_thresh", stability_score_thresh),
                            ("box_nms_thresh", box_nms_thresh), ("min_class_iou", min_class_iou)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value}: must lie in [0, 1]")
        self.predictor = predictor
        self.points_per_side = points_per_side
        self.seeds = tuple(seeds)
        self.points_per_batch = int(points_per_batch)
        self.multimask = multimask
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh
        self.min_region_area = int(min_region_area)
        self.remove_small_regions = remove_small_regions
        self.classify = classify
        self.categories = dict(LAYOUT_QUESTIONS if categories is None else categories)
        self.min_class_iou = min_class_iou
        self.class_match = class_match
        self.snap = bool(snap)
        self.block_masks = block_masks
        # custom categories are questions: name regions by their answers
        self.class_source = "answers" if categories is not None and class_source == "auto" else class_source
        self.mask_threshold = mask_threshold

    def seed_points(self, size: tuple[int, int], word_boxes: np.ndarray) -> tuple[np.ndarray, list[str]]:
        parts, names = [], []
        if "grid" in self.seeds:
            parts.append(grid_points(self.points_per_side, size))
            names += ["grid"] * len(parts[-1])
        if "ocr_lines" in self.seeds and len(word_boxes):
            parts.append(line_points(word_boxes))
            names += ["ocr_lines"] * len(parts[-1])
        if not parts:
            return np.zeros((0, 2), np.float32), []
        return np.concatenate(parts).astype(np.float32), names

    def segment(self, image: Any, words=None, word_boxes=None, ocr=None) -> list[SegmentedRegion]:
        """Regions of the page, best predicted IoU first."""
        self.predictor.set_image(image, words=words, word_boxes=word_boxes, ocr=ocr)   # embedded once
        page = self.predictor.page
        answers = self.class_answers() if self.categories and ("class_boxes" in self.seeds or (
            self.classify and self.class_source != "words")) else {}
        points, seed_names = self.seed_points(page.original_size, page.word_boxes)
        found, text = _Candidates(), None
        for start in range(0, len(points), self.points_per_batch):
            batch = points[start:start + self.points_per_batch]
            logits, iou, _low_res = self.predictor.predict_masks(points=batch[:, None, :], multimask_output=True,
                                                                 return_logits=True)   # [N, 3, H, W], [N, 3]
            self._add_batch(found, np.asarray(logits), np.asarray(iou), batch,
                            seed_names[start:start + self.points_per_batch])
        if "ocr_blocks" in self.seeds and len(page.word_boxes):
            blocks = block_boxes(page.word_boxes, blocks=page_blocks(page.image, page.word_boxes, page.words,
                                                                     ocr=page.word_confidences is not None))
            if self.block_masks == "model":
                self._add_boxes(found, blocks, "ocr_blocks")
            else:
                text = self._add_word_blocks(found, blocks, page.original_size)
        if "class_boxes" in self.seeds:
            boxes = part_boxes(answers.values(), self.min_region_area)
            if text is not None:   # a box prompt's mask lies in its box: skip boxes the word blocks hold
                boxes = boxes[box_text_share(boxes, text) <= MAX_TEXT_SHARE]
            self._add_boxes(found, boxes, "class_boxes")
        if text is not None:
            found = self._without_text(found, text)
        regions = self._deduplicate(found)
        if self.snap and len(page.word_boxes):
            for region in regions:
                region.mask = snap_to_words(region.mask, page.word_boxes)
                if region.mask.any():
                    region.box = mask_boxes(region.mask[None])[0]
        log.debug("%d click seeds, %d candidates after the filters, %d regions after NMS", len(points),
                  len(found.rles), len(regions))
        if self.classify and regions:
            self._name_regions(regions, answers)
        return regions

    def _add_boxes(self, found: _Candidates, boxes: np.ndarray, seed: str) -> None:
        """Decode seed boxes as box prompts, `points_per_batch` at a time, and keep their candidates."""
        for start in range(0, len(boxes), self.points_per_batch):
            batch = boxes[start:start + self.points_per_batch]
            # a box prompt is not ambiguous: the single-mask output, as the model was trained
            logits, iou, _low_res = self.predictor.predict_masks(boxes=batch, return_logits=True)  # [N, H, W]
            centres = (batch[:, :2] + batch[:, 2:]) / 2
            self._add_batch(found, np.asarray(logits)[:, None], np.asarray(iou)[:, None], centres,
                            [seed] * len(batch))

    @staticmethod
    def _without_text(found: _Candidates, text: np.ndarray, max_text_share: float = MAX_TEXT_SHARE) -> _Candidates:
        """Text is segmented by the word blocks (`text`, bool [H, W]): the other seeds' candidates
        keep only regions mostly outside them (figures and stamps, even with a few labels inside)."""
        keep = []
        for i, (rle, seed) in enumerate(zip(found.rles, found.seeds)):
            if seed != "ocr_blocks":
                mask = decode_rle(rle)
                if np.count_nonzero(mask & text) > max_text_share * max(np.count_nonzero(mask), 1):
                    continue
            keep.append(i)
        return found.subset(keep)

    @staticmethod
    def _add_word_blocks(found: _Candidates, blocks: np.ndarray, size: tuple[int, int]) -> np.ndarray:
        """Each block's words' box is a candidate as it is (score 1 until it is named): a text region
        is the box around its words, which the decoder's stride-4 mask only approximates. Returns
        the union of the blocks, bool [H, W]."""
        h, w = size
        text = np.zeros((h, w), dtype=bool)
        for box in blocks:
            x0, y0 = int(np.floor(box[0])), int(np.floor(box[1]))
            x1, y1 = max(int(np.ceil(box[2])), x0 + 1), max(int(np.ceil(box[3])), y0 + 1)
            text[y0:y1, x0:x1] = True
            found.rles.append(None)
            found.boxes.append(np.array([x0, y0, min(x1, w), min(y1, h)], dtype=np.float32))
            found.scores.append(1.0)
            found.stability.append(1.0)
            found.seeds.append("ocr_blocks")
            found.points.append(np.array([(x0 + x1) / 2, (y0 + y1) / 2], np.float32))
        return text

    def class_answers(self) -> dict[str, np.ndarray]:
        """class name -> bool [H, W]: the model's answer to the class's question on the set page."""
        names = list(self.categories)
        # the decoder's own masks (logits > 0), whatever the Predictor's snap: the segmenter snaps itself
        logits, _scores, _low_res = self.predictor.predict_masks(question=[self.categories[n] for n in names],
                                                                 return_logits=True)
        return dict(zip(names, np.asarray(logits) > 0))

    def _add_batch(self, found: _Candidates, logits: np.ndarray, iou: np.ndarray, points: np.ndarray,
                   seed_names: list[str]) -> None:
        """Filter one batch of seeds' candidates [N, K, H, W] and keep the survivors as RLE."""
        n, k = iou.shape
        if self.multimask == "best":
            pick = iou.argmax(1)
            logits, iou = logits[np.arange(n), pick][:, None], iou[np.arange(n), pick][:, None]
            k = 1
        logits, iou = logits.reshape(n * k, *logits.shape[-2:]), iou.reshape(-1)
        owner = np.repeat(np.arange(n), k)                                   # seed of each candidate
        keep = iou > self.pred_iou_thresh
        stability = stability_score(logits, self.mask_threshold, self.stability_score_offset)
        keep &= stability >= self.stability_score_thresh
        masks = logits > self.mask_threshold
        keep &= np.count_nonzero(masks, axis=(1, 2)) >= max(self.min_region_area, 1)
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            return
        masks, iou, stability, owner = masks[idx], iou[idx], stability[idx], owner[idx]
        boxes = mask_boxes(masks)
        for i in nms(boxes, iou, self.box_nms_thresh):   # within the batch first: fewer RLEs to keep
            found.rles.append(encode_rle(masks[i]))
            found.boxes.append(boxes[i])
            found.scores.append(float(iou[i]))
            found.stability.append(float(stability[i]))
            found.seeds.append(seed_names[int(owner[i])])
            found.points.append(points[int(owner[i])])

    def _deduplicate(self, found: _Candidates) -> list[SegmentedRegion]:
        if not found.rles:
            return []
        boxes, scores = np.stack(found.boxes).astype(np.float32), np.asarray(found.scores, np.float32)
        kept = nms(boxes, scores, self.box_nms_thresh).tolist()
        size = self.predictor.page.original_size
        masks = {i: found.mask(i, size) for i in kept}
        if self.remove_small_regions and self.min_region_area > 1:
            # SAM's postprocess_small_regions: clean the survivors, then NMS again on the new boxes
            changed = False
            for i in kept:
                if found.seeds[i] == "ocr_blocks" and self.block_masks == "words":
                    continue        # a word block's mask is its rectangle: no holes, no islands
                masks[i], c = remove_small_regions(masks[i], self.min_region_area)
                if c:
                    boxes[i] = mask_boxes(masks[i][None])[0]
                    changed = True
            if changed:
                kept = [kept[j] for j in nms(boxes[kept], scores[kept], self.box_nms_thresh).tolist()]
        return [SegmentedRegion(mask=masks[i], box=boxes[i].copy(), score=float(np.clip(scores[i], 0.0, 1.0)),
                                stability=float(found.stability[i]), seed=found.seeds[i],
                                point=(float(found.points[i][0]), float(found.points[i][1])))
                for i in kept]

    def word_probabilities(self) -> np.ndarray | None:
        """The set page's word-class probabilities when regions are named by words, else None."""
        if self.class_source == "answers":
            return None
        probs = self.predictor.word_class_probabilities()
        if probs is None and self.class_source == "words":
            raise ValueError("class_source='words' but the model has no word-class head (model.word_classes): "
                             "use class_source='answers'")
        return probs

    def _named_by_words(self, masks: list[np.ndarray]) -> list[tuple[str, float] | None]:
        """Per region, (class, probability) from its words (`class_source` "units" or "words"), or
        None where its words do not name it."""
        page = self.predictor.page
        classifier = getattr(self.predictor, "unit_classifier", None)
        if self.class_source == "units" or (self.class_source == "auto" and classifier is not None):
            if classifier is None:
                raise ValueError("class_source='units' but the predictor has no unit_classifier: give it one "
                                 "(dociq.inference.unit_classifier) or use class_source='answers'")
            return classes_from_units(masks, page.image, page.word_boxes, page.words, classifier,
                                      ocr=page.word_confidences is not None)
        probs = self.word_probabilities()
        return classes_from_words(masks, page.word_boxes, probs, REGION_CLASSES) \
            if probs is not None else [None] * len(masks)

    def _name_regions(self, regions: list[SegmentedRegion], class_masks: dict[str, np.ndarray]) -> None:
        masks = [r.mask for r in regions]
        names = self._named_by_words(masks)
        rest = [i for i, name in enumerate(names) if name is None]     # no words, or not named by words
        by_answers = assign_categories([masks[i] for i in rest], class_masks, self.min_class_iou,
                                       self.min_region_area, measure=self.class_match)
        for i, name in zip(rest, by_answers):
            names[i] = name
        for region, (name, score) in zip(regions, names):
            region.category, region.category_score = name, score
            if region.seed == "ocr_blocks" and self.block_masks == "words":
                region.score = score          # no decoder mask to rate: the class's confidence ranks it


# ---- outputs -----------------------------------------------------------------------------------

def normalise_name(name: str) -> str:
    """'List-item', 'list item', 'LIST_ITEM' -> 'list_item': class names match across data sets."""
    return "_".join(str(name).lower().replace("-", " ").replace("_", " ").split())


def to_coco_results(regions: Iterable[SegmentedRegion], image_id: Any, category_ids: Mapping[str, Any]) -> list[dict]:
    """COCO result dicts (RLE segmentation with str counts, bbox x, y, w, h, score = predicted IoU)
    for the regions whose class is in `category_ids` (class name -> COCO category id; names match
    case-insensitively, '-' / '_' / ' ' alike); the others are left out."""
    ids = {normalise_name(k): v for k, v in category_ids.items()}
    out = []
    for r in regions:
        cat = ids.get(normalise_name(r.category))
        if cat is None:
            continue
        x0, y0, x1, y1 = (float(v) for v in r.box)
        out.append({"image_id": image_id, "category_id": cat, "segmentation": encode_rle(r.mask),
                    "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(r.score), "area": float(r.area)})
    return out
