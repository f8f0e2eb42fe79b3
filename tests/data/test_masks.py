"""Mask geometry (dociq.data.masks): tight boxes with exclusive x1, y1, batched boxes, mask IoU one-to-one
and the box-limited many-to-many IoU against a dense computation."""
from __future__ import annotations

import numpy as np
import pytest

from dociq.data.masks import mask_box, mask_boxes, mask_iou, mask_iou_matrix


def _rect(size, x0, y0, x1, y1):
    m = np.zeros(size, bool)
    m[y0:y1, x0:x1] = True
    return m


def _dense_iou(a, b):
    """IoU of every pair from full-page counts (what mask_iou_matrix must equal)."""
    dense = [[(x & y).sum() / max((x | y).sum(), 1) for y in b] for x in a]
    return np.array(dense, dtype=np.float64).reshape(len(a), len(b))


def test_mask_box_is_tight_with_exclusive_far_corner():
    m = np.zeros((20, 30), bool)
    m[5:9, 3:12] = True
    m[14, 20] = True                                    # a lone pixel stretches the box
    box = mask_box(m)
    assert box.dtype == np.float32 and box.tolist() == [3.0, 5.0, 21.0, 15.0]
    x0, y0, x1, y1 = box.astype(int)
    assert m[y0:y1, x0:x1].sum() == m.sum()             # the box slices the whole mask
    one = np.zeros((4, 4), bool)
    one[3, 3] = True                                    # the page's last pixel: x1, y1 = width, height
    assert mask_box(one).tolist() == [3.0, 3.0, 4.0, 4.0]


def test_mask_box_of_an_empty_mask_is_none():
    assert mask_box(np.zeros((6, 7), bool)) is None


def test_mask_boxes_equal_the_boxes_one_mask_at_a_time():
    rng = np.random.default_rng(0)
    masks = rng.random((12, 17, 23)) < rng.uniform(0.001, 0.2, (12, 1, 1))
    masks[0] = False                                    # empty: a row of zeros
    masks[1] = _rect((17, 23), 22, 16, 23, 17)          # the corner pixel
    boxes = mask_boxes(masks)
    assert boxes.dtype == np.float32 and boxes.shape == (12, 4)
    for m, box in zip(masks, boxes):
        single = mask_box(m)
        np.testing.assert_array_equal(box, np.zeros(4, np.float32) if single is None else single)
    assert mask_boxes(np.zeros((0, 5, 5), bool)).shape == (0, 4)


def test_mask_iou_counts_by_hand():
    a = _rect((10, 10), 0, 0, 4, 4)                     # 16 pixels
    b = _rect((10, 10), 2, 2, 6, 6)                     # 16 pixels, 4 shared
    assert mask_iou(a, b) == pytest.approx(4 / 28)
    assert mask_iou(a, a) == 1.0
    assert mask_iou(a, _rect((10, 10), 5, 5, 9, 9)) == 0.0
    empty = np.zeros((10, 10), bool)
    assert mask_iou(empty, empty) == 1.0                # nothing to find, nothing found
    assert mask_iou(a, empty) == 0.0


@pytest.mark.parametrize("size, n, k", [((30, 40), 4, 3), ((1, 1), 2, 2), ((64, 17), 7, 9), ((25, 25), 1, 5)])
def test_mask_iou_matrix_equals_the_dense_computation(size, n, k):
    rng = np.random.default_rng(sum(size) + n + k)
    a = [rng.random(size) < p for p in rng.uniform(0, 0.4, n)]
    b = [rng.random(size) < p for p in rng.uniform(0, 0.4, k)]
    a[0] = np.zeros(size, bool)                         # an empty mask matches nothing, not even another empty one
    b[-1] = np.zeros(size, bool)
    iou = mask_iou_matrix(a, b)
    assert iou.dtype == np.float32 and iou.shape == (n, k)
    np.testing.assert_allclose(iou, _dense_iou(a, b), rtol=1e-6)


def test_mask_iou_matrix_of_disjoint_and_nested_masks():
    size = (30, 40)
    a = [_rect(size, 0, 0, 10, 10), _rect(size, 20, 15, 40, 30), _rect(size, 0, 0, 40, 30)]
    b = [_rect(size, 12, 0, 18, 30), _rect(size, 25, 20, 30, 25)]
    # boxes that touch but do not overlap: a[0] ends at x 10, this starts at x 10
    b.append(_rect(size, 10, 0, 20, 10))
    iou = mask_iou_matrix(a, b)
    np.testing.assert_allclose(iou, _dense_iou(a, b), rtol=1e-6)
    assert iou[0, 0] == iou[0, 1] == iou[0, 2] == 0.0
    assert iou[1, 1] == pytest.approx(25 / 300)         # nested: the small mask over the large one


def test_mask_iou_matrix_of_empty_lists():
    m = [_rect((5, 5), 0, 0, 2, 2)]
    assert mask_iou_matrix([], m).shape == (0, 1)
    assert mask_iou_matrix(m, []).shape == (1, 0)
    assert mask_iou_matrix([], []).shape == (0, 0)
    assert mask_iou_matrix(m, []).dtype == np.float32
