"""Predictor API and CLI: a page (+ OCR words) and prompts in, masks of the page's size out.

SAM's `SamPredictor` shape: embed the page once, then prompt it as often as needed.

    from dociq.inference.predictor import Predictor
    predictor = Predictor.from_checkpoint("outputs/finetune/runs/<run>/checkpoints/last.ckpt")
    predictor.set_image("page.png", ocr="tesseract")      # image + OCR encoders, once per page
    masks, scores = predictor.predict(question=["the page footer", "all form values"])
    # masks: bool [Q, H, W] at the page's original size; scores: predicted IoU [Q]
    masks, scores, low_res = predictor.predict(points=[[120, 40]], multimask_output=True)  # [1, 3, H, W]
    best = low_res[np.arange(1), scores.argmax(1)][:, None]                              # [1, 1, h, w]
    masks, scores = predictor.predict(points=[[120, 40], [300, 90]], point_labels=[1, 0], mask_input=best)
    masks, scores = predictor.predict("page2.png", question="the title")  # one call: set_image + predict

    python -m dociq.inference.predictor CKPT page.png --question "the page footer" --ocr tesseract --out overlay.png
    python -m dociq.inference.predictor CKPT --pdf paper.pdf --page 2 --question "the title" --coco-json out.json

Prompts (any combination, Q prompts): `question` str or list of Q strings; `points` [P, 2] or
[Q, P, 2] pixel (x, y) of the original page with `point_labels` (1 positive, 0 negative; default
1); `boxes` [4] or [Q, 4] pixel x0, y0, x1, y1; `mask_input` [Q, 1, h, w] low-res logits of an
earlier prediction. A single point set, box or mask input is shared by all questions. OCR words
come from `words` + `word_boxes` (pixels of the original page), an `OcrWords`, or an OCR backend
(`ocr="tesseract"` or an object with `recognise`; a PDF's text layer: the CLI's `--pdf`).
Prompts and words are checked against the page before the model runs, as the data loader checks
annotations: a non-finite or out-of-page point, an inverted / zero-size / out-of-page box, an empty
question or mismatched shapes raise a ValueError naming the argument; coordinates at most
`BOX_OVERSHOOT_TOLERANCE` (1%) of the page beyond its edge are clipped. A question longer than the
question tower's context length is cut, with a warning. The CLI prints such errors as one line and
exits with status 2 (`--debug` shows the traceback). docs/predict.md has the API, the CLI and the
speed of a prompt after `set_image`.
This module uses `dociq.models`/`dociq.data` and reads checkpoints with plain torch — no Lightning.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator, lexical_match, resize_longest_side
from dociq.data.errors import BOX_OVERSHOOT_TOLERANCE, DEFAULT_MAX_PAGE_PIXELS, BadSampleError
from dociq.data.image_io import load_page_image, to_rgb_array
from dociq.data.ocr import OcrWords, PdfTextLayer, make_ocr
from dociq.data.schema import Page
from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer
from dociq.models.word_snap import snap_to_words
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT
from dociq.models.segmenter import (PageEmbedding, SegmentationModel, best_candidate, choose_outputs,
                                    remove_ocr_words)
from dociq.io.checkpoint import CheckpointError, read_finetune_checkpoint

log = logging.getLogger(__name__)


class Predictor:
    """A segmentation model behind SAM's `SamPredictor` interface: `set_image` embeds a page once,
    `predict` answers any number of prompts about it (docs/predict.md)."""

    def __init__(self, model: SegmentationModel, image_size: int, use_ocr: bool = True,
                 ocr_tokenizer: OcrTokenizer | None = None, device: str | torch.device = "cpu",
                 max_question_words: int = 12, snap_to_words: bool = False) -> None:
        self.device = check_device(device)
        # Snap the text parts of each mask to the box around its OCR words (dociq.models.word_snap).
        self.snap_to_words = snap_to_words
        self.model = model.to(self.device).eval()
        self.image_size = int(image_size)
        self.use_ocr = use_ocr
        self.max_question_words = int(max_question_words)
        self.use_lexical_match = True
        self.collator = DocumentCollator(self.image_size, ocr_tokenizer=ocr_tokenizer)
        question_encoder = model.prompt_encoder.question_encoder
        self.question_tokenizer = QuestionTokenizer(question_encoder.context_length) if question_encoder else None
        self._page: PageState | None = None

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> "Predictor":
        """A `stage=finetune` checkpoint (its hyper-parameters hold the model config)."""
        path = Path(path)
        ckpt = read_finetune_checkpoint(path)
        hparams = ckpt["hyper_parameters"]
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

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> "Predictor":
        """A Hugging Face-style folder (config.json + model.safetensors), read by `dociq.inference.hub`."""
        from dociq.inference.hub import predictor_from_pretrained   # here: dociq.inference.hub imports this module

        return predictor_from_pretrained(directory, device=device)

    # ---- the page: SAM's set_image / reset_image ---------------------------------------------

    @torch.no_grad()
    def set_image(self, image: Any, words: Sequence[str] | OcrWords | None = None, word_boxes: Any = None,
                  ocr: str | Any | None = None) -> None:
        """Read the page (a path, PIL image or uint8 [H, W, 3] RGB array) and its OCR words, and
        embed it once: image + OCR encoders, fusion trunk and neck. Every later `predict` reuses it."""
        self.reset_image()
        page_image = self._image(image)
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
        h, w = page_image.shape[:2]
        self._page = PageState(image=page_image, words=page_words,
                               word_boxes=page_boxes, ocr_word_index=batch["ocr_word_index"].cpu(),
                               embedding=self.model.embed_page(batch), scale=float(batch["meta"][0]["scale"]),
                               original_size=(h, w), input_size=resize_longest_side((h, w), self.image_size))

    def reset_image(self) -> None:
        """Forget the page set by `set_image` (and free its embedding)."""
        self._page = None

    @property
    def is_image_set(self) -> bool:
        return self._page is not None

    @property
    def page(self) -> "PageState":
        """The page `set_image` embedded: its image, words, embedding and sizes."""
        if self._page is None:
            raise RuntimeError("no page is set: call predictor.set_image(image, words=..., word_boxes=...) "
                               "first, or pass the image to predict(image, question=...)")
        return self._page

    def set_page_state(self, state: "PageState") -> None:
        """Make an earlier `predictor.page` the set page again without re-embedding it (a cache of
        embedded pages, e.g. the data engine's, swaps pages this way)."""
        if not isinstance(state, PageState):
            raise TypeError(f"set_page_state takes a PageState (predictor.page), got {type(state).__name__}")
        self._page = state

    def get_image_embedding(self) -> PageEmbedding:
        return self.page.embedding

    @property
    def low_res_size(self) -> tuple[int, int]:
        """(h, w) of the low-res logits / `mask_input`: the decoder's stride-4 grid of the square input."""
        return tuple(self.model.prompt_encoder.mask_input_size)

    # ---- inputs ------------------------------------------------------------------------------

    @staticmethod
    def _image(image: Any) -> np.ndarray:
        if isinstance(image, (str, Path)):
            if isinstance(image, str) and not Path(image).is_file():
                raise BadSampleError(Path(image), "image file not found",
                                     "give the page image (a path, PIL image or uint8 [H, W, 3] array) as the "
                                     "first argument; a question goes in question=...")
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
            if isinstance(backend, PdfTextLayer):
                raise ValueError("ocr='pdf' reads a PDF's text layer, and an image has none: pass "
                                 "words=PdfTextLayer().words(pdf, page_index, image.shape[:2]) (the CLI: "
                                 "--pdf FILE --page N), or ocr='tesseract' for a scanned page")
            found = backend.recognise(image).scaled_to(image.shape[:2])
            return list(found.words), found.boxes
        log.warning("no OCR words given (words=None, ocr=None): the model sees the page image only")
        return [], np.zeros((0, 4), np.float32)

    def _check_prompts(self, question, points, point_labels, boxes, mask_input, size: tuple[int, int]) -> Prompts:
        """Validate the prompts against the page (pixels of the original page) before any model work."""
        questions = check_questions(question)
        pts, lbl = (None, None) if points is None else check_points(points, point_labels, size)
        if points is None and point_labels is not None:
            raise ValueError("point_labels given without points: pass points=[[x, y], ...] too")
        bxs = None if boxes is None else check_boxes(boxes, size)
        masks = None if mask_input is None else check_mask_input(mask_input, self.low_res_size)
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
            if self.question_tokenizer is None:
                raise ValueError("this model has no question tower; prompt it with points or boxes")
            warn_cut_questions(questions, self.question_tokenizer.context_length)
            questions = questions * (q if len(questions) == 1 else 1)   # one question shared by all prompts
        return Prompts(q, questions, pts, lbl, bxs, masks)

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
        mask_prompt = None
        if prompts.masks is not None:
            mask_prompt = torch.from_numpy(np.broadcast_to(prompts.masks, (q, *prompts.masks.shape[1:])).copy())
            mask_prompt = mask_prompt.to(self.device)
        # a prompt of clicks only (no question, no box) is ambiguous: pick among the 3 candidates
        ambiguous = torch.full((q,), question_ids is None and bxs is None and pts is not None and pts.shape[1] == 1)
        return question_ids, points_t, mask_prompt, ambiguous

    # ---- prediction --------------------------------------------------------------------------

    def predict(self, image: Any = None, *, question: str | Sequence[str] | None = None,
                points: Any = None, point_labels: Any = None, boxes: Any = None, mask_input: Any = None,
                multimask_output: bool = False, return_logits: bool = False, threshold: float = 0.0,
                words: Sequence[str] | OcrWords | None = None, word_boxes: Any = None,
                ocr: str | Any | None = None) -> tuple[np.ndarray, ...]:
        """Masks for Q prompts about the page set by `set_image`, or about `image` (then set_image(image,
        words, word_boxes, ocr) first: the page stays set for later calls).

        Default flags -> (masks bool [Q, H, W] at the page's original size, scores float [Q] predicted IoU).
        With multimask_output or return_logits -> SAM's triple (masks, scores, low_res_logits):
        multimask_output gives the 3 candidates per prompt (masks [Q, 3, H, W], scores [Q, 3],
        low_res_logits [Q, 3, h, w]), otherwise masks [Q, H, W], scores [Q], low_res_logits
        [Q, 1, h, w]; return_logits gives float logits instead of `logits > threshold`.
        `predict_masks` always returns the triple."""
        if image is not None:
            page_image = self._image(image)
            prompts = self._check_prompts(question, points, point_labels, boxes, mask_input,
                                          page_image.shape[:2])                     # before OCR: fail fast
            self.set_image(page_image, words=words, word_boxes=word_boxes, ocr=ocr)
        else:
            if words is not None or word_boxes is not None or ocr is not None:
                raise ValueError("words / word_boxes / ocr belong to the page: pass them to set_image(image, "
                                 "words=..., word_boxes=...) or with the image to predict(image, ...)")
            prompts = self._check_prompts(question, points, point_labels, boxes, mask_input,
                                          self.page.original_size)
        masks, scores, low_res = self._decode(prompts, multimask_output, return_logits, threshold)
        return (masks, scores, low_res) if multimask_output or return_logits else (masks, scores)

    def predict_masks(self, question: str | Sequence[str] | None = None, points: Any = None,
                      point_labels: Any = None, boxes: Any = None, mask_input: Any = None,
                      multimask_output: bool = False, return_logits: bool = False,
                      threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SamPredictor.predict's return on the page set by `set_image`: always
        (masks, scores, low_res_logits), shapes as in `predict`."""
        prompts = self._check_prompts(question, points, point_labels, boxes, mask_input, self.page.original_size)
        return self._decode(prompts, multimask_output, return_logits, threshold)

    @torch.no_grad()
    def _decode(self, prompts: Prompts, multimask_output: bool, return_logits: bool,
                threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Question tower + word grounding + mask decoder on the cached page embedding."""
        page = self.page
        question_ids, points, mask_prompt, ambiguous = self._prompt_tensors(prompts, page.scale)
        question_tokens, grounding = None, None
        if question_ids is not None:
            question_tokens = self.model.encode_questions(question_ids.to(self.device))
            match, word_pos = lexical_match([page.words if self.use_ocr else []], [prompts.questions],
                                            page.ocr_word_index,
                                            self.max_question_words, self.question_tokenizer.context_length)
            if not self.use_lexical_match:
                match = torch.zeros_like(match)
            has_question = (question_ids != 0).any(1).to(self.device)
            grounding = self.model.ground(page.embedding, question_tokens, match[0].to(self.device),
                                          word_pos[0].to(self.device), has_question)
        emb = page.embedding
        masks, iou = self.model.decode(emb.image, emb.high_res, question_tokens, points, mask_prompt, grounding)
        if multimask_output:                         # SAM: the 3 multimask tokens
            low_res, scores = masks[:, 1:], iou[:, 1:]
        else:                                        # one mask: the best candidate (multimask for a lone click)
            masks, iou = choose_outputs(masks, iou, ambiguous.to(self.device))
            best = iou.argmax(1, keepdim=True)
            low_res = best_candidate(masks, iou)[:, None]
            scores = iou.gather(1, best)[:, 0]
        logits = self._to_page(low_res)
        out = logits if return_logits else logits > threshold
        if not multimask_output:
            out = out[:, 0]
        out = out.cpu().numpy()
        if self.snap_to_words and not return_logits and self.use_ocr and len(page.words):
            flat = out.reshape(-1, *out.shape[-2:])
            out = np.stack([snap_to_words(m, page.word_boxes) for m in flat]).reshape(out.shape)
        return out, scores.cpu().numpy(), low_res.cpu().numpy()

    def _to_page(self, low_res: torch.Tensor) -> torch.Tensor:
        """[Q, C, h, w] decoder grid -> the square input frame -> crop the padding -> [Q, C, H, W]
        at the page's original size."""
        q, c, lh, lw = low_res.shape
        (h, w), (nh, nw) = self.page.original_size, self.page.input_size
        x = F.interpolate(low_res.reshape(q * c, 1, lh, lw), size=(self.image_size, self.image_size),
                          mode="bilinear", align_corners=False)
        x = F.interpolate(x[..., :nh, :nw], size=(h, w), mode="bilinear", align_corners=False)
        return x.reshape(q, c, h, w)


@dataclass
class PageState:
    """What `Predictor.set_image` keeps for the prompts of one page."""
    image: np.ndarray                # uint8 [H, W, 3] the original page
    words: list[str]                 # the page's OCR words
    word_boxes: np.ndarray           # float [N, 4] their pixel boxes on the original page
    ocr_word_index: torch.Tensor     # long [1, T] page word of each OCR token (for the lexical match)
    embedding: PageEmbedding         # SegmentationModel.embed_page of the page
    scale: float                     # original page pixels -> model input pixels
    original_size: tuple[int, int]   # (H, W) of the page
    input_size: tuple[int, int]      # (h, w) of the page inside the model's square input


def check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a torch device ({err}): use 'cpu' or 'cuda[:N]'") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch sees no CUDA device on this machine: use device='cpu'")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} but the MPS backend is not available here: use device='cpu'")
    return dev


