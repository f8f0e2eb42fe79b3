"""The Predictor's interface on the exported ONNX graphs: numpy, onnxruntime, tokenizers and PIL,
no torch.

    from dociq.inference.onnx_predictor import OnnxPredictor
    predictor = OnnxPredictor("models/dociq-tiny")         # a folder from `dociq export CKPT DIR --onnx`
    predictor.set_image("page.png", words=words, word_boxes=boxes)   # page_encoder.onnx, once per page
    masks, scores = predictor.predict(question=["the page footer"], boxes=[10, 10, 200, 80])

    dociq predict models/dociq-tiny page.png --backend onnx --question "the title"

Same arguments, defaults (snap="blocks") and returns as `dociq.inference.predictor.Predictor`;
the prompt checks and the snapping are the same functions. docs/predict.md ("ONNX") has the numbers.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dociq.inference import onnx_geometry as geo
from dociq.inference import onnx_inputs as inputs
from dociq.inference.page_inputs import read_page_image, read_page_words
from dociq.inference.prompts import Prompts, check_prompts, check_threshold
from dociq.inference.snapping import DEFAULT_BEST_GUESS_MARGIN, DEFAULT_SNAP, check_snap, clicks_innermost, page_masks
from dociq.inference.unit_classifier import default_unit_classifier

log = logging.getLogger(__name__)
ONNX_DIR, ONNX_CONFIG = "onnx", "onnx_config.json"           # dociq.inference.onnx_export writes them
RUNTIME_HINT = "pip install 'dociq[onnx]'"
BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = 2, 3


def _runtime():
    try:
        import onnxruntime
        from tokenizers import Tokenizer
    except ImportError as err:
        raise ImportError(f"the ONNX runner needs onnxruntime and tokenizers ({err}): {RUNTIME_HINT}") from err
    return onnxruntime, Tokenizer


# the page graph's word-class output (dociq.models.export_graphs.WORD_CLASS_OUTPUT; named here
# because that module needs torch)
WORD_CLASS_OUTPUT = "word_class_logits"


@dataclass
class OnnxPage:
    """What `OnnxPredictor.set_image` keeps for the prompts of one page."""
    image: np.ndarray
    words: list[str]
    word_boxes: np.ndarray
    tokens: dict[str, np.ndarray]        # ocr_boxes, ocr_mask, word_index [1, T] (+ block_index, block_boxes)
    embedding: dict[str, np.ndarray]     # page_encoder.onnx's outputs by name
    scale: float
    original_size: tuple[int, int]
    input_size: tuple[int, int]
    word_confidences: np.ndarray | None = None   # the OCR's confidence in each word (0..100), None: words given
    text_blocks: list[list[int]] | None = None   # group_blocks of the words, once a prompt needs them
    ink: np.ndarray | None = None                # page_ink of the image, once a box or click needs it
    drawings: np.ndarray | None = None           # the page's pictures (word_snap.picture_boxes), once a click needs them
    figures: np.ndarray | None = None            # the pictures a figure question takes (figure_answers), once one is asked
    signatures: np.ndarray | None = None         # the signatures a signature question takes (figure_answers), once one is asked
    text_units: list[list[int]] | None = None    # class_answers.text_units, once a question names a class
    unit_probs: np.ndarray | None = None         # the unit classifier's (-1: a unit of doubted words only), once a question names a class
    slope: float | None = None                   # how its text lines rise (a skewed scan), once a mask is snapped to blocks
    sure: np.ndarray | None = None               # bool [N] the words read surely (snapping.page_sure), once a picture or a class answer needs them


class OnnxPredictor:
    """`Predictor` on onnxruntime. threads: intra-op threads of each session (None: onnxruntime's default)."""

    def __init__(self, folder: str | Path, threads: int | None = None, snap: str | None = DEFAULT_SNAP) -> None:
        ort, Tokenizer = _runtime()
        self.folder = Path(folder)
        onnx_dir = self.folder / ONNX_DIR
        if not (onnx_dir / ONNX_CONFIG).is_file():
            raise ValueError(f"model folder {self.folder}: has no {ONNX_DIR}/{ONNX_CONFIG}. Fix: export it with "
                             "`dociq export CKPT DIR --onnx`")
        self.config = json.loads((onnx_dir / ONNX_CONFIG).read_text(encoding="utf-8"))
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        files = self.config["files"]
        self.sessions = {k: ort.InferenceSession(str(onnx_dir / files[k]), options, providers=["CPUExecutionProvider"])
                         for k in ("page_encoder", "prompt_decoder", "prompt_decoder_no_points")}
        self.ocr_tokenizer = Tokenizer.from_file(str(onnx_dir / files["ocr_tokenizer"]))
        self.ocr_tokenizer.no_padding()
        self.ocr_tokenizer.enable_truncation(int(self.config["ocr_max_length"]))
        self.question_tokenizer = Tokenizer.from_file(str(onnx_dir / files["question_tokenizer"]))
        self.image_size = int(self.config["image_size"])
        self.use_ocr = bool(self.config["ocr"])
        self.use_lexical_match = bool(self.config["lexical_match"])
        self.max_question_words = int(self.config["max_question_words"])
        self.context_length = int(self.config["context_length"])
        self.grounding = self.config.get("grounding") or {}
        self.snap = snap
        self.best_guess_margin = DEFAULT_BEST_GUESS_MARGIN
        self.class_answers = True            # Predictor.class_answers
        self.unit_classifier = default_unit_classifier()   # Predictor.unit_classifier
        self._page: OnnxPage | None = None

    @property
    def snap(self) -> str | None:
        return self._snap

    @snap.setter
    def snap(self, value: str | None) -> None:
        self._snap = check_snap(value)

    @property
    def low_res_size(self) -> tuple[int, int]:
        return tuple(self.config["low_res_size"])

    @property
    def page(self) -> OnnxPage:
        if self._page is None:
            raise RuntimeError("no page is set: call predictor.set_image(image, words=..., word_boxes=...) first")
        return self._page

    @property
    def is_image_set(self) -> bool:
        return self._page is not None

    def reset_image(self) -> None:
        self._page = None

    # ---- the page ----------------------------------------------------------------------------

    def set_image(self, image: Any, words: Sequence[str] | None = None, word_boxes: Any = None,
                  ocr: str | Any | None = None) -> None:
        """`Predictor.set_image`: the page and its OCR words, embedded once by page_encoder.onnx."""
        self.reset_image()
        page_image = read_page_image(image)
        page_words, page_boxes, confidences = read_page_words(page_image, words, word_boxes, ocr)
        pixels, scale = inputs.letterbox(page_image, self.image_size)
        seen = page_words if self.use_ocr else []
        enc = inputs.encode_words(self.ocr_tokenizer, seen, inputs.layout_boxes(page_boxes, scale, self.image_size)
                                  if seen else np.zeros((0, 4)))
        if enc["truncated"]:
            log.warning("%d of %d OCR words did not fit the model's OCR budget (%d WordPiece tokens) and are not "
                        "seen: questions about them cannot be answered from the text", enc["truncated"],
                        len(page_words), self.config["ocr_max_length"])
        t = len(enc["ids"])
        tokens = {"ocr_boxes": enc["boxes"][None], "ocr_mask": np.ones((1, t), bool),
                  "word_index": enc["word_index"][None]}
        if self.grounding.get("text_blocks"):
            blocks = inputs.block_index(seen, page_boxes, enc["word_index"])
            tokens["block_index"] = blocks[None]
            tokens["block_boxes"] = geo.block_extents(enc["boxes"], blocks)
        outputs = self.sessions["page_encoder"].run(None, {"image": pixels, "ocr_ids": enc["ids"][None],
                                                           "ocr_boxes": tokens["ocr_boxes"],
                                                           "ocr_mask": tokens["ocr_mask"]})
        names = [o.name for o in self.sessions["page_encoder"].get_outputs()]
        h, w = page_image.shape[:2]
        self._page = OnnxPage(page_image, list(page_words), page_boxes, tokens, dict(zip(names, outputs)), scale,
                              (h, w), inputs.resize_longest_side((h, w), self.image_size), confidences)

    # ---- prompts -----------------------------------------------------------------------------

    def predict(self, image: Any = None, *, question: str | Sequence[str] | None = None, points: Any = None,
                point_labels: Any = None, boxes: Any = None, mask_input: Any = None, multimask_output: bool = False,
                return_logits: bool = False, threshold: float = 0.0, words: Sequence[str] | None = None,
                word_boxes: Any = None, ocr: str | Any | None = None) -> tuple[np.ndarray, ...]:
        """`Predictor.predict`: the same arguments and returns."""
        threshold = check_threshold(threshold)
        if image is not None:
            page_image = read_page_image(image)
            prompts = self._check(question, points, point_labels, boxes, mask_input, page_image.shape[:2])
            self.set_image(page_image, words=words, word_boxes=word_boxes, ocr=ocr)
        else:
            if words is not None or word_boxes is not None or ocr is not None:
                raise ValueError("words / word_boxes / ocr belong to the page: pass them to set_image(image, "
                                 "words=..., word_boxes=...) or with the image to predict(image, ...)")
            prompts = self._check(question, points, point_labels, boxes, mask_input, self.page.original_size)
        masks, scores, low_res = self._decode(prompts, multimask_output, return_logits, threshold)
        return (masks, scores, low_res) if multimask_output or return_logits else (masks, scores)

    def predict_masks(self, question: str | Sequence[str] | None = None, points: Any = None,
                      point_labels: Any = None, boxes: Any = None, mask_input: Any = None,
                      multimask_output: bool = False, return_logits: bool = False,
                      threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`Predictor.predict_masks`: always (masks, scores, low_res_logits) on the set page."""
        threshold = check_threshold(threshold)
        prompts = self._check(question, points, point_labels, boxes, mask_input, self.page.original_size)
        return self._decode(prompts, multimask_output, return_logits, threshold)

    def word_class_probabilities(self) -> np.ndarray | None:
        """`Predictor.word_class_probabilities`: float [N, classes] per OCR word of the set page (the
        word-class head on its first sub-token; zeros for a word the token budget left out), or None
        when the exported page graph has no word-class output."""
        page = self.page
        logits = page.embedding.get(WORD_CLASS_OUTPUT)
        if logits is None:
            return None
        word_index = page.tokens["word_index"][0]
        first = (word_index >= 0) & (word_index != np.concatenate([[-1], word_index[:-1]]))
        out = np.zeros((len(page.words), logits.shape[-1]), np.float32)
        if len(page.words) and self.use_ocr:
            z = logits[0, first].astype(np.float64)
            z = np.exp(z - z.max(-1, keepdims=True))
            out[word_index[first]] = z / z.sum(-1, keepdims=True)
        return out

    def _check(self, question, points, point_labels, boxes, mask_input, size) -> Prompts:
        return check_prompts(question, points, point_labels, boxes, mask_input, size, self.low_res_size,
                             self.context_length, self._token_count)

    def _token_count(self, text: str) -> int:
        return len(self.question_tokenizer.encode(text, add_special_tokens=False).ids) + 2   # + start, end

    def prompt_feed(self, prompts: Prompts) -> tuple[str, dict[str, np.ndarray]]:
        """(the prompt graph to run, its inputs) for `prompts` on the set page."""
        page, q = self.page, prompts.count
        word_index = page.tokens["word_index"][0]
        t = len(word_index)
        feed = {**page.embedding, **page.tokens}
        if prompts.questions:
            feed["question_ids"] = inputs.question_ids(self.question_tokenizer, prompts.questions, self.context_length)
            match, word_pos = inputs.lexical_match(page.words if self.use_ocr else [], prompts.questions, word_index,
                                                   self.max_question_words, self.context_length,
                                                   self.question_tokenizer)
            if not self.use_lexical_match:
                match = np.zeros_like(match)
        else:
            feed["question_ids"] = np.zeros((q, self.context_length), np.int64)
            match = np.zeros((q, 1, t), np.uint8)
            word_pos = np.full((q, 1), -1, np.int64)
        feed["match"], feed["word_pos"] = match, word_pos
        on = (match > 0).astype(np.float32)
        boxes = page.tokens["ocr_boxes"][0]
        blocks = page.tokens.get("block_index")
        if self.grounding.get("alignment"):
            feed["match_row"], feed["match_column"] = geo.line_and_column(on, boxes)
        if blocks is not None:
            feed["match_block"] = geo.in_tagged_block(on, blocks[0])
        mask = np.zeros((q, 1, *self.low_res_size), np.float32)
        if prompts.masks is not None:
            mask = np.broadcast_to(prompts.masks, (q, *prompts.masks.shape[1:])).astype(np.float32)
        feed["mask_input"] = np.ascontiguousarray(mask)
        feed["has_mask_input"] = np.full(q, float(prompts.masks is not None), np.float32)
        coords, labels = self._points(prompts, page.scale)
        if coords is None:
            return "prompt_decoder_no_points", feed
        feed["point_coords"], feed["point_labels"] = coords, labels
        size = self.image_size
        if self.grounding.get("click_words"):
            feed["clicked"] = clicked = geo.clicked_words(coords, labels, boxes, word_index, size,
                                                          float(self.grounding["click_margin"]))
            feed["click_row"], feed["click_column"] = geo.line_and_column(clicked, boxes)
            if blocks is not None:
                feed["click_block"] = geo.in_tagged_block(clicked, blocks[0])
        if self.grounding.get("box_words"):
            feed["boxed"] = boxed = geo.boxed_words(coords, labels, boxes, word_index, size)
            if blocks is not None:
                feed["box_block"] = geo.in_tagged_block(boxed, blocks[0])
        return "prompt_decoder", feed

    @staticmethod
    def _points(prompts: Prompts, scale: float) -> tuple[np.ndarray | None, np.ndarray | None]:
        """`Predictor._prompt_tensors`' points: clicks then box corners, pixels of the input frame."""
        q, coords, labels = prompts.count, [], []
        if prompts.points is not None:
            coords.append(np.broadcast_to(prompts.points, (q, *prompts.points.shape[1:])) * scale)
            labels.append(np.broadcast_to(prompts.labels, (q, prompts.labels.shape[1])))
        if prompts.boxes is not None:
            coords.append(np.broadcast_to(prompts.boxes, (q, 4)).reshape(q, 2, 2) * scale)
            labels.append(np.broadcast_to(np.array([BOX_TOP_LEFT, BOX_BOTTOM_RIGHT]), (q, 2)))
        if not coords:
            return None, None
        return np.concatenate(coords, 1).astype(np.float32), np.concatenate(labels, 1).astype(np.int64)

    def _decode(self, prompts: Prompts, multimask_output: bool, return_logits: bool,
                threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`Predictor._decode` on the prompt graph."""
        page = self.page
        graph, feed = self.prompt_feed(prompts)
        session = self.sessions[graph]
        wanted = {i.name for i in session.get_inputs()}
        masks, iou = session.run(None, {k: v for k, v in feed.items() if k in wanted})
        if multimask_output or clicks_innermost(prompts, multimask_output, return_logits, self.snap):
            low_res, scores = masks[:, 1:], iou[:, 1:]
        else:   # the best candidate: of the 3 multimask outputs for a lone click, else the single-mask output
            cand, cand_iou = (masks[:, 1:], iou[:, 1:]) if prompts.lone_click else (masks[:, :1], iou[:, :1])
            best = cand_iou.argmax(1)
            rows = np.arange(len(best))
            low_res, scores = cand[rows, best][:, None], cand_iou[rows, best]
        logits = inputs.to_page(low_res, self.image_size, page.input_size, page.original_size)
        return page_masks(logits, scores, low_res, prompts, page, multimask_output=multimask_output,
                          return_logits=return_logits, threshold=threshold, snap=self.snap,
                          best_guess_margin=self.best_guess_margin, use_ocr=self.use_ocr,
                          unit_classifier=self.unit_classifier if self.class_answers else None)
