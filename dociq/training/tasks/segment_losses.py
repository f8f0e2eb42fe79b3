"""Losses and interactive-round helpers for promptable segmentation (SAM's training recipe).

- Mask loss: focal (alpha 0.25, gamma 2) and dice, weighted 20 : 1, per predicted mask.
- With several candidate masks per prompt (multimask output) only the candidate with the lowest
  20*focal + dice gets gradient, so the candidates can specialise on the ambiguous readings of a
  prompt (whole table vs. one cell) instead of all regressing to their mean.
- IoU head: mean-squared error between the predicted IoU and the actual IoU of the thresholded
  mask with the target, for every candidate (SAM 2's supervise_all_iou; weight 1), so it can
  rank a lone click's three masks.
- Interactive rounds: the next click is drawn uniformly from the larger error region between the
  previous prediction and the target: a positive click in the false-negative region or a
  negative click in the false-positive region.

Masks may come at a lower resolution than the targets (the decoder predicts at stride 4); the
logits are then upsampled bilinearly to the target size, as SAM computes its loss at image size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import sigmoid_focal_loss

FOCAL_ALPHA = 0.25
FOCAL_GAMMA = 2.0
FOCAL_WEIGHT = 20.0
DICE_WEIGHT = 1.0
IOU_WEIGHT = 1.0


def _as_nkhw(x: Tensor, name: str) -> Tensor:
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"segment_losses: {name} must be [N, H, W] or [N, K, H, W], got {list(x.shape)}")
    return x


def _match_size(logits: Tensor, targets: Tensor) -> Tensor:
    """Upsample mask logits [N, K, h, w] to the targets' [H, W] when they differ."""
    if logits.shape[-2:] == targets.shape[-2:]:
        return logits
    return F.interpolate(logits, size=targets.shape[-2:], mode="bilinear", align_corners=False)


def focal_loss(logits: Tensor, targets: Tensor, alpha: float = FOCAL_ALPHA, gamma: float = FOCAL_GAMMA) -> Tensor:
    """Sigmoid focal loss averaged over pixels: logits [N, K, H, W], targets [N, 1 or K, H, W] -> [N, K]."""
    targets = targets.expand_as(logits).to(logits.dtype)
    return sigmoid_focal_loss(logits, targets, alpha=alpha, gamma=gamma, reduction="none").flatten(2).mean(-1)


def dice_loss(logits: Tensor, targets: Tensor, smooth: float = 1.0) -> Tensor:
    """Soft dice loss 1 - (2|P.T| + s) / (|P| + |T| + s) per mask -> [N, K]; P = sigmoid(logits)."""
    probs = logits.sigmoid().flatten(2)
    targets = targets.expand_as(logits).to(logits.dtype).flatten(2)
    intersection = (probs * targets).sum(-1)
    return 1 - (2 * intersection + smooth) / (probs.sum(-1) + targets.sum(-1) + smooth)


# How a page-sized target becomes a target on the coarser loss grid (`loss_grid_targets`).
LOSS_TARGETS = ("area", "peaked")


def check_loss_targets(mode: str) -> str:
    """A `task.loss_targets` setting, or a ValueError naming the allowed ones."""
    if mode not in LOSS_TARGETS:
        raise ValueError(f"task.loss_targets={mode!r}; allowed: {', '.join(LOSS_TARGETS)}")
    return mode


@torch.no_grad()
def loss_grid_targets(targets: Tensor, size: int, mode: str = "area") -> Tensor:
    """targets [N, H, W] (0/1) -> soft targets [N, size, size] on the loss grid.

    "area": each cell holds the share of it the target covers. A target smaller than a cell (a
    page number's digit is 15 px of a 384-px input, a cell of the stride-4 grid 16) then never
    reaches 0.5 anywhere: the focal and dice losses teach the decoder to leave it out, and the
    IoU head that an empty mask is right. "peaked": the same shares, with each target whose
    largest share is under 0.5 divided by that share, so its best-covered cell is 1 and the
    others keep their proportion."""
    check_loss_targets(mode)
    soft = F.interpolate(targets[:, None].float(), size=(size, size), mode="area")[:, 0]
    if mode == "peaked":
        peak = soft.amax(dim=(-2, -1), keepdim=True)
        small = (peak > 0) & (peak < 0.5)
        soft = torch.where(small, soft / peak.clamp(min=1e-6), soft)
    return soft


@torch.no_grad()
def mask_iou(logits: Tensor, targets: Tensor) -> Tensor:
    """IoU of the masks `logits > 0` with `targets > 0.5` -> [N, K]; empty vs empty counts as 1."""
    pred = logits.flatten(2) > 0
    gt = targets.expand_as(logits).flatten(2) > 0.5
    inter = (pred & gt).sum(-1).float()
    union = (pred | gt).sum(-1).float()
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))


@dataclass
class SegmentationLoss:
    """Per-batch losses (scalars, averaged over valid prompts) and the per-prompt choice.

    loss = focal_weight * focal + dice_weight * dice + iou_weight * iou_mse.
    best_index [N]: the candidate mask that received gradient; actual_iou [N]: its IoU with the target.
    """

    loss: Tensor
    focal: Tensor
    dice: Tensor
    iou_mse: Tensor
    best_index: Tensor
    actual_iou: Tensor


