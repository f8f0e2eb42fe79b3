"""A straightforward SubspaceNGD for tests: one matrix at a time, fp64, dense solves, no caches,
no buckets, no ladders. The optimizer's fast step must agree with it (tests/optim/test_reference.py).

Each piece is the documented rule written the obvious way (docs/optim.md):
  refresh count / due from (t + offset(name)) // period, subspace from (seed, name, count);
  tucker: leading singular vectors of the gradient (both sides), from step 0;
  carry: C_new = U_new^T (U_old C V_old^T) V_new for every history column and the momentum;
  lam = damping * sum ||G_j||^2 / (number of non-zero columns);
  natural = (lam I + G G^T)^-1 g_low;  m = beta m + natural;
  W <- W (1 - lr wd) - lr * U (m * scale sqrt(n m) / ||m||) V^T;
  residual=True: W <- W (1 - lr wd) - lr * (target / ||g||) (||g_low|| U (m / ||m||) V^T + R),
  R = g - U g_low V^T, target = scale sqrt(n m), and ||(target / ||g||) R|| capped at
  residual_growth x its previous (capped) value.
"""
from __future__ import annotations

import math

import torch

from dociq.optim import projection


class ReferenceSNGD:
    def __init__(self, named_matrices, lr, rank, history, damping, momentum, weight_decay,
                 refresh_every, projector="random", refresh_policy="carry", seed=0, scale=1.0,
                 residual=False, residual_growth=1.01):
        self.params = list(named_matrices)
        self.cfg = dict(lr=lr, rank=rank, s=history, damping=damping, beta=momentum, wd=weight_decay,
                        period=refresh_every, projector=projector, policy=refresh_policy,
                        seed=seed, scale=scale, residual=residual, growth=residual_growth)
        self.state = {name: {} for name, _ in self.params}

    def _factors(self, name, shape, count, grad):
        c = self.cfg
        if c["projector"] == "tucker":
            u, _, vh = torch.linalg.svd(grad.double(), full_matrices=False)
            r0, r1 = projection.mode_ranks(shape, c["rank"])
            return u[:, :r0], vh[:r1].T
        ranks = projection.mode_ranks(shape, c["rank"])
        if c["projector"] == "coordinates":
            # U = I[:, S]: the identity's columns at the chosen coordinates, as a dense basis.
            index = projection.coordinate_factors(shape, ranks, c["seed"], torch.tensor([projection.name_key(name)]),
                                                  torch.tensor([count]))
            return (torch.eye(shape[0], dtype=torch.float64)[:, index[0][0]],
                    torch.eye(shape[1], dtype=torch.float64)[:, index[1][0]])
        f = projection.random_factors(shape, ranks, c["seed"], torch.tensor([projection.name_key(name)]),
                                      torch.tensor([count]))
        return f[0][0].double(), f[1][0].double()

    @torch.no_grad()
    def step(self):
        c = self.cfg
        for name, p in self.params:
            st = self.state[name]
            g = p.grad.double()
            t = st.get("t", 0)
            offset = projection.name_key(name, "offset") % c["period"]
            count, due = (t + offset) // c["period"], (t + offset) % c["period"] == 0
            if "U" not in st or (due and (c["projector"] == "tucker" or t > 0)) or \
                    (c["projector"] != "tucker" and st.get("count") != count):
                U, V = self._factors(name, p.shape, count, g)
                if "U" in st and t > 0:
                    self._move(st, U, V)
                st["U"], st["V"], st["count"] = U, V, count
            U, V = st["U"], st["V"]
            low = (U.T @ g @ V).reshape(-1)
            k = low.numel()
            G = st.setdefault("G", torch.zeros(k, c["s"], dtype=torch.float64))
            m = st.setdefault("m", torch.zeros(k, dtype=torch.float64))
            G[:, t % c["s"]] = low
            cols = G.square().sum(dim=0)
            lam = c["damping"] * cols.sum() / max(1, int((cols > 0).sum()))
            natural = torch.linalg.solve(lam * torch.eye(k, dtype=torch.float64) + G @ G.T, low)
            m.mul_(c["beta"]).add_(natural)
            target = c["scale"] * math.sqrt(p.numel())
            if c["residual"]:
                u = m * (target * low.norm() / g.norm() / m.norm())
                res = (target / g.norm()) * (g - U @ low.reshape(U.shape[1], V.shape[1]) @ V.T)
                limit = c["growth"] * st.get("res_norm", math.inf)
                if res.norm() > limit:
                    res = res * (limit / res.norm())
                st["res_norm"] = float(res.norm())
            else:
                u = m * (target / m.norm())
                res = 0.0
            full = U @ u.reshape(U.shape[1], V.shape[1]) @ V.T + res
            p.mul_(1 - c["lr"] * c["wd"]).sub_((c["lr"] * full).to(p.dtype))
            st["t"] = t + 1

    def _move(self, st, U, V):
        if self.cfg["policy"] == "reset":
            st["G"].zero_()
            st["m"].zero_()
            return
        r0, r1 = st["U"].shape[1], st["V"].shape[1]

        def move(vec):
            full = st["U"] @ vec.reshape(r0, r1) @ st["V"].T
            return (U.T @ full @ V).reshape(-1)

        st["G"] = torch.stack([move(col) for col in st["G"].T], dim=1)
        st["m"] = move(st["m"])
