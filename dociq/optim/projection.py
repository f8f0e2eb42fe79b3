"""Orthonormal per-mode projectors for SubspaceNGD, batched over same-shaped parameters.

A parameter of shape (n1, ..., nd) is projected along every mode i by an orthonormal
Ui (ni x ri): low = g x1 U1^T ... xd Ud^T, and back: g = low x1 U1 ... xd Ud.
All functions take a leading batch dimension B (a stack of same-shaped parameters), so the
optimizer never loops over parameters in Python.

Three kinds of projector:
- `coordinate_factors`: r_i of the n_i coordinates of every mode, chosen at random from the same
  keys (GRASS-style structured sparse projection): U_i = I[:, S_i], held as the index set S_i
  (int64). Projecting gathers an r_1 x ... x r_d block of the gradient and projecting back adds
  into that block: no matmul, no n x r temporaries. `project`, `project_back` and
  `change_of_basis` take index factors as they take dense ones.
- `random_factors`: randomly permuted, sign-flipped columns of the DCT-II basis, generated from
  integer keys (seed, parameter key, refresh count) by a counter-based hash. The parameter key
  is a hash of the parameter's name (`name_key`), so adding or freezing another parameter does
  not move this one's subspace. Every DDP rank gets the same subspace, generation is batched
  and runs on the parameter's device.
- `tucker_factors`: truncated HOSVD of the current gradient (leading left singular vectors of
  every mode unfolding), batched `torch.linalg.svd` or a batched randomized range finder.
"""
from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch

Tensor = torch.Tensor


def name_key(name: str, salt: str = "") -> int:
    """A stable signed int64 from a parameter name (blake2b; Python's hash() is salted per process)."""
    digest = hashlib.blake2b((salt + name).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def mode_ranks(shape: Sequence[int], rank: int) -> tuple[int, ...]:
    """r_i = min(rank, n_i) for every mode."""
    return tuple(min(rank, n) for n in shape)


# ---------------------------------------------------------------- counter-based Gaussian RNG
def _i64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    return c - (1 << 64) if c >= (1 << 63) else c


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)


