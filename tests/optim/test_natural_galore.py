"""Natural GaLore, the benchmark's rival: its natural gradient against a dense fp64 solve, its first
step against galore-torch's GaLoreAdamW, its window across a subspace refresh, and a loss that falls."""
import pytest
import torch
from galore_torch import GaLoreAdamW

from dociq.optim import factory
from dociq.optim.natural_galore import NaturalGaLoreAdamW


def _weight(seed=0, shape=(24, 16)):
    torch.manual_seed(seed)
    return torch.nn.Parameter(torch.randn(*shape))


def _group(p, **kw):
    return [{"params": [p], "rank": 4, "update_proj_gap": 100, "scale": 0.25, "proj_type": "std", **kw}]


def test_natural_gradient_is_the_inverse_fisher_of_the_window_times_the_projected_gradient():
    p = _weight()
    opt = NaturalGaLoreAdamW(_group(p, history=3, damping=0.5), lr=1e-3, no_deprecation_warning=True)
    state = opt.state[p]
    state["step"] = 0
    group = opt.param_groups[0]
    lows = []
    for t in range(5):                           # more steps than the window: the ring wraps
        g = torch.randn(24, 16, generator=torch.Generator().manual_seed(10 + t))
        natural = NaturalGaLoreAdamW._natural(group, state, g)
        basis = state["projector"].ortho_matrix.double()
        lows.append(basis.t() @ g.double() if basis.shape[0] == 24 else g.double() @ basis.t())
        state["step"] += 1
        window = torch.stack([x.reshape(-1) for x in lows[-3:]], dim=1)          # [k, <= s]
        lam = 0.5 * window.square().sum(0).mean()
        fisher = lam * torch.eye(window.shape[0], dtype=torch.float64) + window @ window.t()
        expected = torch.linalg.solve(fisher, lows[-1].reshape(-1))
        torch.testing.assert_close(natural.double().reshape(-1), expected, rtol=1e-4, atol=1e-6 * expected.abs().max())


def test_first_step_is_galores_and_later_steps_are_not():
    """With one projected gradient in the window, F^-1 g only rescales g, and Adam's first step
    (eps 0) does not see a scale: step 1 equals galore-torch's; later steps differ."""
    a, b = _weight(1), _weight(1)
    grads = [torch.randn(24, 16, generator=torch.Generator().manual_seed(t)) for t in range(3)]
    ref = GaLoreAdamW(_group(a), lr=1e-2, eps=0.0, no_deprecation_warning=True)
    nat = NaturalGaLoreAdamW(_group(b, history=4), lr=1e-2, eps=0.0, no_deprecation_warning=True)
    for t, g in enumerate(grads):
        a.grad, b.grad = g.clone(), g.clone()
        ref.step()
        nat.step()
        if t == 0:
            torch.testing.assert_close(a.data, b.data)
    assert not torch.allclose(a.data, b.data, atol=1e-6)


def test_window_is_cleared_when_the_subspace_refreshes():
    p = _weight(2)
    opt = NaturalGaLoreAdamW(_group(p, history=4, update_proj_gap=3), lr=1e-3, no_deprecation_warning=True)
    for t in range(4):
        p.grad = torch.randn(24, 16, generator=torch.Generator().manual_seed(t))
        opt.step()
    hist = opt.state[p]["history"]
    # steps 0-2 in the first subspace, step 3 refreshed it: one column left, at slot 3 % 4
    assert (hist.abs().sum(0) > 0).tolist() == [False, False, False, True]


def test_loss_falls_on_a_least_squares_problem():
    torch.manual_seed(0)
    x, w_true = torch.randn(256, 16), torch.randn(16, 24)
    y = x @ w_true
    model = torch.nn.Linear(16, 24, bias=False)
    opt = factory.natural_galore(list(model.named_parameters()), rank=8, update_proj_gap=20, scale=1.0,
                                 lr=3e-2, weight_decay=0.0)
    losses = []
    for _ in range(150):
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]
