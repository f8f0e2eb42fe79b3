"""SubspaceNGD: the solve, the failure paths, conv weights, batching, state and resume."""
import io

import pytest
import torch

from dociq.optim.sngd import SubspaceNGD


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48),
                               torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
                               torch.nn.Linear(48, 4))


def _data(seed=1, n=128):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=gen)
    y = torch.tanh(x[:, :4] * 2) + 0.1 * x[:, 4:8]
    return x, y


def _train(model, opt, steps, data=None):
    x, y = data or _data()
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _sngd(model, **kw):
    kw = {"lr": 0.02, "rank": 6, "history": 4, "refresh_every": 5, "min_numel": 200, **kw}
    return SubspaceNGD(model.parameters(), **kw)


def test_woodbury_cholesky_matches_dense_fp64_solve():
    gen = torch.Generator().manual_seed(0)
    B, k, s = 3, 50, 7
    G = torch.randn(B, k, s, generator=gen, dtype=torch.float64)
    g = torch.randn(B, k, generator=gen, dtype=torch.float64)
    group = {"damping": 0.3, "solve_dtype": "float64", "max_retries": 3}
    natural, lam, failed = SubspaceNGD._woodbury_solve(G, g, group)
    assert not failed.any()
    # The documented lambda rule: damping x mean squared norm of a history column.
    torch.testing.assert_close(lam, 0.3 * G.square().sum(dim=(1, 2)) / s)
    dense = torch.linalg.solve(lam[:, None, None] * torch.eye(k, dtype=torch.float64)
                               + G @ G.transpose(1, 2), g.unsqueeze(-1)).squeeze(-1)
    rel = (natural - dense).norm() / dense.norm()
    assert natural.dtype == torch.float64 and rel < 1e-8, rel.item()


def test_cholesky_failure_raises_lambda_and_never_nans():
    # damping=0 and identical history columns: lam I + G^T G is singular (rank 1) in fp32,
    # so the first Cholesky fails and lam must be raised until it succeeds.
    col = torch.randn(1, 30, 1, generator=torch.Generator().manual_seed(0))
    G = col.repeat(1, 1, 5)
    group = {"damping": 0.0, "solve_dtype": "float32", "max_retries": 8}
    natural, lam, failed = SubspaceNGD._woodbury_solve(G, col[..., 0], group)
    assert not failed.any()
    assert torch.isfinite(natural).all()
    scale = G.square().sum() / 5          # the Gram diagonal: lam was raised to >= 1e-6 of it
    assert lam.item() >= 0.99e-6 * scale.item()
    # g lies in the history span, so the natural direction is (up to fp32 cancellation) g's.
    cos = torch.nn.functional.cosine_similarity(natural, col[..., 0])
    assert cos.item() > 0.95
    _, info = torch.linalg.cholesky_ex(G.transpose(1, 2) @ G)
    assert info.item() > 0   # the unregularised system really does fail


def test_optimizer_survives_singular_fisher_end_to_end():
    model = _mlp()
    opt = _sngd(model, damping=0.0, solve_dtype="float32")
    x, y = _data()
    for _ in range(6):    # same batch every step: history columns nearly identical
        _train(model, opt, 1, (x, y))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_gradient_skips_the_step():
    model = _mlp()
    opt = _sngd(model)
    _train(model, opt, 2)
    before = [p.detach().clone() for p in model.parameters()]
    state_before = {k: v.clone() for k, v in opt.state[model[2].weight].items() if torch.is_tensor(v)}
    loss = torch.nn.functional.mse_loss(model(_data()[0]), _data()[1])
    opt.zero_grad()
    loss.backward()
    model[2].weight.grad[0, 0] = float("nan")
    with pytest.warns(RuntimeWarning, match="non-finite gradient"):
        opt.step()
    assert opt.skipped_steps == 1
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p)
    for key, value in state_before.items():
        assert torch.equal(value, opt.state[model[2].weight][key])
    assert opt.state[model[2].weight]["step"] == 2


@pytest.mark.parametrize("projector", ["random", "tucker", "coordinates"])
def test_zero_gradient_leaves_a_parameter_and_its_state_alone(projector):
    """A head that did not reach the loss this step (exactly zero gradient) is not stepped, as if
    its gradient were None; from its very first step that used to be a 0/0 solve (NaN weights)."""
    model = _mlp()
    opt = _sngd(model, projector=projector)
    idle = model[2].weight
    x, y = _data()
    for step in range(4):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step in (0, 2, 3):
            idle.grad.zero_()
        before = idle.detach().clone()
        state = {k: v.clone() for k, v in opt.state[idle].items() if torch.is_tensor(v)} if idle in opt.state else {}
        opt.step()
        if step in (0, 2, 3):
            assert torch.equal(idle, before)
            for key, value in state.items():
                assert torch.equal(value, opt.state[idle][key]), key
        else:
            assert not torch.equal(idle, before)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert opt.state[idle]["step"] == 1 and opt.skipped_steps == 0


