"""The promptable segmentation model: document model + neck + prompt encoder + word grounding +
box maps + mask decoder.

`SegmentationModel` is the nn.Module that `stage=finetune` trains and the Predictor runs. The
document model (Hiera image encoder + layout text encoder + fusion trunk) encodes the page and its
OCR words; a small neck turns the fused image tokens (one per 32-px mask unit, conditioned on the
OCR text) into the decoder's image embedding at stride 16 — the fused grid upsampled x2 plus
Hiera's stride-16 map, SAM's geometry — and the mask decoder upscales it x4 to stride 4 with
SAM 2's high-resolution skips from Hiera's stride-8 and stride-4 maps. Per prompt, the word
grounding (`dociq.models.grounding.WordGrounding`) and the box maps (`BoxMaps`) add dense maps at
stride 16 (to the dense prompt embedding) and stride 4 (to the upscaled features).

    page = model.embed_page(batch)                       # once per page (SAM's set_image)
    a = model.answer(page, question_ids, match, word_pos, points, None, ambiguous)   # a.chosen [N, 1, h, w]
    # a correction round (training): more clicks, the chosen mask as the mask prompt
    a = model.answer(page, question_ids, match, word_pos, points, a.chosen, ambiguous, previous=a)

`answer` is the one prompt path, so that what training validates is what the Predictor serves:
the Predictor calls it once per set of prompts, the training task once per interactive round.
It encodes the questions (`encode_questions`, once: a later round reuses them), grounds them and
the clicks in words (`ground`; a later round again only when clicks are grounded, since its
correction clicks may land on words), decodes (`decode`) and chooses (`choose_outputs`,
`best_candidate`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dociq.data.schema import REGION_CLASSES
from dociq.models.common import LayerNorm2d, build_part
from dociq.models.document_model import DocumentModel
from dociq.models.grounding import (BoxMaps, ClickMaps, Grounding, PageLayout, WordGrounding, box_prompts, boxed_words,
                                    clicked_words)
from dociq.models.prompt_encoder import NEGATIVE_POINT, POSITIVE_POINT
from dociq.models.mask_decoder import MaskDecoder
from dociq.models.prompt_encoder import PromptEncoder
from dociq.models.sizes import ModelConfigError


class ImageEmbeddingNeck(nn.Module):
    """Fused unit-grid tokens [B, N, D] (stride 32) + Hiera stride-16 map -> [B, C, 2gh, 2gw].

    The fused tokens carry what the OCR text says about each unit; the stride-16 map adds the
    resolution a 32-px unit lacks. SAM's neck (1x1 conv, LN, 3x3 conv, LN) mixes the sum."""

    def __init__(self, fused_dim: int, stride16_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fused_proj = nn.Conv2d(fused_dim, out_dim, kernel_size=1)
        self.stride16_proj = nn.Conv2d(stride16_dim, out_dim, kernel_size=1)
        self.mix = nn.Sequential(LayerNorm2d(out_dim), nn.Conv2d(out_dim, out_dim, 3, padding=1, bias=False),
                                 LayerNorm2d(out_dim))

    def forward(self, fused: Tensor, grid: tuple[int, int], stride16: Tensor) -> Tensor:
        b, n, d = fused.shape
        x = self.fused_proj(fused.transpose(1, 2).reshape(b, d, *grid))
        x = F.interpolate(x, size=stride16.shape[-2:], mode="bilinear", align_corners=False)
        return self.mix(x + self.stride16_proj(stride16))


class SegmentationModel(DocumentModel):
    """DocumentModel + neck + prompt encoder + mask decoder. Keys of the document parts are the
    DocumentModel's, so a pretrain checkpoint's `model.*` loads into it unchanged."""

    def __init__(self, image_encoder, text_encoder, fusion, neck: ImageEmbeddingNeck,
                 prompt_encoder: PromptEncoder, mask_decoder: MaskDecoder,
                 grounding: WordGrounding | None = None, box_maps: BoxMaps | None = None,
                 click_maps: ClickMaps | None = None, word_class_head: nn.Module | None = None) -> None:
        super().__init__(image_encoder, text_encoder, fusion)
        self.word_class_head = word_class_head
        self.box_maps = box_maps
        self.click_maps = click_maps
        self.neck = neck
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder
        self.grounding = grounding

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> "SegmentationModel":
        """Build from a complete `model` config (configs/model/<size>.yaml as composed; a checkpoint's
        hyper_parameters.model); anything less is a ModelConfigError naming the missing keys.
        `grounding: null` builds no word grounding; box_maps, click_maps and word_classes switch
        their modules on or off."""
        doc = DocumentModel.from_config(model)
        image_size = int(model["image_size"])
        gh, gw = doc.unit_grid
        prompt_encoder = build_part(PromptEncoder, "prompt_encoder", model, image_embedding_size=(2 * gh, 2 * gw),
                                    input_image_size=(image_size, image_size))   # the stride-16 grid
        stage_dims = doc.image_encoder.stage_dims
        mask_decoder = build_part(MaskDecoder, "mask_decoder", model, use_high_res_features=True,
                                  high_res_channels=(stage_dims[0], stage_dims[1]))
        if mask_decoder.transformer_dim != prompt_encoder.embed_dim:
            raise ModelConfigError(f"model.mask_decoder.transformer_dim ({mask_decoder.transformer_dim}) differs "
                                   f"from model.prompt_encoder.embed_dim ({prompt_encoder.embed_dim})",
                                   "make them equal")
        neck = ImageEmbeddingNeck(doc.dim, stage_dims[2], prompt_encoder.embed_dim)
        prompt_dim, high_res_dim = prompt_encoder.embed_dim, mask_decoder.transformer_dim // 8
        grounding = None
        if model["grounding"] is not None:
            if prompt_encoder.question_encoder is None:
                raise ModelConfigError("model.grounding needs the question tower (model.prompt_encoder.question_model)",
                                       "set model.grounding=null to build the model without word grounding")
            grounding = build_part(WordGrounding, "grounding", model, text_dim=doc.dim, dim=prompt_dim,
                                   high_res_dim=high_res_dim)
        box_maps = BoxMaps(prompt_dim, high_res_dim) if model["box_maps"] else None
        click_maps = ClickMaps(prompt_dim, high_res_dim) if model["click_maps"] else None
        # The layout class of every OCR word (REGION_CLASSES), read off the fused text stream
        # (LayoutLM's token classification): it names the regions segment-page finds.
        word_class_head = nn.Sequential(nn.LayerNorm(doc.dim), nn.Linear(doc.dim, len(REGION_CLASSES))) \
            if model["word_classes"] else None
        return cls(doc.image_encoder, doc.text_encoder, doc.fusion, neck, prompt_encoder, mask_decoder, grounding,
                   box_maps, click_maps, word_class_head)

    def embed_page(self, batch: Mapping[str, Any]) -> "PageEmbedding":
        """Page (+ OCR) -> the decoder's image embedding, the skip maps and the fused OCR tokens:
        everything the prompts of this page need, computed once (SAM's set_image)."""
        fused, text, maps = self.encode(batch, multiscale=True)
        return PageEmbedding(self.neck(fused, self.unit_grid, maps[2]), [maps[0], maps[1]], text,
                             batch["ocr_boxes"], batch["ocr_mask"], batch["ocr_word_index"],
                             batch.get("ocr_block_index"))

    def word_class_logits(self, page: "PageEmbedding") -> Tensor | None:
        """[B, T, len(REGION_CLASSES)] layout class logits of every OCR token, or None without the head."""
        return None if self.word_class_head is None else self.word_class_head(page.text)

    def embed_image(self, batch: Mapping[str, Any]) -> tuple[Tensor, list[Tensor]]:
        """Page (+ OCR) -> decoder image embedding [B, C, h, w] and [stride-4, stride-8] skip maps."""
        page = self.embed_page(batch)
        return page.image, page.high_res

    def ground(self, page: "PageEmbedding", question_tokens: Tensor | None, match: Tensor | None,
               word_pos: Tensor | None, has_question: Tensor,
               points: tuple[Tensor, Tensor] | None = None) -> Grounding | None:
        """Per-prompt word grounding (dociq.models.grounding) of the questions and, when the
        grounding has `click_words`, of the clicks in `points` (coords [N, P, 2] pixels of the
        input frame, labels [N, P]) and, with `box_words`, of the words inside the box in `points`;
        None when the model has no grounding module or no prompt has a question or words tagged.
        match uint8 [N,J,T], word_pos [N,J]."""
        if self.grounding is None:
            return None
        clicked = None
        if self.grounding.click_words and points is not None:
            clicked = clicked_words(points[0], points[1], page.boxes, page.word_index,
                                    self.prompt_encoder.input_image_size[0], self.grounding.click_margin)
        boxed = None
        if self.grounding.box_words and points is not None:
            boxed = boxed_words(points[0], points[1], page.boxes, page.word_index,
                                self.prompt_encoder.input_image_size[0])
        has_words = torch.zeros_like(has_question)
        for tagged in (clicked, boxed):
            if tagged is not None:
                has_words = has_words | tagged.flatten(1).bool().any(1)
        if not bool((has_question | has_words).any()):
            return None
        n = has_question.shape[0]
        if question_tokens is None:
            question_tokens = self.prompt_encoder.question_encoder.no_question_tokens(n)
        if bool(has_question.any()) and (match is None or word_pos is None):
            raise KeyError("the word-grounding path needs the lexical match of the questions: batch keys "
                           "`prompt_match` and `prompt_word_pos` (DocumentCollator with questions=true makes them)")
        if match is None or word_pos is None:
            t = page.boxes.shape[1]
            match = torch.zeros(n, 1, t, dtype=torch.uint8, device=page.boxes.device)
            word_pos = torch.full((n, 1), -1, dtype=torch.long, device=page.boxes.device)
        else:
            # a prompt whose question was dropped keeps no trace of it (its click is grounded alone)
            match = match * has_question[:, None, None].to(match.dtype)
            word_pos = torch.where(has_question[:, None], word_pos, torch.full_like(word_pos, -1))
        return self.grounding(page.text, page.boxes, page.token_mask, page.word_index, question_tokens,
                              match, word_pos, has_question, tuple(page.image.shape[-2:]), clicked,
                              page.block_index, boxed, layout=page.layout)

    def keep_page_layout(self, page: "PageEmbedding") -> None:
        """Compute the grounding's page-only coverage maps once, sparse, for the many prompts of an
        embedded page (`Predictor.set_image`); the training step recomputes them densely."""
        if self.grounding is not None:
            page.layout = self.grounding.page_layout(page.boxes, page.token_mask, page.word_index,
                                                     tuple(page.image.shape[-2:]), page.block_index, sparse=True)

    def encode_questions(self, question_ids: Tensor) -> Tensor:
        """long [N, L] (all-zero rows: no question) -> sparse tokens [N, S_q, C]. Computed once per
        step and reused by every interactive round."""
        if self.prompt_encoder.question_encoder is None:
            raise ValueError("the prompt encoder has no question tower: set model.prompt_encoder.question_model")
        return self.prompt_encoder.question_encoder(question_ids)

    def answer(self, page: "PageEmbedding", question_ids: Tensor | None, match: Tensor | None,
               word_pos: Tensor | None, points: tuple[Tensor, Tensor] | None, mask_prompt: Tensor | None,
               ambiguous: Tensor, previous: "Answer | None" = None) -> "Answer":
        """N prompts about the embedded page(s) -> every decoder output, the candidates and the
        chosen mask. `page` holds B pages and the prompts are flattened image-major (N = B*Q): the
        Predictor gives one page and its Q prompts (the decoder and the grounding repeat the page
        for them), the training task a batch.

        question_ids long [N, L] (all-zero rows: no question) or None; match uint8 [N, J, T] and
        word_pos [N, J]: the lexical match of the questions (`ground`); points: coords [N, P, 2]
        pixels of the input frame and labels [N, P] (box corners as labels 2/3) or None;
        mask_prompt [N, 1, h, w] low-res logits or None; ambiguous bool [N]: the prompts that
        choose among the 3 multimask outputs (a lone click; `choose_outputs`).
        previous: this method's answer to the same prompts one round earlier (the clicks and the
        mask prompt may have changed since): its encoded questions are reused, and its grounding
        too unless the grounding reads clicks."""
        if previous is None:
            question_tokens = self.encode_questions(question_ids) if question_ids is not None else None
            has_question = (question_ids != 0).any(1) if question_ids is not None else torch.zeros_like(ambiguous)
        else:
            question_tokens, has_question = previous.question_tokens, previous.has_question
        if previous is None or (self.grounding is not None and self.grounding.click_words):
            grounding = self.ground(page, question_tokens, match, word_pos, has_question, points)
        else:
            grounding = previous.grounding
        masks, iou = self.decode(page.image, page.high_res, question_tokens, points, mask_prompt, grounding)
        candidates, candidate_iou = choose_outputs(masks, iou, ambiguous)
        best = candidate_iou.argmax(1, keepdim=True)
        chosen = best_candidate(candidates, candidate_iou)[:, None]
        return Answer(masks, iou, candidates, candidate_iou, chosen, candidate_iou.gather(1, best)[:, 0].detach(),
                      question_tokens, has_question, grounding)

    def decode(self, embedding: Tensor, high_res: list[Tensor], question_tokens: Tensor | None,
               points: tuple[Tensor, Tensor] | None, mask_prompt: Tensor | None,
               grounding: Grounding | None = None) -> tuple[Tensor, Tensor]:
        """All decoder outputs: masks [N, 4, 4h, 4w] (0 = single-mask token, 1..3 multimask) and
        iou [N, 4]. Prompts are flattened image-major (N = B*Q). Box corners go in `points`;
        `grounding` (from `ground`) adds the per-prompt word maps."""
        n = question_tokens.shape[0] if question_tokens is not None else (
            points[0].shape[0] if points is not None else mask_prompt.shape[0])
        sparse, dense = self.prompt_encoder(points=points, masks=mask_prompt)
        if sparse.shape[0] != n:   # no point or mask prompt: one empty row and the no-mask map
            sparse, dense = sparse.expand(n, -1, -1), dense.expand(n, -1, -1, -1)
        if question_tokens is None and self.prompt_encoder.question_encoder is not None:
            # Prompts without a question carry the no-question tokens, as in a batch that mixes
            # both: the decoder then sees the same token layout in training and in use.
            question_tokens = self.prompt_encoder.question_encoder.no_question_tokens(n)
        if question_tokens is not None:
            sparse = torch.cat([sparse, question_tokens], dim=1)
        high_res_prompt = None
        if grounding is not None:
            dense = dense + grounding.dense
            high_res_prompt = grounding.high_res
        if self.box_maps is not None and points is not None:
            box, has_box = box_prompts(*points)
            if bool(has_box.any()):
                box_dense, box_high_res = self.box_maps(box, has_box,
                                                        self.prompt_encoder.input_image_size[0],
                                                        tuple(embedding.shape[-2:]))
                dense = dense + box_dense
                high_res_prompt = box_high_res if high_res_prompt is None else high_res_prompt + box_high_res
        if self.click_maps is not None and points is not None:
            coords, labels = points
            if bool(((labels == POSITIVE_POINT) | (labels == NEGATIVE_POINT)).any()):
                click_dense, click_high_res = self.click_maps(coords, labels, self.prompt_encoder.input_image_size[0],
                                                              tuple(embedding.shape[-2:]))
                dense = dense + click_dense
                high_res_prompt = click_high_res if high_res_prompt is None else high_res_prompt + click_high_res
        return self.mask_decoder.predict_masks(embedding, self.prompt_encoder.get_dense_pe(), sparse,
                                               dense, high_res, high_res_prompt=high_res_prompt)


@dataclass
class PageEmbedding:
    """What `SegmentationModel.embed_page` computes once per page (B pages)."""
    image: Tensor              # [B, C, h, w] decoder image embedding (stride 16)
    high_res: list[Tensor]     # [stride-4, stride-8] Hiera maps for the decoder's skips
    text: Tensor               # [B, T, D] fused OCR tokens (the fusion trunk's text stream)
    boxes: Tensor              # long [B, T, 4] token boxes, 0..1000
    token_mask: Tensor         # bool [B, T] real tokens
    word_index: Tensor         # long [B, T] page word of each token, -1 special/pad
    block_index: Tensor | None = None   # long [B, T] text block of each token, -1 none (`ocr_block_index`)
    layout: PageLayout | None = None    # the grounding's page-only coverage maps, when kept for many prompts


@dataclass
class Answer:
    """What `SegmentationModel.answer` gives N prompts ((h, w): the decoder's stride-4 grid)."""
    masks: Tensor              # [N, 4, h, w] every decoder output: 0 single-mask token, 1..3 multimask
    iou: Tensor                # [N, 4] their predicted IoU
    candidates: Tensor         # [N, 3, h, w] `choose_outputs`: what the loss trains and scoring ranks
    candidate_iou: Tensor      # [N, 3]
    chosen: Tensor             # [N, 1, h, w] the candidate of highest predicted IoU, detached
    chosen_iou: Tensor         # [N] its predicted IoU, detached
    question_tokens: Tensor | None   # the encoded questions, for the next round
    has_question: Tensor       # bool [N]
    grounding: Grounding | None      # the word grounding the decoder saw (its relevance: the word loss)


def choose_outputs(masks: Tensor, iou: Tensor, ambiguous: Tensor) -> tuple[Tensor, Tensor]:
    """Per prompt, the candidates to train/score: the 3 multimask outputs for ambiguous prompts,
    the single-mask output (repeated 3 times, so the min-over-candidates picks it) otherwise."""
    single_m, single_i = masks[:, :1].expand(-1, 3, -1, -1), iou[:, :1].expand(-1, 3)
    a = ambiguous.view(-1, 1)
    return torch.where(a[..., None, None], masks[:, 1:], single_m), torch.where(a, iou[:, 1:], single_i)


def best_candidate(masks: Tensor, iou: Tensor) -> Tensor:
    """The candidate with the highest predicted IoU per prompt -> [N, h, w] logits."""
    rows = torch.arange(iou.shape[0], device=iou.device)
    return masks[rows, iou.argmax(dim=1)].detach()


def remove_ocr_words(batch: dict) -> dict:
    """The batch as if the pages had no OCR words: only [CLS] [SEP] remain (the layout-only
    baseline). Special tokens are moved to the front in order, as the tokenizer emits them."""
    keep = batch["ocr_mask"] & (batch["ocr_word_index"] < 0)
    order = torch.sort((~keep).long(), dim=1, stable=True).indices
    t = int(keep.sum(1).max())
    order = order[:, :t]
    out = dict(batch)
    out["ocr_ids"] = batch["ocr_ids"].gather(1, order)
    out["ocr_mask"] = keep.gather(1, order)
    out["ocr_boxes"] = batch["ocr_boxes"].gather(1, order[..., None].expand(-1, -1, 4))
    out["ocr_word_index"] = batch["ocr_word_index"].gather(1, order)
    if "ocr_block_index" in batch:   # special tokens only: no word has a block
        out["ocr_block_index"] = batch["ocr_block_index"].gather(1, order).clamp(max=-1)
    if "ocr_word_class" in batch:   # special tokens only: no word has a class
        out["ocr_word_class"] = batch["ocr_word_class"].gather(1, order).clamp(max=-1)
    if "prompt_match" in batch:   # no words left to match
        out["prompt_match"] = batch["prompt_match"].new_zeros(*batch["prompt_match"].shape[:3], t)
    return out
