"""Pages in, batches out: the one place that turns `Page`s into the batch contract (schema.BATCH_KEYS).

Geometry follows SAM: the page is resized so its longest side is `image_size`, then padded at
the bottom/right to a square. Word boxes, masks and prompts are mapped into that input frame,
and layout boxes are normalised to 0..1000 *of the input frame*, so a token's box and the image
unit under it agree (D-JEPA picks MLM words by the image units they lie in).
"""
from __future__ import annotations

import logging
import zlib
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.lexical import clip_word_positions, match_matrix
from dociq.data.schema import IMAGE_MEAN, IMAGE_STD, LAYOUT_SCALE, REGION_CLASSES, Page
from dociq.data.text_blocks import group_blocks
from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer

log = logging.getLogger(__name__)


def resize_longest_side(size: tuple[int, int], target: int) -> tuple[int, int]:
    """(H, W) of a page scaled so that its longest side is `target`."""
    h, w = size
    scale = target / max(h, w)
    return max(1, int(round(h * scale))), max(1, int(round(w * scale)))


def _writable(a: np.ndarray) -> np.ndarray:
    """A contiguous, writable array (torch.from_numpy warns on read-only memory, e.g. mmaps)."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def _to_input_frame(image: np.ndarray, target: int) -> tuple[torch.Tensor, float]:
    """uint8 [H,W,3] -> normalised float [3,target,target] (resized, zero-padded after normalising
    white so the padding reads as paper), and the scale factor applied."""
    h, w = image.shape[:2]
    nh, nw = resize_longest_side((h, w), target)
    x = torch.from_numpy(_writable(image)).permute(2, 0, 1).float().div_(255.0)
    if (nh, nw) != (h, w):
        x = F.interpolate(x[None], size=(nh, nw), mode="bilinear", antialias=True,
                          align_corners=False)[0]
    canvas = torch.ones(3, target, target)  # white paper
    canvas[:, :nh, :nw] = x
    mean = torch.tensor(IMAGE_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(3, 1, 1)
    return (canvas - mean) / std, nh / h


def _masks_to_input_frame(masks: np.ndarray, target: int) -> torch.Tensor:
    """bool [Q,H,W] page-sized masks -> float [Q,target,target] by nearest resize to the image's
    own resized size (`resize_longest_side`) and zero padding."""
    q, h, w = masks.shape
    out = torch.zeros(q, target, target)
    if q == 0:
        return out
    nh, nw = resize_longest_side((h, w), target)
    m = torch.from_numpy(_writable(masks)).float()
    if (nh, nw) != (h, w):
        m = F.interpolate(m[None], size=(nh, nw), mode="nearest")[0]
    out[:, :nh, :nw] = m
    return out


def normalise_boxes(boxes_px: np.ndarray, scale: float, target: int) -> np.ndarray:
    """Pixel boxes of the original page -> int boxes in 0..LAYOUT_SCALE of the input frame."""
    if len(boxes_px) == 0:
        return np.zeros((0, 4), dtype=np.int64)
    b = np.asarray(boxes_px, dtype=np.float64) * scale / target * LAYOUT_SCALE
    return np.clip(np.round(b), 0, LAYOUT_SCALE).astype(np.int64)


def sample_points(mask: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` (x, y) pixel points drawn uniformly from the True pixels of `mask` [H, W]."""
    ys, xs = torch.nonzero(mask > 0.5, as_tuple=True)
    if len(ys) == 0:
        return torch.full((count, 2), -1.0)
    pick = torch.randint(len(ys), (count,), generator=generator)
    # pixel centres, SAM's convention
    return torch.stack([xs[pick].float() + 0.5, ys[pick].float() + 0.5], dim=-1)


def one_region_mask(page: Page, question, generator: torch.Generator) -> np.ndarray:
    """bool [H, W]: one region of the question's answer, drawn at random (SAM's single-object
    target for a click). The region's mask within the question's mask; the question's whole mask
    when it names no region or the region lies outside it."""
    ids = [i for i in question.region_ids if 0 <= i < len(page.regions)]
    if not ids:
        return question.mask
    region = page.regions[ids[int(torch.randint(len(ids), (1,), generator=generator))]]
    if region.mask.shape != question.mask.shape:
        return question.mask
    own = region.mask & question.mask
    return own if own.any() else question.mask


