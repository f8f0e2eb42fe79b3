"""Load any page image file as uint8 [H, W, 3] RGB, or fail with a message naming the file;
save page images atomically (dociq.io.atomic).

Scans and exports come in every Pillow mode. The rules, chosen for documents:
- transparency (RGBA, LA, PA, palette with a transparent index) is composited on white paper;
- 16-bit grey (I;16*) is rescaled by its full range (65535 -> 255), never clipped; 32-bit
  integer pages whose values fit 0..65535 likewise (0..255 if they fit that), float pages in
  0..1 by 255, anything else by the min..max range its values use;
- CMYK goes through its embedded ICC profile when there is one, else Pillow's conversion;
- EXIF orientation is applied, so the pixels are upright as a viewer shows them.

Size: `max_page_pixels` (the data sets pass theirs, default `DEFAULT_MAX_PAGE_PIXELS`) is checked
from the file header, before decoding. Without it Pillow's decompression-bomb limit
(`PIL.Image.MAX_IMAGE_PIXELS`) applies; with it Pillow's limit only stops files over twice its
value, so the cap can be raised to ~180 MP without touching PIL's global.
"""
from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from dociq.data.errors import BadSampleError, check_page_pixels
from dociq.io.atomic import atomic_write_bytes

_WHITE = (255, 255, 255, 255)


def load_page_image(path: str | Path, max_page_pixels: int | None = None) -> np.ndarray:
    """Read `path` as uint8 [H, W, 3] RGB. Raises `BadSampleError` naming the file on failure,
    and for an image over `max_page_pixels` before decoding it."""
    path = Path(path)
    if not path.is_file():
        raise BadSampleError(
            path, "image file not found",
            "check the path / image_dir and that the file was copied with the annotations",
        )
    try:
        with warnings.catch_warnings():
            # A decompression-bomb warning is a real problem for a data set: make it an error,
            # unless the caller's own cap (checked below, from the header) takes its place.
            warnings.simplefilter("error" if max_page_pixels is None else "ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                check_page_pixels(path, img.width, img.height, max_page_pixels, "image")
                img.load()  # decode now: truncation is only detected while decoding
                img = ImageOps.exif_transpose(img)
                return to_rgb_array(img, path)
    except BadSampleError:
        raise
    except UnidentifiedImageError as err:
        raise BadSampleError(
            path, f"not an image Pillow can read ({err.__class__.__name__})",
            "replace it with a PNG/JPEG/TIFF page image, or remove it from the annotations",
        ) from err
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise BadSampleError(
            path, f"image is implausibly large ({err})",
            "downscale the page, or raise PIL.Image.MAX_IMAGE_PIXELS (and max_page_pixels) if it is trusted",
        ) from err
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        raise BadSampleError(
            path, f"image file is truncated or corrupt ({err})",
            "re-export or re-download the image",
        ) from err


def load_page_image_bytes(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Like `load_page_image` for an in-memory encoded image (e.g. an upload); `name` labels errors."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return to_rgb_array(ImageOps.exif_transpose(img), name)
    except BadSampleError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as err:
        raise BadSampleError(name, f"not a readable image ({err})", "send a PNG/JPEG/TIFF page image") from err


def to_rgb_array(img: Image.Image, path: str | Path = "<image>") -> np.ndarray:
    """Convert an opened Pillow image of any mode to uint8 [H, W, 3] RGB (rules in the module doc)."""
    mode = img.mode
    if img.width == 0 or img.height == 0:
        raise BadSampleError(path, f"image has zero size {img.width}x{img.height}", "re-export the page")
    if mode.startswith("I;16") or mode in ("I", "F"):
        return _high_depth_to_rgb(img)
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    elif mode == "PA":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        paper = Image.new("RGBA", rgba.size, _WHITE)
        img = Image.alpha_composite(paper, rgba)
    elif img.mode == "CMYK":
        img = _cmyk_to_rgb(img)
    return np.array(img.convert("RGB"), dtype=np.uint8)  # a writable copy (torch.from_numpy wants one)


def _high_depth_to_rgb(img: Image.Image) -> np.ndarray:
    """Rescale 16/32-bit and float grey pages to 8 bit by range (clipping would blow out the paper)."""
    arr = np.asarray(img)
    if arr.ndim == 3:  # multi-channel high-depth images are not a Pillow mode we expect; use grey
        arr = arr[..., 0]
    arr = arr.astype(np.float64)
    if img.mode.startswith("I;16"):
        lo, hi = 0.0, 65535.0
    elif img.mode == "I" and arr.min() >= 0 and arr.max() <= 65535:
        lo, hi = 0.0, 65535.0 if arr.max() > 255 else 255.0  # Pillow opens 16-bit PNG/TIFF as I too
    elif img.mode == "F" and arr.min() >= 0 and arr.max() <= 1:
        lo, hi = 0.0, 1.0
    else:
        lo, hi = float(arr.min()), float(arr.max())
        if hi <= lo:
            hi = lo + 1.0
    grey = np.rint((arr - lo) * (255.0 / (hi - lo))).clip(0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=2))


def _cmyk_to_rgb(img: Image.Image) -> Image.Image:
    profile = img.info.get("icc_profile")
    if profile:
        try:
            from PIL import ImageCms

            src = ImageCms.ImageCmsProfile(io.BytesIO(profile))
            dst = ImageCms.createProfile("sRGB")
            return ImageCms.profileToProfile(img, src, dst, outputMode="RGB")
        except Exception:  # a broken embedded profile: fall back to the plain conversion below
            pass
    return img.convert("RGB")


def save_page_image(image: np.ndarray, path: str | Path) -> Path:
    """Write uint8 [H, W, 3] RGB losslessly (format from the suffix, PNG advised), atomically."""
    path = Path(path)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB").save(
        buf, format=Image.registered_extensions().get(path.suffix.lower(), "PNG"))
    atomic_write_bytes(path, buf.getvalue())
    return path
