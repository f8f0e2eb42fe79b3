"""The data contract: what a data set yields per page, and what a batch holds.

Every data set (synthetic, COCO, FUNSD, the engine's store) yields `Page` objects; the collator
(`dociq.data.collate`) turns a list of pages into a batch dict with the keys in `BATCH_KEYS`.
Every task consumes that dict. Keep the batch table of docs/design.md and this file in step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Normalisation of page images (timm's ImageNet defaults, so timm checkpoints see what they expect).
IMAGE_MEAN = (0.485, 0.456, 0.406)
IMAGE_STD = (0.229, 0.224, 0.225)

# Layout boxes are integers in 0..LAYOUT_SCALE (the LayoutLM convention).
LAYOUT_SCALE = 1000

# Region classes the synthetic generator draws, then those the real-document corpus adds
# (built by dociq.corpus); other real data sets bring their own category names.
SYNTHETIC_CLASSES = (
    "title", "section_heading", "paragraph", "list_item", "form_key", "form_value", "table",
    "table_cell", "page_header", "page_footer", "page_number", "figure", "stamp", "signature",
)
REGION_CLASSES = SYNTHETIC_CLASSES + ("caption", "code")

# Question kinds; metrics are reported per kind.
QUESTION_KINDS = ("layout", "reading", "cell", "category", "link")


@dataclass
class Region:
    """One annotated region. `mask` is bool [H, W] in page pixels; `box` is x0, y0, x1, y1 pixels."""

    label: str
    box: np.ndarray
    mask: np.ndarray
    text: str = ""
    word_ids: list[int] = field(default_factory=list)  # indices into Page.words


@dataclass
class Question:
    """A natural-language prompt and its target. `mask` is bool [H, W]; `region_ids` index Page.regions."""

    text: str
    kind: str
    mask: np.ndarray
    region_ids: list[int] = field(default_factory=list)


@dataclass
class Page:
    """One document page as every data set yields it.

    image:      uint8 [H, W, 3] RGB
    words:      OCR words in reading order
    word_boxes: float32 [N, 4] x0, y0, x1, y1 in page pixels
    regions:    annotated regions (class, box, mask)
    questions:  prompts with their target masks
    links:      (key region index, value region index) pairs, e.g. form key -> value
    meta:       page id, source path, original size (H, W), anything provenance-like
    word_confidences: float32 [N] the OCR engine's confidence in each word (0..100), None where
                the words are a text layer's or given
    """

    image: np.ndarray
    words: list[str]
    word_boxes: np.ndarray
    regions: list[Region] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    word_confidences: np.ndarray | None = None

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) in pixels."""
        return int(self.image.shape[0]), int(self.image.shape[1])


# key -> (dtype, shape) of a collated batch. Optional keys appear only when their producer is on.
BATCH_KEYS = {
    "image": "float [B,3,H,W] normalised with IMAGE_MEAN/IMAGE_STD",
    "ocr_ids": "long [B,T] WordPiece ids, [CLS] ... [SEP], padded with pad id",
    "ocr_mask": "bool [B,T] True where a real token",
    "ocr_boxes": "long [B,T,4] token boxes x0,y0,x1,y1 in 0..1000",
    "ocr_word_index": "long [B,T] index of the page word each token came from, -1 for special/pad",
    "ocr_block_index": "long [B,T] text block (dociq.data.text_blocks) of the token's word, numbered per page, "
                       "-1 for special/pad",
    "ocr_word_class": "long [B,T] REGION_CLASSES index of the smallest region holding the token's word, "
                      "-1 = none (finetune)",
    "prompt_ids": "long [B,Q,L] open_clip tokens of the questions (finetune)",
    "prompt_valid": "bool [B,Q] True where a real question (pages have different counts)",
    "prompt_kind": "list[list[str]] question kind per page and question",
    "prompt_text": "list[list[str]] the questions as text (finetune)",
    "prompt_question_index": "list[list[int]] each prompt's index in its page's questions (finetune)",
    "prompt_match": "uint8 [B,Q,J,T] lexical match of question content word j with OCR token t "
                    "(0 none, 1 fuzzy, 2 case-folded, 3 exact; dociq.data.lexical)",
    "prompt_word_pos": "long [B,Q,J] CLIP token position of question content word j, -1 = none",
    "points": "float [B,Q,P,2] point prompts in pixels (x, y) (optional)",
    "point_labels": "long [B,Q,P] 1 positive, 0 negative, -1 padding (optional)",
    "boxes": "float [B,Q,4] box prompts x0,y0,x1,y1 in pixels (optional)",
    "masks": "float [B,Q,H,W] target mask per question",
    "ctx_idx": "long [B,Nc] kept (context) mask-unit indices, same Nc for the batch (image masking)",
    "tgt_idx": "long [B,M,Nt] M target blocks of mask-unit indices (image masking)",
    "mlm_ids": "long [B,T] ocr_ids with MLM corruption applied (text masking)",
    "mlm_labels": "long [B,T] original id at masked positions, -100 elsewhere (text masking)",
    "meta": "list[dict] page id, source path, original size",
}
