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

SIGReg (optional, `sigreg` > 0). LeJEPA's regulariser (Balestriero & LeCun 2025) in place of
those heuristics: the across-page residuals of the *raw* online tokens (each unit's mean, its
position, stays free) should follow an isotropic Gaussian N(0, I), tested on `sigreg_slices`
random 1-D projections with the Epps-Pulley statistic (`sigreg`).

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
    sigreg: float = 0.0       # weight of LeJEPA's SIGReg on the raw tokens' residuals (0: off)
    sigreg_slices: int = 256  # random 1-D projections SIGReg tests per step

    @classmethod
    def from_config(cls, reg: Mapping[str, float] | None) -> "CollapseRegConfig":
        reg = dict(reg or {})
        unknown = set(reg) - set(cls.__dataclass_fields__)
        if unknown:
            raise KeyError(f"unknown task.reg key(s) {sorted(unknown)}; allowed: variance, covariance, "
                           "gamma, per_channel, eps, sigreg, sigreg_slices")
        slices = reg.get("sigreg_slices", cls.sigreg_slices)
        if isinstance(slices, bool) or not isinstance(slices, (int, float)) or int(slices) != slices:
            raise ValueError(f"task.reg.sigreg_slices must be an integer; got {slices!r}")
        cfg = cls(**{k: (bool(v) if k == "per_channel" else int(v) if k == "sigreg_slices" else float(v))
                     for k, v in reg.items()})
        if cfg.variance < 0 or cfg.covariance < 0 or cfg.gamma <= 0 or cfg.eps <= 0:
            raise ValueError(f"task.reg needs variance, covariance >= 0 and gamma, eps > 0; got {reg}")
        if cfg.sigreg < 0 or cfg.sigreg_slices < 1:
            raise ValueError(f"task.reg needs sigreg >= 0 and sigreg_slices >= 1; got {reg}")
        return cfg

    @property
    def active(self) -> bool:
        return self.variance > 0 or self.covariance > 0 or self.sigreg > 0

    def weighted(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The regulariser's share of the loss, from `collapse_terms`' output."""
        return (self.variance * terms["reg_var"] + self.covariance * terms["reg_cov"]
                + self.sigreg * terms["reg_sigreg"])


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


def epps_pulley(z: torch.Tensor, knots: int = 17, t_max: float = 5.0) -> torch.Tensor:
    """Epps-Pulley statistic [M] of each column of z [N, M] (N scalar samples per column) against
    N(0, 1): N * integral of |phi_N(t) - exp(-t^2/2)|^2 exp(-t^2/2) dt, phi_N the empirical
    characteristic function, by the trapezoid rule on `knots` points of [-t_max, t_max]."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))     # float32 at least (bf16 in: float32)
    t = torch.linspace(-t_max, t_max, knots, device=z.device, dtype=z.dtype)
    gauss = torch.exp(-0.5 * t.square())                      # N(0, 1)'s characteristic function
    zt = z.unsqueeze(-1) * t                                  # [N, M, T]
    # |phi_N - g|^2 in real arithmetic: (mean cos - g)^2 + (mean sin)^2
    err = (torch.cos(zt).mean(0) - gauss).square() + torch.sin(zt).mean(0).square()   # [M, T]
    return torch.trapezoid(err * gauss, t, dim=-1) * z.shape[0]


def sigreg(x: torch.Tensor, step: int, slices: int = 256, knots: int = 17, t_max: float = 5.0) -> torch.Tensor:
    """LeJEPA's SIGReg (Balestriero & LeCun 2025) of the samples x [N, D]: how far they are from an
    isotropic Gaussian N(0, I), as the Epps-Pulley statistic (`epps_pulley`) of their projections
    on `slices` random unit directions, averaged over the directions. Differentiable, computed in
    float32. The directions are drawn from a generator seeded by `step` (same step, same
    directions: a resumed run is reproducible). For N(0, I) samples it stays at its null value
    (the expectation of the integral of (1 - exp(-t^2)) exp(-t^2/2), about 1.06, whatever N); any
    departure from N(0, I) — collapse, a wrong scale, anisotropy — grows it in proportion to N."""
    # Per process: LeJEPA all-reduces the ECF over DDP ranks, here each rank tests its own batch.
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        gen = torch.Generator(device=x.device)
        gen.manual_seed(int(step))
        directions = torch.randn(x.shape[-1], slices, generator=gen, device=x.device, dtype=torch.float32)
        directions = directions / directions.norm(p=2, dim=0, keepdim=True)
        return epps_pulley(x @ directions, knots, t_max).mean()


def collapse_terms(tokens: torch.Tensor, idx: torch.Tensor, num_units: int,
                   cfg: CollapseRegConfig, step: int = 0) -> dict[str, torch.Tensor]:
    """{"reg_var", "reg_cov", "reg_sigreg", "content_std"} of the online tokens [B,K,E] at units
    idx [B,K]; "reg_sigreg" is 0 unless cfg.sigreg > 0 (its projections are seeded by `step`)."""
    z = F.layer_norm(tokens.float(), tokens.shape[-1:])
    residuals, dof = unit_residuals(z, idx, num_units)
    E = z.shape[-1]
    if residuals.shape[0] < 2:   # batch of one page, or no unit shared by two pages
        zero = tokens.sum() * 0.0
        return {"reg_var": zero, "reg_cov": zero, "reg_sigreg": zero, "content_std": zero.detach()}
    var = residuals.pow(2).sum(0) / dof
    std = torch.sqrt(var + cfg.eps)
    hinge = F.relu(cfg.gamma - std).mean() if cfg.per_channel else F.relu(cfg.gamma - torch.sqrt(var.mean() + cfg.eps))
    cov = residuals.T @ residuals / dof
    off_diagonal = cov - torch.diag_embed(torch.diagonal(cov))
    if cfg.sigreg > 0:   # the raw tokens' page content at each unit should be N(0, I); unit means stay free
        raw_residuals, _ = unit_residuals(tokens.float(), idx, num_units)
        reg_sigreg = sigreg(raw_residuals, step, slices=cfg.sigreg_slices)
    else:
        reg_sigreg = tokens.sum() * 0.0
    return {"reg_var": hinge,
            "reg_cov": off_diagonal.pow(2).sum() / E,
            "reg_sigreg": reg_sigreg,
            "content_std": std.mean().detach()}


def unexplained_fraction(pred: torch.Tensor, target: torch.Tensor, features: torch.Tensor,
                         units: torch.Tensor) -> torch.Tensor:
    """MSE of the predictions over the across-page variance of the target features [B,N,E] at the
    predicted units (`units`: their indices, any shape; mean over them and the channels): 1 = no
    better than predicting each unit's average page, < 1 = the predictor knows page content. The
    variance is taken where the targets are: masks place target blocks away from the margins, whose
    units barely vary, so the whole page's variance would read each unit's average page as ~1.2.
    Unlike the loss it does not fall when the targets collapse."""
    unit_variance = features.float().var(dim=0).mean(dim=-1)             # [N]
    return F.mse_loss(pred.float(), target.float()) / unit_variance[units].mean().clamp_min(1e-12)


# How a JEPA stage normalises its target tokens (task.target_norm): "layer" = I-JEPA's layer norm per
# token; "page" = then only what varies across the batch's pages at each unit (`page_content`).
TARGET_NORMS = ("layer", "page")


def page_content(features: torch.Tensor) -> torch.Tensor:
    """[B, N, E] tokens -> what varies across the batch's pages at each unit: each unit's mean over
    the pages removed, scaled so that the mean variance across pages is 1. A batch of one page
    has no such content (all zeros)."""
    residual = features - features.mean(dim=0, keepdim=True)
    if features.shape[0] < 2:
        return residual
    return residual / residual.var(dim=0).mean().sqrt().clamp_min(1e-6)
