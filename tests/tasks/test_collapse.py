"""The anti-collapse regulariser (dociq/training/tasks/collapse.py): it measures across-page content at a
fixed unit, ignores what position alone explains, and its gradient restores that content. The
optional SIGReg term (LeJEPA): ~its null value for N(0, I) samples, large otherwise, the same
Epps-Pulley statistic as an independent quadrature, reproducible per step."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.integrate import quad

from dociq.training.tasks.collapse import (CollapseRegConfig, collapse_terms, epps_pulley, sigreg,
                                           unit_residuals)

CFG = CollapseRegConfig(variance=1.0, covariance=0.04, gamma=0.5)


def test_dense_grid_matches_per_unit_unbiased_variance():
    # Every page has every unit: the pooled residual variance is the mean over units of the
    # unbiased variance across pages (the textbook within-group variance).
    torch.manual_seed(0)
    B, N, E = 6, 10, 16
    tokens = torch.randn(B, N, E) + 3 * torch.randn(1, N, E)      # strong position part
    idx = torch.arange(N).expand(B, N)
    residuals, dof = unit_residuals(tokens, idx, N)
    var = residuals.pow(2).sum(0) / dof
    torch.testing.assert_close(var, tokens.var(dim=0, unbiased=True).mean(0))


def test_sparse_units_use_only_units_seen_twice():
    tokens = torch.tensor([[[1.0], [5.0]], [[3.0], [7.0]]])   # unit 0 on both pages, units 1 and 2 once
    idx = torch.tensor([[0, 1], [0, 2]])
    residuals, dof = unit_residuals(tokens, idx, 3)
    torch.testing.assert_close(residuals.squeeze(1), torch.tensor([-1.0, 1.0]))
    assert float(dof) == 1.0


def test_position_only_tokens_are_maximally_penalised_and_content_is_not():
    torch.manual_seed(0)
    B, N, E = 8, 16, 32
    idx = torch.stack([torch.randperm(N)[:10] for _ in range(B)])
    position_only = torch.randn(N, E)[idx]                       # same token per unit on every page
    out = collapse_terms(position_only, idx, N, CFG)
    assert out["content_std"] < 0.02
    assert out["reg_var"] == pytest.approx(CFG.gamma, abs=0.02)
    content = torch.randn(B, 10, E)                              # independent pages
    out = collapse_terms(content, idx, N, CFG)
    assert out["content_std"] > 0.8 and out["reg_var"] < 0.05


def test_gradient_steps_restore_content_of_a_collapsing_encoder():
    torch.manual_seed(0)
    B, N, E = 8, 16, 32
    idx = torch.arange(N).expand(B, N)
    position = torch.randn(N, E)
    content = (0.01 * torch.randn(B, N, E)).requires_grad_()
    opt = torch.optim.Adam([content], lr=0.02)
    before = float(collapse_terms(position + content, idx, N, CFG)["content_std"])
    for _ in range(50):
        out = collapse_terms(position + content, idx, N, CFG)
        opt.zero_grad()
        (CFG.variance * out["reg_var"] + CFG.covariance * out["reg_cov"]).backward()
        opt.step()
    after = float(collapse_terms(position + content, idx, N, CFG)["content_std"])
    assert before < 0.05 and after > 0.3


def test_covariance_term_flags_content_in_one_direction():
    # Same content energy, spread over all channels vs along one direction: only the second is
    # the dimensional collapse the covariance term is there to penalise.
    torch.manual_seed(0)
    B, N, E = 8, 64, 16
    idx = torch.arange(N).expand(B, N)
    spread = torch.randn(B, N, E)
    direction = F.normalize(torch.randn(E), dim=0) * E ** 0.5
    one_direction = torch.randn(B, N, 1) * direction
    cov_spread = collapse_terms(spread, idx, N, CFG)["reg_cov"]
    cov_one = collapse_terms(one_direction, idx, N, CFG)["reg_cov"]
    assert cov_one > 20 * cov_spread


def test_one_page_gives_zero_terms_with_a_graph():
    tokens = torch.randn(1, 5, 8, requires_grad=True)
    out = collapse_terms(tokens, torch.arange(5)[None], 5, CFG)
    assert out["reg_var"] == 0 and out["reg_cov"] == 0
    out["reg_var"].backward()   # no error: the zero keeps the graph


@pytest.mark.parametrize("reg, match", [({"varience": 1.0}, "varience"), ({"gamma": 0.0}, "gamma")])
def test_bad_config_names_the_key(reg, match):
    with pytest.raises((KeyError, ValueError), match=match):
        CollapseRegConfig.from_config(reg)


def test_token_hinge_accepts_low_dimensional_content_that_the_channel_hinge_rejects():
    # Content along 2 of 32 channels: enough energy for one hinge on the mean variance, but 30
    # channels without content fail VICReg's per-channel hinge.
    torch.manual_seed(0)
    B, N, E = 8, 16, 32
    idx = torch.arange(N).expand(B, N)
    tokens = torch.randn(N, E).expand(B, N, E).clone()
    tokens[..., :2] += 3.0 * torch.randn(B, N, 2)
    per_channel = collapse_terms(tokens, idx, N, CollapseRegConfig(variance=1.0, gamma=0.3))
    per_token = collapse_terms(tokens, idx, N, CollapseRegConfig(variance=1.0, gamma=0.3, per_channel=False))
    assert per_channel["reg_var"] > 0.05 and per_token["reg_var"] == 0
    collapsed = torch.randn(N, E).expand(B, N, E)
    assert collapse_terms(collapsed, idx, N, CollapseRegConfig(variance=1.0, gamma=0.3, per_channel=False)
                          )["reg_var"] == pytest.approx(0.3, abs=0.01)


# ---- SIGReg (LeJEPA) ---------------------------------------------------------------------------

# The Epps-Pulley statistic's expectation for N(0, 1) samples, whatever N: the integral of
# (1 - exp(-t^2)) exp(-t^2/2), i.e. sqrt(2 pi) - sqrt(2 pi / 3). Departures grow with N.
NULL_MEAN = math.sqrt(2 * math.pi) - math.sqrt(2 * math.pi / 3)   # ~1.06


def _gaussian(n=2048, d=16, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_sigreg_is_at_its_null_value_for_isotropic_gaussians_and_large_otherwise():
    gaussian = [float(sigreg(_gaussian(seed=s), step=s)) for s in range(4)]
    assert all(v < 2.0 for v in gaussian), gaussian                  # draws fall in ~0.8-1.5
    assert sum(gaussian) / 4 == pytest.approx(NULL_MEAN, rel=0.3)
    x = _gaussian()
    anisotropic = x.clone()
    anisotropic[:, 0] *= 5.0
    others = {"collapsed": x[:1].expand_as(x), "scaled": 3.0 * x, "anisotropic": anisotropic}
    for name, y in others.items():
        assert float(sigreg(y, step=0)) > 50 * max(gaussian), name   # >= ~200 here


def _reference_epps_pulley(z: np.ndarray, t_max: float = 5.0) -> float:
    """N * integral over [-t_max, t_max] of |phi_N(t) - exp(-t^2/2)|^2 exp(-t^2/2), by quad."""
    def integrand(t):
        g = np.exp(-0.5 * t * t)
        return ((np.cos(t * z).mean() - g) ** 2 + np.sin(t * z).mean() ** 2) * g
    value, _ = quad(integrand, -t_max, t_max, limit=200)
    return len(z) * value


def test_epps_pulley_matches_an_independent_quadrature():
    gen = torch.Generator().manual_seed(0)
    z = torch.stack([torch.randn(300, generator=gen),                           # near the null
                     1.5 * torch.randn(300, generator=gen) + 0.3,               # shifted, wider
                     torch.empty(300).exponential_(generator=gen)], dim=1)      # skewed
    ours = epps_pulley(z.double(), knots=201).tolist()
    reference = [_reference_epps_pulley(z[:, m].double().numpy()) for m in range(z.shape[1])]
    assert ours == pytest.approx(reference, rel=0.01)


def test_sigreg_with_one_slice_is_epps_pulley_on_the_step_seeded_direction():
    x = _gaussian(n=512, d=8) * torch.linspace(0.5, 2.0, 8)
    direction = torch.randn(8, 1, generator=torch.Generator().manual_seed(7))
    direction = direction / direction.norm()
    torch.testing.assert_close(sigreg(x, step=7, slices=1), epps_pulley(x @ direction).mean())


def test_sigreg_projections_are_seeded_by_the_step():
    x = _gaussian(n=512, d=8) * torch.linspace(0.5, 2.0, 8)   # anisotropic: the directions matter
    assert torch.equal(sigreg(x, step=3, slices=16), sigreg(x, step=3, slices=16))
    assert not torch.allclose(sigreg(x, step=3, slices=16), sigreg(x, step=4, slices=16))


def test_sigreg_computes_in_float32_for_bf16_input():
    x = _gaussian(n=512, d=8)
    out = sigreg(x.bfloat16(), step=0, slices=32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, sigreg(x.bfloat16().float(), step=0, slices=32))


def test_sigreg_gradient_spreads_a_nearly_collapsed_batch():
    x = (0.01 * _gaussian(n=256, d=8)).requires_grad_()
    opt = torch.optim.Adam([x], lr=0.05)
    before_std, before = float(x.detach().std(dim=0).mean()), float(sigreg(x.detach(), step=0, slices=64))
    for step in range(50):
        loss = sigreg(x, step=step, slices=64)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after_std, after = float(x.detach().std(dim=0).mean()), float(sigreg(x.detach(), step=0, slices=64))
    assert after_std > 10 * before_std and after < before / 10, (before_std, after_std, before, after)


def test_config_accepts_sigreg_and_rejects_bad_values():
    cfg = CollapseRegConfig.from_config({"variance": 0.0, "covariance": 0.0, "sigreg": 1, "sigreg_slices": 64})
    assert cfg.sigreg == 1.0 and cfg.sigreg_slices == 64 and isinstance(cfg.sigreg_slices, int)
    assert cfg.active and not CollapseRegConfig.from_config({"variance": 0.0, "covariance": 0.0}).active
    with pytest.raises(ValueError, match="task.reg"):
        CollapseRegConfig.from_config({"sigreg": -1.0})
    for slices in (0, 2.5):
        with pytest.raises(ValueError, match="sigreg_slices"):
            CollapseRegConfig.from_config({"sigreg": 1.0, "sigreg_slices": slices})
    with pytest.raises(KeyError, match="sigreg_slices"):   # the allowed keys are listed
        CollapseRegConfig.from_config({"sigreg_slice": 64})


def test_collapse_terms_add_sigreg_of_the_raw_residuals_and_leave_the_old_terms_alone():
    torch.manual_seed(0)
    B, N, E = 8, 64, 16
    idx = torch.arange(N).expand(B, N)
    content = torch.randn(B, N, E) * math.sqrt(B / (B - 1))       # residuals of unit variance
    position = 3.0 * torch.randn(N, E)
    on = CollapseRegConfig(variance=1.0, covariance=0.04, gamma=0.5, sigreg=2.0, sigreg_slices=64)
    with_sigreg = collapse_terms(position + content, idx, N, on, step=5)
    old = collapse_terms(position + content, idx, N, CFG, step=5)
    assert set(old) == {"reg_var", "reg_cov", "reg_sigreg", "content_std"} and old["reg_sigreg"] == 0
    for key in ("reg_var", "reg_cov", "content_std"):
        assert torch.equal(with_sigreg[key], old[key]), key
    # The position part is free: the same value without it; page content that is N(0, I) passes,
    # position-only tokens (no page content) do not.
    sig = with_sigreg["reg_sigreg"]
    assert torch.isfinite(sig) and 0 < sig < 2.0
    torch.testing.assert_close(sig, collapse_terms(content, idx, N, on, step=5)["reg_sigreg"],
                               rtol=1e-4, atol=1e-4)
    position_only = collapse_terms(position.expand(B, N, E), idx, N, on, step=5)["reg_sigreg"]
    assert position_only > 50 * sig


def test_one_page_gives_a_zero_sigreg_with_a_graph():
    tokens = torch.randn(1, 5, 8, requires_grad=True)
    cfg = CollapseRegConfig(sigreg=1.0, sigreg_slices=8)
    out = collapse_terms(tokens, torch.arange(5)[None], 5, cfg)
    assert out["reg_sigreg"] == 0
    out["reg_sigreg"].backward()
