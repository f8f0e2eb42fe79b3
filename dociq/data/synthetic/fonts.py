"""DejaVu fonts for the synthetic generator: lookup, caching, word measurement and glyph bitmaps.

Fonts and rendered word bitmaps are cached per process: loading a TrueType face costs ~1 ms and
rasterising a word ~50 us, while the lorem vocabulary repeats across pages, so the caches make
page generation several times faster. Everything here is deterministic for a given font file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import ImageFont

SYSTEM_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


def font_dirs() -> list[Path]:
    """Debian's DejaVu folder, then matplotlib's copy of the same faces: the oblique faces are in
    fonts-dejavu-extra, which many machines lack. Called only when a file is not in the first."""
    try:
        import matplotlib
    except ImportError:
        return [SYSTEM_FONT_DIR]
    return [SYSTEM_FONT_DIR, Path(matplotlib.get_data_path()) / "fonts" / "ttf"]


FONT_FILES = {
    ("sans", "regular"): "DejaVuSans.ttf",
    ("sans", "bold"): "DejaVuSans-Bold.ttf",
    ("sans", "oblique"): "DejaVuSans-Oblique.ttf",
    ("serif", "regular"): "DejaVuSerif.ttf",
    ("serif", "bold"): "DejaVuSerif-Bold.ttf",
    ("serif", "oblique"): "DejaVuSerif-Italic.ttf",
    ("mono", "regular"): "DejaVuSansMono.ttf",
    ("mono", "bold"): "DejaVuSansMono-Bold.ttf",
    ("mono", "oblique"): "DejaVuSansMono-Oblique.ttf",
}

FontKey = tuple[str, str, int]  # (family, style, pixel size)

_fonts: dict[FontKey, ImageFont.FreeTypeFont] = {}
_glyphs: dict[tuple[FontKey, str], tuple[np.ndarray, tuple[int, int, int, int]]] = {}
_bboxes: dict[tuple[FontKey, str], tuple[int, int, int, int]] = {}
_GLYPH_CACHE_LIMIT = 200_000


def font_path(family: str, style: str) -> Path:
    """The DejaVu file for (family, style); raises naming the searched folders and the fix."""
    name = FONT_FILES.get((family, style))
    if name is None:
        raise KeyError(f"unknown font ({family!r}, {style!r}); choose from {sorted(FONT_FILES)}")
    if (SYSTEM_FONT_DIR / name).is_file():
        return SYSTEM_FONT_DIR / name
    folders = font_dirs()
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"font {name} not found in {[str(d) for d in folders]}; install it with "
        "`apt-get install fonts-dejavu-core fonts-dejavu-extra` (or `pip install matplotlib`, which ships DejaVu)"
    )


def get_font(key: FontKey) -> ImageFont.FreeTypeFont:
    """A cached FreeType font. BASIC layout: no shaping is needed for Latin text and it is faster."""
    font = _fonts.get(key)
    if font is None:
        family, style, size = key
        font = ImageFont.truetype(str(font_path(family, style)), size, layout_engine=ImageFont.Layout.BASIC)
        _fonts[key] = font
    return font


def word_bbox(key: FontKey, text: str) -> tuple[int, int, int, int]:
    """The font's getbbox(text), cached: measuring is needed for every candidate word, rendering
    only for the words that end up on the page."""
    bbox = _bboxes.get((key, text))
    if bbox is None:
        bbox = tuple(int(v) for v in get_font(key).getbbox(text))
        if len(_bboxes) >= _GLYPH_CACHE_LIMIT:
            _bboxes.clear()
        _bboxes[(key, text)] = bbox
    return bbox


def word_glyph(key: FontKey, text: str) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """(alpha uint8 [h, w], bbox) of `text` drawn at origin (0, 0) with the font's default anchor.

    `bbox` is the font's `getbbox(text)`: the tight box of the word relative to the draw origin;
    `alpha` covers exactly that box.
    """
    cached = _glyphs.get((key, text))
    if cached is None:
        font = get_font(key)
        bbox = word_bbox(key, text)
        mask, _offset = font.getmask2(text, mode="L")
        w, h = mask.size
        alpha = np.asarray(mask, dtype=np.uint8).reshape(h, w) if w and h else np.zeros((0, 0), np.uint8)
        if alpha.shape != (bbox[3] - bbox[1], bbox[2] - bbox[0]):  # keep box and bitmap in step
            fixed = np.zeros((bbox[3] - bbox[1], bbox[2] - bbox[0]), np.uint8)
            hh, ww = min(h, fixed.shape[0]), min(w, fixed.shape[1])
            fixed[:hh, :ww] = alpha[:hh, :ww]
            alpha = fixed
        if len(_glyphs) >= _GLYPH_CACHE_LIMIT:
            _glyphs.clear()
        cached = (alpha, bbox)
        _glyphs[(key, text)] = cached
    return cached


def word_width(key: FontKey, text: str) -> int:
    """Width of a word from the draw origin to its right ink edge (what line breaking needs)."""
    return word_bbox(key, text)[2]


def space_width(key: FontKey) -> int:
    return max(2, int(round(get_font(key).getlength(" "))))


def line_height(key: FontKey) -> int:
    """Baseline-to-baseline distance: 1.25 em, the usual body leading."""
    return int(round(key[2] * 1.25))
