"""Prompt and word checks of the Predictor: pixel coordinates of the original page, checked as the
data loader checks annotations, before any model work.

A non-finite or out-of-page point, an inverted / zero-size / out-of-page box, an empty question,
mismatched shapes or a non-finite mask threshold raise a ValueError naming the argument; coordinates at most
`BOX_OVERSHOOT_TOLERANCE` (1%) of the page beyond its edge are clipped. A question longer than the
question tower's context length is cut, with a warning (`warn_cut_questions`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dociq.data.errors import BOX_OVERSHOOT_TOLERANCE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompts:
    count: int                       # Q prompts
    questions: list[str]             # Q (or none)
    points: np.ndarray | None        # float [1 or Q, P, 2], clipped to the page
    labels: np.ndarray | None        # int [1 or Q, P], 1 positive / 0 negative
    boxes: np.ndarray | None         # float [1 or Q, 4], clipped to the page
    masks: np.ndarray | None = None  # float [1 or Q, 1, h, w] low-res mask logits (SAM's mask_input)

    @property
    def lone_click(self) -> bool:
        """One click, no question and no box (a mask prompt may come with it): ambiguous, so the
        decoder's 3 multimask candidates are chosen among."""
        return not self.questions and self.boxes is None and self.points is not None and self.points.shape[1] == 1


_PIXELS = "pixel coordinates of the original page (not normalised, not the model's input size)"


def _xy(values) -> str:
    return "(" + ", ".join(repr(float(v)) for v in values) + ")"


def _margin(size: tuple[int, int]) -> tuple[float, float]:
    h, w = size
    return BOX_OVERSHOOT_TOLERANCE * w, BOX_OVERSHOOT_TOLERANCE * h


def _outside(size: tuple[int, int]) -> str:
    h, w = size
    return f"lies outside the {w}x{h} page (more than {BOX_OVERSHOOT_TOLERANCE:.0%} beyond x 0..{w}, y 0..{h})"


def check_questions(question) -> list[str]:
    if question is None:
        return []
    single = isinstance(question, str)
    questions = [question] if single else list(question)
    for i, text in enumerate(questions):
        name = "question" if single else f"question[{i}]"
        if not isinstance(text, str):
            raise ValueError(f"{name} is not a string (got {type(text).__name__} {text!r}): pass the question text")
        if not text.strip():
            raise ValueError(f"{name} is empty{' (only whitespace)' if text else ''}: ask something, e.g. "
                             "'the page footer', or prompt with points/boxes instead")
    return questions


def warn_cut_questions(questions: list[str], context_length: int,
                       token_count: Callable[[str], int] | None = None) -> None:
    """open_clip keeps the first `context_length` tokens (start and end included) and drops the rest.
    token_count: a question's token count, start and end included (default: open_clip's tokenizer)."""
    if token_count is None:
        import open_clip

        longest = max(len(t) for t in questions) + 8      # a BPE token spans at least one character
        lengths = (open_clip.tokenize(questions, context_length=longest) != 0).sum(1).tolist()
    else:
        lengths = [token_count(t) for t in questions]
    for text, n in dict(zip(questions, lengths)).items():
        if n > context_length:
            log.warning("question %r is %d tokens long and is cut to the model's context length %d "
                        "(%d tokens of text): the rest is not read; shorten the question",
                        text, n, context_length, context_length - 2)


def check_points(points, point_labels, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """-> points float [1 or Q, P, 2] clipped to the page, labels int [1 or Q, P]."""
    try:
        pts = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"points must be [N, 2] (or [Q, N, 2]) numbers, {_PIXELS}: {err}") from err
    grouped = pts.ndim == 3
    pts = pts[None] if pts.ndim == 2 else pts
    if pts.ndim != 3 or pts.shape[-1] != 2 or pts.shape[1] == 0:
        raise ValueError(f"points must be [N, 2] (or [Q, N, 2]) pixel (x, y), got shape {np.shape(points)}")
    flat = pts.reshape(-1, 2)
    name = (lambda i: f"points[{i // pts.shape[1]}][{i % pts.shape[1]}]") if grouped else (lambda i: f"points[{i}]")
    finite = np.isfinite(flat).all(1)
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(f"{name(i)} = {_xy(flat[i])} is not finite: give {_PIXELS}")
    h, w = size
    tx, ty = _margin(size)
    out = (flat[:, 0] < -tx) | (flat[:, 0] > w + tx) | (flat[:, 1] < -ty) | (flat[:, 1] > h + ty)
    if out.any():
        i = int(np.argmax(out))
        raise ValueError(f"{name(i)} = {_xy(flat[i])} {_outside(size)}: give {_PIXELS}")
    pts = np.stack([pts[..., 0].clip(0, w), pts[..., 1].clip(0, h)], axis=-1)
    if point_labels is None:
        return pts, np.ones(pts.shape[:2], np.int64)
    lbl = np.asarray(point_labels)
    if lbl.size != flat.shape[0]:
        raise ValueError(f"point_labels has {lbl.size} values for {flat.shape[0]} points: give one label per "
                         "point (1 positive, 0 negative)")
    flat_lbl = lbl.reshape(-1)
    ok = np.array([isinstance(v, (int, float, np.number, np.bool_)) and v in (0, 1) for v in flat_lbl.tolist()])
    if not ok.all():
        i = int(np.argmin(ok))
        raise ValueError(f"point_labels[{i}] = {flat_lbl.tolist()[i]!r} is not 0 or 1: label each point 1 "
                         "(positive, on the object) or 0 (negative, off it)")
    return pts, flat_lbl.astype(np.int64).reshape(pts.shape[:2])


