"""The Predictor: a page (+ OCR words) and prompts in, masks of the page's size out.

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

    dociq predict CKPT page.png --question "the page footer" --ocr tesseract --out overlay.png  # dociq/cli/predict.py
    dociq predict CKPT --pdf paper.pdf --page 2 --question "the title" --coco-json out.json

Prompts (any combination, Q prompts): `question` str or list of Q strings; `points` [P, 2] or
[Q, P, 2] pixel (x, y) of the original page with `point_labels` (1 positive, 0 negative; default
1); `boxes` [4] or [Q, 4] pixel x0, y0, x1, y1; `mask_input` [Q, 1, h, w] low-res logits of an
earlier prediction. A single point set, box or mask input is shared by all questions. OCR words
come from `words` + `word_boxes` (pixels of the original page), an `OcrWords`, or an OCR backend
(`ocr="tesseract"` or an object with `recognise`; a PDF's text layer: the CLI's `--pdf`).
Prompts and words are checked against the page before the model runs (dociq.inference.prompts), as
the data loader checks annotations: a non-finite or out-of-page point, an inverted / zero-size / out-of-page box, an empty
question or mismatched shapes raise a ValueError naming the argument; coordinates at most
`BOX_OVERSHOOT_TOLERANCE` (1%) of the page beyond its edge are clipped. A question longer than the
question tower's context length is cut, with a warning. `dociq predict` prints such errors as one
line and exits with status 2 (`--debug` shows the traceback). docs/predict.md has the API, the CLI and the
speed of a prompt after `set_image`.
This module uses `dociq.models`/`dociq.data`, reads checkpoints with plain torch — no Lightning — and
model folders with `dociq.inference.model_folder` (which knows nothing of the Predictor).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator, lexical_match, resize_longest_side
from dociq.data.ocr import OcrWords
from dociq.data.schema import Page
from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer
from dociq.models.grounding import first_subtokens
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT
from dociq.models.segmenter import PageEmbedding, SegmentationModel, remove_ocr_words
from dociq.models.sizes import checkpoint_model_config
from dociq.inference.model_folder import (DEFAULT_MAX_QUESTION_WORDS, DociqSegmenter, folder_ocr_tokenizer,
                                          folder_question_tokenizer_of)
from dociq.inference.page_inputs import read_page_image, read_page_words
from dociq.inference.prompts import Prompts, check_prompts, check_threshold
from dociq.inference.snapping import (DEFAULT_BEST_GUESS_MARGIN, DEFAULT_SNAP, SNAP_MODES,  # noqa: F401  (re-exported)
                                      check_snap, clicks_innermost, page_masks)
from dociq.inference.unit_classifier import default_unit_classifier
from dociq.io.checkpoint import CheckpointError, model_state_dict, read_finetune_checkpoint

log = logging.getLogger(__name__)


class Predictor:
    """A segmentation model behind SAM's `SamPredictor` interface: `set_image` embeds a page once,
    `predict` answers any number of prompts about it (docs/predict.md)."""

    def __init__(self, model: SegmentationModel, image_size: int, use_ocr: bool = True,
                 ocr_tokenizer: OcrTokenizer | None = None, device: str | torch.device = "cpu",
                 max_question_words: int = DEFAULT_MAX_QUESTION_WORDS, snap: str | None = DEFAULT_SNAP) -> None:
        self.device = check_device(device)
        # Masks drawn at word-box precision (dociq.models.word_snap): "words" snaps the text parts of
        # each mask to the box around their OCR words; "blocks" (the default) also completes each text
        # block the mask holds or a click lands in, and keeps a box prompt's mask inside its box;
        # None returns the decoder's masks as they are.
        self.snap = snap
        self.best_guess_margin = DEFAULT_BEST_GUESS_MARGIN
        # With snap="blocks", a layout question naming a text class ("the page number", "all section
        # headings") is answered by the text units `unit_classifier` names, not by the decoder's mask
        # (dociq.inference.class_answers); False keeps the decoder's.
        self.class_answers = True
        self.unit_classifier = default_unit_classifier()
        self.model = model.to(self.device).eval()
        self.image_size = int(image_size)
        self.use_ocr = use_ocr
        self.max_question_words = int(max_question_words)
        self.use_lexical_match = True
        # the page's text blocks only for a grounding that reads them (model.grounding.text_blocks)
        uses_blocks = model.grounding is not None and model.grounding.text_blocks
        self.collator = DocumentCollator(self.image_size, ocr_tokenizer=ocr_tokenizer, blocks=uses_blocks)
        question_encoder = model.prompt_encoder.question_encoder
        self.question_tokenizer = QuestionTokenizer(question_encoder.context_length) if question_encoder else None
        self._page: PageState | None = None

    @property
    def snap(self) -> str | None:
        return self._snap

    @snap.setter
    def snap(self, value: str | None) -> None:
        self._snap = check_snap(value)

    @contextmanager
    def snapping(self, mode: str | None):
        """`with predictor.snapping(None): ...`: masks snapped as `mode` inside the block, the
        Predictor's own setting again after it (for callers that post-process raw masks themselves)."""
        own = self.snap
        self.snap = mode
        try:
            yield self
        finally:
            self.snap = own

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> "Predictor":
        """A `stage=finetune` checkpoint (its hyper-parameters hold the model config)."""
        path = Path(path)
        ckpt = read_finetune_checkpoint(path)
        hparams = ckpt["hyper_parameters"]
        model = SegmentationModel.from_config(checkpoint_model_config(hparams["model"], path))
        state = model_state_dict(ckpt["state_dict"])
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
        """A Hugging Face-style folder (config.json + model.safetensors), read by `dociq.inference.model_folder`."""
        return predictor_from_pretrained(directory, device=device)

    # ---- the page: SAM's set_image / reset_image ---------------------------------------------

    @torch.no_grad()
    def set_image(self, image: Any, words: Sequence[str] | OcrWords | None = None, word_boxes: Any = None,
                  ocr: str | Any | None = None) -> None:
        """Read the page (a path, PIL image or uint8 [H, W, 3] RGB array) and its OCR words, and
        embed it once: image + OCR encoders, fusion trunk and neck. Every later `predict` reuses it."""
        self.reset_image()
        page_image = self._image(image)
        page_words, page_boxes, confidences = self._words(page_image, words, word_boxes, ocr)
        batch = self.collator([Page(image=page_image, words=page_words, word_boxes=page_boxes)])
        cut = int(batch["ocr_truncated"][0])
        if cut and self.use_ocr:
            # Dense real pages exceed the OCR token budget; questions about the words past it
            # cannot be matched (docs/experiments.md, 2026-11-25, "Real pages").
            log.warning("%d of %d OCR words did not fit the model's OCR budget (%d WordPiece tokens) and "
                        "are not seen: questions about them cannot be answered from the text",
                        cut, len(page_words), self.collator.ocr_tokenizer.max_length)
        if not self.use_ocr:
            batch = remove_ocr_words(batch)
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        h, w = page_image.shape[:2]
        embedding = self.model.embed_page(batch)
        self.model.keep_page_layout(embedding)       # the grounding's page-only maps, once for all prompts
        self._page = PageState(image=page_image, words=page_words,
                               word_boxes=page_boxes, word_confidences=confidences,
                               ocr_word_index=batch["ocr_word_index"].cpu(),
                               embedding=embedding, scale=float(batch["meta"][0]["scale"]),
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
        return read_page_image(image)

    @staticmethod
    def _words(image: np.ndarray, words, word_boxes, ocr) -> tuple[list[str], np.ndarray, np.ndarray | None]:
        return read_page_words(image, words, word_boxes, ocr)

    def _check_prompts(self, question, points, point_labels, boxes, mask_input, size: tuple[int, int]) -> Prompts:
        """Validate the prompts against the page (pixels of the original page) before any model work."""
        context_length = None if self.question_tokenizer is None else self.question_tokenizer.context_length
        return check_prompts(question, points, point_labels, boxes, mask_input, size, self.low_res_size,
                             context_length)

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
        ambiguous = torch.full((q,), prompts.lone_click, device=self.device)
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
        threshold = check_threshold(threshold)
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

    @torch.no_grad()
    def word_class_probabilities(self) -> np.ndarray | None:
        """float [N, len(REGION_CLASSES)]: the layout class probabilities of each of the set page's N
        OCR words (the word-class head on its first sub-token; a row of zeros for a word the token
        budget left out), or None when the model has no word-class head."""
        page = self.page
        logits = self.model.word_class_logits(page.embedding)
        if logits is None:
            return None
        word_index = page.ocr_word_index.to(logits.device)
        first = first_subtokens(word_index)[0]
        out = np.zeros((len(page.words), logits.shape[-1]), np.float32)
        if len(page.words) and self.use_ocr:
            out[word_index[0, first].cpu().numpy()] = logits[0, first].softmax(-1).float().cpu().numpy()
        return out

    def predict_masks(self, question: str | Sequence[str] | None = None, points: Any = None,
                      point_labels: Any = None, boxes: Any = None, mask_input: Any = None,
                      multimask_output: bool = False, return_logits: bool = False,
                      threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SamPredictor.predict's return on the page set by `set_image`: always
        (masks, scores, low_res_logits), shapes as in `predict`."""
        threshold = check_threshold(threshold)
        prompts = self._check_prompts(question, points, point_labels, boxes, mask_input, self.page.original_size)
        return self._decode(prompts, multimask_output, return_logits, threshold)

    @torch.no_grad()
    def _decode(self, prompts: Prompts, multimask_output: bool, return_logits: bool,
                threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`SegmentationModel.answer` on the cached page embedding (the prompt path training
        validates), then the masks at the page's size."""
        page = self.page
        question_ids, points, mask_prompt, ambiguous = self._prompt_tensors(prompts, page.scale)
        match, word_pos = None, None
        if question_ids is not None:
            match, word_pos = lexical_match([page.words if self.use_ocr else []], [prompts.questions],
                                            page.ocr_word_index,
                                            self.max_question_words, self.question_tokenizer.context_length)
            if not self.use_lexical_match:
                match = torch.zeros_like(match)
            match, word_pos = match[0].to(self.device), word_pos[0].to(self.device)
            question_ids = question_ids.to(self.device)
        answer = self.model.answer(page.embedding, question_ids, match, word_pos, points, mask_prompt, ambiguous)
        if multimask_output or clicks_innermost(prompts, multimask_output, return_logits, self.snap):
            low_res, scores = answer.masks[:, 1:], answer.iou[:, 1:]     # SAM: the 3 multimask tokens
        else:                                        # one mask: the best candidate (multimask for a lone click)
            low_res, scores = answer.chosen, answer.chosen_iou
        return page_masks(_float_numpy(self._to_page(low_res)), _float_numpy(scores), _float_numpy(low_res), prompts,
                          page, multimask_output=multimask_output, return_logits=return_logits, threshold=threshold,
                          snap=self.snap, best_guess_margin=self.best_guess_margin, use_ocr=self.use_ocr,
                          unit_classifier=self.unit_classifier if self.class_answers else None)

    def _to_page(self, low_res: torch.Tensor) -> torch.Tensor:
        """[Q, C, h, w] decoder grid -> the square input frame -> crop the padding -> [Q, C, H, W]
        at the page's original size."""
        q, c, lh, lw = low_res.shape
        (h, w), (nh, nw) = self.page.original_size, self.page.input_size
        x = F.interpolate(low_res.reshape(q * c, 1, lh, lw), size=(self.image_size, self.image_size),
                          mode="bilinear", align_corners=False)
        x = F.interpolate(x[..., :nh, :nw], size=(h, w), mode="bilinear", align_corners=False)
        return x.reshape(q, c, h, w)


def _float_numpy(x: torch.Tensor) -> np.ndarray:
    """float32 numpy of a tensor in any dtype and device (numpy has no bfloat16)."""
    return x.float().cpu().numpy()


@dataclass
class PageState:
    """What `Predictor.set_image` keeps for the prompts of one page."""
    image: np.ndarray                # uint8 [H, W, 3] the original page
    words: list[str]                 # the page's OCR words
    word_boxes: np.ndarray           # float [N, 4] their pixel boxes on the original page
    word_confidences: np.ndarray | None   # float [N] the OCR's confidence in each (0..100), None: words given
    ocr_word_index: torch.Tensor     # long [1, T] page word of each OCR token (for the lexical match)
    embedding: PageEmbedding         # SegmentationModel.embed_page of the page
    scale: float                     # original page pixels -> model input pixels
    original_size: tuple[int, int]   # (H, W) of the page
    input_size: tuple[int, int]      # (h, w) of the page inside the model's square input
    text_blocks: list[list[int]] | None = None   # group_blocks of the words, once a prompt needs them
    ink: np.ndarray | None = None                # page_ink of the image, once a box or click needs it
    drawings: np.ndarray | None = None           # the page's pictures (word_snap.picture_boxes), once a click needs them
    figures: np.ndarray | None = None            # the pictures a figure question takes (figure_answers), once one is asked
    signatures: np.ndarray | None = None         # the signatures a signature question takes (figure_answers), once one is asked
    text_units: list[list[int]] | None = None    # class_answers.text_units, once a question names a class
    unit_probs: np.ndarray | None = None         # the unit classifier's (-1: a unit of doubted words only), once a question names a class
    slope: float | None = None                   # how its text lines rise (a skewed scan), once a mask is snapped to blocks
    sure: np.ndarray | None = None               # bool [N] the words read surely (snapping.page_sure), once a picture or a class answer needs them


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


# ---- loading ---------------------------------------------------------------------------------

def predictor_from_pretrained(directory: str | Path, device: str | torch.device = "cpu") -> Predictor:
    """A model folder -> a Predictor, set up as `Predictor.from_checkpoint` sets it up from the
    original checkpoint (image size, OCR on/off, lexical match), with the folder's tokenizers."""
    folder = Path(directory)
    segmenter = DociqSegmenter.from_pretrained(folder)
    predictor = Predictor(segmenter.model, segmenter.image_size, use_ocr=segmenter.ocr,
                          ocr_tokenizer=folder_ocr_tokenizer(folder, segmenter), device=device,
                          max_question_words=segmenter.max_question_words)
    predictor.use_lexical_match = segmenter.lexical_match
    if predictor.question_tokenizer is not None:
        predictor.question_tokenizer = folder_question_tokenizer_of(folder, segmenter,
                                                                    predictor.question_tokenizer.context_length)
    return predictor


def load_predictor(checkpoint: str | Path, device: str = "cpu") -> Predictor:
    """A directory is a from_pretrained folder (config.json + model.safetensors), a file a .ckpt."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        return Predictor.from_pretrained(checkpoint, device=device)
    return Predictor.from_checkpoint(checkpoint, device=device)
