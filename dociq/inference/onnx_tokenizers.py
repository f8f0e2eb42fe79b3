"""The model's two tokenizers as `tokenizers` JSON files, so the ONNX runner needs no torch,
transformers or open_clip: the OCR WordPiece tokenizer as transformers builds it, and open_clip's
BPE (`SimpleTokenizer`) as a CLIP tokenizer (the conversion transformers' CLIPConverter makes).
Writing needs transformers / open_clip; reading (dociq.inference.onnx_inputs) only `tokenizers`."""
from __future__ import annotations

import gzip
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

SOT, EOT = "<start_of_text>", "<end_of_text>"
# open_clip's SimpleTokenizer pattern (its text is lower-cased first)
CLIP_PATTERN = r"""<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (open_clip's `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def clip_tokenizer(bpe_path: Path) -> Tokenizer:
    """open_clip's vocabulary (built from its merges file as SimpleTokenizer builds it) as a
    `tokenizers` BPE: the same ids for text that ftfy / html unescaping leaves as it is."""
    merges = gzip.open(bpe_path).read().decode("utf-8").split("\n")[1:49152 - 256 - 2 + 1]
    merges = [tuple(m.split()) for m in merges]
    vocab = list(_bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges] + [SOT, EOT]
    tok = Tokenizer(BPE(vocab={v: i for i, v in enumerate(vocab)}, merges=merges, continuing_subword_prefix="",
                        end_of_word_suffix="</w>", fuse_unk=False))
    # ftfy's uncurl_quotes (open_clip cleans text with ftfy.fix_text), then whitespace_clean and lower()
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex("[\u2018\u2019\u201a\u201b]"), "'"),
                                           normalizers.Replace(Regex("[\u201c\u201d\u201e\u201f]"), '"'),
                                           normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Strip(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CLIP_PATTERN), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def write_tokenizers(ocr_tokenizer, bpe_path: Path | None, ocr_target: Path, question_target: Path) -> None:
    """The OCR tokenizer (a dociq.data.tokenize.OcrTokenizer) and, when the model has a question
    tower, open_clip's BPE at `bpe_path` as tokenizers JSON files."""
    backend = Tokenizer.from_str(ocr_tokenizer.hf.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()     # the runner truncates at the folder's max_length, as the Predictor does
    backend.save(str(ocr_target))
    if bpe_path is not None:
        clip_tokenizer(bpe_path).save(str(question_target))
