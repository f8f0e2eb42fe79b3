"""Predictor API and CLI: a page (+ OCR words) and prompts in, masks of the page's size out.

    from dociq.predict import Predictor
    predictor = Predictor.from_checkpoint("outputs/finetune/runs/<run>/checkpoints/last.ckpt")
    masks, scores = predictor.predict("page.png", question=["the page footer", "all form values"],
                                      ocr="tesseract")
    # masks: bool [Q, H, W] at the page's original size; scores: predicted IoU [Q]

    python -m dociq.predict CKPT page.png --question "the page footer" --ocr tesseract --out overlay.png

Prompts (any combination, Q prompts): `question` str or list of Q strings; `points` [P, 2] or
[Q, P, 2] pixel (x, y) of the original page with `point_labels` (1 positive, 0 negative; default
1); `boxes` [4] or [Q, 4] pixel x0, y0, x1, y1. A single point set or box is shared by all
questions. OCR words come from `words` + `word_boxes` (pixels of the original page), an `OcrWords`,
or an OCR backend (`ocr="tesseract"`, `"pdf"` is not for images, or an object with `recognise`).
Prompts and words are checked against the page before the model runs, as the data loader checks
annotations: a non-finite or out-of-page point, an inverted / zero-size / out-of-page box, an empty
question or mismatched shapes raise a ValueError naming the argument; coordinates at most
`BOX_OVERSHOOT_TOLERANCE` (1%) of the page beyond its edge are clipped. A question longer than the
question tower's context length is cut, with a warning. The CLI prints such errors as one line and
exits with status 2 (`--debug` shows the traceback).
This module uses `dociq.models`/`dociq.data` and reads checkpoints with plain torch — no Lightning.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator, lexical_match, resize_longest_side
from dociq.data.errors import BOX_OVERSHOOT_TOLERANCE
from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS
from dociq.data.image_io import load_page_image, to_rgb_array
from dociq.data.ocr import OcrWords, make_ocr
from dociq.data.schema import Page
from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT
from dociq.models.segmenter import SegmentationModel, best_candidate, choose_outputs, remove_ocr_words
from dociq.tasks.checkpoint_io import CheckpointError, CheckpointNotFoundError, read_checkpoint

log = logging.getLogger(__name__)


class Predictor:
    def __init__(self, model: SegmentationModel, image_size: int, use_ocr: bool = True,
                 ocr_tokenizer: OcrTokenizer | None = None, device: str | torch.device = "cpu",
                 max_question_words: int = 12) -> None:
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.image_size = int(image_size)
        self.use_ocr = use_ocr
        self.max_question_words = int(max_question_words)
        self.use_lexical_match = True
        self.collator = DocumentCollator(self.image_size, ocr_tokenizer=ocr_tokenizer)
        question_encoder = model.prompt_encoder.question_encoder
        self.question_tokenizer = QuestionTokenizer(question_encoder.context_length) if question_encoder else None

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> "Predictor":
        """A `stage=finetune` checkpoint (its hyper-parameters hold the model config)."""
        path = Path(path)
        if not path.exists():
            raise CheckpointNotFoundError(path, "does not exist", "pass a .ckpt written by `python train.py "
                                          "stage=finetune` (<run>/checkpoints/last.ckpt)")
        ckpt = read_checkpoint(path)
        hparams = ckpt.get("hyper_parameters")
        if not hparams or "model" not in hparams or "state_dict" not in ckpt:
            raise CheckpointError(path, "is not a stage=finetune Lightning checkpoint (no hyper_parameters.model "
                                  "or state_dict)", "give the checkpoint of a `python train.py stage=finetune` run")
        model = SegmentationModel.from_config(hparams["model"])
        state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
        result = model.load_state_dict(state, strict=False)
        if result.missing_keys:
            raise CheckpointError(path, f"lacks {len(result.missing_keys)} weights of the segmentation model "
                                  f"(e.g. {result.missing_keys[:3]})",
                                  "give the checkpoint of a `python train.py stage=finetune` run")
        predictor = cls(model, int(hparams["model"]["image_size"]), use_ocr=bool(hparams.get("ocr", True)),
                        device=device)
        predictor.use_lexical_match = bool(hparams.get("lexical_match", True))   # as the model was trained
        return predictor

    # ---- inputs ------------------------------------------------------------------------------

    @staticmethod
    def _image(image: Any) -> np.ndarray:
        if isinstance(image, (str, Path)):
            return load_page_image(image, DEFAULT_MAX_PAGE_PIXELS)
        if isinstance(image, np.ndarray):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(f"image array must be uint8 [H, W, 3] RGB, got {image.dtype} {image.shape}")
            return image
        from PIL import Image
        if isinstance(image, Image.Image):
            return to_rgb_array(image)
        raise TypeError(f"image must be a path, a PIL image or a uint8 [H, W, 3] array, got {type(image).__name__}")

    @staticmethod
    def _words(image: np.ndarray, words, word_boxes, ocr) -> tuple[list[str], np.ndarray]:
        if isinstance(words, OcrWords):
            words = words.scaled_to(image.shape[:2])
            return list(words.words), words.boxes
        if words is not None:
            return check_words(words, word_boxes, image.shape[:2])
        if word_boxes is not None:
            raise ValueError("word_boxes given without words: pass words=[...] with one word per box "
                             "(or leave word_boxes out)")
        if ocr is not None:
            backend = make_ocr(ocr)
            if backend is None:
                raise ValueError("ocr='groundtruth' needs words=...: pass the page's words and word_boxes")
            found = backend.recognise(image).scaled_to(image.shape[:2])
            return list(found.words), found.boxes
        log.warning("no OCR words given (words=None, ocr=None): the model sees the page image only")
        return [], np.zeros((0, 4), np.float32)

    def _check_prompts(self, question, points, point_labels, boxes, size: tuple[int, int]) -> Prompts:
        """Validate the prompts against the page (pixels of the original page) before any model work."""
        questions = check_questions(question)
        pts, lbl = (None, None) if points is None else check_points(points, point_labels, size)
        if points is None and point_labels is not None:
            raise ValueError("point_labels given without points: pass points=[[x, y], ...] too")
        bxs = None if boxes is None else check_boxes(boxes, size)
        counts = {n for n in (len(questions) or None, None if pts is None else len(pts),
                              None if bxs is None else len(bxs)) if n is not None}
        if not counts:
            raise ValueError("predict needs a prompt: question=..., points=... and/or boxes=...")
        q = max(counts)
        if counts - {1, q}:
            raise ValueError(f"prompt counts disagree: {len(questions)} questions, "
                             f"{0 if pts is None else len(pts)} point sets, {0 if bxs is None else len(bxs)} "
                             "boxes; give one of each per prompt (or one shared by all)")
        if questions:
            if self.question_tokenizer is None:
                raise ValueError("this model has no question tower; prompt it with points or boxes")
            warn_cut_questions(questions, self.question_tokenizer.context_length)
            questions = questions * (q if len(questions) == 1 else 1)   # one question shared by all prompts
        return Prompts(q, questions, pts, lbl, bxs)

    def _prompt_tensors(self, prompts: Prompts, scale: float):
        q, pts, lbl, bxs = prompts.count, prompts.points, prompts.labels, prompts.boxes
        question_ids = self.question_tokenizer(prompts.questions) if prompts.questions else None
        coords_list, labels_list = [], []
        if pts is not None:
            coords_list.append(np.broadcast_to(pts, (q, *pts.shape[1:])) * scale)
            labels_list.append(np.broadcast_to(lbl, (q, lbl.shape[1])))
        if bxs is not None:
            coords_list.append(np.broadcast_to(bxs, (q, 4)).reshape(q, 2, 2) * scale)
            labels_list.append(np.broadcast_to(np.array([BOX_TOP_LEFT, BOX_BOTTOM_RIGHT]), (q, 2)))
        points_t = None
        if coords_list:
            coords = torch.from_numpy(np.concatenate(coords_list, axis=1).astype(np.float32))
            labels = torch.from_numpy(np.concatenate(labels_list, axis=1).astype(np.int64))
            points_t = (coords.to(self.device), labels.to(self.device))
        # a prompt of clicks only (no question, no box) is ambiguous: pick among the 3 candidates
        ambiguous = torch.full((q,), question_ids is None and bxs is None and pts is not None and pts.shape[1] == 1)
        return question_ids, points_t, ambiguous

    # ---- prediction --------------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, image: Any, question: str | Sequence[str] | None = None,
                points: Any = None, point_labels: Any = None, boxes: Any = None,
                words: Sequence[str] | OcrWords | None = None, word_boxes: Any = None,
                ocr: str | Any | None = None, threshold: float = 0.0,
                ) -> tuple[np.ndarray, np.ndarray]:
        """-> masks bool [Q, H, W] at the page's original size and scores float [Q] (predicted IoU)."""
        page_image = self._image(image)
        h, w = page_image.shape[:2]
        prompts = self._check_prompts(question, points, point_labels, boxes, (h, w))   # before OCR: fail fast
        page_words, page_boxes = self._words(page_image, words, word_boxes, ocr)
        batch = self.collator([Page(image=page_image, words=page_words, word_boxes=page_boxes)])
        cut = int(batch["ocr_truncated"][0])
        if cut and self.use_ocr:
            # Dense real pages exceed the OCR token budget; questions about the words past it
            # cannot be matched (docs/finetune.md, "Real pages").
            log.warning("%d of %d OCR words did not fit the model's OCR budget (%d WordPiece tokens) and "
                        "are not seen: questions about them cannot be answered from the text",
                        cut, len(page_words), self.collator.ocr_tokenizer.max_length)
        if not self.use_ocr:
            batch = remove_ocr_words(batch)
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        scale = batch["meta"][0]["scale"]
        texts = prompts.questions
        question_ids, points, ambiguous = self._prompt_tensors(prompts, scale)

        page = self.model.embed_page(batch)
        question_tokens, grounding = None, None
        if question_ids is not None:
            question_tokens = self.model.encode_questions(question_ids.to(self.device))
            match, word_pos = lexical_match([page_words if self.use_ocr else []], [texts],
                                            batch["ocr_word_index"].cpu(), self.max_question_words,
                                            self.question_tokenizer.context_length)
            if not self.use_lexical_match:
                match = torch.zeros_like(match)
            has_question = (question_ids != 0).any(1).to(self.device)
            grounding = self.model.ground(page, question_tokens, match[0].to(self.device),
                                          word_pos[0].to(self.device), has_question)
        masks, iou = self.model.decode(page.image, page.high_res, question_tokens, points, None, grounding)
        masks, iou = choose_outputs(masks, iou, ambiguous.to(self.device))
        logits = best_candidate(masks, iou)                                   # [Q, h4, w4]
        scores = iou.gather(1, iou.argmax(1, keepdim=True))[:, 0]
        # decoder grid -> the square input frame -> crop the padding -> the original page size
        logits = F.interpolate(logits[:, None], size=(self.image_size, self.image_size), mode="bilinear",
                               align_corners=False)
        nh, nw = resize_longest_side((h, w), self.image_size)
        logits = F.interpolate(logits[..., :nh, :nw], size=(h, w), mode="bilinear", align_corners=False)[:, 0]
        return (logits > threshold).cpu().numpy(), scores.cpu().numpy()