def check_boxes(boxes, size: tuple[int, int]) -> np.ndarray:
    """-> float [M, 4] x0, y0, x1, y1 clipped to the page; every box must overlap the page."""
    try:
        bxs = np.asarray(boxes, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"boxes must be [4] or [M, 4] numbers x0, y0, x1, y1, {_PIXELS}: {err}") from err
    bxs = bxs[None] if bxs.shape == (4,) else bxs
    if bxs.ndim != 2 or bxs.shape[1] != 4 or len(bxs) == 0:
        raise ValueError(f"boxes must be [4] or [M, 4] pixel x0, y0, x1, y1, got shape {np.shape(boxes)}")
    h, w = size
    tx, ty = _margin(size)
    for i, (x0, y0, x1, y1) in enumerate(bxs):
        name = f"boxes[{i}] (x0,y0,x1,y1)={_xy(bxs[i])}"
        if not np.isfinite(bxs[i]).all():
            raise ValueError(f"{name} is not finite: give {_PIXELS}")
        if x1 <= x0 or y1 <= y0:
            raise ValueError(f"{name} has zero or negative size: give the top-left corner (x0, y0) first and "
                             "the bottom-right (x1, y1) second, x1 > x0 and y1 > y0")
        beyond = x0 < -tx or y0 < -ty or x1 > w + tx or y1 > h + ty
        if beyond or x0 >= w or y0 >= h or x1 <= 0 or y1 <= 0:     # nothing of it on the page
            raise ValueError(f"{name} {_outside(size)}: give {_PIXELS}")
    return np.stack([bxs[:, 0].clip(0, w), bxs[:, 1].clip(0, h), bxs[:, 2].clip(0, w), bxs[:, 3].clip(0, h)], 1)