def _srl(x: Tensor, k: int) -> Tensor:
    """Logical right shift on int64 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(x: Tensor) -> Tensor:
    # int64 arithmetic wraps modulo 2**64, which is what the hash needs.
    z = x + _GOLDEN
    z = (z ^ _srl(z, 30)) * _MIX1
    z = (z ^ _srl(z, 27)) * _MIX2
    return z ^ _srl(z, 31)


def hashed_bits(keys: Tensor, count: int) -> Tensor:
    """[B, count] pseudo-random int64: the splitmix64 sequence seeded by each key in `keys` [B]."""
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=keys.device) * _GOLDEN
    return _splitmix64(keys.to(torch.int64)[:, None] + steps[None, :] - _GOLDEN)


def projector_keys(seed: int, param_index: Tensor, refresh_count: Tensor, mode: int) -> Tensor:
    """One int64 key per (seed, parameter, refresh, mode); distinct tuples give distinct keys."""
    key = torch.full_like(param_index, seed, dtype=torch.int64)
    for part in (param_index, refresh_count, torch.full_like(param_index, mode)):
        key = _splitmix64(key ^ part.to(torch.int64))
    return key


def random_factors(shape: Sequence[int], ranks: Sequence[int], seed: int,
                   param_index: Tensor, refresh_count: Tensor,
                   dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """Orthonormal [B, n_i, r_i] per mode, a pure function of (seed, index, refresh count).

    U = P D C[:, S]: r_i columns S of the orthonormal DCT-II basis C of size n_i, chosen at
    random, with rows randomly permuted (P) and sign-flipped (D) — the subsampled randomized
    trigonometric transform of the sketching literature. It is exactly orthonormal without a
    QR, and costs 3 n_i hashes per factor instead of n_i r_i Gaussians, so it is regenerated
    every step instead of being stored (measured in docs/optim.md).
    """
    factors = []
    for mode, (n, r) in enumerate(zip(shape, ranks)):
        keys = projector_keys(seed, param_index.to(torch.int64), refresh_count.to(torch.int64), mode)
        bits = hashed_bits(keys, 3 * n)
        rows = torch.argsort(bits[:, :n], dim=1, stable=True)            # P
        cols = torch.argsort(bits[:, n:2 * n], dim=1, stable=True)[:, :r]  # S
        signs = (bits[:, 2 * n:] & 1) * 2 - 1                             # D
        # cos(pi (2i+1) f / 2n) with the phase reduced exactly in integers (period 4n), so a
        # float32 cos of a small angle is accurate to ~1e-7. int32 when (2n-1)(n-1) fits, and
        # in-place ops: the temporaries of a refresh stay at ~2 x n r x 4 bytes.
        itype = torch.int32 if 2 * n * n < 2 ** 31 else torch.int64
        phase = (2 * rows[:, :, None] + 1).to(itype) * cols[:, None, :].to(itype)
        phase.remainder_(4 * n)
        basis = phase.to(torch.float32).mul_(math.pi / (2.0 * n)).cos_()
        del phase
        norm = torch.where(cols == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n)).to(torch.float32)
        basis.mul_(signs.to(torch.float32)[:, :, None]).mul_(norm[:, None, :])   # D and scaling
        factors.append(basis.to(dtype))
    return factors


def coordinate_factors(shape: Sequence[int], ranks: Sequence[int], seed: int,
                       param_index: Tensor, refresh_count: Tensor) -> list[Tensor]:
    """Index factors [B, r_i] (int64, ascending) per mode, a pure function of (seed, index, refresh
    count): the first r_i entries of a random permutation of range(n_i), i.e. the columns
    S_i of U_i = I[:, S_i], which is exactly orthonormal. Ascending order keeps the gathers
    and scatters of a projection in memory order."""
    factors = []
    for mode, (n, r) in enumerate(zip(shape, ranks)):
        keys = projector_keys(seed, param_index.to(torch.int64), refresh_count.to(torch.int64), mode)
        chosen = torch.argsort(hashed_bits(keys, n), dim=1, stable=True)[:, :r]
        factors.append(chosen.sort(dim=1).values)
    return factors


def is_index(factors: Sequence[Tensor]) -> bool:
    """Whether these factors are coordinate index sets (`coordinate_factors`), not dense bases."""
    return not factors[0].is_floating_point()


def block_index(index: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """Open-mesh indices [B, 1, ..], [B, r_1, 1, ..], ... selecting the batched r_1 x .. x r_d block."""
    d, batch = len(index), index[0].shape[0]
    lead = torch.arange(batch, device=index[0].device).view(batch, *([1] * d))
    return (lead, *(idx.view(batch, *[idx.shape[1] if j == i else 1 for j in range(d)])
                    for i, idx in enumerate(index)))


# ---------------------------------------------------------------- Tucker / HOSVD projector
def unfold(x: Tensor, mode: int) -> Tensor:
    """Batched mode-`mode` unfolding: [B, n1..nd] -> [B, n_mode, prod(others)]."""
    if x.dim() == 3:
        return x if mode == 0 else x.transpose(1, 2)     # a view: no copy of a matrix gradient
    return torch.movedim(x, mode + 1, 1).reshape(x.shape[0], x.shape[mode + 1], -1)


def tucker_factors(grads: Tensor, ranks: Sequence[int], method: str = "svd",
                   oversample: int = 8, power_iters: int = 2) -> list[Tensor]:
    """Truncated HOSVD factors of a stack of gradients [B, n1..nd] -> [B, n_i, r_i] per mode.

    method="svd": exact batched thin SVD of each unfolding. method="randomized": batched
    randomized range finder (Halko et al.) with `power_iters` power iterations — cheaper when
    r_i is much smaller than n_i. See docs/optim.md for the measured timings.
    """
    x = grads.to(torch.float32)
    factors = []
    for mode, r in enumerate(ranks):
        a = unfold(x, mode)
        n, m = a.shape[1], a.shape[2]
        if r >= n:
            # Full rank along this mode: any orthonormal basis is exact; use the identity.
            factors.append(torch.eye(n, dtype=x.dtype, device=x.device).expand(a.shape[0], n, n).clone())
            continue
        if method == "svd":
            u = torch.linalg.svd(a, full_matrices=False)[0][..., :r]
        elif method == "randomized":
            q = min(r + oversample, n, m)
            omega = torch.randn(a.shape[0], m, q, dtype=a.dtype, device=a.device,
                                generator=torch.Generator(device=a.device).manual_seed(mode))
            y = torch.linalg.qr(a @ omega)[0]
            for _ in range(power_iters):
                y = torch.linalg.qr(a @ (a.transpose(1, 2) @ y))[0]
            small_u = torch.linalg.svd(y.transpose(1, 2) @ a, full_matrices=False)[0]
            u = (y @ small_u)[..., :r]
        else:
            raise ValueError(f"tucker method must be 'svd' or 'randomized', got {method!r}")
        factors.append(_complete_basis(u, r))
    return factors


def _complete_basis(u: Tensor, r: int) -> Tensor:
    """Extend orthonormal columns u [B, n, c] to r columns when the unfolding has rank c < r
    (e.g. a 3 x 32 weight asked for rank 4 along its long mode)."""
    c = u.shape[-1]
    if c >= r:
        return u
    gen = torch.Generator(device=u.device).manual_seed(r)
    extra = torch.randn(u.shape[0], u.shape[1], r - c, dtype=u.dtype, device=u.device, generator=gen)
    extra = extra - u @ (u.transpose(1, 2) @ extra)
    return torch.cat([u, torch.linalg.qr(extra)[0]], dim=2)


# ---------------------------------------------------------------- apply projectors
def _mode_matmul(x: Tensor, mode: int, mat: Tensor) -> Tensor:
    """x [B, ...] times mat [B, a, b] along axis mode+1 (size a -> b)."""
    x = torch.movedim(x, mode + 1, -1)
    lead = x.shape[1:-1]
    out = x.reshape(x.shape[0], -1, x.shape[-1]) @ mat
    return torch.movedim(out.reshape(x.shape[0], *lead, mat.shape[-1]), -1, mode + 1)


def project(x: Tensor, factors: Sequence[Tensor]) -> Tensor:
    """[B, n1..nd] -> core [B, r1..rd]."""
    if is_index(factors):
        return x[block_index(factors)]
    if len(factors) == 2:
        # U^T X V with bmm on transposed views: no transposed copy of X.
        u, v = factors
        return (u.to(x.dtype).transpose(1, 2) @ x) @ v.to(x.dtype)
    for mode, u in enumerate(factors):
        x = _mode_matmul(x, mode, u.to(x.dtype))
    return x


def project_back(core: Tensor, factors: Sequence[Tensor],
                 shape: Sequence[int] | None = None) -> Tensor:
    """core [B, r1..rd] -> [B, n1..nd]; index factors need the full `shape` (n1..nd)."""
    if is_index(factors):
        if shape is None:
            raise ValueError("project_back: index factors (projector='coordinates') need shape=(n1, ..., nd)")
        full = core.new_zeros(core.shape[0], *shape)
        full[block_index(factors)] = core
        return full
    if len(factors) == 2:
        u, v = factors
        return u.to(core.dtype) @ (core @ v.to(core.dtype).transpose(1, 2))
    for mode, u in enumerate(factors):
        core = _mode_matmul(core, mode, u.to(core.dtype).transpose(1, 2))
    return core


def change_of_basis(new: Sequence[Tensor], old: Sequence[Tensor]) -> list[Tensor]:
    """Per-mode U_old^T U_new [B, r_old, r_new]; `project(core_old, these)` gives the core of
    U_old-coordinates re-expressed (orthogonally projected) in the new subspace. Index factors:
    the 0/1 matrix of the coordinates both sets hold."""
    if is_index(new):
        return [(o[:, :, None] == n[:, None, :]).to(torch.float32) for n, o in zip(new, old)]
    return [o.transpose(1, 2).to(torch.float32) @ n.to(torch.float32) for n, o in zip(new, old)]