# ---- prompt checks: pixel coordinates of the original page, as the data loader checks annotations

@dataclass(frozen=True)
class Prompts:
    count: int                       # Q prompts
    questions: list[str]             # Q (or none)
    points: np.ndarray | None        # float [1 or Q, P, 2], clipped to the page
    labels: np.ndarray | None        # int [1 or Q, P], 1 positive / 0 negative
    boxes: np.ndarray | None         # float [1 or Q, 4], clipped to the page


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


def warn_cut_questions(questions: list[str], context_length: int) -> None:
    """open_clip keeps the first `context_length` tokens (start and end included) and drops the rest."""
    import open_clip

    longest = max(len(t) for t in questions) + 8      # a BPE token spans at least one character
    lengths = (open_clip.tokenize(questions, context_length=longest) != 0).sum(1).tolist()
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


def overlay(image: np.ndarray, masks: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The page with each mask tinted in its own colour (uint8 [H, W, 3])."""
    colours = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                        [70, 240, 240]], dtype=np.float32)
    out = image.astype(np.float32)
    for i, m in enumerate(masks):
        out[m] = (1 - alpha) * out[m] + alpha * colours[i % len(colours)]
    return out.clip(0, 255).astype(np.uint8)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Segment a page with a stage=finetune checkpoint.")
    p.add_argument("checkpoint")
    p.add_argument("image")
    p.add_argument("--question", action="append", help="a question (repeat for several)")
    p.add_argument("--point", nargs=2, type=float, action="append", metavar=("X", "Y"),
                   help="a positive click in page pixels (repeat for several, one prompt)")
    p.add_argument("--box", nargs=4, type=float, metavar=("X0", "Y0", "X1", "Y1"))
    p.add_argument("--ocr", default=None, help="OCR backend for the page words: tesseract (default: none)")
    p.add_argument("--out", default="prediction.png", help="overlay image to write")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = p.parse_args(argv)
    from PIL import Image

    try:
        image = load_page_image(args.image, DEFAULT_MAX_PAGE_PIXELS)  # before the model: a wrong path fails fast
        predictor = Predictor.from_checkpoint(args.checkpoint)
        masks, scores = predictor.predict(image, question=args.question, points=args.point, boxes=args.box,
                                          ocr=args.ocr)
        Image.fromarray(overlay(image, masks)).save(args.out)
    except (FileNotFoundError, ValueError) as err:   # a user's mistake (CheckpointError is a ValueError)
        if args.debug:
            raise
        message = " ".join(str(err).split())         # one line
        p.exit(2, f"dociq predict: error: {message}\n")
    labels = args.question or ["prompt"] * len(masks)
    for label, mask, score in zip(labels, masks, scores):
        print(f"{label!r}: {int(mask.sum())} px, predicted IoU {score:.3f}")
    print(f"overlay written to {args.out}")


if __name__ == "__main__":
    main()
