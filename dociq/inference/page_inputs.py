"""A page and its OCR words as the Predictor and the ONNX runner take them (numpy and PIL, no torch)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS, BadSampleError
from dociq.data.image_io import load_page_image, to_rgb_array
from dociq.data.ocr import OcrWords, PdfTextLayer, make_ocr
from dociq.inference.prompts import check_words

log = logging.getLogger("dociq.inference.predictor")


def read_page_image(image: Any) -> np.ndarray:
    """A path, PIL image or uint8 [H, W, 3] RGB array -> the page as uint8 [H, W, 3] (named errors)."""
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

def read_page_words(image: np.ndarray, words, word_boxes, ocr) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """The page's OCR words, pixel boxes and OCR confidences (0..100; None for words a caller gives)
    from words + word_boxes, an OcrWords or an OCR backend."""
    if isinstance(words, OcrWords):
        words = words.scaled_to(image.shape[:2])
        return list(words.words), words.boxes, words.confidences
    if words is not None:
        return (*check_words(words, word_boxes, image.shape[:2]), None)
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
        return list(found.words), found.boxes, found.confidences
    log.warning("no OCR words given (words=None, ocr=None): the model sees the page image only")
    return [], np.zeros((0, 4), np.float32), None
