"""Whole documents through the model: the pages of a PDF or an image file, their words, and each
page's regions (PageSegmenter) and answers to questions (the Predictor), with the words inside.

    segmenter = DocumentSegmenter(Predictor.from_checkpoint(CKPT), questions=["the page footer"])
    for n in range(1, page_count("paper.pdf") + 1):
        page = segmenter.segment_page("paper.pdf", n)       # PageResult: size, regions, words

Words: a PDF page's text layer (`dociq.data.pdf`); a page without words there (a scan) or an image goes
through tesseract (`ocr="auto"`). `ocr="tesseract"` reads every page with tesseract, `ocr="none"`
never calls it (images are then segmented from their pixels alone). `dociq segment` writes the
results (dociq/cli/segment.py, docs/segment.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS
from dociq.data.image_io import load_page_image
from dociq.data.ocr import OcrWords, PdfTextLayer, TesseractOCR
from dociq.data.pdf import page_count as pdf_page_count
from dociq.data.masks import mask_boxes
from dociq.inference.automatic import DEFAULT_SEEDS, LAYOUT_QUESTIONS, UNCLASSIFIED, PageSegmenter

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif", ".pnm", ".ppm", ".pgm")
OCR_MODES = ("auto", "tesseract", "none")
ANSWER = "answer"           # the class of a question's answer region


def document_kind(name: str) -> str | None:
    """'pdf', 'image' or None (another kind of file) from a file name."""
    low = name.lower()
    if low.endswith(".pdf"):
        return "pdf"
    if low.endswith(IMAGE_SUFFIXES):
        return "image"
    return None


def page_count(path: str | Path) -> int:
    """Pages of a PDF (a BadSampleError naming the file when it cannot be read), 1 for an image."""
    path = Path(path)
    return pdf_page_count(path) if document_kind(path.name) == "pdf" else 1


@dataclass
class PageRegion:
    """One region of a page: found by the segmenter (question None) or a question's answer."""
    mask: np.ndarray                 # bool [H, W] at the page's size
    box: np.ndarray                  # float [4] x0, y0, x1, y1 pixels, x1 and y1 exclusive
    category: str                    # a layout class, "region" (unnamed) or "answer"
    score: float                     # the predicted IoU (a word block: its class probability)
    text: str = ""                   # the words whose box centre lies in the mask, in reading order
    question: str | None = None
    word_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # those words' indices

    @property
    def area(self) -> int:
        return int(self.mask.sum())


@dataclass
class PageResult:
    page: int                        # from 1
    image: np.ndarray                # uint8 [H, W, 3] as the model saw it
    words: list[str]
    word_boxes: np.ndarray           # float [N, 4] pixels
    word_source: str                 # "pdf" (text layer), "tesseract" or "none"
    dpi: float | None                # a PDF page's rendering resolution; None for an image
    regions: list[PageRegion] = field(default_factory=list)
    word_confidences: np.ndarray | None = None   # tesseract's, 0..100 (None: a text layer's words)

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])


def words_inside(mask: np.ndarray, word_boxes: np.ndarray) -> np.ndarray:
    """Indices (in reading order) of the words whose box centre lies in the bool [H, W] mask."""
    boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4)
    if not len(boxes):
        return np.zeros(0, np.int64)
    h, w = mask.shape
    cx = ((boxes[:, 0] + boxes[:, 2]) / 2).astype(np.int64).clip(0, w - 1)
    cy = ((boxes[:, 1] + boxes[:, 3]) / 2).astype(np.int64).clip(0, h - 1)
    return np.flatnonzero(mask[cy, cx])