def choose_questions(page: Page, count: int, generator: torch.Generator) -> list[int]:
    """Indices of up to `count` of the page's questions with a non-empty target, in page order
    (a random subset, drawn from `generator`, when there are more)."""
    index = [k for k, q in enumerate(page.questions) if q.mask.any()]
    if len(index) > count:
        order = torch.randperm(len(index), generator=generator)[:count].tolist()
        index = [index[i] for i in sorted(order)]
    return index


def mask_box(mask: torch.Tensor) -> torch.Tensor:
    """Tight x0, y0, x1, y1 box of a mask [H, W] in pixels (zeros for an empty mask)."""
    ys, xs = torch.nonzero(mask > 0.5, as_tuple=True)
    if len(ys) == 0:
        return torch.zeros(4)
    return torch.stack([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float()


def visible_tokens(boxes: torch.Tensor, ctx_idx: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """bool [B,T]: tokens whose box centre lies in a kept (context) mask unit.

    boxes: long [B,T,4] in 0..LAYOUT_SCALE of the square input frame; ctx_idx: long [B,Nc]."""
    gh, gw = grid
    cx = (boxes[..., 0] + boxes[..., 2]).float() / (2 * LAYOUT_SCALE)
    cy = (boxes[..., 1] + boxes[..., 3]).float() / (2 * LAYOUT_SCALE)
    col = (cx * gw).long().clamp(0, gw - 1)
    row = (cy * gh).long().clamp(0, gh - 1)
    unit = row * gw + col
    kept = torch.zeros(boxes.shape[0], gh * gw, dtype=torch.bool)
    kept.scatter_(1, ctx_idx, True)
    return torch.gather(kept, 1, unit)


class DocumentCollator:
    """list[Page | None] -> batch dict. `None` entries (bad pages skipped by a data set) are dropped
    and counted in `batch["skipped"]`.

    image_masking: called as `image_masking(batch_size, generator) -> (ctx_idx, tgt_idx)`.
    text_masking:  called as `text_masking(ids, special, generator, allowed=None) -> (mlm_ids, labels)`;
                   with `text_masking.visible_only` the MLM words are chosen among tokens lying in
                   context units (needs image_masking with a `grid`).
    blocks: add `ocr_block_index` (the text block of every token; default: with `questions`).
    """

    def __init__(
        self,
        image_size: int,
        ocr_tokenizer: OcrTokenizer | None = None,
        question_tokenizer: QuestionTokenizer | None = None,
        questions: bool = False,
        max_questions: int = 4,
        points_per_prompt: int = 1,
        image_masking: Callable | None = None,
        text_masking: Callable | None = None,
        seed: int | None = None,
        max_question_words: int = 12,
        blocks: bool | None = None,
    ) -> None:
        self.image_size = image_size
        # the text blocks (`ocr_block_index`) serve the prompts' word grounding; pretraining has
        # no prompts and skips their cost (~27 ms per 1,000 words, measured on the corpus pages)
        self.blocks = questions if blocks is None else bool(blocks)
        self.ocr_tokenizer = ocr_tokenizer or OcrTokenizer()
        self.questions = questions
        self.question_tokenizer = question_tokenizer or (QuestionTokenizer() if questions else None)
        self.max_questions = max_questions
        self.points_per_prompt = points_per_prompt
        self.image_masking = image_masking
        self.text_masking = text_masking
        self.seed = seed
        if int(max_question_words) < 1:
            raise ValueError(f"data.max_question_words must be >= 1, got {max_question_words}")
        self.max_question_words = int(max_question_words)
        self._calls = 0
        if text_masking is not None and getattr(text_masking, "visible_only", False):
            if image_masking is None or not hasattr(image_masking, "grid"):
                raise ValueError("data.text_masking.visible_only=true needs data.image_masking "
                                 "(with a grid) to know which image units are visible")

    def _generator(self, pages: Sequence[Page], batch_seed: int | None) -> torch.Generator:
        # A batch seed (training: from (seed, step), dociq.data.sampling) makes the batch a function
        # of its step, so a resumed run repeats it. A fixed collator seed makes a batch reproducible
        # (validation): seeded by its pages' ids, so the same pages get the same masks and prompts in
        # every validation, whatever the worker. Without either, draw from torch's global RNG.
        g = torch.Generator()
        if batch_seed is not None:
            g.manual_seed(int(batch_seed))
        elif self.seed is not None:
            ids = [str(p.meta.get("page_id", "")) for p in pages]
            key = zlib.crc32("|".join(ids).encode()) if all(ids) else self._calls
            g.manual_seed(self.seed + key)
        else:
            g.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self._calls += 1
        return g

    def __call__(self, pages: Sequence[Page | None], batch_seed: int | None = None) -> dict:
        skipped = sum(p is None for p in pages)
        pages = [p for p in pages if p is not None]
        if not pages:
            raise RuntimeError(f"all {skipped} pages of a batch were bad and skipped: check the data set "
                               "(see the warnings above for the files and reasons)")
        g = self._generator(pages, batch_seed)
        size = self.image_size
        images, scales, encoded = [], [], []
        for page in pages:
            img, scale = _to_input_frame(page.image, size)
            images.append(img)
            scales.append(scale)
            encoded.append(self.ocr_tokenizer(page.words, normalise_boxes(page.word_boxes, scale, size)))

        batch: dict = {"image": torch.stack(images), "skipped": skipped}
        self._add_ocr(batch, encoded)
        if self.blocks:
            batch["ocr_block_index"] = block_index(pages, batch["ocr_word_index"])
        if self.questions:
            batch["ocr_word_class"] = word_classes(pages, batch["ocr_word_index"])
            self._add_questions(batch, pages, g)
            self._add_lexical_match(batch, pages)
        batch["meta"] = [dict(page.meta, original_size=page.size, scale=s) for page, s in zip(pages, scales)]
        if self.image_masking is not None:
            batch["ctx_idx"], batch["tgt_idx"] = self.image_masking(len(pages), g)
        if self.text_masking is not None:
            allowed = None
            if getattr(self.text_masking, "visible_only", False):
                allowed = visible_tokens(batch["ocr_boxes"], batch["ctx_idx"], tuple(self.image_masking.grid))
            special = ~batch["ocr_mask"] | (batch["ocr_word_index"] < 0)
            batch["mlm_ids"], batch["mlm_labels"] = self.text_masking(
                batch["ocr_ids"], special, g, allowed=allowed)
        return batch

    def _add_ocr(self, batch: dict, encoded: list) -> None:
        t = max(len(e.ids) for e in encoded)
        b = len(encoded)
        ids = torch.full((b, t), self.ocr_tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros(b, t, dtype=torch.bool)
        boxes = torch.zeros(b, t, 4, dtype=torch.long)
        word_index = torch.full((b, t), -1, dtype=torch.long)
        for i, e in enumerate(encoded):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], boxes[i, :n], word_index[i, :n] = e.ids, True, e.boxes, e.word_index
        batch.update(ocr_ids=ids, ocr_mask=mask, ocr_boxes=boxes, ocr_word_index=word_index,
                     ocr_truncated=torch.tensor([e.truncated_words for e in encoded]))

    def _add_questions(self, batch: dict, pages: list[Page], g: torch.Generator) -> None:
        b, size = len(pages), self.image_size
        chosen, chosen_index = [], []
        for page in pages:
            index = choose_questions(page, self.max_questions, g)
            chosen_index.append(index)
            chosen.append([page.questions[k] for k in index])
        q_max = max(1, max(len(qs) for qs in chosen))
        length = self.question_tokenizer.context_length
        prompt_ids = torch.zeros(b, q_max, length, dtype=torch.long)
        valid = torch.zeros(b, q_max, dtype=torch.bool)
        masks = torch.zeros(b, q_max, size, size)
        region_masks = torch.zeros(b, q_max, size, size)
        points = torch.full((b, q_max, self.points_per_prompt, 2), -1.0)
        point_labels = torch.full((b, q_max, self.points_per_prompt), -1, dtype=torch.long)
        boxes = torch.zeros(b, q_max, 4)
        kinds: list[list[str]] = []
        for i, (page, qs) in enumerate(zip(pages, chosen)):
            kinds.append([q.kind for q in qs])
            if not qs:
                continue
            n = len(qs)
            prompt_ids[i, :n] = self.question_tokenizer([q.text for q in qs])
            valid[i, :n] = True
            masks[i, :n] = _masks_to_input_frame(np.stack([q.mask for q in qs]), size)
            # The click lies on one region of the answer: with the question its target is the
            # answer, alone (a click-only prompt) it is that region (dociq/training/tasks/finetune.py).
            region_masks[i, :n] = _masks_to_input_frame(
                np.stack([one_region_mask(page, q, g) for q in qs]), size)
            for j in range(n):
                clickable = region_masks[i, j] if region_masks[i, j].any() else masks[i, j]
                points[i, j] = sample_points(clickable, self.points_per_prompt, g)
                point_labels[i, j] = 1
                boxes[i, j] = mask_box(masks[i, j])
        batch.update(prompt_ids=prompt_ids, prompt_valid=valid, prompt_kind=kinds, masks=masks,
                     region_masks=region_masks, points=points, point_labels=point_labels, boxes=boxes,
                     prompt_text=[[q.text for q in qs] for qs in chosen],
                     prompt_question_index=chosen_index)   # into page.questions: its mask at any resolution

    def _add_lexical_match(self, batch: dict, pages: list[Page]) -> None:
        batch["prompt_match"], batch["prompt_word_pos"] = lexical_match(
            [p.words for p in pages], batch["prompt_text"], batch["ocr_word_index"],
            self.max_question_words, self.question_tokenizer.context_length,
            num_questions=batch["prompt_valid"].shape[1])


REGION_INDEX = {name: i for i, name in enumerate(REGION_CLASSES)}


def block_index(pages: Sequence[Page], word_index: torch.Tensor) -> torch.Tensor:
    """long [B, T]: per OCR token, the text block (paragraph, list item, heading, line of a table:
    `text_blocks.group_blocks`, from the word boxes and the words alone) its word lies in, numbered
    per page; -1 for special and pad tokens. The grounding spreads a click or a matched question
    word to its block with it."""
    out = torch.full_like(word_index, -1)
    for i, page in enumerate(pages):
        if not len(page.words):
            continue
        per_word = np.full(len(page.words), -1, dtype=np.int64)
        for k, ids in enumerate(group_blocks(page.word_boxes, page.words)):
            per_word[ids] = k
        tokens = word_index[i]
        out[i] = torch.where(tokens >= 0, torch.from_numpy(per_word)[tokens.clamp(min=0)], out[i])
    return out


def page_word_classes(page: Page) -> np.ndarray:
    """long [N]: per page word, the `REGION_CLASSES` index of the smallest region holding it (a
    table cell's words are cells, not table), -1 for words in no region or regions of other classes."""
    per_word = np.full(len(page.words), -1, dtype=np.int64)
    regions = sorted(page.regions, key=lambda r: -float(np.prod(np.asarray(r.box[2:]) - np.asarray(r.box[:2]))))
    for region in regions:                     # largest first: smaller regions overwrite
        label = REGION_INDEX.get(region.label)
        ids = [k for k in region.word_ids if 0 <= k < len(per_word)]
        if label is not None and ids:
            per_word[ids] = label
    return per_word


def word_classes(pages: Sequence[Page], word_index: torch.Tensor) -> torch.Tensor:
    """long [B, T]: per OCR token, the `REGION_CLASSES` index of the smallest region holding its
    word (a table cell's words are cells, not table), -1 for special and pad tokens, words in no
    region and regions of other classes."""
    out = torch.full_like(word_index, -1)
    for i, page in enumerate(pages):
        per_word = page_word_classes(page)
        if len(per_word):
            tokens = word_index[i]
            out[i] = torch.where(tokens >= 0, torch.from_numpy(per_word)[tokens.clamp(min=0)], out[i])
    return out


def lexical_match(page_words: Sequence[Sequence[str]], questions: Sequence[Sequence[str]],
                  word_index: torch.Tensor, max_words: int, context_length: int,
                  num_questions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lexical match of each page's questions with its OCR tokens.

    page_words: the words of each of B pages; questions: the question texts of each page;
    word_index long [B,T]: the page word of each OCR token (-1 special/pad).
    Returns `prompt_match` uint8 [B,Q,J,T] — how question content word j matches token t
    (dociq.data.lexical codes; a word's sub-tokens share its code) — and `prompt_word_pos` long
    [B,Q,J] — the CLIP position of word j's first token (-1: no word j). Q = num_questions or
    the largest question count."""
    b, t = word_index.shape
    q_max = num_questions or max(1, max((len(qs) for qs in questions), default=1))
    match = torch.zeros(b, q_max, max_words, t, dtype=torch.uint8)
    word_pos = torch.full((b, q_max, max_words), -1, dtype=torch.long)
    for i, (words, texts) in enumerate(zip(page_words, questions)):
        is_word = word_index[i] >= 0
        for k, text in enumerate(texts):
            codes, word_ids = match_matrix(text, words, max_words)
            if not word_ids:
                continue
            n = len(word_ids)
            word_pos[i, k, :n] = torch.tensor(clip_word_positions(text, word_ids, context_length))
            if codes.size:
                per_token = torch.from_numpy(codes)[:, word_index[i].clamp(min=0)]
                match[i, k, :n] = per_token * is_word
    return match, word_pos
