"""Projectors: orthonormal, reproducible from their keys, tucker finds a planted subspace."""
import pytest
import torch

from dociq.optim import projection


def _random(shape, rank, index, refresh, seed=0):
    ranks = projection.mode_ranks(shape, rank)
    return projection.random_factors(shape, ranks, seed, torch.tensor(index),
                                     torch.tensor(refresh))


@pytest.mark.parametrize("shape,rank", [((48, 20), 8), ((16, 8, 3, 3), 4), ((5, 40), 5)])
def test_random_factors_are_orthonormal(shape, rank):
    factors = _random(shape, rank, [0, 1, 2], [0, 0, 3])
    for n, u in zip(shape, factors):
        r = min(rank, n)
        assert u.shape == (3, n, r)
        gram = u.transpose(1, 2) @ u
        torch.testing.assert_close(gram, torch.eye(r).expand(3, r, r), atol=2e-6, rtol=0)


def test_random_factors_reproducible_from_seed_index_and_refresh():
    a = _random((64, 32), 8, [0, 1], [0, 0])
    b = _random((64, 32), 8, [0, 1], [0, 0])
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # Another parameter, refresh count or seed gives another subspace.
    for other in (_random((64, 32), 8, [1, 0], [0, 0]), _random((64, 32), 8, [0, 1], [1, 1]),
                  _random((64, 32), 8, [0, 1], [0, 0], seed=1)):
        overlap = torch.linalg.matrix_norm(a[0].transpose(1, 2) @ other[0]) ** 2 / 8
        # Independent r-dim subspaces of R^n overlap by about r/n = 0.125 on average.
        assert (overlap < 0.6).all(), overlap


def test_project_back_inverts_project_inside_the_subspace():
    shape = (12, 10, 3, 3)
    factors = _random(shape, 4, [0, 1], [0, 0])
    core = torch.randn(2, 4, 4, 3, 3)
    full = projection.project_back(core, factors)
    assert full.shape == (2, *shape)
    torch.testing.assert_close(projection.project(full, factors), core, atol=1e-5, rtol=1e-5)
    # Projection is idempotent and never grows the norm.
    x = torch.randn(2, *shape)
    px = projection.project_back(projection.project(x, factors), factors)
    torch.testing.assert_close(projection.project_back(projection.project(px, factors), factors), px,
                               atol=1e-5, rtol=1e-5)
    assert (px.flatten(1).norm(dim=1) < x.flatten(1).norm(dim=1)).all()


@pytest.mark.parametrize("method", ["svd", "randomized"])
def test_tucker_recovers_planted_low_rank_gradient(method):
    gen = torch.Generator().manual_seed(0)
    n, m, r = 60, 40, 5
    u = torch.linalg.qr(torch.randn(2, n, r, generator=gen))[0]
    v = torch.linalg.qr(torch.randn(2, m, r, generator=gen))[0]
    core = torch.randn(2, r, r, generator=gen) * 10
    grad = u @ core @ v.transpose(1, 2) + 1e-4 * torch.randn(2, n, m, generator=gen)
    factors = projection.tucker_factors(grad, (r, r), method=method)
    for found, planted in zip(factors, (u, v)):
        # Same subspace: the principal angles are ~0, i.e. ||U_found^T U_planted||_F^2 = r.
        overlap = torch.linalg.matrix_norm(found.transpose(1, 2) @ planted) ** 2
        torch.testing.assert_close(overlap, torch.full((2,), float(r)), atol=1e-4, rtol=0)
    recon = projection.project_back(projection.project(grad, factors), factors)
    assert ((recon - grad).flatten(1).norm(dim=1) / grad.flatten(1).norm(dim=1) < 1e-4).all()


def test_tucker_completes_rank_deficient_modes():
    grad = torch.randn(1, 3, 1) * torch.randn(1, 1, 32)     # rank 1, asked for rank 4 on mode 1
    factors = projection.tucker_factors(grad, (3, 4), method="svd")
    u = factors[1][0]
    torch.testing.assert_close(u.T @ u, torch.eye(4), atol=1e-5, rtol=0)


def test_change_of_basis_carries_vectors_shared_by_both_subspaces():
    old = _random((30, 20), 6, [0], [0])
    new = _random((30, 20), 6, [0], [0])
    maps = projection.change_of_basis(new, old)
    core = torch.randn(1, 6, 6)
    torch.testing.assert_close(projection.project(core, maps), core, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["svd", "randomized"])
def test_tucker_factors_match_tensorly_hosvd_on_a_conv_weight(method):
    """tensorly's Tucker with the HOSVD initialisation (no HOOI iterations) is the reference:
    our batched factors span the same per-mode subspaces, for each member of the batch."""
    tl = pytest.importorskip("tensorly")
    from tensorly.decomposition import tucker

    tl.set_backend("pytorch")
    gen = torch.Generator().manual_seed(0)
    # A 4-D (conv-shaped) gradient with a clear spectral gap on every mode.
    ranks = (4, 3, 2, 2)
    core = torch.randn(2, *ranks, generator=gen, dtype=torch.float64) * 10
    mats = [torch.linalg.qr(torch.randn(2, n, r, generator=gen, dtype=torch.float64))[0]
            for n, r in zip((24, 16, 3, 3), ranks)]
    grad = projection.project_back(core, mats) + 1e-3 * torch.randn(2, 24, 16, 3, 3, generator=gen,
                                                                    dtype=torch.float64)
    ours = projection.tucker_factors(grad, ranks, method=method)
    for b in range(2):
        _, reference = tucker(grad[b], rank=list(ranks), init="svd", n_iter_max=0)
        for mode, r in enumerate(ranks):
            overlap = torch.linalg.matrix_norm(ours[mode][b].double().T @ reference[mode]) ** 2
            assert overlap.item() == pytest.approx(r, abs=1e-3), (b, mode)
