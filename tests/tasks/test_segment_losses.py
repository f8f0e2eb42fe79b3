"""Segmentation losses, min-over-candidates selection and correction clicks, on hand-built masks."""
import math

import pytest
import torch

from dociq.models.mask_decoder import MaskDecoder
from dociq.models.prompt_encoder import PromptEncoder
from dociq.models.sizes import size_config
from dociq.training.tasks.segment_losses import (
    append_points,
    dice_loss,
    focal_loss,
    loss_grid_targets,
    mask_iou,
    sample_correction_points,
    segmentation_loss,
    select_mask_prompt,
)


def _digit_and_paragraph():
    """Two 64 x 64 targets: a 3 x 5 px digit inside one 8 x 8 cell of the 8 x 8 loss grid, and a
    20 x 40 px block straddling cells."""
    t = torch.zeros(2, 64, 64)
    t[0, 9:14, 17:20] = 1
    t[1, 10:30, 4:44] = 1
    return t


def test_area_targets_are_cell_shares_and_never_reach_half_for_a_target_smaller_than_a_cell():
    t = _digit_and_paragraph()
    soft = loss_grid_targets(t, 8, "area")
    assert soft.shape == (2, 8, 8)
    assert soft[0].max().item() == pytest.approx(15 / 64)            # the digit's cell: 15 of 64 px
    assert soft[0].nonzero().tolist() == [[1, 2]]
    assert soft[1, 2, 1].item() == 1.0 and soft[1, 1, 1].item() == pytest.approx(6 / 8)   # rows 10..15 of 8..15
    assert torch.allclose(soft.sum((-2, -1)) * 64, t.sum((-2, -1)))   # shares add up to the target's area


def test_peaked_targets_keep_a_small_targets_best_cell_at_one_and_leave_others_alone():
    t = _digit_and_paragraph()
    area, peaked = loss_grid_targets(t, 8, "area"), loss_grid_targets(t, 8, "peaked")
    assert peaked[0, 1, 2].item() == pytest.approx(1.0) and (peaked[0] > 0).sum() == 1
    assert torch.equal(peaked[1], area[1])                            # a target reaching 0.5 is unchanged
    # a digit across two cells keeps its proportions, its larger share scaled to 1
    two = torch.zeros(1, 64, 64)
    two[0, 9:13, 14:19] = 1                                           # 2 columns in cell 1, 3 in cell 2
    p = loss_grid_targets(two, 8, "peaked")[0]
    assert p[1, 2].item() == pytest.approx(1.0) and p[1, 1].item() == pytest.approx(2 / 3)
    # an empty target stays empty; the loss of a decoder that paints nothing now sees the digit
    assert loss_grid_targets(torch.zeros(1, 64, 64), 8, "peaked").sum() == 0
    assert mask_iou(torch.full((1, 1, 8, 8), -5.0), area[:1, None]).item() == 1.0       # "empty is right"
    assert mask_iou(torch.full((1, 1, 8, 8), -5.0), peaked[:1, None]).item() == 0.0


def test_loss_grid_targets_name_the_allowed_modes():
    with pytest.raises(ValueError, match=r"task.loss_targets='max'; allowed: area, peaked"):
        loss_grid_targets(torch.zeros(1, 8, 8), 4, "max")


