"""The segmentation model as two traceable graphs, split as SAM's ONNX export splits it.

`PageEncoderGraph` is `SegmentationModel.embed_page` of one page (SAM's image encoder): the
letterboxed image and the page's OCR tokens in, everything the prompts need out. `PromptDecoderGraph`
is `ground` + `decode` of Q prompts on that embedding (SAM's `SamOnnxModel`): question ids, points
(box corners as points, labels 2/3), a mask input and the prompts' word geometry in, all four mask
candidates and their IoU out. What the Predictor decides in Python from the values (is any prompt a
question? a box? a click?) is computed for every prompt here and gated to exact zeros, as SAM's
`has_mask_input` gates its mask prompt, so the numbers are the Predictor's. The word geometry
(`prompt_geometry`: nonzero and data-sized loops) comes in as inputs, computed in numpy by
dociq.inference.onnx_geometry. A prompt without points has no point tokens at all (not even
SAM's pad), so that case is its own graph (`with_points=False`).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from dociq.models.grounding import box_prompts
from dociq.models.segmenter import SegmentationModel

PAGE_INPUTS = ("image", "ocr_ids", "ocr_boxes", "ocr_mask")
PAGE_OUTPUTS = ("image_embedding", "high_res_s4", "high_res_s8", "text_tokens")
WORD_CLASS_OUTPUT = "word_class_logits"     # a page graph output when the model has a word-class head
PROMPT_OUTPUTS = ("masks", "iou")


class PageEncoderGraph(nn.Module):
    """image float [1, 3, S, S] (normalised, letterboxed), ocr_ids long [1, T], ocr_boxes long
    [1, T, 4] (0..1000 of the input frame), ocr_mask bool [1, T] -> (image embedding [1, C, h, w],
    stride-4 and stride-8 maps, fused OCR tokens [1, T, D] and, with a word-class head, the
    tokens' layout class logits [1, T, len(REGION_CLASSES)])."""

    def __init__(self, model: SegmentationModel) -> None:
        super().__init__()
        self.model = model
        self.output_names = list(PAGE_OUTPUTS) + ([WORD_CLASS_OUTPUT] if model.word_class_head is not None else [])

    def forward(self, image: Tensor, ocr_ids: Tensor, ocr_boxes: Tensor, ocr_mask: Tensor):
        batch = {"image": image, "ocr_ids": ocr_ids, "ocr_boxes": ocr_boxes, "ocr_mask": ocr_mask}
        fused, text, maps = self.model.encode(batch, multiscale=True)
        out = (self.model.neck(fused, self.model.unit_grid, maps[2]), maps[0], maps[1], text)
        if self.model.word_class_head is not None:
            out = out + (self.model.word_class_head(text),)
        return out


def prompt_input_names(model: SegmentationModel, with_points: bool) -> list[str]:
    """The prompt graph's inputs, in order: which ones exist depends on the model's switches."""
    g = model.grounding
    names = ["image_embedding", "high_res_s4", "high_res_s8", "text_tokens", "ocr_boxes", "ocr_mask",
             "word_index", "question_ids", "match", "word_pos"]
    if g is not None and g.text_blocks:
        names += ["block_index", "block_boxes", "match_block"]
    if g is not None and g.alignment:
        names += ["match_row", "match_column"]
    if with_points:
        names += ["point_coords", "point_labels"]
        if g is not None and g.click_words:
            names += ["clicked", "click_row", "click_column"] + (["click_block"] if g.text_blocks else [])
        if g is not None and g.box_words:
            names += ["boxed"] + (["box_block"] if g.text_blocks else [])
    return names + ["mask_input", "has_mask_input"]


class PromptDecoderGraph(nn.Module):
    """Q prompts on one page's embedding -> masks [Q, 4, 4h, 4w] logits (0: single-mask output,
    1..3: multimask) and iou [Q, 4]. Inputs are named by `prompt_input_names`; coordinates are
    pixels of the model's square input frame, as the Predictor passes them to the model."""

    def __init__(self, model: SegmentationModel, with_points: bool) -> None:
        super().__init__()
        if model.prompt_encoder.question_encoder is None:
            raise ValueError("ONNX export needs a model with a question tower (model.prompt_encoder.question_model)")
        self.model = model
        self.with_points = with_points
        self.input_names = prompt_input_names(model, with_points)

    def forward(self, *args: Tensor):
        a = dict(zip(self.input_names, args))
        model = self.model
        points = (a["point_coords"], a["point_labels"]) if self.with_points else None
        question_tokens = model.encode_questions(a["question_ids"])   # all-zero rows: the no-question tokens
        grounding = self._ground(a, question_tokens) if model.grounding is not None else None
        n = question_tokens.shape[0]
        sparse, dense = model.prompt_encoder(points=points)
        if not self.with_points:
            sparse = sparse.expand(n, -1, -1)
        # SAM's has_mask_input: the mask prompt's embedding or the no-mask one, exactly
        has_mask = a["has_mask_input"].to(dense.dtype)[:, None, None, None]
        dense = has_mask * model.prompt_encoder.mask_downscaling(a["mask_input"]) + (1 - has_mask) * dense
        sparse = torch.cat([sparse, question_tokens], dim=1)
        high_res_prompt = None
        if grounding is not None:
            dense = dense + grounding.dense
            high_res_prompt = grounding.high_res
        embedding = a["image_embedding"]
        grid, size = tuple(embedding.shape[-2:]), model.prompt_encoder.input_image_size[0]
        if model.box_maps is not None and points is not None:
            box, has_box = box_prompts(*points)
            box_dense, box_high_res = model.box_maps(box, has_box, size, grid)
            dense = dense + box_dense
            high_res_prompt = box_high_res if high_res_prompt is None else high_res_prompt + box_high_res
        if model.click_maps is not None and points is not None:
            click_dense, click_high_res = model.click_maps(*points, size, grid)
            dense = dense + click_dense
            high_res_prompt = click_high_res if high_res_prompt is None else high_res_prompt + click_high_res
        return model.mask_decoder.predict_masks(embedding, model.prompt_encoder.get_dense_pe(), sparse, dense,
                                                [a["high_res_s4"], a["high_res_s8"]],
                                                high_res_prompt=high_res_prompt)

    def _ground(self, a: dict[str, Tensor], question_tokens: Tensor):
        """`SegmentationModel.ground` without its early return: a prompt with neither a question
        nor a tagged word gets the grounding's gate of zero, which is what returning None means."""
        g = self.model.grounding
        has_question = (a["question_ids"] != 0).any(1)
        match = a["match"] * has_question[:, None, None].to(a["match"].dtype)
        word_pos = torch.where(has_question[:, None], a["word_pos"], torch.full_like(a["word_pos"], -1))
        geometry = {k: a[k] for k in ("match_row", "match_column", "match_block", "click_row", "click_column",
                                      "click_block", "box_block", "block_boxes") if k in a}
        return g(a["text_tokens"], a["ocr_boxes"], a["ocr_mask"], a["word_index"], question_tokens, match,
                 word_pos, has_question, tuple(a["image_embedding"].shape[-2:]), a.get("clicked"),
                 a.get("block_index"), a.get("boxed"), geometry=geometry)

