"""The anti-collapse regulariser (dociq/training/tasks/collapse.py): it measures across-page content at a
fixed unit, ignores what position alone explains, and its gradient restores that content."""
import pytest
import torch
import torch.nn.functional as F

from dociq.training.tasks.collapse import CollapseRegConfig, collapse_terms, unit_residuals

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
