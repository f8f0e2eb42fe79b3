"""A model folder's ONNX files: the two graphs of dociq.models.export_graphs and the tokenizers
as `tokenizers` JSON, so dociq.inference.onnx_predictor runs the model without torch.

    <dir>/onnx/page_encoder.onnx              image + OCR tokens -> page embedding (once per page)
    <dir>/onnx/prompt_decoder.onnx            page embedding + prompts with points/boxes -> masks, IoU
    <dir>/onnx/prompt_decoder_no_points.onnx  the same for prompts without points or boxes
    <dir>/onnx/ocr_tokenizer.json             the OCR WordPiece tokenizer (the one the Predictor uses)
    <dir>/onnx/question_tokenizer.json        open_clip's BPE as a CLIP tokenizer
    <dir>/onnx/onnx_config.json               sizes and switches the runner needs

`dociq export CKPT DIR --onnx` writes it (dociq/cli/export.py). Exporting needs torch, onnx and onnxscript.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from dociq.data.collate import DocumentCollator, lexical_match
from dociq.data.schema import Page
from dociq.data.tokenize import QuestionTokenizer
from dociq.models.export_graphs import (PAGE_INPUTS, PROMPT_OUTPUTS, PageEncoderGraph,
                                        PromptDecoderGraph)
from dociq.models.grounding import boxed_words, clicked_words, prompt_geometry
from dociq.models.segmenter import SegmentationModel
from dociq.inference.model_folder import DociqSegmenter, folder_ocr_tokenizer
from dociq.inference.onnx_tokenizers import write_tokenizers

ONNX_DIR = "onnx"
ONNX_FORMAT = 1
PAGE_ENCODER, PROMPT_DECODER, PROMPT_DECODER_NO_POINTS = "page_encoder.onnx", "prompt_decoder.onnx", \
    "prompt_decoder_no_points.onnx"
OCR_TOKENIZER_JSON, QUESTION_TOKENIZER_JSON, ONNX_CONFIG = "ocr_tokenizer.json", "question_tokenizer.json", \
    "onnx_config.json"
OPSET = 18
INSTALL_HINT = "pip install 'dociq[export]'"

# Dimensions that vary between calls: tokens, prompts, question words, points, text blocks.
_DIMS = {"T": ("ocr_boxes", "ocr_mask", "word_index", "block_index", "text_tokens"),
         "N": ("question_ids", "match", "word_pos", "match_row", "match_column", "match_block", "point_coords",
               "point_labels", "clicked", "click_row", "click_column", "click_block", "boxed", "box_block",
               "mask_input", "has_mask_input")}


def check_export_dependencies() -> None:
    missing = [name for name in ("onnx", "onnxscript") if not _importable(name)]
    if missing:
        raise ImportError(f"ONNX export needs {' and '.join(missing)}: {INSTALL_HINT}")


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


@contextmanager
def _plain_attention(model: torch.nn.Module):
    """timm's Hiera calls fused attention on 5-D tensors, which the ONNX SDPA translation rejects:
    its own unfused path (the same product and softmax) while exporting."""
    fused = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    for m, _ in fused:
        m.fused_attn = False
    try:
        yield
    finally:
        for m, value in fused:
            m.fused_attn = value


def _sample_page(model: SegmentationModel, image_size: int, ocr_tokenizer, blocks: bool):
    """A synthetic page's batch through the Predictor's collator: realistic tokens and blocks."""
    rng = np.random.default_rng(0)
    words, boxes = [], []
    for line in range(24):
        for k in range(6):
            words.append(f"word{line}x{k}")
            boxes.append([20 + 60 * k, 20 + 30 * line, 70 + 60 * k, 40 + 30 * line])
    image = (255 - rng.integers(0, 40, (800, 420, 3))).astype(np.uint8)
    collator = DocumentCollator(image_size, ocr_tokenizer=ocr_tokenizer, blocks=blocks)
    return collator([Page(image=image, words=words, word_boxes=np.asarray(boxes, np.float32))]), words


def _prompt_sample(model: SegmentationModel, batch, page, words, with_points: bool, max_words: int,
                   graph: PromptDecoderGraph) -> tuple[torch.Tensor, ...]:
    """Example inputs of the prompt graph for 2 prompts (questions, and a click + a box)."""
    g, pe = model.grounding, model.prompt_encoder
    questions = ["the word3x2 column", "which line mentions word7x1"]
    ids = QuestionTokenizer(pe.question_encoder.context_length)(questions)
    match, word_pos = lexical_match([words], [questions], batch["ocr_word_index"], max_words, ids.shape[1])
    match, word_pos = match[0], word_pos[0]
    n, size = 2, pe.input_image_size[0]
    coords = torch.tensor([[[100.0, 60.0], [0.0, 0.0], [0.0, 0.0]], [[20.0, 30.0], [90.0, 80.0], [50.0, 50.0]]])
    labels = torch.tensor([[1, 0, -1], [2, 3, 1]])
    a = {"image_embedding": page[0], "high_res_s4": page[1], "high_res_s8": page[2], "text_tokens": page[3],
         "ocr_boxes": batch["ocr_boxes"], "ocr_mask": batch["ocr_mask"], "word_index": batch["ocr_word_index"],
         "question_ids": ids, "match": match, "word_pos": word_pos,
         "point_coords": coords, "point_labels": labels,
         "mask_input": torch.randn(n, 1, *pe.mask_input_size), "has_mask_input": torch.tensor([1.0, 0.0])}
    clicked = boxed = None
    if g is not None and with_points and g.click_words:
        a["clicked"] = clicked = clicked_words(coords, labels, batch["ocr_boxes"], batch["ocr_word_index"], size,
                                               g.click_margin)
    if g is not None and with_points and g.box_words:
        a["boxed"] = boxed = boxed_words(coords, labels, batch["ocr_boxes"], batch["ocr_word_index"], size)
    blocks = batch.get("ocr_block_index") if g is not None and g.text_blocks else None
    if blocks is not None:
        a["block_index"] = blocks
    if g is not None:
        a.update(prompt_geometry(match, batch["ocr_boxes"], clicked, boxed, blocks, g.alignment))
    return tuple(a[name] for name in graph.input_names)


def _dynamic_shapes(names: list[str]) -> dict:
    dims = {d: torch.export.Dim(d, min=2, max=8192) for d in ("T", "N", "J", "P", "S")}
    out = {}
    for name in names:
        spec = {}
        if name in _DIMS["N"]:
            spec[0] = dims["N"]
        if name in _DIMS["T"]:
            spec[1] = dims["T"]
        if name in ("match", "match_row", "match_column", "match_block"):
            spec.update({1: dims["J"], 2: dims["T"]})
        if name == "word_pos":
            spec[1] = dims["J"]
        if name in ("clicked", "click_row", "click_column", "click_block", "boxed", "box_block"):
            spec[2] = dims["T"]
        if name in ("point_coords", "point_labels"):
            spec[1] = dims["P"]
        if name == "block_boxes":
            spec[1] = dims["S"]
        out[name] = spec or None
    return out


def _export(graph: torch.nn.Module, args: tuple, path: Path, input_names: list[str], output_names: list[str],
            dynamic_shapes: dict, optimize: bool) -> None:
    with torch.no_grad(), _plain_attention(graph):
        torch.onnx.export(graph, args, str(path), input_names=input_names, output_names=output_names,
                          dynamic_shapes=dynamic_shapes, dynamo=True, external_data=False, opset_version=OPSET,
                          verbose=False, optimize=optimize)


def export_onnx_graphs(model: SegmentationModel, image_size: int, ocr_tokenizer, max_question_words: int,
                       out_dir: Path, optimize: bool = True) -> None:
    """The three graphs of `model` into `out_dir`. optimize: torch.onnx's graph optimizer (onnxruntime
    optimizes again when it loads a graph; tests skip it to export faster)."""
    check_export_dependencies()
    model = model.eval()
    blocks = model.grounding is not None and model.grounding.text_blocks
    batch, words = _sample_page(model, image_size, ocr_tokenizer, blocks)
    page_graph = PageEncoderGraph(model).eval()
    page_args = tuple(batch[k] for k in ("image", "ocr_ids", "ocr_boxes", "ocr_mask"))
    t = torch.export.Dim("T", min=2, max=8192)
    _export(page_graph, page_args, out_dir / PAGE_ENCODER, list(PAGE_INPUTS), page_graph.output_names,
            {"image": None, "ocr_ids": {1: t}, "ocr_boxes": {1: t}, "ocr_mask": {1: t}}, optimize)
    with torch.no_grad():
        page = page_graph(*page_args)
    for with_points, name in ((True, PROMPT_DECODER), (False, PROMPT_DECODER_NO_POINTS)):
        graph = PromptDecoderGraph(model, with_points).eval()
        args = _prompt_sample(model, batch, page, words, with_points, max_question_words, graph)
        _export(graph, args, out_dir / name, graph.input_names, list(PROMPT_OUTPUTS),
                {"args": tuple(_dynamic_shapes(graph.input_names).values())}, optimize)


def onnx_config(segmenter, ocr_max_length: int) -> dict:
    """What the runner reads besides the graphs: sizes, the Predictor's switches, the file names."""
    model = segmenter.model
    g = model.grounding
    question_encoder = model.prompt_encoder.question_encoder
    return {"onnx_format": ONNX_FORMAT, "opset": OPSET, "image_size": segmenter.image_size, "ocr": segmenter.ocr,
            "lexical_match": segmenter.lexical_match, "max_question_words": segmenter.max_question_words,
            "ocr_max_length": int(ocr_max_length), "context_length": int(question_encoder.context_length),
            "low_res_size": list(model.prompt_encoder.mask_input_size),
            "grounding": None if g is None else {"alignment": g.alignment, "text_blocks": g.text_blocks,
                                                 "click_words": g.click_words, "click_margin": g.click_margin,
                                                 "box_words": g.box_words},
            "files": {"page_encoder": PAGE_ENCODER, "prompt_decoder": PROMPT_DECODER,
                      "prompt_decoder_no_points": PROMPT_DECODER_NO_POINTS, "ocr_tokenizer": OCR_TOKENIZER_JSON,
                      "question_tokenizer": QUESTION_TOKENIZER_JSON}}


def export_onnx(folder: str | Path, optimize: bool = True) -> Path:
    """Add `onnx/` (module doc) to an exported model folder, from the folder's own weights and
    tokenizer files. -> the onnx/ folder."""
    check_export_dependencies()
    folder = Path(folder)
    segmenter = DociqSegmenter.from_pretrained(folder)
    ocr_tokenizer = folder_ocr_tokenizer(folder, segmenter)
    out = folder / ONNX_DIR
    out.mkdir(exist_ok=True)
    export_onnx_graphs(segmenter.model, segmenter.image_size, ocr_tokenizer, segmenter.max_question_words, out,
                       optimize)
    write_tokenizers(ocr_tokenizer, segmenter.question_bpe_source, out / OCR_TOKENIZER_JSON,
                     out / QUESTION_TOKENIZER_JSON)
    (out / ONNX_CONFIG).write_text(json.dumps(onnx_config(segmenter, ocr_tokenizer.max_length), indent=2) + "\n",
                                   encoding="utf-8")
    return out
