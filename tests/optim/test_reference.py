"""The fast step (cached factors, bucket buffers, lam ladder, per-matrix addmm) equals the
straightforward fp64 reference in tests/optim/reference_sngd.py, and the other
preconditioners / the graft do what docs/optim.md says."""
import math

import pytest
import torch

from dociq.optim.sngd import SubspaceNGD
from tests.optim.reference_sngd import ReferenceSNGD

SHAPES = {"w1": (48, 40), "w2": (48, 48), "w3": (48, 48), "w4": (30, 48)}


def _weights(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(0.1 * torch.randn(*s, generator=gen))) for n, s in SHAPES.items()]


def _grads(steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    # A fixed rank-6 signal plus noise: a spectral gap after the 6th singular value, so fp32 and
    # fp64 HOSVDs find the same subspace (a degenerate spectrum would amplify rounding).
    out = []
    base = {n: torch.randn(s[0], 6, generator=gen) @ torch.randn(6, s[1], generator=gen)
            for n, s in SHAPES.items()}
    for _ in range(steps):
        out.append({n: base[n] + 0.5 * torch.randn(*s, generator=gen) for n, s in SHAPES.items()})
    return out


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("projector,policy", [("random", "carry"), ("random", "reset"),
                                              ("tucker", "carry"), ("tucker", "reset"),
                                              ("coordinates", "carry"), ("coordinates", "reset")])
def test_fast_step_matches_the_reference(projector, policy, residual):
    # residual_growth 1.05: the limiter binds on some tucker steps here (a stale subspace), so
    # both of its branches are compared.
    cfg = dict(lr=3e-3, rank=6, history=4, damping=0.5, momentum=0.9, weight_decay=0.1,
               refresh_every=5, projector=projector, refresh_policy=policy, residual=residual,
               residual_growth=1.05)
    fast_params, ref_params = _weights(), _weights()
    fast = SubspaceNGD(fast_params, min_numel=64, tucker_method="svd", **cfg)
    ref = ReferenceSNGD(ref_params, **cfg)
    # One bucket: every matrix has ranks (6, 6), whatever its shape.
    assert sorted(len(m) for m in fast.layout["buckets"].values()) == [4]
    for grads in _grads(13):
        for (n, p), (_, q) in zip(fast_params, ref_params):
            p.grad, q.grad = grads[n].clone(), grads[n].clone()
        fast.step()
        ref.step()
    for (n, p), (_, q) in zip(fast_params, ref_params):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=lambda m, n=n: f"{n}: {m}")   # fp32 vs fp64: ~1e-6
    assert fast.fallback_steps == 0


@pytest.mark.parametrize("residual", [False, True])
def test_update_rms_per_weight_is_lr_times_scale(residual):
    """The graft gives a projected matrix an update of RMS lr * scale per weight (AdamW's
    normalised step has RMS ~1 per weight, so lr transfers between the two), with or without
    the residual."""
    for scale in (1.0, 0.3):
        (_, w), = _weights()[:1]
        before = w.detach().clone()
        opt = SubspaceNGD([w], lr=1e-2, rank=6, scale=scale, weight_decay=0.0, min_numel=64,
                          residual=residual)
        w.grad = torch.randn_like(w)
        opt.step()
        rms = (w - before).square().mean().sqrt().item()
        assert rms == pytest.approx(1e-2 * scale, rel=1e-5)


def _history(k=30, s=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, k, s, generator=gen, dtype=torch.float64),
            torch.randn(2, k, generator=gen, dtype=torch.float64))


def test_inverse_sqrt_matches_a_dense_matrix_power():
    G, g = _history()
    group = {"damping": 0.7, "solve_dtype": "float64"}
    ours = SubspaceNGD._inverse_sqrt(G, g, group)
    lam = 0.7 * G.square().sum(dim=(1, 2)) / 5
    F = lam[:, None, None] * torch.eye(30, dtype=torch.float64) + G @ G.transpose(1, 2)
    evals, evecs = torch.linalg.eigh(F)
    dense = (evecs @ torch.diag_embed(evals.rsqrt()) @ evecs.transpose(1, 2) @ g.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ours, dense, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("preconditioner", ["none", "adam", "sqrt", "ngd"])
def test_every_preconditioner_trains(preconditioner):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48),
                              torch.nn.Tanh(), torch.nn.Linear(48, 4))
    opt = SubspaceNGD(net.parameters(), lr=0.02, rank=6, history=4, refresh_every=5,
                      min_numel=200, preconditioner=preconditioner)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 20, generator=gen)
    y = torch.tanh(x[:, :4] * 2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    st = opt.state[net[2].weight]
    assert ("exp_avg_sq" in st) == (preconditioner == "adam")


def test_none_preconditioner_is_normalised_momentum_of_the_projected_gradient():
    """NGD off: the update direction is the momentum of g_low itself."""
    (_, w), = _weights()[:1]
    opt = SubspaceNGD([w], lr=1e-2, rank=6, preconditioner="none", min_numel=64, momentum=0.0,
                      residual=False)
    w.grad = torch.randn_like(w)
    g = w.grad.clone()
    before = w.detach().clone()
    opt.step()
    u, v = opt.subspace_of(w)
    low = u.T @ g @ v
    expected = u @ (low * (math.sqrt(w.numel()) / low.norm())) @ v.T
    torch.testing.assert_close(before - w.detach(), 1e-2 * expected, atol=1e-7, rtol=1e-5)