def segmentation_loss(
    mask_logits: Tensor,
    iou_pred: Tensor,
    target_masks: Tensor,
    valid: Tensor | None = None,
    focal_weight: float = FOCAL_WEIGHT,
    dice_weight: float = DICE_WEIGHT,
    iou_weight: float = IOU_WEIGHT,
    focal_alpha: float = FOCAL_ALPHA,
    focal_gamma: float = FOCAL_GAMMA,
    supervise_all_iou: bool = True,
) -> SegmentationLoss:
    """SAM's loss with min-over-candidates selection.

    The masks are trained on the lowest-loss candidate only; the IoU head on every candidate
    (SAM 2's `supervise_all_iou`), so it learns to rank the three masks of a lone click — trained
    on the best one only it ranked them worse than always taking the first (click mIoU 7.7 chosen,
    21.5 first candidate, 24.8 best, at step 1000 of the recipe).
    mask_logits: [N, K, h, w] decoder logits (K = 1 or 3), any resolution.
    iou_pred: [N, K] predicted IoUs.
    target_masks: [N, H, W] or [N, 1, H, W] binary targets (float or bool).
    valid: optional bool [N]; prompts with False (padding questions) contribute nothing.
    """
    target_masks = _as_nkhw(target_masks, "target_masks").float()
    mask_logits = _as_nkhw(mask_logits, "mask_logits")
    if target_masks.shape[1] != 1 or target_masks.shape[0] != mask_logits.shape[0]:
        raise ValueError(
            f"segmentation_loss: target_masks must be one mask per prompt [N, (1,) H, W] with N = "
            f"{mask_logits.shape[0]}, got {list(target_masks.shape)}"
        )
    if iou_pred.shape != mask_logits.shape[:2]:
        raise ValueError(
            f"segmentation_loss: iou_pred {list(iou_pred.shape)} must match mask_logits' [N, K] "
            f"{list(mask_logits.shape[:2])}"
        )
    logits = _match_size(mask_logits, target_masks)
    focal = focal_loss(logits, target_masks, focal_alpha, focal_gamma)  # [N, K]
    dice = dice_loss(logits, target_masks)
    actual = mask_iou(logits, target_masks)

    best = (focal_weight * focal + dice_weight * dice).detach().argmin(dim=1)  # [N]
    rows = torch.arange(best.shape[0], device=best.device)
    iou_mse = ((iou_pred - actual) ** 2).mean(dim=1) if supervise_all_iou else \
        (iou_pred[rows, best] - actual[rows, best]) ** 2
    focal, dice, actual = focal[rows, best], dice[rows, best], actual[rows, best]

    weights = torch.ones_like(focal) if valid is None else valid.to(focal.dtype)
    denom = weights.sum().clamp(min=1)

    def reduce(x: Tensor) -> Tensor:
        return (x * weights).sum() / denom

    focal_m, dice_m, iou_m = reduce(focal), reduce(dice), reduce(iou_mse)
    total = focal_weight * focal_m + dice_weight * dice_m + iou_weight * iou_m
    return SegmentationLoss(total, focal_m, dice_m, iou_m, best, actual)


@torch.no_grad()
def sample_correction_points(
    mask_logits: Tensor, target_masks: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """One corrective click per prompt, drawn uniformly from the larger error region.

    mask_logits: [N, H', W'] or [N, 1, H', W'] previous prediction (upsampled to the target size).
    target_masks: [N, H, W] or [N, 1, H, W].
    Returns points float [N, 1, 2] as (x, y) pixel indices of the target grid and labels long
    [N, 1]: 1 (positive) from the false negatives when they are at least as many pixels as the
    false positives, else 0 (negative) from the false positives. A perfect prediction gets a
    negative click on the background (a positive one inside the target if there is no background).
    The same `generator` state gives the same clicks.
    """
    target = _as_nkhw(target_masks, "target_masks")
    logits = _as_nkhw(mask_logits, "mask_logits")
    if logits.shape[1] != 1 or target.shape[1] != 1 or logits.shape[0] != target.shape[0]:
        raise ValueError(
            f"sample_correction_points: need one mask per prompt, got logits {list(mask_logits.shape)} "
            f"and targets {list(target_masks.shape)}; pick one candidate per prompt first"
        )
    gt = target.flatten(1) > 0.5
    pred = _match_size(logits.float(), target).flatten(1) > 0
    false_neg, false_pos = gt & ~pred, ~gt & pred
    n_fn, n_fp = false_neg.sum(1), false_pos.sum(1)

    positive = n_fn >= n_fp
    region = torch.where(positive[:, None], false_neg, false_pos)
    perfect = (n_fn + n_fp) == 0
    has_background = (~gt).any(1)
    fallback = torch.where(has_background[:, None], ~gt, gt)
    region = torch.where(perfect[:, None], fallback, region)
    labels = torch.where(perfect, ~has_background, positive).long()

    index = torch.multinomial(region.float(), 1, generator=generator).squeeze(1)  # uniform over the region
    width = target.shape[-1]
    points = torch.stack([index % width, index // width], dim=-1).float()
    return points.unsqueeze(1), labels.unsqueeze(1)


def append_points(
    points: tuple[Tensor, Tensor] | None, new_points: Tensor, new_labels: Tensor
) -> tuple[Tensor, Tensor]:
    """Add this round's clicks [N, 1, 2] / [N, 1] to the earlier ones (or start the list)."""
    if points is None:
        return new_points, new_labels
    coords, labels = points
    return torch.cat([coords, new_points.to(coords)], dim=1), torch.cat([labels, new_labels.to(labels)], dim=1)


def select_mask_prompt(mask_logits: Tensor, iou_pred: Tensor) -> Tensor:
    """The candidate with the highest predicted IoU per prompt, [N, 1, h, w], for the next round's
    mask prompt (detached: SAM does not back-propagate through earlier rounds)."""
    best = iou_pred.argmax(dim=1)
    rows = torch.arange(best.shape[0], device=best.device)
    return mask_logits[rows, best].unsqueeze(1).detach()
