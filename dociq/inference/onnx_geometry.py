"""The word geometry of prompts in numpy: what `dociq.models.grounding.prompt_geometry`,
`clicked_words` and `boxed_words` compute in torch, for the exported prompt graph, which takes it
as inputs (nonzero and loops sized by the data do not trace). One page; prompts N; tokens T.
float32 throughout, as in torch, so thresholds fall the same way."""
from __future__ import annotations

import numpy as np

LAYOUT_SCALE = 1000          # dociq.data.schema.LAYOUT_SCALE
POSITIVE, NEGATIVE, TOP_LEFT, BOTTOM_RIGHT = 1, 0, 2, 3   # dociq.models.prompt_encoder point labels


def _overlap(lo, hi, lo2, hi2) -> np.ndarray:
    inter = np.minimum(hi[:, None], hi2[None, :]) - np.maximum(lo[:, None], lo2[None, :])
    size, size2 = np.maximum(hi - lo, 1.0), np.maximum(hi2 - lo2, 1.0)
    return np.maximum(inter, 0) / np.minimum(size[:, None], size2[None, :])


def line_and_column(tagged: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`matched_on_line_and_column`: tagged [N, K, T] (0/1), boxes [T, 4] -> two float32 [N, K, T],
    the largest line (column) overlap of each token with a tagged token other than itself."""
    n, k, t = tagged.shape
    b = boxes.astype(np.float32)
    row, col = np.zeros((n * k, t), np.float32), np.zeros((n * k, t), np.float32)
    rows, tokens = np.nonzero(tagged.reshape(n * k, t))
    if len(tokens):
        r = _overlap(b[tokens, 1], b[tokens, 3], b[:, 1], b[:, 3]).astype(np.float32)    # [K', T]
        c = _overlap(b[tokens, 0], b[tokens, 2], b[:, 0], b[:, 2]).astype(np.float32)
        own = np.arange(len(tokens))
        r[own, tokens] = 0
        c[own, tokens] = 0
        np.maximum.at(row, rows, r)
        np.maximum.at(col, rows, c)
    return row.reshape(n, k, t), col.reshape(n, k, t)


def in_tagged_block(tagged: np.ndarray, block_index: np.ndarray) -> np.ndarray:
    """`in_tagged_block`: tagged [N, K, T], block_index [T] (-1 none) -> float32 [N, K, T]."""
    slots = np.maximum(block_index.astype(np.int64) + 1, 0)
    count = int(slots.max()) + 1 if slots.size else 1
    n, k, _ = tagged.shape
    hit = np.zeros((n, k, count), np.float32)
    on = (tagged > 0)
    for s in np.unique(slots[slots > 0]):
        hit[..., s] = on[..., slots == s].any(-1)
    return hit[..., slots]


def block_extents(boxes: np.ndarray, block_index: np.ndarray) -> np.ndarray:
    """`block_extents` of one page: float32 [1, S, 4], S = blocks + 1 (slot 0 and absent blocks empty)."""
    slots = np.maximum(block_index.astype(np.int64) + 1, 0)
    count = int(slots.max()) + 1 if slots.size else 1
    out = np.zeros((count, 4), np.float32)
    for s in np.unique(slots[slots > 0]):
        b = boxes[slots == s].astype(np.float32)
        out[s] = [b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max()]
    return out[None]


def clicked_words(coords: np.ndarray, labels: np.ndarray, boxes: np.ndarray, word_index: np.ndarray,
                  input_size: int, margin: float) -> np.ndarray:
    """`clicked_words`: coords [N, P, 2] pixels of the input frame, labels [N, P] -> float32 [N, 2, T]."""
    xy = (coords.astype(np.float32) + np.float32(0.5)) / np.float32(input_size) * np.float32(LAYOUT_SCALE)
    bx = boxes.astype(np.float32)[None, None]                                       # [1, 1, T, 4]
    x, y = xy[..., 0:1], xy[..., 1:2]
    dx = np.maximum(bx[..., 0] - x, 0) + np.maximum(x - bx[..., 2], 0)
    dy = np.maximum(bx[..., 1] - y, 0) + np.maximum(y - bx[..., 3], 0)
    dist = np.hypot(dx, dy).astype(np.float32)
    dist = np.where((word_index >= 0)[None, None], dist, np.float32(np.inf))
    nearest = dist.min(-1, keepdims=True) if dist.shape[-1] else np.full(dist.shape[:-1] + (1,), np.inf, np.float32)
    hit = (dist <= nearest + np.float32(1e-3)) & (nearest <= margin)
    rows = [(hit & (labels == label)[..., None]).any(1) for label in (POSITIVE, NEGATIVE)]
    return np.stack(rows, 1).astype(np.float32)


def box_of_prompts(coords: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`box_prompts`: float32 [N, 4] from the corner points and has_box bool [N]."""
    corners = []
    for label in (TOP_LEFT, BOTTOM_RIGHT):
        pick = (labels == label).astype(np.float32)[..., None]
        corners.append((coords.astype(np.float32) * pick).sum(1) / np.maximum(pick.sum(1), 1))
    has_box = (labels == TOP_LEFT).any(1) & (labels == BOTTOM_RIGHT).any(1)
    return np.concatenate(corners, 1).astype(np.float32), has_box


def boxed_words(coords: np.ndarray, labels: np.ndarray, boxes: np.ndarray, word_index: np.ndarray,
                input_size: int, min_inside: float = 0.5) -> np.ndarray:
    """`boxed_words`: float32 [N, 1, T], the tokens of words at least half inside the prompt's box."""
    prompt, has_box = box_of_prompts(coords, labels)
    p = (prompt / np.float32(input_size) * np.float32(LAYOUT_SCALE))[:, None]        # [N, 1, 4]
    bx = boxes.astype(np.float32)[None]
    iw = np.maximum(np.minimum(bx[..., 2], p[..., 2]) - np.maximum(bx[..., 0], p[..., 0]), 0)
    ih = np.maximum(np.minimum(bx[..., 3], p[..., 3]) - np.maximum(bx[..., 1], p[..., 1]), 0)
    area = np.maximum((bx[..., 2] - bx[..., 0]) * (bx[..., 3] - bx[..., 1]), np.float32(1e-6))
    inside = (iw * ih / area >= min_inside) & (word_index >= 0)[None]
    return (inside & has_box[:, None]).astype(np.float32)[:, None]
