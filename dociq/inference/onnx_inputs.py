"""What the Predictor computes with torch around the model, in numpy, for the ONNX runner: the
letterboxed page (the collator's antialiased bilinear resize), the OCR tokens with their boxes and
blocks, question ids, the lexical match, and the low-res logits resized to the page. Each mirrors
the torch function named in its docstring; tests/test_onnx.py holds them to it."""
from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from dociq.data.lexical import clip_word_positions, match_matrix
from dociq.data.schema import IMAGE_MEAN, IMAGE_STD, LAYOUT_SCALE
from dociq.data.text_blocks import group_blocks
from dociq.data.word_text import clean_word

CLS_BOX, SEP_BOX = (0, 0, 0, 0), (LAYOUT_SCALE,) * 4     # dociq.data.tokenize
SOT_ID, EOT_ID = 49406, 49407                            # open_clip's start / end of text


def resize_longest_side(size: tuple[int, int], target: int) -> tuple[int, int]:
    """`dociq.data.collate.resize_longest_side`."""
    h, w = size
    scale = target / max(h, w)
    return max(1, int(round(h * scale))), max(1, int(round(w * scale)))


def antialiased_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: torch's bilinear interpolation with antialias=True (PIL's triangle filter
    widened by the scale when shrinking) as a matrix."""
    scale = n_in / n_out
    support, inv = (scale, 1.0 / scale) if scale >= 1.0 else (1.0, 1.0)
    out = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        centre = scale * (i + 0.5)
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        j = np.arange(lo, hi)
        w = np.maximum(0.0, 1.0 - np.abs((j - centre + 0.5) * inv))
        out[i, lo:hi] = w / w.sum() if w.sum() > 0 else w
    return out.astype(np.float32)


def bilinear_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in]: torch's bilinear interpolation (align_corners=False, no antialias) as a matrix."""
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    frac = src - i0
    out = np.zeros((n_out, n_in), np.float64)
    np.add.at(out, (np.arange(n_out), i0), 1.0 - frac)
    np.add.at(out, (np.arange(n_out), i1), frac)
    return out.astype(np.float32)


