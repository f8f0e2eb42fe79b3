"""Linear probe of an image encoder: what its unit tokens say about the page's layout.

A self-supervised loss that falls says little by itself — a JEPA loss also falls when the encoder
collapses. The probe asks what a layout segmenter needs: from the frozen encoder's token of one
mask unit (32 px on the tiny model), can a linear classifier tell which region class lies there
(title, paragraph, table cell, figure, ..., or background)?

- Unit labels come from the page's regions: each region is painted into a label map (larger
  regions first, so a table cell wins over its table), the map goes to the input frame like the
  image (resize-longest + pad), and a unit takes the class covering most of it if non-background
  classes cover at least `min_cover` of the unit, else background.
- Features: the encoder's dense forward (final LayerNorm applied), standardised per channel on
  the training pages. The classifier: multinomial logistic regression fitted with L-BFGS.
- Reported: unit accuracy and balanced accuracy (mean recall over the classes present in the
  held-out pages — background dominates, so this is the number to read), the same for a probe on
  the unit's *position alone* (what page layout priors give without looking), and two collapse
  signals: `page_std` = std across pages at a fixed unit of the layer-normed tokens (the JEPA
  `target_std`; 0 = every page gives the same tokens) and the effective rank of the token matrix.
- What a JEPA predictor could learn of these tokens as targets: `unexplained` (the JEPA stages'
  MSE over the across-page variance) on the held-out pages of each unit's mean training page, and
  of a ridge regression from the unit's 8 neighbours' tokens on the same page (one linear map for
  every unit, on top of the unit's mean): below 1, the page's own context predicts the target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dociq.data.collate import _masks_to_input_frame, _to_input_frame
from dociq.data.schema import REGION_CLASSES, Page

CLASSES = ("background",) + tuple(REGION_CLASSES)


def label_map(page: Page) -> np.ndarray:
    """int [H, W] class index per page pixel (0 = background); larger regions painted first."""
    labels = np.zeros(page.size, dtype=np.int64)
    for region in sorted(page.regions, key=lambda r: -int(r.mask.sum())):
        if region.label in CLASSES:
            labels[region.mask] = CLASSES.index(region.label)
    return labels


def unit_labels(page: Page, image_size: int, unit_px: int, min_cover: float = 0.25) -> torch.Tensor:
    """int [num_units] (raster order) class of each mask unit of the page's input frame."""
    labels = label_map(page)
    onehot = np.stack([labels == c for c in range(len(CLASSES))])                  # [C, H, W]
    frame = _masks_to_input_frame(onehot, image_size)                              # [C, S, S]
    grid = image_size // unit_px
    cover = F.avg_pool2d(frame[None], unit_px)[0].reshape(len(CLASSES), grid * grid)  # [C, N]
    cover[0] = 0.0                                                                  # padding reads as background too
    best = cover.argmax(0)
    return torch.where(cover.sum(0) >= min_cover, best, torch.zeros_like(best))


def input_frames(pages: Sequence[Page], image_size: int) -> torch.Tensor:
    """[P, 3, S, S] the pages as the encoder sees them (resize-longest + pad, normalised)."""
    return torch.stack([_to_input_frame(p.image, image_size)[0] for p in pages])