def _left_half(h=8, w=8):
    t = torch.zeros(1, 1, h, w)
    t[..., : w // 2] = 1
    return t


def test_focal_loss_by_hand():
    target = _left_half()
    # p = 0.5 everywhere: CE = ln 2, (1 - p_t)^2 = 1/4, alpha_t = 0.25 (pos) / 0.75 (neg), half each.
    got = focal_loss(torch.zeros(1, 1, 8, 8), target)
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx(math.log(2) * 0.25 * (0.25 + 0.75) / 2, rel=1e-5)
    confident_right = focal_loss(100 * (2 * target - 1), target)
    confident_wrong = focal_loss(-100 * (2 * target - 1), target)
    assert confident_right.item() < 1e-6 and confident_wrong.item() == pytest.approx(100 * (0.25 + 0.75) / 2, rel=1e-4)


def test_dice_loss_by_hand():
    target = _left_half()  # 32 pixels
    assert dice_loss(50 * (2 * target - 1), target).item() == pytest.approx(0.0, abs=1e-6)
    assert dice_loss(-50 * (2 * target - 1), target).item() == pytest.approx(1 - 1 / 65, rel=1e-5)
    assert dice_loss(torch.zeros(1, 1, 8, 8), target).item() == pytest.approx(1 - 33 / 65, rel=1e-5)


def test_mask_iou_by_hand():
    pred = torch.full((1, 2, 8, 8), -1.0)
    pred[0, 0, 0:4, 0:4] = 1  # 16 px
    target = torch.zeros(1, 1, 8, 8)
    target[0, 0, 0:4, 2:6] = 1  # 16 px, overlap 8
    iou = mask_iou(pred, target)
    assert iou[0, 0].item() == pytest.approx(8 / 24)
    assert iou[0, 1].item() == 0.0  # empty prediction vs a non-empty target
    assert mask_iou(torch.full((1, 1, 4, 4), -1.0), torch.zeros(1, 1, 4, 4)).item() == 1.0  # empty vs empty


def test_only_the_lowest_loss_candidate_gets_gradient():
    target = _left_half()
    sign = 2 * target[0, 0] - 1
    logits = torch.stack([torch.zeros(8, 8), -50 * sign, 2 * sign])[None].requires_grad_(True)  # [1, 3, 8, 8]
    iou_pred = torch.tensor([[0.3, 0.2, 0.6]], requires_grad=True)
    out = segmentation_loss(logits, iou_pred, target[:, 0], supervise_all_iou=False)   # SAM 1

    # Candidate 2 (p = sigmoid(2) on the right side of every pixel) has the lowest 20*focal + dice.
    p = 1 / (1 + math.exp(-2))
    focal = -math.log(p) * (1 - p) ** 2 * (0.25 + 0.75) / 2
    dice = 1 - (2 * 32 * p + 1) / (32 + 32 + 1)
    assert out.best_index.tolist() == [2]
    assert out.actual_iou.tolist() == [1.0]
    assert out.focal.item() == pytest.approx(focal, rel=1e-4)
    assert out.dice.item() == pytest.approx(dice, rel=1e-4)
    assert out.iou_mse.item() == pytest.approx((0.6 - 1.0) ** 2, rel=1e-5)
    assert out.loss.item() == pytest.approx(20 * focal + dice + 0.16, rel=1e-4)

    out.loss.backward()
    assert logits.grad[0, :2].abs().max() == 0 and logits.grad[0, 2].abs().max() > 0
    torch.testing.assert_close(iou_pred.grad, torch.tensor([[0.0, 0.0, 2 * (0.6 - 1.0)]]))


def test_the_iou_head_learns_every_candidates_iou_by_default():
    """SAM 2's supervise_all_iou: the masks train on the best candidate, the IoU head on all three
    (actual IoUs here: 0 for the empty and the inverted mask, 1 for the right one)."""
    target = _left_half()
    sign = 2 * target[0, 0] - 1
    logits = torch.stack([torch.zeros(8, 8), -50 * sign, 2 * sign])[None].requires_grad_(True)
    iou_pred = torch.tensor([[0.3, 0.2, 0.6]], requires_grad=True)
    out = segmentation_loss(logits, iou_pred, target[:, 0])
    assert out.best_index.tolist() == [2]
    assert out.iou_mse.item() == pytest.approx((0.3 ** 2 + 0.2 ** 2 + 0.4 ** 2) / 3, rel=1e-5)
    out.loss.backward()
    torch.testing.assert_close(iou_pred.grad, torch.tensor([[0.6, 0.4, -0.8]]) / 3)
    assert logits.grad[0, :2].abs().max() == 0          # the masks still train on the best only


def test_low_resolution_logits_are_upsampled_to_the_target():
    target = _left_half(16, 16)
    low = torch.full((1, 1, 4, 4), -50.0)
    low[..., :2] = 50.0  # left half at stride 4
    out = segmentation_loss(low, torch.tensor([[1.0]]), target)
    assert out.actual_iou.tolist() == [1.0]
    assert out.iou_mse.item() == 0.0


def test_invalid_prompts_do_not_count():
    target = torch.cat([_left_half(), torch.zeros(1, 1, 8, 8)])
    logits = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    iou = torch.tensor([[0.5], [0.1]])
    both = segmentation_loss(logits, iou, target, valid=torch.tensor([True, False]))
    first = segmentation_loss(logits[:1], iou[:1], target[:1])
    torch.testing.assert_close(both.loss, first.loss)
    none = segmentation_loss(logits, iou, target, valid=torch.tensor([False, False]))
    assert none.loss.item() == 0.0


def test_loss_shape_errors():
    with pytest.raises(ValueError, match="iou_pred"):
        segmentation_loss(torch.zeros(2, 3, 8, 8), torch.zeros(2, 1), torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match="one mask per prompt"):
        segmentation_loss(torch.zeros(2, 3, 8, 8), torch.zeros(2, 3), torch.zeros(2, 2, 8, 8))


def _square(h, w, y0, y1, x0, x1):
    m = torch.zeros(h, w)
    m[y0:y1, x0:x1] = 1
    return m


def _logits(mask):
    return 10 * (2 * mask - 1)


def test_correction_click_in_the_false_negatives():
    target = _square(10, 10, 2, 5, 3, 6)  # 9 px, nothing predicted
    pts, labels = sample_correction_points(torch.full((1, 10, 10), -10.0), target[None],
                                           generator=torch.Generator().manual_seed(0))
    assert pts.shape == (1, 1, 2) and labels.tolist() == [[1]]
    x, y = pts[0, 0].long().tolist()
    assert target[y, x] == 1


def test_correction_click_in_the_larger_error_region():
    target = _square(10, 10, 0, 5, 0, 4)  # cols 0..3
    pred = _square(10, 10, 0, 5, 2, 8)  # cols 2..7: FN = cols 0..1 (10 px), FP = cols 4..7 (20 px)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        pts, labels = sample_correction_points(_logits(pred)[None], target[None], generator=g)
        x, y = pts[0, 0].long().tolist()
        assert labels.tolist() == [[0]] and pred[y, x] == 1 and target[y, x] == 0
    # Swap roles: now the false negatives are larger -> positive click in them.
    pts, labels = sample_correction_points(_logits(target)[None], pred[None], generator=g)
    x, y = pts[0, 0].long().tolist()
    assert labels.tolist() == [[1]] and pred[y, x] == 1 and target[y, x] == 0


def test_correction_click_ties_and_perfect_predictions():
    target = _square(6, 6, 0, 2, 0, 2)
    pred = _square(6, 6, 0, 2, 1, 3)  # FN 2 px, FP 2 px -> tie -> positive
    _, labels = sample_correction_points(_logits(pred)[None], target[None])
    assert labels.tolist() == [[1]]
    pts, labels = sample_correction_points(_logits(target)[None], target[None])  # perfect -> background
    x, y = pts[0, 0].long().tolist()
    assert labels.tolist() == [[0]] and target[y, x] == 0
    full = torch.ones(1, 6, 6)
    _, labels = sample_correction_points(_logits(full), full)  # no background -> positive inside
    assert labels.tolist() == [[1]]


def test_correction_clicks_are_deterministic_and_uniform():
    target = _square(10, 10, 0, 10, 0, 10)
    empty = torch.full((1, 10, 10), -10.0)

    def draw(seed):
        return sample_correction_points(empty, target[None], generator=torch.Generator().manual_seed(seed))[0]

    torch.testing.assert_close(draw(3), draw(3))
    assert len({tuple(draw(s)[0, 0].tolist()) for s in range(10)}) > 5
    # 4-pixel error region, 800 prompts: every pixel is drawn about 200 times.
    small = _square(8, 8, 3, 5, 3, 5).expand(800, 8, 8)
    pts, labels = sample_correction_points(torch.full((800, 8, 8), -10.0), small,
                                           generator=torch.Generator().manual_seed(0))
    assert labels.eq(1).all()
    counts = torch.zeros(8, 8)
    for x, y in pts[:, 0].long().tolist():
        counts[y, x] += 1
    assert counts.sum() == 800 and counts[3:5, 3:5].min() > 140 and counts[3:5, 3:5].max() < 260


def test_low_resolution_logits_give_target_grid_clicks():
    target = _square(16, 16, 8, 16, 8, 16)  # bottom-right quadrant, nothing predicted
    pts, labels = sample_correction_points(torch.full((1, 1, 4, 4), -5.0), target[None, None],
                                           generator=torch.Generator().manual_seed(1))
    x, y = pts[0, 0].tolist()
    assert labels.item() == 1 and 8 <= x < 16 and 8 <= y < 16


def test_points_accumulate_over_rounds():
    p1, l1 = torch.tensor([[[1.0, 2.0]]]), torch.tensor([[1]])
    p2, l2 = torch.tensor([[[3.0, 4.0]]]), torch.tensor([[0]])
    coords, labels = append_points(append_points(None, p1, l1), p2, l2)
    assert coords.tolist() == [[[1.0, 2.0], [3.0, 4.0]]] and labels.tolist() == [[1, 0]]


def test_prompt_encoder_and_decoder_learn_box_prompts_with_interactive_rounds():
    """The phase-1 pieces together: box prompt -> masks, SAM loss falls; round 2 feeds back a click
    and the best mask as the mask prompt."""
    torch.manual_seed(0)
    tiny = size_config("tiny")
    enc = PromptEncoder(**{**tiny["prompt_encoder"], "question_model": None}, input_image_size=(64, 64),
                        image_embedding_size=(4, 4))
    dec = MaskDecoder(**tiny["mask_decoder"])
    image = torch.randn(2, 64, 4, 4)  # two "images", two prompts each
    boxes = torch.tensor([[0.0, 0, 31, 31], [32, 32, 63, 63], [0, 32, 31, 63], [32, 0, 63, 31]])
    targets = torch.stack([_square(64, 64, int(b[1]), int(b[3]) + 1, int(b[0]), int(b[2]) + 1) for b in boxes])
    opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=3e-3)
    losses = []
    for _ in range(40):
        sparse, dense = enc(boxes=boxes)
        masks, iou = dec(image, enc.get_dense_pe(), sparse, dense, multimask_output=True)
        out = segmentation_loss(masks, iou, targets)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert masks.shape == (4, 3, 16, 16)
    assert losses[-1] < 0.5 * losses[0]
    assert out.actual_iou.mean() > 0.5

    with torch.no_grad():
        best = select_mask_prompt(masks, iou)
        best_up = torch.nn.functional.interpolate(best, size=(64, 64), mode="bilinear", align_corners=False)
        clicks, click_labels = sample_correction_points(best_up, targets, generator=torch.Generator().manual_seed(0))
        sparse, dense = enc(points=(clicks, click_labels), boxes=boxes, masks=best)
        masks2, iou2 = dec(image, enc.get_dense_pe(), sparse, dense, multimask_output=False)
    assert best.shape == (4, 1, 16, 16) and sparse.shape == (4, 1 + 2, 64) and masks2.shape == (4, 1, 16, 16)