# ---- prompt checks: pixel coordinates of the original page, as the data loader checks annotations

@dataclass(frozen=True)
class Prompts:
    count: int                       # Q prompts
    questions: list[str]             # Q (or none)
    points: np.ndarray | None        # float [1 or Q, P, 2], clipped to the page
    labels: np.ndarray | None        # int [1 or Q, P], 1 positive / 0 negative
    boxes: np.ndarray | None         # float [1 or Q, 4], clipped to the page
    masks: np.ndarray | None = None  # float [1 or Q, 1, h, w] low-res mask logits (SAM's mask_input)


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


def check_mask_input(mask_input, size: tuple[int, int]) -> np.ndarray:
    """SAM's mask_input: low-res logits of a previous prediction, one per prompt -> float32
    [1 or Q, 1, h, w]. [Q, h, w] is read as one mask per prompt (SAM's [1, h, w] for one prompt)."""
    if torch.is_tensor(mask_input):
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


def overlay(image: np.ndarray, masks: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The page with each mask tinted in its own colour (uint8 [H, W, 3])."""
    colours = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                        [70, 240, 240]], dtype=np.float32)
    out = image.astype(np.float32)
    for i, m in enumerate(masks):
        out[m] = (1 - alpha) * out[m] + alpha * colours[i % len(colours)]
    return out.clip(0, 255).astype(np.uint8)


# ---- the CLI -----------------------------------------------------------------------------------

def read_words_json(path: str | Path) -> tuple[list, list]:
    """OCR words for the CLI's --words: a JSON list of {"text": str, "box": [x0, y0, x1, y1]}, or an
    object {"words": [str, ...], "boxes": [[x0, y0, x1, y1], ...]}; boxes in pixels of the page."""
    path = Path(path)
    form = ('a list of {"text": "...", "box": [x0, y0, x1, y1]} or {"words": [...], "boxes": [[x0, y0, x1, y1], '
            '...]}, boxes in page pixels')
    if not path.is_file():
        raise FileNotFoundError(f"--words {path}: file not found; give a JSON file of {form}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--words {path}: not JSON ({err}); give {form}") from err
    if isinstance(data, dict):
        missing = [k for k in ("words", "boxes") if k not in data]
        if missing:
            raise ValueError(f"--words {path}: the object lacks the key(s) {missing}; give {form}")
        return data["words"], data["boxes"]
    if not isinstance(data, list):
        raise ValueError(f"--words {path}: the JSON is a {type(data).__name__}; give {form}")
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "text" not in item or "box" not in item:
            raise ValueError(f"--words {path}: item [{i}] = {str(item)[:60]} lacks 'text' or 'box'; give {form}")
    return [item["text"] for item in data], [item["box"] for item in data]


def read_pdf_page(path: str | Path, page: int, dpi: float) -> tuple[np.ndarray, OcrWords]:
    """Page `page` (numbered from 1) of a PDF rendered at `dpi`, and its text-layer words."""
    if page < 1:
        raise ValueError(f"--page {page}: pages are numbered from 1")
    path = Path(path)
    if path.is_file():
        import pypdfium2 as pdfium

        try:
            doc = pdfium.PdfDocument(str(path))
        except pdfium.PdfiumError:
            doc = None                                   # PdfTextLayer names the problem below
        if doc is not None:
            count = len(doc)
            doc.close()
            if page > count:
                raise ValueError(f"--pdf {path}: --page {page} but the PDF has {count} page(s); give --page "
                                 f"1..{count}")
    return PdfTextLayer(dpi=dpi).read(path, page - 1)


def load_predictor(checkpoint: str | Path, device: str = "cpu") -> Predictor:
    """A directory is a from_pretrained folder (config.json + model.safetensors), a file a .ckpt."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        return Predictor.from_pretrained(checkpoint, device=device)
    return Predictor.from_checkpoint(checkpoint, device=device)


@dataclass(frozen=True)
class Output:
    prompt: int                 # index of the prompt
    candidate: int | None       # multimask candidate 0..2 (None: one mask per prompt)
    label: str                  # the question, or what the prompt was
    mask: np.ndarray            # bool [H, W]
    score: float                # predicted IoU


def outputs(masks: np.ndarray, scores: np.ndarray, labels: list[str]) -> list[Output]:
    """Flatten [Q, H, W] / [Q] or multimask [Q, 3, H, W] / [Q, 3] predictions, prompt-major."""
    if masks.ndim == 3:
        return [Output(q, None, labels[q], masks[q], float(scores[q])) for q in range(len(masks))]
    return [Output(q, k, labels[q], masks[q, k], float(scores[q, k]))
            for q in range(masks.shape[0]) for k in range(masks.shape[1])]


def coco_results(results: list[Output], image_id: int, file_name: str, questions: list[str]) -> list[dict]:
    """COCO segmentation results (pycocotools' loadRes format: image_id, category_id, segmentation as
    compressed RLE, score) plus the question text (null for a point/box prompt) and the prompt index."""
    from pycocotools import mask as mask_utils

    out = []
    for r in results:
        rle = mask_utils.encode(np.asfortranarray(r.mask.astype(np.uint8)))
        rle["counts"] = rle["counts"].decode("ascii")
        entry = {"image_id": image_id, "category_id": 1, "segmentation": rle, "score": r.score,
                 "bbox": [float(v) for v in mask_utils.toBbox(rle)], "area": float(mask_utils.area(rle)),
                 "question": questions[r.prompt] if questions else None, "prompt": r.prompt,
                 "file_name": file_name}
        if r.candidate is not None:
            entry["candidate"] = r.candidate
        out.append(entry)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq predict",
                                description="Segment a page with a stage=finetune checkpoint (docs/predict.md).")
    p.add_argument("checkpoint", help="a stage=finetune .ckpt file, or a from_pretrained folder "
                                      "(config.json + model.safetensors)")
    p.add_argument("image", nargs="?", help="the page image (PNG/JPEG/TIFF); or give --pdf FILE --page N")
    p.add_argument("--pdf", help="a born-digital PDF: its page --page is rendered and its text layer is the OCR")
    p.add_argument("--page", type=int, default=None, help="page of --pdf, numbered from 1 (default 1)")
    p.add_argument("--dpi", type=float, default=144.0, help="render resolution of --pdf (default 144)")
    p.add_argument("--question", action="append", help="a question (repeat for several prompts, one call)")
    p.add_argument("--point", nargs=2, type=float, action="append", metavar=("X", "Y"),
                   help="a positive click in page pixels (repeat for several, one prompt)")
    p.add_argument("--box", nargs=4, type=float, action="append", metavar=("X0", "Y0", "X1", "Y1"),
                   help="a box in page pixels (repeat for several prompts; one box is shared by all questions)")
    p.add_argument("--words", help='OCR words as JSON: [{"text": ..., "box": [x0, y0, x1, y1]}, ...] or '
                                   '{"words": [...], "boxes": [[x0, y0, x1, y1], ...]}, page pixels')
    p.add_argument("--ocr", default=None, choices=["tesseract", "pdf"],
                   help="OCR for the page words: tesseract, or pdf (the text layer of --pdf, its default)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threshold", type=float, default=0.0, help="mask logit threshold (default 0)")
    p.add_argument("--multimask", action="store_true", help="the 3 candidate masks per prompt (SAM's multimask)")
    p.add_argument("--out", default=None, help="overlay image to write (default: ./<input>_prediction.png)")
    p.add_argument("--masks-dir", help="also write one PNG per mask (0/255) into this folder")
    p.add_argument("--coco-json", help="also write the masks as COCO results JSON (RLE, score, question)")
    p.add_argument("--image-id", type=int, default=1, help="image_id of the COCO results (default 1)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def _page_and_words(args) -> tuple[np.ndarray, Any, str, str | None]:
    """-> page image, words (OcrWords / (words, boxes) / None), a name for outputs, the OCR backend."""
    if args.pdf and args.image:
        raise ValueError(f"give the page as an image ({args.image}) or as --pdf {args.pdf}, not both")
    if not args.pdf and not args.image:
        raise ValueError("give the page: an image path, or --pdf FILE --page N")
    if args.page is not None and not args.pdf:
        raise ValueError(f"--page {args.page} needs --pdf FILE (an image has one page)")
    if args.words and args.ocr:
        raise ValueError(f"give the words by --words {args.words} or --ocr {args.ocr}, not both")
    if args.ocr == "pdf" and not args.pdf:
        raise ValueError("--ocr pdf reads a PDF's text layer and an image has none: give --pdf FILE --page N, "
                         "or --ocr tesseract for a scanned image")
    if args.pdf:
        page = args.page or 1
        image, words = read_pdf_page(args.pdf, page, args.dpi)
        name = f"{Path(args.pdf).stem}_p{page}"
        ocr = None
        if args.ocr == "tesseract" or args.words:
            words, ocr = None, args.ocr
    else:
        image = load_page_image(args.image, DEFAULT_MAX_PAGE_PIXELS)   # before the model: a wrong path fails fast
        words, name, ocr = None, Path(args.image).stem, args.ocr
    if args.words:
        words = read_words_json(args.words)
        try:
            check_words(*words, image.shape[:2])
        except ValueError as err:
            raise ValueError(f"--words {args.words}: {err}") from err
    return image, words, name, ocr


def run(args) -> None:
    from PIL import Image

    image, words, name, ocr = _page_and_words(args)
    if args.masks_dir and Path(args.masks_dir).exists() and not Path(args.masks_dir).is_dir():
        raise ValueError(f"--masks-dir {args.masks_dir} is a file: give a folder")
    predictor = load_predictor(args.checkpoint, args.device)
    page_words, page_boxes = (words, None) if isinstance(words, OcrWords) or words is None else words
    # the prompts are checked against the page before the page is embedded: a bad one fails fast
    masks, scores = predictor.predict(image, question=args.question, points=args.point, boxes=args.box,
                                      words=page_words, word_boxes=page_boxes, ocr=ocr,
                                      multimask_output=args.multimask, threshold=args.threshold)[:2]
    n = masks.shape[0]
    questions = list(args.question or [])
    questions = questions * n if len(questions) == 1 else questions      # one question shared by all boxes
    labels = [repr(q) for q in questions] if questions else [f"prompt {i}" for i in range(n)]
    results = outputs(masks, scores, labels)
    best = masks if masks.ndim == 3 else masks[np.arange(n), scores.argmax(1)]
    out = Path(args.out) if args.out else Path.cwd() / f"{name}_prediction.png"
    Image.fromarray(overlay(image, best)).save(out)
    for r in results:
        which = "" if r.candidate is None else f" candidate {r.candidate}"
        print(f"{r.label}{which}: {int(r.mask.sum())} px, predicted IoU {r.score:.3f}")
    print(f"overlay written to {out}")
    if args.masks_dir:
        folder = Path(args.masks_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for r in results:
            suffix = "" if r.candidate is None else f"_{r.candidate}"
            Image.fromarray(r.mask.astype(np.uint8) * 255).save(folder / f"{name}_{r.prompt:02d}{suffix}.png")
        print(f"{len(results)} mask PNGs written to {folder}")
    if args.coco_json:
        file_name = Path(args.pdf or args.image).name
        Path(args.coco_json).write_text(json.dumps(coco_results(results, args.image_id, file_name, questions)))
        print(f"COCO results written to {args.coco_json}")


def main(argv: list[str] | None = None) -> int:
    """`python -m dociq.inference.predictor ...` / `dociq predict ...`: 0 when done, 2 on a user's mistake (one line
    on stderr; --debug raises it with its traceback). argparse's usage errors exit 2 as usual."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run(args)
    except (FileNotFoundError, ValueError) as err:   # a user's mistake (CheckpointError is a ValueError)
        if args.debug:
            raise
        message = " ".join(str(err).split())         # one line
        print(f"dociq predict: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
