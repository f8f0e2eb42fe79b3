"""What held-out scoring shares, whichever path produced the masks (the Predictor's,
dociq.evaluation.answers; the training task's batched one, dociq.training.heldout; validation
during training): the seed and the region prompts of held-out pages, per-prompt IoU and Dice, their
running means per question kind, region size and layout class, and the results table.

mIoU here is the mean over prompts of each prompt's IoU (the thresholded chosen mask against its
target), not the dataset-level intersection-over-union: every question counts the same whether
it asks for a page footer or the whole body text. The running means are torchmetrics `MeanMetric`s,
so they reduce correctly across processes under DDP.
"""
from __future__ import annotations

import dataclasses
import random
import warnings
from typing import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, SumMetric

from dociq.data.schema import QUESTION_KINDS, Page, Question

# The seed of held-out prompts: questions drawn per page, clicks, region prompts.
VAL_SEED = 1000003
# Region size classes of the *_region prompt sets: (name, upper bound of the page fraction).
REGION_SIZES = (("small", 0.01), ("medium", 0.05), ("large", float("inf")))


def per_prompt_iou_dice(pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """IoU and Dice of each binary mask pair: pred, target bool/0-1 [N, H, W] -> ([N], [N]).

    An empty prediction of an empty target scores 1 (torchmetrics returns NaN for 0/0)."""
    if pred.shape != target.shape or pred.dim() != 3:
        raise ValueError(f"per_prompt_iou_dice: pred and target must both be [N, H, W], got "
                         f"{list(pred.shape)} and {list(target.shape)}")
    p = (pred > 0.5 if pred.is_floating_point() else pred.bool()).flatten(1)
    t = (target > 0.5 if target.is_floating_point() else target.bool()).flatten(1)
    # torchmetrics' mean_iou / dice_score (one class, samplewise) computed on bool masks: the same
    # numbers (tests/tasks/test_finetune.py checks them against it), without its int64 one-hot copies,
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

    def results(self) -> dict:
        """compute() as plain floats, with the prompt count of every kind it reports (`count_<kind>`)."""
        values = {k: float(v) for k, v in self.compute().items()}
        counts = {f"count_{k}": int(c.compute()) for k, c in self.count_by_kind.items() if f"miou_{k}" in values}
        return values | counts

    def reset(self) -> None:
        self.miou.reset()
        self.dice.reset()
        for m in (*self.miou_by_kind.values(), *self.dice_by_kind.values(), *self.count_by_kind.values()):
            m.reset()


def metric_results(metrics: dict[str, SegmentationMetrics], by_class: "MeanByName") -> dict:
    """{set: {miou, dice, miou_<kind>, ..., count_<kind>}}, and the layout questions by class."""
    results = {}
    for name, m in metrics.items():
        results[name] = m.results()
    if by_class.counts:
        results["question_layout_by_class"] = by_class.compute()
    return results


class MeanByName:
    """Running mean IoU per name (a question's region class); names are not known in advance."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: torch.Tensor, names: Sequence[str | None]) -> None:
        for value, name in zip(values.tolist(), names):
            if name is not None:
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1

    def compute(self) -> dict:
        """{"miou": over all, "miou_<name>": ..., "count_<name>": ...}, names by count."""
        names = sorted(self.counts, key=lambda n: -self.counts[n])
        out = {"miou": sum(self.sums.values()) / sum(self.counts.values())}
        for n in names:
            out[f"miou_{n}"] = self.sums[n] / self.counts[n]
        return out | {f"count_{n}": self.counts[n] for n in names}


def question_classes(batch: dict, pages: Sequence[Page]) -> list[str | None]:
    """Per prompt of the batch (in the order of its valid prompts): the region class a layout
    question asks for ("mixed" when its regions have several), None for other kinds."""
    return [layout_class(page, page.questions[k]) for page, index in zip(pages, batch["prompt_question_index"])
            for k in index]


def layout_class(page: Page, question: Question) -> str | None:
    """The region class a layout question asks for ("mixed" when its regions have several), None
    for other kinds."""
    labels = {page.regions[r].label for r in question.region_ids if 0 <= r < len(page.regions)}
    if question.kind != "layout" or not labels:
        return None
    return labels.pop() if len(labels) == 1 else "mixed"


def region_size(mask) -> str:
    """small / medium / large: the region's share of the page (REGION_SIZES)."""
    share = float(mask.mean())
    return next(name for name, bound in REGION_SIZES if share < bound)


def regions_as_prompts(page: Page, count: int, seed: int) -> Page:
    """The page with up to `count` of its regions (fixed draw per page) as its prompts, one object
    per prompt; the prompt's kind is the region's size class (`region_size`)."""
    regions = [r for r in page.regions if r.mask.any()]
    rng = random.Random(f"{seed}:{page.meta.get('page_id', '')}")
    chosen = rng.sample(regions, k=min(count, len(regions)))
    return dataclasses.replace(page, questions=[Question(text=r.label, kind=region_size(r.mask), mask=r.mask)
                                                for r in chosen])


def format_table(results: dict[str, dict]) -> str:
    kinds = ["layout", "reading", "cell", "link"] + [name for name, _ in REGION_SIZES]
    lines = ["| checkpoint | prompt | mIoU | " + " | ".join(f"mIoU {k}" for k in kinds) + " |",
             "|---|---|---|" + "---|" * len(kinds)]
    by_class = []
    for ckpt, sets in results.items():
        for name, r in sets.items():
            if name == "question_layout_by_class":
                by_class.append(f"layout questions by class, {ckpt}: " + ", ".join(
                    f"{k[5:]} {100 * v:.1f} (n={r[f'count_{k[5:]}']})" for k, v in r.items() if k.startswith("miou_")))
                continue
            cells = [f"{100 * r[f'miou_{k}']:.1f} (n={r.get(f'count_{k}', '?')})" if f"miou_{k}" in r else "-"
                     for k in kinds]
            lines.append(f"| {ckpt} | {name} | {100 * r.get('miou', float('nan')):.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines + by_class)
