"""Anti-collapse regularisers for the JEPA stages (I-JEPA, D-JEPA).

What collapses here. With an EMA target and a predictor, the JEPA loss is also minimised by an
encoder whose tokens carry only their *position*: the predictor knows the target positions, so a
position-only target is predicted perfectly and the loss goes to ~0. On small CPU runs of the
tiny Hiera that is what happened — the layer-normed target's std across pages at a fixed unit
fell from 0.18 to 0.004 (docs/pretrain.md) while the loss fell to 4e-5.

The term. VICReg's variance and covariance terms (Bardes et al. 2022; added to I-JEPA as in
C-JEPA, Mo & Tong 2024), measured on what collapse removes: the *across-page* variation at a
fixed unit. The online encoder's context tokens are layer-normed (the targets' space), each
token's unit mean over the batch is subtracted (so the position-only part does not count), and
  variance   = mean over channels of relu(gamma - std of the residuals)
  covariance = sum of squared off-diagonal covariances of the residuals / channels.
A layer-normed token has unit energy per channel on average, so gamma^2 is the share of it that
must vary across pages (the default 0.25: 6 %; a random encoder has ~0.18, i.e. 3 %).

`unexplained_fraction` is the matching learning signal for the JEPA stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class CollapseRegConfig:
    variance: float = 0.0     # weight of the variance hinge (0: off)
    covariance: float = 0.0   # weight of the covariance term (0: off)
    gamma: float = 0.5        # target std across pages: of each channel, or of the whole token
    per_channel: bool = True  # VICReg's hinge per channel; False: one hinge on the mean variance
    eps: float = 1e-4

    @classmethod
    def from_config(cls, reg: Mapping[str, float] | None) -> "CollapseRegConfig":
        reg = dict(reg or {})
        unknown = set(reg) - set(cls.__dataclass_fields__)
        if unknown:
            raise KeyError(f"unknown task.reg key(s) {sorted(unknown)}; allowed: variance, covariance, "
                           "gamma, per_channel, eps")
        cfg = cls(**{k: (bool(v) if k == "per_channel" else float(v)) for k, v in reg.items()})
        if cfg.variance < 0 or cfg.covariance < 0 or cfg.gamma <= 0 or cfg.eps <= 0:
            raise ValueError(f"task.reg needs variance, covariance >= 0 and gamma, eps > 0; got {reg}")
        return cfg

    @property
    def active(self) -> bool:
        return self.variance > 0 or self.covariance > 0


def unit_residuals(tokens: torch.Tensor, idx: torch.Tensor, num_units: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B,K,E] of units idx [B,K] -> (residuals [R,E] from each unit's mean over the pages
    that have it, degrees of freedom). Units present on one page only are left out."""
    E = tokens.shape[-1]
    flat_idx = idx.reshape(-1)
    x = tokens.reshape(-1, E)
    counts = torch.bincount(flat_idx, minlength=num_units)
    sums = x.new_zeros(num_units, E).index_add(0, flat_idx, x)
    mean = sums / counts.clamp_min(1).unsqueeze(1).to(x.dtype)
    shared = counts[flat_idx] >= 2
    residuals = (x - mean[flat_idx])[shared]
    dof = shared.sum() - (counts >= 2).sum()   # one mean estimated per unit
    return residuals, dof.clamp_min(1).to(x.dtype)


def collapse_terms(tokens: torch.Tensor, idx: torch.Tensor, num_units: int,
                   cfg: CollapseRegConfig) -> dict[str, torch.Tensor]:
    """{"reg_var", "reg_cov", "content_std"} of the online tokens [B,K,E] at units idx [B,K]."""
    z = F.layer_norm(tokens.float(), tokens.shape[-1:])
    residuals, dof = unit_residuals(z, idx, num_units)
    E = z.shape[-1]
    if residuals.shape[0] < 2:   # batch of one page, or no unit shared by two pages
        zero = tokens.sum() * 0.0
        return {"reg_var": zero, "reg_cov": zero, "content_std": zero.detach()}
    var = residuals.pow(2).sum(0) / dof
    std = torch.sqrt(var + cfg.eps)
    hinge = F.relu(cfg.gamma - std).mean() if cfg.per_channel else F.relu(cfg.gamma - torch.sqrt(var.mean() + cfg.eps))
    cov = residuals.T @ residuals / dof
    off_diagonal = cov - torch.diag_embed(torch.diagonal(cov))
    return {"reg_var": hinge,
            "reg_cov": off_diagonal.pow(2).sum() / E,
            "content_std": std.mean().detach()}


def unexplained_fraction(pred: torch.Tensor, target: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """MSE of the predictions over the across-page variance of the target features [B,N,E] (mean
    over units and channels): 1 = no better than predicting each unit's average page, < 1 = the
    predictor knows page content. Unlike the loss it does not fall when the targets collapse."""
    return F.mse_loss(pred.float(), target.float()) / features.float().var(dim=0).mean().clamp_min(1e-12)
