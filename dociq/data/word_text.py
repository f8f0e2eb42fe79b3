"""OCR words as a tokenizer can read them: shared by the torch tokenizers (dociq.data.tokenize) and
the ONNX runner's (dociq.inference.onnx_inputs), so both read the same text; no torch here."""
from __future__ import annotations

import re

# WordPiece reads at most 100 characters of a word (BERT's max_input_chars_per_word: a longer one is
# [UNK]), and a word split at every punctuation mark (a 2,000-dot leader) would fill a page's token
# budget alone: OCR words are cut to this length (6 of the recipe corpus's 535k words are longer).
MAX_WORD_CHARS = 100
# Not text: C0/C1 control characters (NUL, BEL, ...; tab, newline and CR are whitespace to the
# tokenizer) are dropped, lone UTF-16 surrogates (JSON "\ud800") become U+FFFD: the Rust tokenizer
# refuses a page holding one. Right-to-left and zero-width marks are text and pass.
_NOT_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_word(word: str) -> str:
    """An OCR word as the tokenizer can read it: control characters dropped, lone surrogates
    replaced by U+FFFD, cut to MAX_WORD_CHARS."""
    word = _NOT_TEXT.sub(lambda m: "\ufffd" if m.group() >= "\ud800" else "", word)
    return word[:MAX_WORD_CHARS]