def test_vanishing_gradients_keep_weights_finite():
    torch.manual_seed(0)
    for size in (1e-20, 1e-38, 1e-42):
        weight = torch.nn.Parameter(torch.randn(64, 64))
        opt = SubspaceNGD([weight], lr=1e-3, rank=8, min_numel=16)
        for _ in range(3):
            weight.grad = torch.randn(64, 64) * size
            opt.step()
        assert torch.isfinite(weight).all(), size



@pytest.mark.parametrize("projector", ["random", "tucker", "coordinates"])
def test_loss_falls_and_state_is_small(projector):
    model = _mlp()
    opt = _sngd(model, projector=projector)
    losses = _train(model, opt, 40)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    w = model[2].weight                              # 48 x 48, rank 6: k = 36
    st = opt.state[w]
    assert st["history"].shape == (36, 4) and st["momentum"].shape == (36,)
    state_bytes = sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    factor_bytes = 2 * 48 * 6 * 4 if projector == "tucker" else 0
    assert state_bytes == (36 * 4 + 36 + 1) * 4 + factor_bytes       # + residual_norm (a scalar)
    assert state_bytes / w.numel() < (1.5 if projector == "tucker" else 0.5)


@pytest.mark.parametrize("projector", ["tucker", "coordinates"])
def test_conv_weights_are_projected_along_all_four_modes(projector):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    x = torch.randn(32, 3, 8, 8)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long()
    opt = SubspaceNGD(net.parameters(), lr=0.01, rank=4, history=4, refresh_every=10,
                      min_numel=200, projector=projector)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    st = opt.state[net[2].weight]                     # 16 x 16 x 3 x 3 -> 4 x 4 x 3 x 3
    assert st["momentum"].shape == (4 * 4 * 3 * 3,)
    if projector == "tucker":
        assert [st[f"factor{m}"].shape for m in range(4)] == [(16, 4), (16, 4), (3, 3), (3, 3)]
    else:   # index sets, a function of the name: nothing stored
        assert [f.shape for f in opt.factors_of(net[2].weight)] == [(4,), (4,), (3,), (3,)]
        assert not any(key.startswith("factor") for key in st)


def test_batched_buckets_equal_one_parameter_at_a_time():
    """Matrices with the same ranks share a bucket (whatever their shapes); the result must
    not depend on it."""
    a, b = _mlp(), _mlp()
    opt_a = _sngd(a)
    # One param group per parameter: every bucket has a single member.
    opt_b = SubspaceNGD([{"params": [p]} for p in b.parameters()], lr=0.02, rank=6, history=4,
                        refresh_every=5, min_numel=200)
    assert max(len(m) for m in opt_a.layout["buckets"].values()) == 3
    _train(a, opt_a, 12)
    _train(b, opt_b, 12)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)


def test_gradient_accumulation_counts_optimizer_steps():
    model = _mlp()
    opt = _sngd(model)
    x, y = _data()
    for _ in range(3):      # three micro-batches, one optimizer step
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert opt.state[model[2].weight]["step"] == 1
    assert opt.state[model[2].weight]["history"][:, 1:].abs().sum() == 0   # one column filled