def check_mask_input(mask_input, size: tuple[int, int]) -> np.ndarray:
    """SAM's mask_input: low-res logits of a previous prediction, one per prompt -> float32
    [1 or Q, 1, h, w]. [Q, h, w] is read as one mask per prompt (SAM's [1, h, w] for one prompt)."""
    if hasattr(mask_input, "detach") and hasattr(mask_input, "cpu"):   # a torch tensor, without importing torch
        mask_input = mask_input.detach().cpu().numpy()
    try:
        masks = np.asarray(mask_input, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise ValueError(f"mask_input must be a float array [Q, 1, {size[0]}, {size[1]}]: {err}") from err
    masks = masks[:, None] if masks.ndim == 3 else masks
    if masks.ndim != 4 or masks.shape[1] != 1 or tuple(masks.shape[2:]) != tuple(size) or len(masks) == 0:
        raise ValueError(f"mask_input must be [Q, 1, {size[0]}, {size[1]}] (or [Q, {size[0]}, {size[1]}]) low-res "
                         f"logits, got shape {list(np.shape(mask_input))}: pass the low_res_logits a previous "
                         "predict(..., return_logits=True) or predict_masks returned, one candidate per prompt "
                         "(with multimask_output: low_res[np.arange(Q), scores.argmax(1)][:, None])")
    if not np.isfinite(masks).all():
        raise ValueError("mask_input has non-finite values: pass the logits a previous prediction returned")
    return masks


def check_words(words, word_boxes, size: tuple[int, int]) -> tuple[list[str], np.ndarray]:
    """User OCR words: one string and one pixel box per word; boxes are clipped to the page within the
    data loader's tolerance (zero-size boxes are allowed, as there)."""
    if isinstance(words, str):
        raise ValueError(f"words must be a list of strings, one per word box; got the single string {words!r} "
                         "(pass words=[...])")
    words = list(words)
    for i, word in enumerate(words):
        if not isinstance(word, str):
            raise ValueError(f"words[{i}] is not a string (got {type(word).__name__} {word!r}): pass the OCR text")
    try:
        boxes = np.asarray(word_boxes if word_boxes is not None else np.zeros((0, 4)), dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"word_boxes must be [N, 4] numbers x0, y0, x1, y1, {_PIXELS}: {err}") from err
    boxes = boxes.reshape(0, 4) if boxes.size == 0 else boxes
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"word_boxes must be [N, 4] pixel x0, y0, x1, y1 (one per word), got shape "
                         f"{np.shape(word_boxes)}")
    if len(boxes) != len(words):
        raise ValueError(f"{len(words)} words but {len(boxes)} word_boxes: give one pixel box x0, y0, x1, y1 "
                         "per word")
    h, w = size
    tx, ty = _margin(size)
    finite = np.isfinite(boxes).all(1)
    negative = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    beyond = (boxes[:, 0] < -tx) | (boxes[:, 1] < -ty) | (boxes[:, 2] > w + tx) | (boxes[:, 3] > h + ty)
    bad = ~finite | negative | beyond
    if bad.any():
        i = int(np.argmax(bad))
        name = f"word_boxes[{i}] (word {words[i]!r}) (x0,y0,x1,y1)={_xy(boxes[i])}"
        if not finite[i]:
            raise ValueError(f"{name} is not finite: give {_PIXELS}")
        if negative[i]:
            raise ValueError(f"{name} has negative size: give the top-left corner first, then the bottom-right")
        raise ValueError(f"{name} {_outside(size)}: give {_PIXELS}, the page the words were read from")
    clipped = np.stack([boxes[:, 0].clip(0, w), boxes[:, 1].clip(0, h), boxes[:, 2].clip(0, w),
                        boxes[:, 3].clip(0, h)], 1)
    return words, clipped.astype(np.float32)


def check_threshold(threshold, name: str = "threshold") -> float:
    """The mask logit threshold: a finite number (NaN would leave every mask empty, inf too)."""
    try:
        value = float(threshold)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} {threshold!r} is not a number: give a mask logit threshold, e.g. 0 "
                         "(the default; lower keeps more pixels)") from err
    if not np.isfinite(value):
        raise ValueError(f"{name} {value} is not finite: give a mask logit threshold, e.g. 0 (the default; "
                         "lower keeps more pixels)")
    return value


def check_prompts(question, points, point_labels, boxes, mask_input, size: tuple[int, int],
                  low_res_size: tuple[int, int], context_length: int | None,
                  token_count: Callable[[str], int] | None = None) -> Prompts:
    """All the prompts of one `predict` call against the page of `size` (H, W): the questions, the
    point sets, boxes and low-res mask inputs (`low_res_size`, the decoder's grid) -> `Prompts`, one
    shared prompt broadcast to the others' count. `context_length` is the question tower's (None:
    the model has none, and a question is an error)."""
    questions = check_questions(question)
    pts, lbl = (None, None) if points is None else check_points(points, point_labels, size)
    if points is None and point_labels is not None:
        raise ValueError("point_labels given without points: pass points=[[x, y], ...] too")
    bxs = None if boxes is None else check_boxes(boxes, size)
    masks = None if mask_input is None else check_mask_input(mask_input, low_res_size)
    given = {"questions": len(questions) or None, "point sets": None if pts is None else len(pts),
             "boxes": None if bxs is None else len(bxs), "mask inputs": None if masks is None else len(masks)}
    counts = {n for n in given.values() if n is not None}
    if not counts:
        raise ValueError("predict needs a prompt: question=..., points=..., boxes=... and/or mask_input=...")
    q = max(counts)
    if counts - {1, q}:
        raise ValueError("prompt counts disagree: " + ", ".join(f"{n or 0} {k}" for k, n in given.items())
                         + "; give one of each per prompt (or one shared by all)")
    if questions:
        if context_length is None:
            raise ValueError("this model has no question tower; prompt it with points or boxes")
        warn_cut_questions(questions, context_length, token_count)
        questions = questions * (q if len(questions) == 1 else 1)   # one question shared by all prompts
    return Prompts(q, questions, pts, lbl, bxs, masks)
