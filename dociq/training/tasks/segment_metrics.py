"""Promptable-segmentation metrics: per-prompt IoU and Dice, averaged overall and per question kind.

mIoU here is the mean over prompts of each prompt's IoU (the thresholded chosen mask against its
target), not the dataset-level intersection-over-union: every question counts the same whether
it asks for a page footer or the whole body text. Per-prompt scores are torchmetrics' segmentation
functionals' (mean_iou, dice_score) computed on bool masks; the running means are torchmetrics `MeanMetric`s, so they reduce
correctly across processes under DDP.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, SumMetric

from dociq.data.schema import QUESTION_KINDS


def per_prompt_iou_dice(pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """IoU and Dice of each binary mask pair: pred, target bool/0-1 [N, H, W] -> ([N], [N]).

    An empty prediction of an empty target scores 1 (torchmetrics returns NaN for 0/0)."""
    if pred.shape != target.shape or pred.dim() != 3:
        raise ValueError(f"per_prompt_iou_dice: pred and target must both be [N, H, W], got "
                         f"{list(pred.shape)} and {list(target.shape)}")
    p = (pred > 0.5 if pred.is_floating_point() else pred.bool()).flatten(1)
    t = (target > 0.5 if target.is_floating_point() else target.bool()).flatten(1)
    # torchmetrics' mean_iou / dice_score (one class, samplewise) computed on bool masks: the same
    # numbers (tests/tasks/test_segment.py checks them against it), without its int64 one-hot copies,
    # which cost seconds per batch for masks scored at 1,024 px.
    both = (p & t).sum(1).double()
    total = p.sum(1).double() + t.sum(1).double()
    iou = both / (total - both)
    dice = 2 * both / total
    return torch.nan_to_num(iou.float(), nan=1.0), torch.nan_to_num(dice.float(), nan=1.0)


class SegmentationMetrics(nn.Module):
    """Running mIoU / Dice, overall and per question kind.

    update(pred [N,H,W] bool, target [N,H,W], kinds: N kind names) accumulates one score per prompt;
    compute() -> {"miou", "dice", "miou_<kind>", "dice_<kind>"} for the kinds seen since reset().
    Unknown kinds raise (add them to dociq.data.schema.QUESTION_KINDS)."""

    def __init__(self, kinds: Sequence[str] = QUESTION_KINDS) -> None:
        super().__init__()
        self.kinds = tuple(kinds)
        self.miou = MeanMetric()
        self.dice = MeanMetric()
        self.miou_by_kind = nn.ModuleDict({k: MeanMetric() for k in self.kinds})
        self.dice_by_kind = nn.ModuleDict({k: MeanMetric() for k in self.kinds})
        # prompts per kind, synced across processes like the means, so every rank reports the same keys
        self.count_by_kind = nn.ModuleDict({k: SumMetric() for k in self.kinds})

    @torch.no_grad()
    def update(self, pred: Tensor, target: Tensor, kinds: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Add N prompts; returns their (iou [N], dice [N])."""
        if len(kinds) != pred.shape[0]:
            raise ValueError(f"SegmentationMetrics.update: {pred.shape[0]} masks but {len(kinds)} kinds")
        iou, dice = per_prompt_iou_dice(pred, target)
        if len(kinds) == 0:
            return iou, dice
        self.miou.update(iou)
        self.dice.update(dice)
        for kind in sorted(set(kinds)):
            if kind not in self.miou_by_kind:
                raise KeyError(f"question kind {kind!r} is not one of {self.kinds}: add it to "
                               "dociq.data.schema.QUESTION_KINDS (metrics are reported per kind)")
            sel = torch.tensor([k == kind for k in kinds], device=iou.device)
            self.miou_by_kind[kind].update(iou[sel])
            self.dice_by_kind[kind].update(dice[sel])
            self.count_by_kind[kind].update(sel.sum().float())
        return iou, dice

    def compute(self) -> dict[str, Tensor]:
        with warnings.catch_warnings():   # kinds never updated: a count of 0 is the right answer
            warnings.filterwarnings("ignore", message=".*called before the ``update`` method.*")
            counts = {k: int(m.compute()) for k, m in self.count_by_kind.items()}  # collective: every rank
        if sum(counts.values()) == 0:
            return {}
        out = {"miou": self.miou.compute(), "dice": self.dice.compute()}
        for kind in self.kinds:
            if counts[kind] > 0:
                out[f"miou_{kind}"] = self.miou_by_kind[kind].compute()
                out[f"dice_{kind}"] = self.dice_by_kind[kind].compute()
        return out

    def reset(self) -> None:
        self.miou.reset()
        self.dice.reset()
        for m in (*self.miou_by_kind.values(), *self.dice_by_kind.values(), *self.count_by_kind.values()):
            m.reset()
