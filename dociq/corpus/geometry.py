"""Boxes (x0, y0, x1, y1 in pixels) as the labellers compare them."""
from __future__ import annotations

Box = tuple[float, float, float, float]


def union(boxes) -> Box | None:
    """The smallest box around `boxes`; None when there are none."""
    boxes = list(boxes)
    if not boxes:
        return None
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes),
            max(b[3] for b in boxes))


def area(b: Box) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def inside(inner: Box, outer: Box) -> float:
    """Fraction of `inner`'s area inside `outer` (a zero-area box counts by its centre)."""
    ix = min(inner[2], outer[2]) - max(inner[0], outer[0])
    iy = min(inner[3], outer[3]) - max(inner[1], outer[1])
    a = area(inner)
    if a <= 0:
        cx, cy = (inner[0] + inner[2]) / 2, (inner[1] + inner[3]) / 2
        return float(outer[0] <= cx <= outer[2] and outer[1] <= cy <= outer[3])
    return max(0.0, ix) * max(0.0, iy) / a