def resample(x: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    """`weights` [n_out, n_in] applied along `axis` of `x`, reading only each row's nonzero taps
    (a resize touches a few input pixels per output pixel; a dense product would touch them all)."""
    taps = max(1, int((weights != 0).sum(1).max()))
    index = np.argsort(weights == 0, axis=1, kind="stable")[:, :taps]                 # nonzero columns first
    w = np.take_along_axis(weights, index, 1)
    x = np.moveaxis(x, axis, -1)
    out = (x[..., index] * w).sum(-1)                                                  # [..., n_out]
    return np.moveaxis(out.astype(np.float32), -1, axis)


def letterbox(image: np.ndarray, target: int) -> tuple[np.ndarray, float]:
    """`collate._to_input_frame`: uint8 [H, W, 3] -> normalised float32 [1, 3, target, target] (white
    paper padding) and the scale applied."""
    h, w = image.shape[:2]
    nh, nw = resize_longest_side((h, w), target)
    x = image.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    if (nh, nw) != (h, w):
        x = resample(resample(x, antialiased_weights(w, nw), 2), antialiased_weights(h, nh), 1)   # as torch: x, then y
    canvas = np.ones((3, target, target), np.float32)
    canvas[:, :nh, :nw] = x
    mean, std = np.asarray(IMAGE_MEAN, np.float32)[:, None, None], np.asarray(IMAGE_STD, np.float32)[:, None, None]
    return ((canvas - mean) / std)[None], nh / h


def layout_boxes(boxes_px: np.ndarray, scale: float, target: int) -> np.ndarray:
    """`collate.normalise_boxes`: pixel boxes -> int64 0..1000 of the input frame."""
    if len(boxes_px) == 0:
        return np.zeros((0, 4), np.int64)
    b = np.asarray(boxes_px, dtype=np.float64) * scale / target * LAYOUT_SCALE
    return np.clip(np.round(b), 0, LAYOUT_SCALE).astype(np.int64)


def encode_words(tokenizer: Tokenizer, words: list[str], boxes: np.ndarray) -> dict[str, np.ndarray]:
    """`OcrTokenizer.__call__` (truncation set on `tokenizer`): ids, boxes, word_index [T] and
    `truncated`, the words that did not fit."""
    enc = tokenizer.encode([clean_word(w) for w in words], is_pretokenized=True, add_special_tokens=True)
    word_index = np.array([-1 if w is None else w for w in enc.word_ids], np.int64)
    out_boxes = np.zeros((len(word_index), 4), np.int64)
    real = word_index >= 0
    if len(words):
        out_boxes[real] = np.clip(np.asarray(boxes, np.int64), 0, LAYOUT_SCALE)[word_index[real]]
    out_boxes[0], out_boxes[-1] = CLS_BOX, SEP_BOX
    kept = int(word_index.max()) + 1 if real.any() else 0
    return {"ids": np.asarray(enc.ids, np.int64), "boxes": out_boxes, "word_index": word_index,
            "truncated": len(words) - kept}


def block_index(words: list[str], word_boxes: np.ndarray, word_index: np.ndarray) -> np.ndarray:
    """`collate.block_index` of one page: the text block of each token's word, -1 none."""
    per_word = np.full(len(words), -1, np.int64)
    if len(words):
        for k, ids in enumerate(group_blocks(word_boxes, words)):
            per_word[ids] = k
    return np.where(word_index >= 0, per_word[np.maximum(word_index, 0)] if len(words) else -1, -1)


def question_ids(tokenizer: Tokenizer, questions: list[str], context_length: int) -> np.ndarray:
    """`open_clip.tokenize`: int64 [Q, context_length], SOT ... EOT, cut to fit, zero-padded."""
    out = np.zeros((len(questions), context_length), np.int64)
    for i, text in enumerate(questions):
        ids = [SOT_ID] + tokenizer.encode(text, add_special_tokens=False).ids + [EOT_ID]
        if len(ids) > context_length:
            ids = ids[:context_length]
            ids[-1] = EOT_ID
        out[i, :len(ids)] = ids
    return out


def lexical_match(words: list[str], questions: list[str], word_index: np.ndarray, max_words: int,
                  context_length: int, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """`collate.lexical_match` of one page: match uint8 [Q, J, T] and word_pos int64 [Q, J]."""
    t = len(word_index)
    match = np.zeros((len(questions), max_words, t), np.uint8)
    word_pos = np.full((len(questions), max_words), -1, np.int64)
    is_word = word_index >= 0
    bpe_length = lambda word: len(tokenizer.encode(word, add_special_tokens=False).ids)   # noqa: E731
    for k, text in enumerate(questions):
        codes, word_ids = match_matrix(text, words, max_words)
        if not word_ids:
            continue
        n = len(word_ids)
        word_pos[k, :n] = clip_word_positions(text, word_ids, context_length, bpe_length)
        if codes.size:
            match[k, :n] = codes[:, np.maximum(word_index, 0)] * is_word
    return match, word_pos


def to_page(low_res: np.ndarray, image_size: int, input_size: tuple[int, int],
            original_size: tuple[int, int]) -> np.ndarray:
    """`Predictor._to_page`: [Q, C, h, w] logits -> the square input frame -> crop the padding ->
    [Q, C, H, W] at the page's size; the two bilinear resizes as one matrix per axis."""
    (h, w), (nh, nw) = original_size, input_size
    rows = bilinear_weights(nh, h) @ bilinear_weights(low_res.shape[-2], image_size)[:nh]
    cols = bilinear_weights(nw, w) @ bilinear_weights(low_res.shape[-1], image_size)[:nw]
    return resample(resample(low_res.astype(np.float32), rows, 2), cols, 3)
