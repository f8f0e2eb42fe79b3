"""Scan degradations for `Page`s: small rotation, blur, sensor noise, JPEG.

Photometric steps change pixels only. Rotation moves the ground truth with the image: every mask is
warped by the same affine map as the image (nearest neighbour), word and region boxes become the
bounds of their rotated corners, and question masks are rebuilt as the union of their regions.
"""
from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
from PIL import Image, ImageFilter

from dociq.data.schema import Page

MAX_ROTATION_DEG = 2.0


def rotation_matrices(angle_deg: float, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, inverse) 2x3 affine maps rotating by `angle_deg` (counter-clockwise on screen)
    about the page centre, in continuous pixel coordinates (pixel i spans [i, i+1))."""
    t = math.radians(angle_deg)
    c, s = math.cos(t), math.sin(t)
    cx, cy = width / 2, height / 2
    # y points down, so a counter-clockwise turn on screen is [[c, s], [-s, c]].
    rot = np.array([[c, s], [-s, c]])
    centre = np.array([cx, cy])
    forward = np.hstack([rot, (centre - rot @ centre)[:, None]])
    inv_rot = rot.T
    inverse = np.hstack([inv_rot, (centre - inv_rot @ centre)[:, None]])
    return forward, inverse


def transform_boxes(boxes: np.ndarray, forward: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 [N, 4]: axis-aligned bounds of each box's four rotated corners, clipped to the page."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    xs = boxes[:, [0, 2, 2, 0]]
    ys = boxes[:, [1, 1, 3, 3]]
    tx = forward[0, 0] * xs + forward[0, 1] * ys + forward[0, 2]
    ty = forward[1, 0] * xs + forward[1, 1] * ys + forward[1, 2]
    out = np.stack([np.floor(tx.min(1)), np.floor(ty.min(1)), np.ceil(tx.max(1)), np.ceil(ty.max(1))], axis=1)
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, width)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, height)
    return out.astype(np.float32)


def _affine_coeffs(inverse: np.ndarray, src_origin: tuple[int, int], dst_origin: tuple[int, int]) -> tuple:
    """PIL AFFINE data for warping a crop at `src_origin` into a window at `dst_origin`."""
    (a, b, c), (d, e, f) = inverse
    dx, dy = dst_origin
    sx, sy = src_origin
    return (a, b, a * dx + b * dy + c - sx, d, e, d * dx + e * dy + f - sy)


def warp_mask(mask: np.ndarray, box: np.ndarray, forward: np.ndarray, inverse: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
    """Warp a bool mask whose pixels lie inside `box`; only the box's window is resampled.
    `out`, if given, is a zeroed bool [H, W] array to write into."""
    height, width = mask.shape
    out = np.zeros_like(mask) if out is None else out
    sx0, sy0 = int(max(0, math.floor(box[0]))), int(max(0, math.floor(box[1])))
    sx1, sy1 = int(min(width, math.ceil(box[2]))), int(min(height, math.ceil(box[3])))
    if sx1 <= sx0 or sy1 <= sy0:
        return out
    dst = transform_boxes(np.array([[sx0, sy0, sx1, sy1]]), forward, height, width)[0]
    dx0, dy0, dx1, dy1 = (int(v) for v in dst)
    dx0, dy0 = max(0, dx0 - 1), max(0, dy0 - 1)
    dx1, dy1 = min(width, dx1 + 1), min(height, dy1 + 1)
    crop = Image.fromarray(mask[sy0:sy1, sx0:sx1].astype(np.uint8) * 255)
    warped = crop.transform((dx1 - dx0, dy1 - dy0), Image.Transform.AFFINE,
                            _affine_coeffs(inverse, (sx0, sy0), (dx0, dy0)), resample=Image.Resampling.NEAREST)
    out[dy0:dy1, dx0:dx1] = np.asarray(warped) > 127
    return out


def rotate_page(page: Page, angle_deg: float) -> Page:
    """The page rotated by `angle_deg` about its centre with all ground truth moved alike."""
    if abs(angle_deg) > MAX_ROTATION_DEG + 1e-9:
        raise ValueError(f"rotation {angle_deg} deg: scan skew is at most {MAX_ROTATION_DEG} deg")
    height, width = page.size
    forward, inverse = rotation_matrices(angle_deg, height, width)
    paper = tuple(int(v) for v in np.median(page.image[[0, -1]].reshape(-1, 3), axis=0))
    image = Image.fromarray(page.image).transform(
        (width, height), Image.Transform.AFFINE, _affine_coeffs(inverse, (0, 0), (0, 0)),
        resample=Image.Resampling.BILINEAR, fillcolor=paper)
    # One allocation for all masks: page-sized np.zeros per mask costs more than the warping.
    region_masks = np.zeros((len(page.regions), height, width), dtype=bool)
    region_boxes = transform_boxes(np.array([r.box for r in page.regions]).reshape(-1, 4), forward, height, width)
    regions = []
    for r, box, mask in zip(page.regions, region_boxes, region_masks):
        warp_mask(r.mask, r.box, forward, inverse, out=mask)
        regions.append(dataclasses.replace(r, box=box, mask=mask))
    question_masks = np.zeros((len(page.questions), height, width), dtype=bool)
    questions = []
    for q, mask in zip(page.questions, question_masks):
        for i in q.region_ids:  # union over each region's box window only
            x0, y0 = int(region_boxes[i][0]), int(region_boxes[i][1])
            x1, y1 = int(math.ceil(region_boxes[i][2])), int(math.ceil(region_boxes[i][3]))
            mask[y0:y1, x0:x1] |= region_masks[i, y0:y1, x0:x1]
        if not q.region_ids:  # a question not tied to regions: warp its own mask
            full = np.array([0, 0, width, height], dtype=np.float32)
            mask = warp_mask(q.mask, full, forward, inverse)
        questions.append(dataclasses.replace(q, mask=mask))
    return dataclasses.replace(
        page, image=np.asarray(image), word_boxes=transform_boxes(page.word_boxes, forward, height, width),
        regions=regions, questions=questions,
        meta={**page.meta, "degradations": [*page.meta.get("degradations", []), f"rotate({angle_deg:.2f})"]})


def _photometric(page: Page, image: np.ndarray, step: str) -> Page:
    return dataclasses.replace(page, image=image,
                               meta={**page.meta, "degradations": [*page.meta.get("degradations", []), step]})


def blur_page(page: Page, radius: float) -> Page:
    image = Image.fromarray(page.image).filter(ImageFilter.GaussianBlur(radius))
    return _photometric(page, np.asarray(image), f"blur({radius:.2f})")


def noise_page(page: Page, sigma: float, rng: np.random.Generator) -> Page:
    noise = (rng.standard_normal(page.image.shape[:2], dtype=np.float32) * sigma).astype(np.int16)  # grey
    image = np.clip(page.image.astype(np.int16) + noise[..., None], 0, 255).astype(np.uint8)
    return _photometric(page, image, f"noise({sigma:.1f})")


def jpeg_page(page: Page, quality: int) -> Page:
    buffer = io.BytesIO()
    Image.fromarray(page.image).save(buffer, format="JPEG", quality=int(quality))
    buffer.seek(0)
    image = np.asarray(Image.open(buffer).convert("RGB"))
    return _photometric(page, image, f"jpeg({int(quality)})")


def degrade_page(page: Page, rng: np.random.Generator, max_rotation_deg: float = MAX_ROTATION_DEG) -> Page:
    """A random scan: each step with its own probability, at least one step. Geometry first (as the
    paper is skewed on the glass), then optics (blur), sensor (noise) and compression (JPEG)."""
    steps = rng.random(4) < np.array([0.5, 0.4, 0.6, 0.5])
    if not steps.any():
        steps[rng.integers(4)] = True
    if steps[0]:
        page = rotate_page(page, float(rng.uniform(-max_rotation_deg, max_rotation_deg)))
    if steps[1]:
        page = blur_page(page, float(rng.uniform(0.3, 0.9)))
    if steps[2]:
        page = noise_page(page, float(rng.uniform(2.0, 8.0)), rng)
    if steps[3]:
        page = jpeg_page(page, int(rng.integers(35, 90)))
    return page