class DocumentSegmenter:
    """A document's pages -> `PageResult`s: regions (unless `regions=False`) and one answer per
    question (left out when the answer is empty), through one Predictor."""

    def __init__(self, predictor, questions: Sequence[str] = (), regions: bool = True,
                 seeds: Sequence[str] = DEFAULT_SEEDS, dpi: float = 144.0, ocr: str = "auto") -> None:
        if ocr not in OCR_MODES:
            raise ValueError(f"ocr={ocr!r}: use one of {OCR_MODES}")
        if not regions and not questions:
            raise ValueError("nothing to segment: regions are off and no question was given")
        self.predictor = predictor
        self.questions = [str(q) for q in questions]
        self.segmenter = PageSegmenter(predictor, seeds=seeds) if regions else None
        self.text_layer = PdfTextLayer(dpi=dpi, max_page_pixels=DEFAULT_MAX_PAGE_PIXELS)
        self.ocr = ocr
        self._tesseract: TesseractOCR | None = None

    @property
    def categories(self) -> list[str]:
        """Every class a region can have: the layout classes, "region" and "answer"."""
        names = list(self.segmenter.categories if self.segmenter else LAYOUT_QUESTIONS)
        return [*names, UNCLASSIFIED, ANSWER]

    def tesseract(self) -> TesseractOCR:
        """The tesseract backend, made on first use (a RuntimeError naming the fix when it is missing)."""
        if self._tesseract is None:
            self._tesseract = TesseractOCR()
        return self._tesseract

    def read_page(self, path: str | Path, page: int) -> PageResult:
        """Page `page` (from 1) of a PDF or image file, and its words (module doc)."""
        path = Path(path)
        if document_kind(path.name) == "pdf":
            image, words = self.text_layer.read(path, page - 1)
            source, dpi = "pdf", self.text_layer.dpi
        else:
            if page != 1:
                raise ValueError(f"{path}: an image has one page, not {page}")
            image, words = load_page_image(path, DEFAULT_MAX_PAGE_PIXELS), None
            source, dpi = "none", None
        if self.ocr == "tesseract" or (self.ocr == "auto" and (words is None or not len(words))):
            words, source = self.tesseract().recognise(image), "tesseract"
        words = (words or OcrWords([], np.zeros((0, 4)), image.shape[:2])).scaled_to(image.shape[:2])
        return PageResult(page=page, image=image, words=list(words.words), word_boxes=words.boxes,
                          word_source=source, dpi=dpi,
                          word_confidences=words.confidences if source == "tesseract" else None)

    def segment_page(self, path: str | Path, page: int) -> PageResult:
        result = self.read_page(path, page)
        found: list[PageRegion] = []
        words = result.words if result.word_confidences is None else \
            OcrWords(result.words, result.word_boxes, result.image.shape[:2], result.word_confidences)
        if self.segmenter is not None:
            for r in self.segmenter.segment(result.image, words=words, word_boxes=result.word_boxes):
                found.append(PageRegion(r.mask, np.asarray(r.box, np.float32), r.category, float(r.score)))
        else:
            self.predictor.set_image(result.image, words=words, word_boxes=result.word_boxes)
        if self.questions:
            masks, scores = self.predictor.predict(question=self.questions)     # the Predictor's defaults
            for question, mask, score in zip(self.questions, masks, scores):
                if mask.any():
                    # the IoU head's raw output, clipped to [0, 1] as the segmenter's regions are
                    found.append(PageRegion(mask, mask_boxes(mask[None])[0], ANSWER, float(np.clip(score, 0.0, 1.0)),
                                            question=question))
        page_words = self.predictor.page.words
        boxes = self.predictor.page.word_boxes
        inside = [words_inside(region.mask, boxes) for region in found]
        for region, index in zip(found, inside):
            region.text, region.word_index = " ".join(page_words[i] for i in index), index
        result.words, result.word_boxes = list(page_words), boxes
        result.regions = [found[i] for i in reading_order(found, inside, boxes)]
        return result


def reading_order(regions: Sequence[PageRegion], inside: Sequence[np.ndarray], word_boxes: np.ndarray) -> list[int]:
    """Region indices in the page's reading order: a region ranks by its first word (the words are in
    reading order); one without words (a figure) by the first word below its top edge. Answers
    follow the regions, in the questions' order."""
    centre_y = (np.asarray(word_boxes, np.float64).reshape(-1, 4)[:, [1, 3]].sum(1) / 2)

    def key(i: int):
        region = regions[i]
        if region.question is not None:
            return (1, i, 0.0, 0.0)
        if len(inside[i]):
            first = int(inside[i][0])
        else:
            below = np.flatnonzero(centre_y >= region.box[1])
            first = int(below[0]) if len(below) else len(centre_y)
        return (0, first, float(region.box[1]), float(region.box[0]))
    return sorted(range(len(regions)), key=key)
