"""Held-out scores on the training task's batched path: `FinetuneTask.run_rounds` in the model's
input frame (or a letterboxed `eval_size` frame), with the diagnostics that need the task — the
decoder's candidates (SAM's oracle), the word grounding's painted masks, text-free heuristics.
What a user sees is scored through the Predictor instead (dociq.evaluation.answers, `dociq eval`);
this is `dociq eval --task-path` and the validation loop's view.

Every question of `--pages` held-out synthetic pages (seed 1000003, the `data.val_set` of
training, which no training page shares) is prompted, one round, three ways:
- `question`: the question only (what a user types);
- `box`: the target's tight box only (SAM's box prompt);
- `question_no_ocr`: the question only, with the page's OCR words removed from the model's input
  (the same weights: how much of the answer comes from reading);
- `box_region`: the box of one annotated region (up to `max_questions` per page, drawn with a fixed
  seed), target that region's mask — SAM's box prompt, one object per box. (`box` uses the
  question targets, and a plural layout question's target is several regions inside one box.)
- `point_region`: one positive click inside each of the same regions, nothing else, target that
  region's mask — SAM's click prompt (the model's three candidate masks; the one its IoU head
  ranks first is scored). `point_region_oracle` scores the candidate closest to the target
  instead (SAM's "oracle"): what a better choice among the three would give.
`question_layout_by_class` splits the layout questions' mIoU by the region class they ask for.
The `_region` sets report their regions by size, as COCO does: `small` (< 1 % of the page),
`medium` (1-5 %), `large` (>= 5 %) — on synthetic pages most small regions are table cells and
form fields, the large ones paragraphs, tables and figures.
mIoU is the mean over prompts of each prompt's IoU (thresholded mask vs target), ×100 in the
printed table; counts per kind are reported next to it. With `snap`, each set is scored again with
its masks snapped to the words (`<set>_snap`, `Predictor(snap="words")`) and completed to text
blocks (`<set>_blocks`, `Predictor(snap="blocks")`: dociq.models.word_snap).

Real pages: `--data corpus --corpus data/corpus --split val` asks the same prompts on the held-out
split of a `dociq corpus build` (docs/corpus.md: split by document, weakly labelled regions and
their questions).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator, _masks_to_input_frame
from dociq.data.schema import LAYOUT_SCALE, QUESTION_KINDS, Page
from dociq.data.scoring import (REGION_SIZES, VAL_SEED, MeanByName, SegmentationMetrics, metric_results,
                                per_prompt_iou_dice, question_classes, regions_as_prompts)
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.text_blocks import group_blocks
from dociq.data.tokenize import QuestionTokenizer
from dociq.io.checkpoint import read_finetune_checkpoint
from dociq.io.track import track
from dociq.models.grounding import first_subtokens
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, NEGATIVE_POINT, POSITIVE_POINT
from dociq.models.sizes import checkpoint_model_config
from dociq.models.word_snap import paint_words, snap_to_blocks, snap_to_words
from dociq.training.tasks.finetune import FinetuneTask

PROMPT_SETS = {"question": (("question",), True), "box": (("box",), True),
               "question_no_ocr": (("question",), False), "box_region": (("box",), True),
               "point_region": (("point",), True)}
# Text-free heuristics scored on the same prompts and targets (no model): a layout question is
# answered by all the words' area, a reading or cell question by the boxes of the words it names,
# a box prompt by the box itself, a region's click by the text block under it (text_blocks.group_blocks;
# nothing off text). A model that does not beat them has not learnt the task.
HEURISTIC_SETS = ("heuristic_question", "heuristic_box")
HEURISTIC_REGION_SETS = ("heuristic_point_region",)


def load_task(path: str | Path) -> FinetuneTask:
    """The FinetuneTask of a finetune checkpoint, weights loaded, in eval mode."""
    ckpt = read_finetune_checkpoint(path)
    hparams = dict(ckpt["hyper_parameters"])
    hparams["model"] = checkpoint_model_config(hparams["model"], path)
    hparams["init"] = None                      # the weights come from this checkpoint
    task = FinetuneTask(**hparams)
    task.load_state_dict(ckpt["state_dict"], strict=True)
    return task.eval()


@torch.no_grad()
def evaluate(task: FinetuneTask, pages: int | None = 128, seed: int = VAL_SEED, batch_size: int = 8,
             max_questions: int = 8, prompt_sets: Sequence[str] = tuple(PROMPT_SETS),
             data: Sequence[Page] | None = None, heuristics: bool = False, snap: bool = False,
             eval_size: int | None = None, page_size: int | None = None) -> dict:
    """{prompt set: {miou, dice, miou_<kind>, ..., count_<kind>}} on held-out pages: the first
    `pages` of `data` (e.g. a corpus's val split; None: all of it), or by default `pages` held-out
    synthetic pages of `seed`.

    eval_size: the side of the frame masks are scored in (the page letterboxed as the model's
    input is). None: the model's input size. A larger one scores what a user sees — masks at the
    page's resolution, as SAM's are — and is the same for models of every input size: at 256 px a
    text line is ~4 px tall, so a 1-px rounding costs a small region a quarter of its IoU.
    page_size: the side of the synthetic pages (default the model's input size); the generator
    fills a larger page with more text (~3x the words at 384 px as at 256), so models of different
    input sizes compare on the same page_size."""
    image_size = int(task.hparams["model"]["image_size"])
    frame = image_size if eval_size is None else int(eval_size)
    if frame < 1:
        raise ValueError(f"eval_size must be a positive number of pixels, got {eval_size}")
    context = task.model.prompt_encoder.question_encoder.context_length
    if data is None:
        data = SyntheticDocuments(num_pages=pages or 128, image_size=page_size or image_size, seed=seed, degrade=0.3)
    pages = len(data) if pages is None else min(pages, len(data))
    collate = DocumentCollator(image_size, question_tokenizer=QuestionTokenizer(context), questions=True,
                               max_questions=max_questions, seed=seed)
    metrics, snapped_sets, painted_sets = _metric_sets(prompt_sets, heuristics, snap)
    by_class = MeanByName()
    use_ocr, device = task.use_ocr, next(task.parameters()).device   # the model's device: a GPU too
    try:
        for start in track(range(0, pages, batch_size), desc="held-out batches"):
            page_list = [data[i] for i in range(start, min(pages, start + batch_size))]
            batch = collate(page_list)
            region_pages = [regions_as_prompts(p, max_questions, seed) for p in page_list] \
                if any(name.endswith("_region") for name in prompt_sets) else None
            region_batch = None if region_pages is None else collate(region_pages)
            grouped, targets_in_frame = {}, {}   # batch id -> page_blocks / targets, made once per batch

            def targets_of(b: dict, prompt_pages: Sequence[Page]) -> torch.Tensor:
                if id(b) not in targets_in_frame:
                    targets_in_frame[id(b)] = b["masks"].flatten(0, 1) > 0.5 if frame == image_size \
                        else frame_targets(b, prompt_pages, frame)
                return targets_in_frame[id(b)]

            def blocks_of(b: dict) -> list:
                if id(b) not in grouped:
                    grouped[id(b)] = page_blocks(b, page_list, frame)
                return grouped[id(b)]

            for name in prompt_sets:
                prompt_kinds, with_ocr = PROMPT_SETS[name]
                task.use_ocr = use_ocr and with_ocr
                b, prompt_pages = (region_batch, region_pages) if name.endswith("_region") else (batch, page_list)
                kinds = [k for page in b["prompt_kind"] for k in page]
                out = to_device(task.run_rounds(to_device(b, device), 1, kinds=prompt_kinds), torch.device("cpu"))
                valid, targets = out["valid"], targets_of(b, prompt_pages)[out["valid"]]
                masks = to_frame(out["masks"], frame)
                iou, _ = metrics[name].update(masks[valid], targets, kinds)
                if name == "question":
                    by_class.add(iou, question_classes(b, prompt_pages))
                if name == "point_region":
                    metrics["point_region_oracle"].update(
                        oracle_masks(out["candidates"][valid], image_size, frame, targets), targets, kinds)
                if name in snapped_sets:
                    snapped = snap_batch(masks, b, frame)
                    metrics[f"{name}_snap"].update(snapped[valid], targets, kinds)
                    points = out["points"] if out["points"] is None \
                        else (scale_points(out["points"][0], frame / image_size), out["points"][1])
                    completed = snap_batch(masks, b, frame, blocks_of(b), points)
                    metrics[f"{name}_blocks"].update(completed[valid], targets, kinds)
                if name in painted_sets and out["relevance"] is not None:
                    painted = paint_batch(out["relevance"] > 0, b, frame)
                    metrics[f"{name}_words"].update(painted[valid], targets, kinds)
            if heuristics:
                _score_heuristics(metrics, batch, targets_of(batch, page_list), frame, image_size)
                if "point_region" in prompt_sets:
                    _score_click_heuristic(metrics, region_batch, targets_of(region_batch, region_pages),
                                           page_list, blocks_of(region_batch), frame, image_size)
    finally:
        task.use_ocr = use_ocr
    return metric_results(metrics, by_class)


def to_device(data, device: torch.device):
    """Tensors in nested dicts / lists / tuples moved to `device`; anything else as it is (the model
    answers on its device, the scoring stays on the CPU)."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, dict):
        return {k: to_device(v, device) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):   # a named tuple
        return type(data)(*(to_device(v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(v, device) for v in data)
    return data


def _score_heuristics(metrics: dict, batch: dict, targets: torch.Tensor, frame: int, image_size: int) -> None:
    """Score HEURISTIC_SETS' text-free answers to the batch's prompts (targets bool [B*Q, frame, frame])."""
    kinds = [k for page in batch["prompt_kind"] for k in page]
    valid = batch["prompt_valid"].reshape(-1)
    for name, masks in heuristic_masks(batch, frame, image_size).items():
        metrics[name].update(masks.flatten(0, 1)[valid], targets[valid], kinds)


def _score_click_heuristic(metrics: dict, region_batch: dict, targets: torch.Tensor, pages: Sequence[Page],
                           blocks: Sequence, frame: int, image_size: int) -> None:
    """Score the block under each region prompt's click (`heuristic_point_region`)."""
    kinds = [k for page in region_batch["prompt_kind"] for k in page]
    valid = region_batch["prompt_valid"].reshape(-1)
    masks = clicked_block_masks(region_batch, pages, frame, blocks, input_size=image_size)
    metrics["heuristic_point_region"].update(masks.flatten(0, 1)[valid], targets[valid], kinds)


def _metric_sets(prompt_sets: Sequence[str], heuristics: bool,
                 snap: bool) -> tuple[dict[str, SegmentationMetrics], list[str], list[str]]:
    """The metrics `evaluate` fills — one per prompt set, heuristic, snapped and painted set — and
    the names of the sets scored snapped (they read the words) and painted (questions)."""
    sizes = tuple(name for name, _ in REGION_SIZES)
    metrics = {name: SegmentationMetrics(kinds=sizes if name.endswith("_region") else QUESTION_KINDS)
               for name in prompt_sets}
    if heuristics:
        metrics |= {name: SegmentationMetrics(kinds=QUESTION_KINDS) for name in HEURISTIC_SETS}
        if "point_region" in prompt_sets:
            metrics |= {name: SegmentationMetrics(kinds=sizes) for name in HEURISTIC_REGION_SETS}
    if "point_region" in prompt_sets:
        metrics["point_region_oracle"] = SegmentationMetrics(kinds=sizes)
    snapped_sets = [name for name in prompt_sets if snap and PROMPT_SETS[name][1]]   # not without the words
    metrics |= {f"{name}_{how}": SegmentationMetrics(kinds=metrics[name].kinds)
                for name in snapped_sets for how in ("snap", "blocks")}
    painted_sets = [name for name in snapped_sets if "question" in PROMPT_SETS[name][0]]
    metrics |= {f"{name}_words": SegmentationMetrics(kinds=metrics[name].kinds) for name in painted_sets}
    return metrics, snapped_sets, painted_sets


def frame_targets(batch: dict, pages: Sequence[Page], size: int) -> torch.Tensor:
    """bool [B*Q, size, size]: every prompt's target (its question's page-sized mask) in a `size`
    frame, letterboxed as the batch's input frame is; empty where a page has fewer prompts."""
    b, q = batch["prompt_valid"].shape
    out = torch.zeros(b, q, size, size, dtype=torch.bool)
    for i, (page, index) in enumerate(zip(pages, batch["prompt_question_index"])):
        if index:
            out[i, :len(index)] = _masks_to_input_frame(np.stack([page.questions[k].mask for k in index]), size) > 0.5
    return out.flatten(0, 1)


def to_frame(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Mask logits [N, s, s] of the input frame -> bool masks [N, size, size] (bilinear, as the
    Predictor brings masks to the page's size)."""
    if logits.shape[-1] != size:
        logits = F.interpolate(logits[:, None], size=(size, size), mode="bilinear", align_corners=False)[:, 0]
    return logits > 0


def oracle_masks(candidates: torch.Tensor, input_size: int, frame: int, targets: torch.Tensor) -> torch.Tensor:
    """bool [N, frame, frame]: per prompt, of its candidate mask logits [N, C, h, w] the one with the
    highest IoU against its target, each brought to the frame as the chosen mask is (to the input
    size, then to the frame)."""
    best = torch.zeros_like(targets)
    best_iou = torch.full((targets.shape[0],), -1.0)
    for k in range(candidates.shape[1]):
        logits = F.interpolate(candidates[:, k:k + 1], size=(input_size, input_size), mode="bilinear",
                               align_corners=False)[:, 0]
        masks = to_frame(logits, frame)
        iou, _ = per_prompt_iou_dice(masks, targets)
        better = iou > best_iou
        best[better], best_iou[better] = masks[better], iou[better]
    return best


def scale_points(coords: torch.Tensor, factor: float) -> torch.Tensor:
    """Point coordinates of one frame (pixel k spans [k, k + 1): the collator's clicks sit at
    k + 0.5) in a frame `factor` times larger."""
    return coords if factor == 1 else coords * factor


def _first_tokens(batch: dict, i: int) -> torch.Tensor:
    return first_subtokens(batch["ocr_word_index"][i:i + 1])[0] & batch["ocr_mask"][i]


def word_boxes_in_frame(batch: dict, i: int, size: int) -> np.ndarray:
    """Page i's word boxes in whole pixels of the `size` input frame, one row per word (the
    layout's quantised coordinates come back at 19.97 for 20: rounded to the frame's pixels)."""
    return np.round(batch["ocr_boxes"][i][_first_tokens(batch, i)].float().numpy() * size / LAYOUT_SCALE)


def word_indices_in_frame(batch: dict, i: int) -> np.ndarray:
    """The page's word index of each row of `word_boxes_in_frame(batch, i, ...)`."""
    return batch["ocr_word_index"][i][_first_tokens(batch, i)].numpy()


def page_blocks(batch: dict, pages: Sequence[Page], size: int) -> list[tuple[np.ndarray, list[str], list[list[int]]]]:
    """Per page of the batch: its word boxes in the `size` frame, their words and their text blocks
    (`text_blocks.group_blocks`)."""
    out = []
    for i, page in enumerate(pages):
        boxes = word_boxes_in_frame(batch, i, size)
        words = [page.words[k] for k in word_indices_in_frame(batch, i)]
        out.append((boxes, words, group_blocks(boxes, words)))
    return out


def snap_batch(masks: torch.Tensor, batch: dict, size: int,
               blocks: Sequence[tuple[np.ndarray, list[str], list[list[int]]]] | None = None,
               points: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Predicted masks bool [B*Q, size, size] (image-major) snapped to their page's words
    (`snap_to_words`) or, given the batch's `page_blocks` and the prompts' `points` (coords
    [B*Q, P, 2], labels [B*Q, P] as `run_rounds` returns them), completed to text blocks (`snap_to_blocks`)."""
    b = batch["ocr_ids"].shape[0]
    q = masks.shape[0] // b
    if blocks is None:
        boxes = [word_boxes_in_frame(batch, i, size) for i in range(b)]
        return torch.stack([torch.from_numpy(snap_to_words(m.numpy(), boxes[n // q])) for n, m in enumerate(masks)])
    out = []
    for n, m in enumerate(masks):
        clicks, labels, box = None, None, None
        if points is not None:
            coords, kinds = points[0][n].numpy(), points[1][n].numpy()
            is_click = (kinds == POSITIVE_POINT) | (kinds == NEGATIVE_POINT)
            clicks, labels = coords[is_click], kinds[is_click]
            if (kinds == BOX_TOP_LEFT).any():
                box = np.concatenate([coords[kinds == BOX_TOP_LEFT][0], coords[kinds == BOX_BOTTOM_RIGHT][0]])
        boxes, words, groups = blocks[n // q]
        out.append(torch.from_numpy(snap_to_blocks(m.numpy(), boxes, words, clicks, labels, box, blocks=groups)))
    return torch.stack(out)


def paint_batch(relevant: torch.Tensor, batch: dict, size: int) -> torch.Tensor:
    """Masks painted from the word grounding: relevant bool [B*Q, T] (per token) -> bool
    [B*Q, size, size], each prompt's relevant words closed into blocks (word_snap.paint_words)."""
    b = batch["ocr_ids"].shape[0]
    q = relevant.shape[0] // b
    first = first_subtokens(batch["ocr_word_index"]) & batch["ocr_mask"]
    boxes = [word_boxes_in_frame(batch, i, size) for i in range(b)]
    return torch.stack([torch.from_numpy(paint_words((size, size), boxes[n // q], relevant[n][first[n // q]].numpy()))
                        for n in range(relevant.shape[0])])


def heuristic_masks(batch: dict, size: int, input_size: int | None = None) -> dict[str, torch.Tensor]:
    """The text-free answers of HEURISTIC_SETS for every prompt of a collated batch, bool
    [B, Q, size, size] each, in a `size` frame (the batch's box prompts are in pixels of its
    `input_size` frame; default the same)."""
    b, q = batch["prompt_valid"].shape
    boxes = (batch["ocr_boxes"].float() * size / LAYOUT_SCALE).round().long().clamp(0, size)
    is_word = batch["ocr_mask"] & (batch["ocr_word_index"] >= 0)
    words_area = torch.zeros(b, size, size, dtype=torch.bool)
    named = torch.zeros(b, q, size, size, dtype=torch.bool)
    matched = (batch["prompt_match"] > 0).any(2) & is_word[:, None]            # [B, Q, T]
    for i in range(b):
        for t in is_word[i].nonzero()[:, 0].tolist():
            x0, y0, x1, y1 = boxes[i, t].tolist()
            words_area[i, y0:y1, x0:x1] = True
            for k in matched[i, :, t].nonzero()[:, 0].tolist():
                named[i, k, y0:y1, x0:x1] = True
    reading = torch.tensor([[kind in ("reading", "cell") for kind in kinds] + [False] * (q - len(kinds))
                            for kinds in batch["prompt_kind"]])
    question = torch.where(reading[..., None, None], named, words_area[:, None].expand(-1, q, -1, -1))
    box = torch.zeros(b, q, size, size, dtype=torch.bool)
    corners = (batch["boxes"] * (size / (input_size or size))).round().long().clamp(0, size)
    for i in range(b):
        for k in range(q):
            x0, y0, x1, y1 = corners[i, k].tolist()
            box[i, k, y0:y1, x0:x1] = True    # mask_box: x1, y1 exclusive
    return {"heuristic_question": question, "heuristic_box": box}


def clicked_block_masks(batch: dict, pages: Sequence[Page], size: int,
                        blocks: Sequence[tuple[np.ndarray, list[str], list[list[int]]]] | None = None,
                        input_size: int | None = None) -> torch.Tensor:
    """bool [B, Q, size, size]: the box of the text block each prompt's click lands in —
    `snap_to_blocks` of an empty mask and the click; empty where it lands off text. `blocks`: the
    batch's `page_blocks` in the `size` frame, when already grouped; `input_size`: the frame of the
    batch's clicks (default `size`)."""
    b, q = batch["prompt_valid"].shape
    blocks = page_blocks(batch, pages, size) if blocks is None else blocks
    empty = np.zeros((size, size), dtype=bool)
    out = torch.zeros(b, q, size, size, dtype=torch.bool)
    for i, (boxes, words, groups) in enumerate(blocks):
        for k in range(q):
            # the collator's clicks are pixel centres (k + 0.5): the pixel k
            click = scale_points(batch["points"][i, k, :1], size / (input_size or size)).numpy() - 0.5
            out[i, k] = torch.from_numpy(snap_to_blocks(empty, boxes, words, clicks=click, blocks=groups))
    return out
