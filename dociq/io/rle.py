"""COCO run-length encoding of masks, the one codec every part of dociq writes and reads.

Masks are stored as compressed COCO RLE with a `str` counts, `{"size": [H, W], "counts": "..."}`,
so they go into JSON as they are. Reading checks the run lengths in Python first: pycocotools
decodes runs that sum to less than H*W without complaint and leaves the rest of the mask as
uninitialised memory, and a malformed string should be a ValueError, never reach its C decoder.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from pycocotools import mask as mask_util


def encode_rle(mask: np.ndarray) -> dict:
    """bool [H, W] -> compressed COCO RLE with a str `counts` (JSON-safe)."""
    rle = mask_util.encode(np.asfortranarray(np.asarray(mask).astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def decode_rle(rle: dict) -> np.ndarray:
    """A compressed COCO RLE this codec wrote -> bool [H, W] (trusted input: no checks)."""
    counts = rle["counts"]
    counts = counts.encode("ascii") if isinstance(counts, str) else counts
    return mask_util.decode({"size": [int(v) for v in rle["size"]], "counts": counts}).astype(bool)


def rle_string_counts(counts: str | bytes, name: str = "rle") -> list[int]:
    """The run lengths of a compressed COCO RLE string (pycocotools' rleFrString, in Python);
    a string that is not one is a ValueError that says why, naming the RLE `name`."""
    data = counts.encode("ascii") if isinstance(counts, str) else counts
    runs: list[int] = []
    p = 0
    while p < len(data):
        x, k, more = 0, 0, True
        while more:
            if p >= len(data):
                raise ValueError(f"{name}.counts ends inside a number")
            c = data[p] - 48
            if not 0 <= c < 64:
                raise ValueError(f"{name}.counts has the character {chr(data[p])!r}, not a COCO RLE string")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def rle_runs(rle: Any, size: tuple[int, int], name: str = "rle") -> list[int]:
    """The run lengths of an untrusted COCO RLE (compressed str or uncompressed list) of a mask of
    `size` (H, W); a wrong size, negative runs or runs that do not cover H*W are a ValueError that
    names the RLE `name` (e.g. the request field it came in)."""
    if not isinstance(rle, dict) or "size" not in rle or "counts" not in rle:
        raise ValueError(f'{name} must be a COCO RLE {{"size": [H, W], "counts": "..."}}')
    h, w = size
    if list(rle["size"]) != [h, w]:
        raise ValueError(f"{name}.size {list(rle['size'])} is not the page's [H, W] = [{h}, {w}]")
    counts = rle["counts"]
    if isinstance(counts, (str, bytes)):
        runs = rle_string_counts(counts, name)
    elif isinstance(counts, list):
        runs = list(counts)
    else:
        raise ValueError(f"{name}.counts is neither a COCO RLE string nor a list of run lengths")
    if any((not isinstance(c, (int, np.integer))) or isinstance(c, bool) or c < 0 for c in runs):
        raise ValueError(f"{name}.counts has a negative or non-integer run length")
    if sum(runs) != h * w:
        raise ValueError(f"{name}.counts covers {sum(runs)} pixels, the page has {h * w} (H x W)")
    return [int(c) for c in runs]


def runs_to_mask(runs: list[int], size: tuple[int, int]) -> np.ndarray:
    """Checked run lengths (`rle_runs`) -> bool [H, W]; COCO RLE runs down the columns."""
    h, w = size
    values = np.arange(len(runs)) % 2 == 1
    return np.repeat(values, runs).reshape(w, h).T.copy()


def rle_to_mask(rle: Any, size: tuple[int, int], name: str = "rle") -> np.ndarray:
    """An untrusted COCO RLE of a page of `size` (H, W) -> bool [H, W] (errors as `rle_runs`)."""
    return runs_to_mask(rle_runs(rle, size, name), size)
