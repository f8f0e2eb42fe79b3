"""The defects of issue 12 item 4, one test each: lambda after a reset refresh, the counted and
reported Cholesky fallback, tucker's HOSVD at step 0, name-keyed subspaces on resume with a
parameter frozen, and buckets capped by a byte budget."""
import warnings

import pytest
import torch

from dociq.optim import factory
from dociq.optim.sngd import SubspaceNGD


def _param(shape=(64, 48), seed=0):
    return torch.nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)))


def test_lambda_after_a_reset_refresh_divides_by_the_stored_gradients():
    """History 4, reset every 5 steps: right after the reset only the current gradient is stored,
    so F = lam I + g g^T with lam = damping |g|^2 / 1 and F^-1 g = g / (2 |g|^2); the old rule
    divided by min(t+1, s) = 4 (lam 4x too small: F^-1 g = g / (1.25 |g|^2))."""
    w = _param()
    opt = SubspaceNGD([w], lr=1e-3, rank=8, history=4, refresh_every=5, refresh_policy="reset",
                      damping=1.0, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    checked = False
    for t in range(12):
        w.grad = torch.randn(w.shape, generator=gen)
        opt.step()
        hist, mom = opt.state[w]["history"], opt.state[w]["momentum"]
        stored = (hist.square().sum(dim=0) > 0).sum().item()
        if t >= 4 and stored == 1:                      # this step's refresh emptied the history
            g_norm = hist.square().sum().sqrt()
            # momentum was reset too, so it is exactly F^-1 g: |F^-1 g| |g| = 1 / (1 + damping)
            torch.testing.assert_close(mom.norm() * g_norm, torch.tensor(0.5), rtol=1e-4, atol=0)
            checked = True
    assert checked, "no reset refresh happened in 12 steps"


def test_cholesky_fallback_is_counted_and_warned_once():
    """damping 0, identical gradients, no retries: lam I + G^T G is singular, every factorisation
    fails; each such (matrix, step) is counted and one warning names the count."""
    w = _param((40, 40))
    opt = SubspaceNGD([w], lr=1e-3, rank=8, history=4, damping=0.0, solve_dtype="float32",
                      max_retries=0)
    g = torch.randn(40, 40, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            w.grad = g.clone()
            opt.step()
        count = opt.fallback_steps
    fallback_warnings = [str(c.message) for c in caught if "Cholesky" in str(c.message)]
    assert count >= 2, count
    assert len(fallback_warnings) == 1, fallback_warnings
    assert "max_retries" in fallback_warnings[0] and "damping" in fallback_warnings[0]
    assert any(ch.isdigit() for ch in fallback_warnings[0].split("for")[1].split("(")[0])
    assert torch.isfinite(w).all()


def test_tucker_uses_hosvd_from_step_zero():
    """Every tucker matrix takes the HOSVD of its step-0 gradient (not a random subspace until
    its staggered refresh): tensorly's HOSVD of that gradient spans the same subspaces."""
    tl = pytest.importorskip("tensorly")
    from tensorly.decomposition import tucker

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Tanh(), torch.nn.Linear(40, 40),
                              torch.nn.Tanh(), torch.nn.Linear(40, 40), torch.nn.Tanh(),
                              torch.nn.Linear(40, 30))
    opt = SubspaceNGD(net.parameters(), lr=1e-3, rank=4, refresh_every=50, projector="tucker",
                      tucker_method="svd", min_numel=200)
    x = torch.randn(64, 24, generator=torch.Generator().manual_seed(3))
    net(x).square().mean().backward()
    grads = {p: p.grad.double().clone() for p in net.parameters()}
    opt.step()
    tl.set_backend("pytorch")
    projected = [p for g in opt.param_groups for p in g["params"] if opt.is_projected(p, g)]
    assert len(projected) == 4
    for p in projected:
        assert "factor0" in opt.state[p], "no HOSVD at step 0"
        _, reference = tucker(grads[p], rank=[4, 4], init="svd", n_iter_max=0)
        for mode in range(2):
            ours = opt.state[p][f"factor{mode}"].double()
            overlap = torch.linalg.matrix_norm(ours.T @ reference[mode]) ** 2   # = r when equal spans
            assert overlap.item() == pytest.approx(4.0, abs=1e-4)


class Three(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(32, 48)
        self.b = torch.nn.Linear(48, 48)
        self.c = torch.nn.Linear(48, 48)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def test_random_subspaces_are_keyed_by_name_and_survive_a_frozen_parameter_on_resume():
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(4))
    kw = dict(lr=1e-2, rank=6, history=3, refresh_every=4, min_numel=200)
    model = Three()
    opt = factory.sngd(list(model.named_parameters()), **kw)
    for _ in range(5):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    saved = opt.state_dict()
    before = {n: opt.factors_of(p) for n, p in model.named_parameters() if n in ("b.weight", "c.weight")}

    resumed = Three()
    resumed.load_state_dict(model.state_dict())
    resumed.a.weight.requires_grad_(False)              # frozen on resume: not in the optimizer
    opt2 = factory.sngd(list(resumed.named_parameters()), **kw)
    opt2.load_state_dict(saved)
    for name in ("b.weight", "c.weight"):
        p_old, p_new = model.get_parameter(name), resumed.get_parameter(name)
        for f_old, f_new in zip(before[name], opt2.factors_of(p_new)):
            assert torch.equal(f_old, f_new), name
        for key in ("history", "momentum"):
            assert torch.equal(opt.state[p_old][key], opt2.state[p_new][key]), (name, key)
    assert resumed.a.weight not in opt2.state


def test_buckets_are_capped_by_bytes_and_give_the_same_result():
    def run(cap):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(48, 48) for _ in range(4)])
        opt = SubspaceNGD(net.parameters(), lr=1e-2, rank=6, history=3, refresh_every=3,
                          min_numel=200, max_bucket_bytes=cap)
        x = torch.randn(16, 48, generator=torch.Generator().manual_seed(5))
        for _ in range(7):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        return opt, [p.detach().clone() for p in net.parameters()]

    capped, w_capped = run(2 * 48 * 48 * 4)             # two fp32 48 x 48 matrices per bucket
    whole, w_whole = run(64 * 2 ** 20)
    assert sorted(len(m) for m in capped.layout["buckets"].values()) == [2, 2]
    assert sorted(len(m) for m in whole.layout["buckets"].values()) == [4]
    for a, b in zip(w_capped, w_whole):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="max_bucket_bytes"):
        SubspaceNGD([_param()], max_bucket_bytes=0)