def _save_load(opt_state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(opt_state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("projector,fallback", [("random", "adamw"), ("tucker", "factored")])
def test_state_dict_round_trip_weights_only(projector, fallback):
    model = _mlp()
    opt = _sngd(model, projector=projector, fallback=fallback)
    _train(model, opt, 7)
    loaded = _save_load(opt.state_dict())
    fresh = _sngd(_mlp(), projector=projector, fallback=fallback)
    fresh.load_state_dict(loaded)
    for p_old, p_new in zip(model.parameters(), fresh.param_groups[0]["params"]):
        old, new = opt.state[p_old], fresh.state[p_new]
        assert old.keys() == new.keys()
        for key in old:
            if torch.is_tensor(old[key]):
                assert new[key].dtype == old[key].dtype and torch.equal(new[key], old[key])
            else:
                assert new[key] == old[key]


@pytest.mark.parametrize("projector", ["random", "tucker", "coordinates"])
def test_resume_is_bit_exact(projector):
    n = 12                                            # refresh_every=5: resume mid-period
    straight = _mlp()
    opt = _sngd(straight, projector=projector)
    _train(straight, opt, n)

    first = _mlp()
    opt1 = _sngd(first, projector=projector)
    _train(first, opt1, n // 2)
    saved = _save_load({"model": first.state_dict(), "optim": opt1.state_dict()})
    second = _mlp(seed=123)                           # different init: everything must come from the file
    second.load_state_dict(saved["model"])
    opt2 = _sngd(second, projector=projector)
    opt2.load_state_dict(saved["optim"])
    _train(second, opt2, n - n // 2)
    for a, b in zip(straight.parameters(), second.parameters()):
        assert torch.equal(a, b)


def test_bad_configuration_names_the_key():
    with pytest.raises(ValueError, match="projector='qr'.*configs/optim/sngd.yaml"):
        _sngd(_mlp(), projector="qr")
    with pytest.raises(ValueError, match="rank"):
        _sngd(_mlp(), rank=0)


def test_max_share_sends_matrices_the_subspace_would_mostly_fill_to_adamw():
    wide, narrow = torch.nn.Parameter(torch.randn(64, 256)), torch.nn.Parameter(torch.randn(32, 256))
    # rank 32: the wide matrix's subspace holds 1024 / 16384 = 1/16 of it, the narrow one's 1/8
    opt = SubspaceNGD([wide, narrow], lr=1e-3, rank=32, max_share=1 / 16)
    group = opt.param_groups[0]
    assert opt.is_projected(wide, group) and not opt.is_projected(narrow, group)
    default = SubspaceNGD([wide, narrow], lr=1e-3, rank=32)
    assert all(default.is_projected(p, default.param_groups[0]) for p in (wide, narrow))
    for p in (wide, narrow):
        p.grad = torch.randn_like(p)
    opt.step()
    assert "history" in opt.state[wide] and "exp_avg" in opt.state[narrow]
    with pytest.raises(ValueError, match="max_share"):
        SubspaceNGD([wide], max_share=0)


def test_resume_with_the_factorys_param_groups_is_bit_exact():
    """The recipe's groups (projected / fallback x decay / no decay): the fallback's groups that
    share settings step together, before and after a state dict is loaded (which turns tuples
    into lists)."""
    from dociq.optim import factory

    def build(model):
        return factory.sngd(list(model.named_parameters()), lr=0.02, rank=6, history=4,
                            refresh_every=5, min_numel=200, projector="coordinates")

    straight = _mlp()
    _train(straight, build(straight), 8)
    first = _mlp()
    opt1 = build(first)
    assert len(opt1.param_groups) > 1
    _train(first, opt1, 4)
    saved = _save_load({"model": first.state_dict(), "optim": opt1.state_dict()})
    second = _mlp(seed=123)
    second.load_state_dict(saved["model"])
    opt2 = build(second)
    opt2.load_state_dict(saved["optim"])
    _train(second, opt2, 4)
    for a, b in zip(straight.parameters(), second.parameters()):
        assert torch.equal(a, b)


def test_coordinates_step_the_block_of_a_channels_last_weight():
    """The block's offsets follow the tensor's strides: a channels-last conv trains as its
    contiguous twin does (to rounding: the convolutions themselves differ in order)."""
    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    x = torch.randn(16, 3, 8, 8)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long()
    nets = [net(), net().to(memory_format=torch.channels_last)]
    assert not nets[1][2].weight.is_contiguous()
    for model in nets:
        opt = SubspaceNGD(model.parameters(), lr=0.01, rank=4, history=4, refresh_every=10,
                          min_numel=200, projector="coordinates")
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(x if model is nets[0] else
                                                           x.to(memory_format=torch.channels_last)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    moved = (nets[0][2].weight - net()[2].weight).detach().abs().max()
    assert moved > 1e-3
    torch.testing.assert_close(nets[1][2].weight, nets[0][2].weight, atol=1e-5 * float(moved) + 1e-6, rtol=1e-4)


def test_a_weight_that_is_not_dense_in_memory_is_named():
    w = torch.nn.Parameter(torch.randn(64, 128)[:, ::2])          # every other column of a buffer
    opt = SubspaceNGD([w], lr=0.01, rank=4, min_numel=200, projector="coordinates")
    w.grad = torch.randn(64, 64)
    with pytest.raises(ValueError, match=r"shape \(64, 64\).*not dense.*contiguous"):
        opt.step()