@torch.no_grad()
def encode_images(encoder: torch.nn.Module, images: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """[P, N, E] dense last-stage tokens of input-frame images, in eval mode (the mode is restored)."""
    was_training = encoder.training
    encoder.eval()
    try:
        return torch.cat([encoder(images[i:i + batch_size]).float() for i in range(0, len(images), batch_size)])
    finally:
        encoder.train(was_training)


def encode_pages(encoder: torch.nn.Module, pages: Sequence[Page], image_size: int,
                 batch_size: int = 16) -> torch.Tensor:
    """[P, N, E] dense last-stage tokens of every page."""
    return encode_images(encoder, input_frames(pages, image_size), batch_size)


def page_std(tokens: torch.Tensor) -> float:
    """Std across pages at a fixed unit of the layer-normed tokens, averaged (JEPA `target_std`)."""
    normed = F.layer_norm(tokens, tokens.shape[-1:])
    return float(normed.std(dim=0).mean())


def effective_rank(tokens: torch.Tensor) -> float:
    """exp(entropy) of the normalised singular values of the centred [P*N, E] token matrix."""
    x = tokens.reshape(-1, tokens.shape[-1]).double()
    s = torch.linalg.svdvals(x - x.mean(0))
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def fit_linear_probe(x_train: torch.Tensor, y_train: torch.Tensor, num_classes: int,
                     weight_decay: float = 1e-4, max_iter: int = 200) -> torch.nn.Linear:
    """Multinomial logistic regression on standardised features (full-batch L-BFGS)."""
    torch.manual_seed(0)
    probe = torch.nn.Linear(x_train.shape[1], num_classes).double()
    x, y = x_train.double(), y_train
    opt = torch.optim.LBFGS(probe.parameters(), lr=1.0, max_iter=max_iter, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(probe(x), y) + weight_decay * probe.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return probe


def accuracies(pred: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, balanced accuracy = mean recall over the classes present in y)."""
    acc = float((pred == y).double().mean())
    recalls = [float((pred[y == c] == c).double().mean()) for c in y.unique()]
    return acc, float(np.mean(recalls))


def neighbour_features(values: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """[P, N, C] values on an h x w unit grid -> [P, N, 8C]: each unit's 8 neighbours' values, side
    by side (zeros beyond the page)."""
    h, w = int(grid[0]), int(grid[1])
    p, _, c = values.shape
    padded = F.pad(values.reshape(p, h, w, c).permute(0, 3, 1, 2), (1, 1, 1, 1))
    shifted = [padded[:, :, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx]
    return torch.cat(shifted, 1).permute(0, 2, 3, 1).reshape(p, h * w, -1)


def ridge_weights(gram: torch.Tensor, moment: torch.Tensor, ridge: float) -> torch.Tensor:
    """Ridge regression weights from X^T X and X^T Y, the damping `ridge` times the mean feature
    variance (so one setting suits features of any scale)."""
    damping = ridge * gram.diagonal().mean().clamp_min(1e-12)
    return torch.linalg.solve(gram + damping * torch.eye(len(gram), dtype=gram.dtype), moment)


def neighbour_predictability(train_tokens: torch.Tensor, test_tokens: torch.Tensor, grid: Sequence[int],
                             ridge: float = 1e-2) -> tuple[float, float]:
    """(`unexplained` of each unit's mean, of the ridge from its 8 neighbours' tokens) on the test
    pages, the tokens [P, N, E] layer-normed as JEPA targets are; `ridge` is relative to the mean
    feature variance. NaN for tokens that do not vary across pages (nothing to predict)."""
    train, test = (F.layer_norm(t.double(), t.shape[-1:]) for t in (train_tokens, test_tokens))
    unit_mean = train.mean(0)
    variance = test.var(0).mean()
    if variance < 1e-12:
        return float("nan"), float("nan")
    x_train = neighbour_features(train - unit_mean, grid).flatten(0, 1)
    weights = ridge_weights(x_train.T @ x_train, x_train.T @ (train - unit_mean).flatten(0, 1), ridge)
    mean_error = ((test - unit_mean) ** 2).mean() / variance
    ridge_error = ((test - unit_mean - neighbour_features(test - unit_mean, grid) @ weights) ** 2).mean() / variance
    return float(mean_error), float(ridge_error)


@dataclass
class ProbeResult:
    accuracy: float
    balanced_accuracy: float
    position_accuracy: float
    position_balanced_accuracy: float
    page_std: float
    effective_rank: float
    train_units: int
    test_units: int
    unit_mean_unexplained: float
    neighbour_unexplained: float


def token_probe_accuracy(train_tokens: torch.Tensor, train_labels: torch.Tensor, test_tokens: torch.Tensor,
                         test_labels: torch.Tensor, max_iter: int = 200) -> tuple[float, float]:
    """(accuracy, balanced accuracy) of the linear probe fitted on [P, N, E] tokens and their
    [P * N] unit classes, scored on the test pages'; features standardised on the training pages."""
    x_tr, x_te = (t.reshape(-1, t.shape[-1]) for t in (train_tokens, test_tokens))
    mean, std = x_tr.mean(0), x_tr.std(0).clamp_min(1e-6)
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    probe = fit_linear_probe(x_tr, train_labels, len(CLASSES), max_iter=max_iter)
    with torch.no_grad():
        return accuracies(probe(x_te.double()).argmax(1), test_labels)


def probe_encoder(encoder: torch.nn.Module, train_pages: Sequence[Page], test_pages: Sequence[Page],
                  image_size: int, unit_px: int) -> ProbeResult:
    """Fit the unit-class probe on `train_pages`' tokens and score it on `test_pages`'."""
    feats = [encode_pages(encoder, pages, image_size) for pages in (train_pages, test_pages)]
    labels = [torch.stack([unit_labels(p, image_size, unit_px) for p in pages]).reshape(-1)
              for pages in (train_pages, test_pages)]
    num_units = feats[0].shape[1]
    if num_units != (image_size // unit_px) ** 2:
        raise ValueError(f"encoder gives {num_units} tokens per page but image_size={image_size} and "
                         f"unit_px={unit_px} make {(image_size // unit_px) ** 2} units: check model.mask_unit_px")
    acc, bal = token_probe_accuracy(feats[0], labels[0], feats[1], labels[1])

    # Position alone: one-hot unit index, same classifier.
    eye = torch.eye(num_units)
    pos_tr, pos_te = eye.repeat(len(train_pages), 1), eye.repeat(len(test_pages), 1)
    pos_probe = fit_linear_probe(pos_tr, labels[0], len(CLASSES))
    pos_acc, pos_bal = accuracies(pos_probe(pos_te.double()).argmax(1), labels[1])
    side = image_size // unit_px
    return ProbeResult(acc, bal, pos_acc, pos_bal, page_std(feats[1]), effective_rank(feats[1]),
                       len(labels[0]), len(labels[1]), *neighbour_predictability(feats[0], feats[1], (side, side)))
