"""OCR backends: words with boxes in page pixels, from the annotation, a PDF text layer or tesseract.

- `groundtruth`: the words stored with the annotation (data sets read them; no backend object).
- `PdfTextLayer`: the text layer of a born-digital PDF (read by `dociq.data.pdf`), boxes in pixels
  of the page rendered at `dpi`; it renders the page image too, so image and words always agree.
- `TesseractOCR`: tesseract's hOCR (pytesseract over Debian's `tesseract-ocr`), words with
  confidence above `min_conf`, their boxes as tall as the font (`hocr_words`).

Results are cached per page on disk (`OcrCache`): the key is the content hash of the image or
PDF page plus the backend name and its settings, the value a JSON file written atomically.
A custom backend is any object with `name`, `settings()` and `recognise(image) -> OcrWords`.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from dociq.data.errors import DEFAULT_MAX_PAGE_PIXELS
from dociq.data.pdf import POINTS_PER_INCH, open_page, render_page, text_layer_words
from dociq.data.ruling_lines import erase_ruling_lines
from dociq.data.text_blocks import group_lines
from dociq.data.unread_ink import unread_pieces
from dociq.io.atomic import atomic_write_text

OCR_CHOICES = ("groundtruth", "tesseract", "pdf")


# Tesseract's word confidences run 0..100. TesseractOCR keeps every word it reads (EVERY_WORD): on
# scanned corpus pages the words it doubts are mostly true words (layout / reading / box / click
# 44.9 / 58.9 / 86.5 / 54.3 -> 46.3 / 62.3 / 88.1 / 58.4 with them), and on scanned forms the field
# values they hold (field questions 80.1 -> 83.1). A word over SURE_CONFIDENCE, or holding a digit
# over SURE_CONFIDENCE_DIGITS, is read surely (`read_surely`); the others may be a mark read as
# letters (70 of the 181 words read on signature strokes of 60 scanned training forms), so the
# Predictor tells a page's pictures and its class answers from the sure words only. Its language
# model scores codes, amounts and dates low even when it reads them right (a form's account number
# "PSPQ35853042122962" at 48), hence the digits' bar (docs/finetune.md, "Words tesseract doubts"
# and "Every word tesseract reads").
EVERY_WORD = -1.0
SURE_CONFIDENCE, SURE_CONFIDENCE_DIGITS = 50.0, -1.0


def read_surely(words: Sequence[str], confidences: np.ndarray | None, min_conf: float = SURE_CONFIDENCE,
                min_conf_digits: float | None = SURE_CONFIDENCE_DIGITS) -> np.ndarray:
    """bool [N]: the words read with confidence above `min_conf` (0..100), and those holding a digit
    above `min_conf_digits` (None: `min_conf`); every word when `confidences` is None (words a
    caller or a text layer gives)."""
    if confidences is None:
        return np.ones(len(words), bool)
    digits = min_conf if min_conf_digits is None else min_conf_digits
    bars = np.array([digits if any(c.isdigit() for c in w) else min_conf for w in words], np.float64)
    return np.asarray(confidences, np.float64).reshape(-1) > bars


@dataclass
class OcrWords:
    """Words in reading order; `boxes` float32 [N, 4] x0,y0,x1,y1 in pixels of a page of `size` (H, W)."""

    words: list[str]
    boxes: np.ndarray
    size: tuple[int, int]
    confidences: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def __post_init__(self):
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        if len(self.confidences) != len(self.words):
            self.confidences = np.full(len(self.words), 100.0, np.float32)
        self.confidences = np.asarray(self.confidences, dtype=np.float32)
        self.size = (int(self.size[0]), int(self.size[1]))

    def __len__(self) -> int:
        return len(self.words)

    def scaled_to(self, size: tuple[int, int]) -> "OcrWords":
        """The same words with boxes mapped onto a page of pixel size (H, W)."""
        sy, sx = size[0] / self.size[0], size[1] / self.size[1]
        scale = np.array([sx, sy, sx, sy], dtype=np.float32)
        return OcrWords(list(self.words), self.boxes * scale, size, self.confidences.copy())

    def widened(self, share: float, digit_advance: float = 0.0) -> "OcrWords":
        """The same words with each box widened by `share` of its height on either side, and a word
        of digits to at least `digit_advance` x its height per digit about its centre: a typeface's
        figures share one advance width, so a "1", whose ink is a stroke, sits in a box as wide as a
        "0" (inside the page)."""
        boxes = self.boxes.copy()
        height = boxes[:, 3] - boxes[:, 1]
        pad = share * height
        digits = np.array([len(w) if w.isdigit() else 0 for w in self.words], np.float32)
        pad = np.maximum(pad, (digits * digit_advance * height - (boxes[:, 2] - boxes[:, 0])) / 2)
        boxes[:, 0] = np.maximum(boxes[:, 0] - pad, 0.0)
        boxes[:, 2] = np.minimum(boxes[:, 2] + pad, float(self.size[1]))
        return OcrWords(list(self.words), boxes, self.size, self.confidences.copy())

    def confident(self, min_conf: float, min_conf_digits: float | None = None) -> "OcrWords":
        """The words read with confidence above `min_conf` (0..100), and those holding a digit above
        `min_conf_digits` (default `min_conf`)."""
        keep = read_surely(self.words, self.confidences, min_conf, min_conf_digits)
        if keep.all():
            return self
        return OcrWords([w for w, k in zip(self.words, keep) if k], self.boxes[keep], self.size, self.confidences[keep])

    def to_json(self) -> dict:
        return {
            "size": list(self.size),
            "words": list(self.words),
            "boxes": [[float(v) for v in b] for b in self.boxes],
            "confidences": [float(c) for c in self.confidences],
        }

    @classmethod
    def from_json(cls, d: dict) -> "OcrWords":
        return cls(d["words"], np.array(d["boxes"], np.float32).reshape(-1, 4), tuple(d["size"]),
                   np.array(d["confidences"], np.float32))


@runtime_checkable
class OcrBackend(Protocol):
    """What `CocoDocuments(ocr=...)` / `FunsdDocuments(ocr=...)` accept besides a name."""

    name: str

    def settings(self) -> dict: ...

    def recognise(self, image: np.ndarray) -> OcrWords: ...


class OcrCache:
    """One JSON file per (content, backend, settings) under `root`."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @staticmethod
    def key(content_hash: str, backend: str, settings: dict) -> str:
        blob = json.dumps({"content": content_hash, "backend": backend, "settings": settings},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get_or_compute(self, key: str, compute: Callable[[], OcrWords]) -> OcrWords:
        path = self.path(key)
        if path.is_file():
            try:
                return OcrWords.from_json(json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, KeyError, TypeError):
                pass  # an unreadable cache entry is recomputed and overwritten
        result = compute()
        atomic_write_text(path, json.dumps(result.to_json()))
        return result


def image_hash(image: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(repr((image.shape, str(image.dtype))).encode())
    h.update(np.ascontiguousarray(image).tobytes())
    return h.hexdigest()


def _as_cache(cache: OcrCache | str | Path | None) -> OcrCache | None:
    if cache is None or isinstance(cache, OcrCache):
        return cache
    return OcrCache(cache)


# Tesseract reads text best at ~300 dpi: a page image whose longest side is below this is enlarged to
# it before OCR (a 1,024-px page of a two-column article: 73 % of its words read back at 1x, 85 %
# at 2x; docs/finetune.md, "Documents it has never seen"), and the boxes are mapped back.
OCR_MIN_LONG_SIDE = 2048


# Tesseract's `thresholding_method`: how it turns the page into black and white before reading.
# Sauvola's local threshold keeps blurred and noisy scans legible where the global Otsu threshold
# (tesseract's default) merges their small letters into blots: on 20 degraded browser-printed forms
# it read 82 % of the words against 65 % and no page came back empty; on 12 scanned corpus pages it
# read 68 % against 72 % (docs/finetune.md, "Scanned forms: a local threshold, rules erased").
BINARIZATIONS = {"otsu": 0, "leptonica-otsu": 1, "sauvola": 2}
# TesseractOCR's word_boxes: the heights a word's box can take.
WORD_BOXES = ("font", "ink", "line")
# A text layer's word box spans its letters' advance widths, tesseract's box their ink: a font box is
# widened by this share of its height on either side (the letters' side bearings). Against the text
# layer's boxes of the same words on level scans of training pages (mean IoU; 60 browser-printed
# forms, 1,715 words / 12 corpus pages, 1,682 words): 0 0.878 / 0.861, 0.02 0.885 / 0.874,
# 0.04 0.886 / 0.882, 0.06 0.881 / 0.881 (docs/finetune.md, "Every word tesseract reads").
SIDE_BEARING = 0.04
# A number's box is at least this share of its height wide per digit: a text layer's boxes of words of
# one digit are 0.47 / 0.50 / 0.52 of their height wide (5th / 25th / 50th percentile; 1,465 words on
# every fifth training page; 0.47 / 0.50 / 0.53 per digit for two digits), whatever the digit, where
# tesseract's box of a "1" spans its stroke (docs/finetune.md, "A step's marker and a number's figures").
DIGIT_ADVANCE = 0.5
# what `erase_rules` erases, in the cache's key (dociq.data.ruling_lines)
ERASED = "rules and box sides"
# `sharpen`: an unsharp mask (PIL's: radius px, percent, threshold) applied to the page before it is
# enlarged and thresholded, so that a blurred scan's letters keep their strokes apart where Sauvola's
# local threshold merges them into blots. Applied to every scan it raises every prompt kind on the own
# split's scans but costs the scanned forms' field questions (docs/finetune.md, "Blocks along a scan's
# skew, and a sharpened page for tesseract"); so by default (`sharpen="surer"`) a page is read both
# ways and the reading with more sure words is kept: on the own split's 164 scans it reads 0.855 of
# the text layer's words (plain 0.829, sharpened 0.840), on 100 scanned forms 0.964 (0.959, 0.956),
# where a gate on the page's blur loses on forms (docs/finetune.md, "The surer of two readings").
UNSHARP = {"radius": 2, "percent": 150, "threshold": 2}
SHARPEN_CHOICES = (False, True, "surer")


def sure_words(read: "OcrWords") -> int:
    """How many of a reading's words tesseract is sure of (confidence over SURE_CONFIDENCE)."""
    return int((np.asarray(read.confidences) > SURE_CONFIDENCE).sum())


# how `read_unread_ink` reads a piece of ink no word covers (`dociq.data.unread_ink`): as one text
# line, thresholded with Otsu's global threshold — on a crop that is local already, and Sauvola's
# window, larger than the crop, read a lone "7" as "-"
UNREAD_INK_PSM, UNREAD_INK_BINARIZE = 7, "otsu"
UNREAD_INK_READING = f"psm {UNREAD_INK_PSM}, {UNREAD_INK_BINARIZE}"     # how it is named in cache keys
# A word this short alone on its line piece (a page number, an item's number) is read again alone, the
# same way: in the page's reading tesseract's language model turns a lone figure into letters ("2"
# read as "wo", "10" as "w"; 15 % of the own split's scanned page numbers, docs/finetune.md, "A lone
# number read alone").
LONE_WORD_CHARS = 4
_NUMBER = re.compile(r"^[0-9]+$")


def lone_short_words(read: "OcrWords") -> list[int]:
    """The indices of the words of at most LONE_WORD_CHARS characters, not already a number, that are
    alone on their line piece (`text_blocks.group_lines`)."""
    return [piece[0] for piece in group_lines(read.boxes) if len(piece) == 1
            and len(read.words[piece[0]]) <= LONE_WORD_CHARS and not _NUMBER.match(read.words[piece[0]])]


class TesseractOCR:
    """Tesseract via pytesseract; words with confidence > `min_conf` (0..100), those holding a digit
    > `min_conf_digits` (default: every word, each with its confidence; see EVERY_WORD); a cache
    keeps every word read, whatever the thresholds. Pages whose longest side is under
    `min_long_side` px are enlarged to it first (None: read as given). `binarize`: one of
    BINARIZATIONS, how tesseract thresholds the page (needs tesseract >= 5). `erase_rules`: paint the
    page's ruling lines and the sides of its boxes white first (`dociq.data.ruling_lines`), so that a
    ruled table reads as text and a boxed value without a "|" beside it. `read_unread_ink`: read
    again, each as one text line, the text-sized pieces of ink no word covers
    (`dociq.data.unread_ink`): tesseract drops a lone page number at the margin with the specks; and
    a short word alone on its line piece, which the page's reading may have turned from a figure into
    letters, is read alone too and becomes the number it reads as, if tesseract is surer of that
    (`lone_short_words`).
    `sharpen`: whether tesseract reads the page after an UNSHARP mask: "surer" (default) reads it
    both ways and keeps the reading with more sure words (`sure_words`; the plain one on a tie),
    True sharpened, False as given.

    word_boxes: how tall a word's box is. "font" (default): the font's height on the word's text
    line, from its baseline down to the line's descenders and up by its row height (tesseract's hOCR
    `baseline`, `x_size`, `x_descenders`), as a PDF text layer's boxes span the font's ascent and
    descent whatever the letters, and as wide as its letters with their side bearings
    (`side_bearing` of its height on either side, SIDE_BEARING) and a number as wide as its digits'
    advances (`digit_advance` of its height per digit, DIGIT_ADVANCE); "ink": tesseract's glyph-tight
    box; "line": the top of the line's tallest glyph to the bottom of its lowest. Against the text
    layer's boxes of the same words on scanned pages (mean IoU; 6 corpus pages, 1,859 words / 6
    browser-printed forms, 441 words) ink boxes score 0.67 / 0.72, line boxes 0.82 / 0.79, font
    boxes 0.83 / 0.85 before the side bearings (docs/finetune.md, "Word boxes as tall as the font")."""

    name = "tesseract"

    def __init__(self, lang: str = "eng", psm: int = 3, min_conf: float = EVERY_WORD,
                 min_conf_digits: float = EVERY_WORD,
                 cache: OcrCache | str | Path | None = None, tesseract_cmd: str | None = None,
                 min_long_side: int | None = OCR_MIN_LONG_SIDE, word_boxes: str = "font",
                 binarize: str = "sauvola", erase_rules: bool = True, side_bearing: float = SIDE_BEARING,
                 digit_advance: float = DIGIT_ADVANCE, read_unread_ink: bool = True, sharpen: bool | str = "surer"):
        import pytesseract

        if binarize not in BINARIZATIONS:
            raise ValueError(f"binarize={binarize!r} is not one of {sorted(BINARIZATIONS)}. Fix: pass one of those "
                             "('sauvola' reads blurred scans best; 'otsu' is tesseract's own default)")
        if sharpen not in SHARPEN_CHOICES:
            raise ValueError(f"sharpen={sharpen!r} is not one of {SHARPEN_CHOICES}. Fix: pass 'surer' (read "
                             "both ways, keep the surer reading), True (sharpened) or False (as given)")
        if word_boxes not in WORD_BOXES:
            raise ValueError(f"word_boxes={word_boxes!r} is not one of {WORD_BOXES}. Fix: pass one of those "
                             "('font' spans the font's height, as a PDF text layer's boxes do)")
        self.lang, self.psm, self.binarize = lang, int(psm), binarize
        self.min_conf, self.min_conf_digits = float(min_conf), float(min_conf_digits)
        self.word_boxes, self.erase_rules, self.side_bearing = word_boxes, bool(erase_rules), float(side_bearing)
        self.digit_advance = float(digit_advance)
        self.read_unread_ink, self.sharpen = bool(read_unread_ink), sharpen
        self.min_long_side = None if min_long_side is None else int(min_long_side)
        self.cache = _as_cache(cache)
        cmd = tesseract_cmd or pytesseract.pytesseract.tesseract_cmd
        if shutil.which(cmd) is None:
            raise RuntimeError(
                f"the tesseract binary ({cmd!r}) is not installed or not on PATH. Fix: install the "
                "Debian package tesseract-ocr (`sudo apt-get install -y tesseract-ocr`), pass "
                "tesseract_cmd=<path>, or use ocr='groundtruth' / ocr='pdf'"
            )
        self.tesseract_cmd = cmd

    def settings(self, sharpened: bool | str | None = None) -> dict:
        """What tesseract's reading depends on (the cache's key): min_conf is not among them, the
        cache keeps every word read, so another threshold reads the same cache. `erase_rules` names
        what is erased, so that a page read before box sides were erased is read again. `sharpened`:
        the key of one reading, sharpened or not (default: as constructed, where "surer" names its
        rule; its two readings are cached under the keys of True and False); a page read without
        sharpening keeps the key it had before sharpening existed."""
        sharpened = self.sharpen if sharpened is None else sharpened
        sharpening = ({"sharpen": {**UNSHARP, "keep": "the reading with more sure words"}} if sharpened == "surer"
                      else {"sharpen": UNSHARP} if sharpened else {})
        return {"lang": self.lang, "psm": self.psm, "min_long_side": self.min_long_side,
                "word_boxes": self.word_boxes, "binarize": self.binarize,
                "erase_rules": ERASED if self.erase_rules else False,
                "unread_ink": UNREAD_INK_READING if self.read_unread_ink else False,
                **sharpening}

    def recognise(self, image: np.ndarray) -> OcrWords:
        ways = (False, True) if self.sharpen == "surer" else (self.sharpen,)
        read = max((self._reading(image, sharpened) for sharpened in ways), key=sure_words)   # first on a tie
        if self.read_unread_ink:
            read = self._numbers_read_alone(image, read)
        read = read.confident(self.min_conf, self.min_conf_digits)
        return read.widened(self.side_bearing, self.digit_advance) if self.word_boxes == "font" else read

    def _reading(self, image: np.ndarray, sharpened: bool) -> OcrWords:
        """Every word tesseract reads on the page, sharpened first or not, from the cache if it holds them."""
        if self.cache is None:
            return self._run(image, sharpened)
        key = OcrCache.key(image_hash(image), self.name, self.settings(sharpened))
        return self.cache.get_or_compute(key, lambda: self._run(image, sharpened))

    def _run(self, image: np.ndarray, sharpened: bool) -> OcrWords:
        import pytesseract as pt
        from PIL import Image, ImageFilter

        pt.pytesseract.tesseract_cmd = self.tesseract_cmd
        page = Image.fromarray(image)
        if sharpened:
            page = page.filter(ImageFilter.UnsharpMask(**UNSHARP))
        scale = 1.0
        if self.min_long_side is not None and max(page.size) < self.min_long_side:
            scale = self.min_long_side / max(page.size)
            page = page.resize((round(page.width * scale), round(page.height * scale)), Image.LANCZOS)
        if self.erase_rules:
            page = Image.fromarray(erase_ruling_lines(np.asarray(page.convert("L"))))
        read = [w for w in self._read(page, self.psm, self.binarize) if w.text]
        if self.read_unread_ink:
            read = self._with_unread_ink(np.asarray(page.convert("L")), read)
        boxes = np.array([getattr(w, self.word_boxes) for w in read], np.float32).reshape(-1, 4)
        return OcrWords([w.text for w in read], boxes / scale, image.shape[:2],
                        np.array([w.confidence for w in read], np.float32))

    def _numbers_read_alone(self, image: np.ndarray, read: OcrWords) -> OcrWords:
        """`read` with each short word alone on its line piece (`lone_short_words`) that tesseract,
        reading it alone as `read_unread_ink` reads a piece of ink, reads as a number it is surer of
        than the page's reading was of the word: that number, with its confidence, in the same box."""
        lone = lone_short_words(read)
        if not lone:
            return read
        from PIL import Image

        grey = np.asarray(Image.fromarray(np.asarray(image)).convert("L"))
        words, confidences = list(read.words), read.confidences.copy()
        for k in lone:
            x0, y0, x1, y1 = read.boxes[k]
            pad = y1 - y0                                   # a line's height of paper round the word
            crop = grey[max(0, int(y0 - pad)):int(np.ceil(y1 + pad)), max(0, int(x0 - pad)):int(np.ceil(x1 + pad))]
            again = self._alone(crop)
            if len(again) == 1 and _NUMBER.match(again.words[0]) and again.confidences[0] > confidences[k]:
                words[k], confidences[k] = again.words[0], again.confidences[0]
        return OcrWords(words, read.boxes.copy(), read.size, confidences)

    def _alone(self, crop: np.ndarray) -> OcrWords:
        """The words tesseract reads in a crop of a page as one text line (UNREAD_INK_PSM,
        UNREAD_INK_BINARIZE), from the cache if it holds them."""
        from PIL import Image

        def run() -> OcrWords:
            found = [w for w in self._read(Image.fromarray(crop), UNREAD_INK_PSM, UNREAD_INK_BINARIZE) if w.text]
            return OcrWords([w.text for w in found], np.array([w.ink for w in found], np.float32).reshape(-1, 4),
                            crop.shape[:2], np.array([w.confidence for w in found], np.float32))
        if not crop.size:
            return OcrWords([], np.zeros((0, 4)), crop.shape[:2])
        if self.cache is None:
            return run()
        settings = {"lang": self.lang, "alone": UNREAD_INK_READING}
        return self.cache.get_or_compute(OcrCache.key(image_hash(crop), self.name, settings), run)

    def _read(self, page, psm: int, binarize: str) -> list[HocrWord]:
        import pytesseract as pt

        return hocr_words(pt.image_to_pdf_or_hocr(
            page, lang=self.lang, extension="hocr",
            config=f"--psm {psm} -c thresholding_method={BINARIZATIONS[binarize]}"))

    def _with_unread_ink(self, grey: np.ndarray, read: list[HocrWord]) -> list[HocrWord]:
        """`read` with the words of each piece of ink none of them covers, read alone as a line and
        put in reading order after the words above it."""
        from PIL import Image

        pieces = unread_pieces(grey, np.array([w.ink for w in read], np.float64).reshape(-1, 4))
        for x0, y0, x1, y1 in pieces.round().astype(int):
            pad = y1 - y0                                   # a line's height of paper round the piece
            left, top = max(0, x0 - pad), max(0, y0 - pad)
            crop = Image.fromarray(grey[top:y1 + pad, left:x1 + pad])
            found = [_shifted(w, left, top) for w in self._read(crop, UNREAD_INK_PSM, UNREAD_INK_BINARIZE) if w.text]
            at = next((k for k, w in enumerate(read) if w.ink[1] >= y1), len(read))
            read[at:at] = found
        return read


@dataclass
class HocrWord:
    """One word of tesseract's hOCR: its text, confidence and three boxes (x0, y0, x1, y1), see
    `TesseractOCR`'s word_boxes."""

    text: str
    confidence: float
    ink: list[float]
    line: list[float]
    font: list[float]


def _shifted(word: HocrWord, dx: float, dy: float) -> HocrWord:
    """The word read from a crop, its boxes moved to the page's pixels (the crop's origin dx, dy)."""
    def move(box: list[float]) -> list[float]:
        return [box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy]
    return HocrWord(word.text, word.confidence, move(word.ink), move(word.line), move(word.font))


def _title(element) -> dict[str, list[float]]:
    """hOCR's title properties: "bbox 1 2 3 4; x_wconf 96" -> {"bbox": [1, 2, 3, 4], "x_wconf": [96]}."""
    props = {}
    for part in element.get("title", "").split(";"):
        if not part.strip():
            continue
        name, *values = part.split()
        try:
            props[name] = [float(v) for v in values]
        except ValueError:                               # "image" and other non-numeric properties
            continue
    return props


def hocr_words(hocr: bytes | str) -> list[HocrWord]:
    """The words of a tesseract hOCR page in reading order, each with its ink, line and font boxes."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(hocr)
    out = []
    for line in root.iter():
        props = _title(line)
        words = [w for w in line if w.get("class") == "ocrx_word"]
        if not words or "bbox" not in props:
            continue
        lx0, ly0, lx1, ly1 = props["bbox"]
        slope, offset = (props.get("baseline") or [0.0, 0.0])[:2]
        size = (props.get("x_size") or [0.0])[0]
        descent = (props.get("x_descenders") or [0.0])[0]
        for word in words:
            wprops = _title(word)
            x0, y0, x1, y1 = wprops["bbox"]
            bottom = ly1 + offset + slope * ((x0 + x1) / 2 - lx0) + descent
            # a line without its metrics, or whose font box misses the word's ink, keeps the ink box
            font = [x0, bottom - size, x1, bottom] if size > 0 and bottom - size < y1 and bottom > y0 else [x0, y0, x1, y1]
            out.append(HocrWord("".join(word.itertext()).strip(), (wprops.get("x_wconf") or [0.0])[0],
                                [x0, y0, x1, y1], [x0, ly0, x1, ly1], font))
    return out


class PdfTextLayer:
    """Words and page image from a born-digital PDF page (pypdfium2), both in pixels at `dpi`.

    `read(pdf, page_index, size=None)` renders the page at `dpi` (or scaled to exactly `size`
    (H, W)) and returns (image, words). Words are split at whitespace and at jumps between lines.
    A render larger than `max_page_pixels` (None: no cap) - the requested `size` or pdfium's
    bitmap before resizing to it - is a `BadSampleError`, raised before any pixels are allocated.
    Opening, rendering and reading the words are `dociq.data.pdf`'s; this adds the cache.
    """

    name = "pdf"

    def __init__(self, dpi: float = 144.0, cache: OcrCache | str | Path | None = None,
                 max_page_pixels: int | None = DEFAULT_MAX_PAGE_PIXELS):
        self.dpi = float(dpi)
        self.cache = _as_cache(cache)
        self.max_page_pixels = max_page_pixels

    def settings(self) -> dict:
        return {"dpi": self.dpi}

    def recognise(self, image: np.ndarray) -> OcrWords:
        raise TypeError("PdfTextLayer reads PDFs, not images: call read(pdf_path, page_index) or "
                        "words(pdf_path, page_index, size)")

    def read(self, pdf_path: str | Path, page_index: int = 0,
             size: tuple[int, int] | None = None) -> tuple[np.ndarray, OcrWords]:
        image = self.render(pdf_path, page_index, size)
        return image, self.words(pdf_path, page_index, image.shape[:2])

    def render(self, pdf_path: str | Path, page_index: int = 0,
               size: tuple[int, int] | None = None) -> np.ndarray:
        with open_page(pdf_path, page_index) as page:
            # a requested size keeps the page's width; its aspect is reached by resizing
            scale = self.dpi / POINTS_PER_INCH if size is None else size[1] / page.get_size()[0]
            return render_page(page, scale, size, max_page_pixels=self.max_page_pixels, name=pdf_path,
                               what=f"PDF page {page_index}")

    def words(self, pdf_path: str | Path, page_index: int = 0,
              size: tuple[int, int] | None = None) -> OcrWords:
        """Text-layer words in pixels of the page rendered at `dpi`, or mapped to `size` (H, W)."""
        pdf_path = Path(pdf_path)
        if self.cache is None:
            result = self._extract(pdf_path, page_index)
        else:
            content = hashlib.sha256(pdf_path.read_bytes() if pdf_path.is_file() else b"").hexdigest()
            key = OcrCache.key(f"{content}:page{page_index}", self.name, self.settings())
            result = self.cache.get_or_compute(key, lambda: self._extract(pdf_path, page_index))
        return result if size is None or tuple(size) == result.size else result.scaled_to(size)

    def _extract(self, pdf_path: Path, page_index: int) -> OcrWords:
        with open_page(pdf_path, page_index) as page:
            w_pt, h_pt = page.get_size()
            scale = self.dpi / POINTS_PER_INCH
            # a rounded canvas, not the render's ceil: cached entries keep the size they were made with
            size = (int(round(h_pt * scale)), int(round(w_pt * scale)))
            words, boxes = text_layer_words(page, size, name=pdf_path, what=f"PDF page {page_index}")
        return OcrWords(words, boxes, size)


def make_ocr(ocr: str | Any = "groundtruth", cache_dir: str | Path | None = None, **kwargs) -> Any:
    """'groundtruth' -> None (words come from the annotation); 'tesseract' / 'pdf' -> a backend;
    an object with `recognise` (or a PdfTextLayer) is returned as is."""
    if ocr is None or ocr == "groundtruth":
        return None
    if ocr == "tesseract":
        return TesseractOCR(cache=cache_dir, **kwargs)
    if ocr == "pdf":
        return PdfTextLayer(cache=cache_dir, **kwargs)
    if isinstance(ocr, (PdfTextLayer, OcrBackend)):
        return ocr
    raise ValueError(
        f"ocr={ocr!r} is not one of {OCR_CHOICES} or an OCR backend object. Fix: pass one of those "
        "names, or an object with name, settings() and recognise(image) -> OcrWords"
    )
