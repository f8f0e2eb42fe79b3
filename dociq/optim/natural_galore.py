"""Natural GaLore (Das, arXiv:2410.16029), a rival for the optimizer benchmark: GaLore's SVD
subspace and Adam, with the projected gradient first preconditioned by the inverse of the
empirical Fisher of the last `history` projected gradients (lam I + G G^T)^-1 g, via Woodbury.

No package ships it, so it is built from galore-torch's pieces (its projector, its AdamW step)
and SubspaceNGD's batched Woodbury solve (the same lam rule: `damping` x the history's mean
squared norm). The history is cleared when the projector refreshes its subspace: projected
gradients of an old subspace are coordinates of another basis.
"""
from __future__ import annotations

import math

import torch
from galore_torch import GaLoreAdamW
from galore_torch.galore_projector import GaLoreProjector

from dociq.optim.sngd import SubspaceNGD


class NaturalGaLoreAdamW(GaLoreAdamW):
    """GaLoreAdamW whose low-rank group (the groups with "rank") also takes `history` (s, the
    Fisher's window) and `damping`; other groups step as plain AdamW."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state.setdefault("step", 0)
                grad = p.grad
                if "rank" in group:
                    grad = self._natural(group, state, grad)
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                size = group["lr"] * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                update = m / v.sqrt().add_(group["eps"])
                if "rank" in group:
                    update = state["projector"].project_back(update)
                p.add_(update, alpha=-size)
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss

    @staticmethod
    def _natural(group: dict, state: dict, grad: torch.Tensor) -> torch.Tensor:
        """The projected gradient, preconditioned by the inverse empirical Fisher of the window."""
        if "projector" not in state:
            state["projector"] = GaLoreProjector(group["rank"], update_proj_gap=group["update_proj_gap"],
                                                 scale=group["scale"], proj_type=group["proj_type"])
        projector = state["projector"]
        basis = projector.ortho_matrix
        low = projector.project(grad, state["step"])
        s = group.get("history", 10)
        if projector.ortho_matrix is not basis or "history" not in state:
            state["history"] = low.new_zeros(low.numel(), s)        # a new subspace: a new window
        hist = state["history"]
        hist[:, state["step"] % s] = low.reshape(-1).float()
        settings = {"damping": group.get("damping", 1.0), "solve_dtype": "float64", "max_retries": 6}
        (natural,), _, _ = SubspaceNGD._woodbury_many([(hist[None], low.reshape(1, -1).float())], settings)
        return natural.view_as(low).to(low.dtype)
