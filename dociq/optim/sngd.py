"""SubspaceNGD: natural gradient in a low-rank per-mode subspace, with a tiny optimizer state.

For every projected parameter W (n1 x ... x nd, d >= 2) and step t:

  1. g_low = g x1 U1^T ... xd Ud^T            (k = prod r_i values; projection.py)
  2. ring buffer G (k x s) of recent g_low     (s = `history`; includes the current g_low)
  3. F = lam I + G G^T, lam = damping * mean_j ||G_j||^2        (the "lambda rule", below)
  4. F^-1 g_low = (g_low - G z) / lam,  (lam I_s + G^T G) z = G^T g_low   (Woodbury)
  5. z by batched Cholesky (`cholesky_ex`, fp64 by default); where it fails, lam *= 10 and
     retry; after `max_retries` failures z = 0 (plain g/lam): never a NaN in the weights.
  6. m = beta m + F^-1 g_low (momentum kept in the subspace); update u = m scaled to
     ||u|| = scale * sqrt(k) (grafting: per subspace coordinate the RMS an Adam step has, the
     length GaLore's low-rank Adam step would have); W <- W (1 - lr wd) - lr * (u x1 U1 .. xd Ud).

Lambda rule: lam = damping * (1/s_filled) * sum_j ||G_j||^2, the mean squared norm of a stored
gradient, i.e. the mean non-zero eigenvalue of G G^T. It has the units of G G^T, so `damping`
is scale-free: damping -> inf gives plain (momentum, normalised) gradient descent in the
subspace, damping -> 0 the pure empirical-Fisher step restricted to the history span.

Grafting rule: NGD chooses the direction, the step length is fixed per matrix (RMS 1 per
subspace coordinate, times `scale`), so `lr` means what it means for AdamW/GaLore and the step
cannot blow up when lam or the Fisher is badly estimated.

Refresh: each projector is renewed every `refresh_every` optimizer steps, parameter j at steps
where (t + offset_j) % refresh_every == 0 (offsets spread over the period, so no step pays for
all refreshes; a tucker parameter uses its random subspace until its first slot, so even the
first step computes no HOSVD burst). `refresh_policy="carry"` re-expresses history and momentum
in the new subspace with U_old^T U_new (per mode); "reset" zeros them. docs/optim.md records
which won and why.

Same-shaped parameters of a param group are stacked and processed with batched matmul /
Cholesky. Parameters that are not projected (1-D, fewer than `min_numel` elements, no mode
larger than `rank`, or a group with `project=False` such as embeddings) use the fallback:
`fallback="adamw"` (torch's multi-tensor AdamW kernel) or `"factored"` (Adafactor-style
factored second moment, no momentum, for >= 2-D; 1-D parameters still use AdamW).

State (per parameter, plain tensors and ints; `torch.load(weights_only=True)` works):
projected: step (int), history [k, s], momentum [k], and for `projector="tucker"` the factors
factor0..factor{d-1} [n_i, r_i]. `random` factors are a pure function of
(seed, parameter index, refresh count), regenerated each step and never stored.
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Callable, Iterable, Optional

import torch
from torch.optim import Optimizer
from torch.optim.adam import adam as functional_adam

from dociq.optim import projection

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
PROJECTORS = ("random", "tucker")
FALLBACKS = ("adamw", "factored")
REFRESH_POLICIES = ("carry", "reset")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"SubspaceNGD: {name}={value!r} is not one of {choices}; "
                         f"set optimizer.{name} in configs/optim/sngd.yaml to one of them.")


class SubspaceNGD(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, rank: int = 32, history: int = 10,
                 damping: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 refresh_every: int = 100, projector: str = "random",
                 tucker_method: str = "randomized", refresh_policy: str = "carry",
                 seed: int = 0, min_numel: int = 1024, scale: float = 1.0,
                 solve_dtype: str = "float64", projector_dtype: str = "float32",
                 max_retries: int = 6, fallback: str = "adamw",
                 fallback_betas: tuple[float, float] = (0.9, 0.999), fallback_eps: float = 1e-8,
                 project: bool = True, max_skips_in_row: int = 10) -> None:
        if lr < 0 or rank < 1 or history < 1 or refresh_every < 1 or damping < 0:
            raise ValueError(f"SubspaceNGD: need lr >= 0, rank >= 1, history >= 1, "
                             f"refresh_every >= 1, damping >= 0; got lr={lr}, rank={rank}, "
                             f"history={history}, refresh_every={refresh_every}, damping={damping}")
        _check_choice("projector", projector, PROJECTORS)
        _check_choice("fallback", fallback, FALLBACKS)
        _check_choice("refresh_policy", refresh_policy, REFRESH_POLICIES)
        _check_choice("solve_dtype", solve_dtype, ("float32", "float64"))
        _check_choice("projector_dtype", projector_dtype, tuple(_DTYPES))
        _check_choice("tucker_method", tucker_method, ("svd", "randomized"))
        defaults = dict(lr=lr, rank=rank, history=history, damping=damping, momentum=momentum,
                        weight_decay=weight_decay, refresh_every=refresh_every,
                        projector=projector, tucker_method=tucker_method,
                        refresh_policy=refresh_policy, seed=seed, min_numel=min_numel,
                        scale=scale, solve_dtype=solve_dtype, projector_dtype=projector_dtype,
                        max_retries=max_retries, fallback=fallback,
                        fallback_betas=tuple(fallback_betas), fallback_eps=fallback_eps,
                        project=project)
        super().__init__(params, defaults)
        self._layout: Optional[dict] = None
        self._step_cache: dict = {}   # per-step projectors shared with the DDP comm hook
        self.skipped_steps = 0
        # Non-finite gradients skip a step; this many in a row means the run diverged: stop (0: never).
        if not (isinstance(max_skips_in_row, int) and max_skips_in_row >= 0):
            raise ValueError(f"SubspaceNGD: max_skips_in_row={max_skips_in_row!r}; set "
                             "optim.optimizer.max_skips_in_row to a non-negative int (0: never stop)")
        self.max_skips_in_row = max_skips_in_row
        self.skips_in_row = 0

    # ------------------------------------------------------------------ layout
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._layout = None

    def is_projected(self, p: torch.Tensor, group: dict) -> bool:
        if not group["project"] or p.dim() < 2 or p.numel() < group["min_numel"]:
            return False
        return math.prod(projection.mode_ranks(p.shape, group["rank"])) < p.numel()

    def _build_layout(self) -> dict:
        """Global parameter index, refresh offset and bucket of every projected parameter."""
        info, buckets = {}, defaultdict(list)
        projected = [(gi, p) for gi, g in enumerate(self.param_groups) for p in g["params"]
                     if self.is_projected(p, g)]
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        for j, (gi, p) in enumerate(projected):
            period = self.param_groups[gi]["refresh_every"]
            key = (gi, tuple(p.shape), p.dtype, p.device)
            info[p] = dict(index=index[p], offset=(j * period) // len(projected), bucket=key)
            buckets[key].append(p)
        return dict(info=info, buckets=dict(buckets))

    @property
    def layout(self) -> dict:
        if self._layout is None:
            self._layout = self._build_layout()
        return self._layout

    # ------------------------------------------------------------------ projectors
    @staticmethod
    def _schedule(group: dict, t: int, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(refresh count, refresh due now) per member for a bucket at step t."""
        period = group["refresh_every"]
        shifted = offsets + t
        return shifted // period, shifted % period == 0

    def _member_tensors(self, members: list) -> tuple[torch.Tensor, torch.Tensor]:
        info = self.layout["info"]
        return (torch.tensor([info[p]["index"] for p in members]),
                torch.tensor([info[p]["offset"] for p in members]))

    def _random(self, key, index: torch.Tensor, counts: torch.Tensor) -> list[torch.Tensor]:
        group = self.param_groups[key[0]]
        ranks = projection.mode_ranks(key[1], group["rank"])
        factors = projection.random_factors(key[1], ranks, group["seed"], index, counts)
        return [f.to(key[3]) for f in factors]

    def _bucket_factors(self, key, members: list, t: int) -> dict:
        """Projectors of a bucket at step t, cached for the step (the DDP hook asks first).

        "current": the factors in force before this step's refreshes — for `random` the ones
        this step uses (a function of the refresh count); for `tucker` the stored HOSVD factors,
        or, until a member's first staggered refresh, its random factors (so no step computes
        every HOSVD at once). "due": members refreshed at this step."""
        cache_key = (key, tuple(id(p) for p in members), t)
        if cache_key in self._step_cache:
            return self._step_cache[cache_key]
        group = self.param_groups[key[0]]
        index, offsets = self._member_tensors(members)
        counts, due = self._schedule(group, t, offsets)
        if group["projector"] == "random":
            current = self._random(key, index, counts)
        else:
            ranks = projection.mode_ranks(key[1], group["rank"])
            stored = [self.state[p].get("factor0") is not None if p in self.state else False
                      for p in members]
            fallback = None if all(stored) else self._random(key, index, torch.zeros_like(counts))
            current = [torch.stack([self.state[p][f"factor{m}"].float() if has else fallback[m][i]
                                    for i, (p, has) in enumerate(zip(members, stored))])
                       for m in range(len(ranks))]
        entry = dict(current=current, due=due, counts=counts, index=index)
        self._step_cache[cache_key] = entry
        return entry

    def subspace_of(self, p: torch.Tensor) -> Optional[list[torch.Tensor]]:
        """Factors [n_i, r_i] that the next step() projects p's gradient with, or None when p
        is not projected or its subspace depends on the (not yet reduced) gradient (a tucker
        refresh in its bucket). Used by the DDP hook to all-reduce projected gradients."""
        info = self.layout["info"].get(p)
        if info is None:
            return None
        members = self.layout["buckets"][info["bucket"]]
        steps = {self.state[q].get("step", 0) if q in self.state else 0 for q in members}
        if len(steps) != 1:
            return None
        entry = self._bucket_factors(info["bucket"], members, steps.pop())
        if self.param_groups[info["bucket"][0]]["projector"] == "tucker" and entry["due"].any():
            return None
        i = next(j for j, q in enumerate(members) if q is p)   # identity: == on tensors is elementwise
        return [f[i] for f in entry["current"]]

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if grads and not torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()):
            warnings.warn("SubspaceNGD: non-finite gradient, skipping this optimizer step "
                          "(weights and state unchanged).", RuntimeWarning, stacklevel=2)
            self.skipped_steps += 1
            self.skips_in_row += 1
            self._step_cache.clear()
            if self.max_skips_in_row and self.skips_in_row >= self.max_skips_in_row:
                raise FloatingPointError(
                    f"SubspaceNGD: {self.skips_in_row} optimizer steps in a row had non-finite "
                    f"gradients ({self.skipped_steps} skipped in all): the run diverged. Fix: lower "
                    "optim.optimizer.lr, or raise optim.optimizer.max_skips_in_row (0: never stop)")
            return loss
        self.skips_in_row = 0
        info = self.layout["info"]
        for gi, group in enumerate(self.param_groups):
            rest = [p for p in group["params"] if p.grad is not None and p not in info]
            if rest:
                self._fallback_step(group, rest)
        for key, members in self.layout["buckets"].items():
            live = [p for p in members if p.grad is not None]
            by_step = defaultdict(list)
            for p in live:
                by_step[self.state[p].get("step", 0)].append(p)
            for t, ps in by_step.items():
                self._projected_step(key, ps, t)
        self._step_cache.clear()
        return loss

    def _init_projected_state(self, p: torch.Tensor, k: int, s: int) -> dict:
        state = self.state[p]
        if "history" not in state:
            state["step"] = 0
            state["history"] = torch.zeros(k, s, dtype=torch.float32, device=p.device)
            state["momentum"] = torch.zeros(k, dtype=torch.float32, device=p.device)
        return state

    def _projected_step(self, key, ps: list, t: int) -> None:
        group = self.param_groups[key[0]]
        shape = key[1]
        ranks = projection.mode_ranks(shape, group["rank"])
        k, s, B = math.prod(ranks), group["history"], len(ps)
        states = [self._init_projected_state(p, k, s) for p in ps]
        g = torch.stack([p.grad for p in ps]).to(torch.float32)

        entry = self._bucket_factors(key, ps, t)
        factors, due, old = entry["current"], entry["due"], None
        if due.any():
            sub = due.nonzero().squeeze(1)
            if group["projector"] == "tucker":
                old = (sub, [f[sub] for f in factors])
                factors = self._refresh_tucker(group, states, g, sub, factors, ranks)
            elif t > 0:
                old = (sub, self._random(key, entry["index"][sub], entry["counts"][sub] - 1))

        hist = torch.stack([st["history"] for st in states])      # [B, k, s]
        mom = torch.stack([st["momentum"] for st in states])       # [B, k]
        if old is not None:
            self._carry_or_reset(group, hist, mom, old, factors, ranks)

        low = projection.project(g, factors).reshape(B, k)
        hist[:, :, t % s] = low
        filled = min(t + 1, s)
        natural, _ = self._woodbury_solve(hist, low, group, filled)
        natural = natural.to(torch.float32)
        mom.mul_(group["momentum"]).add_(natural)

        norm = torch.linalg.vector_norm(mom, dim=1, keepdim=True)
        target = group["scale"] * math.sqrt(k)
        update = torch.where(norm > 0, mom * (target / norm.clamp_min(1e-30)), torch.zeros_like(mom))
        full = projection.project_back(update.view(B, *ranks), factors)

        lr, wd = group["lr"], group["weight_decay"]
        if wd != 0:
            torch._foreach_mul_(ps, 1.0 - lr * wd)
        torch._foreach_add_(ps, list(full.to(ps[0].dtype).unbind(0)), alpha=-lr)
        torch._foreach_copy_([st["history"] for st in states], list(hist.unbind(0)))
        torch._foreach_copy_([st["momentum"] for st in states], list(mom.unbind(0)))
        for st in states:
            st["step"] = t + 1

    def _refresh_tucker(self, group, states, g, sub, current, ranks) -> list[torch.Tensor]:
        """HOSVD of the gradients of members whose refresh is due; store the new factors and
        return the bucket's factors for this step."""
        new_sub = projection.tucker_factors(g[sub], ranks, method=group["tucker_method"])
        store = _DTYPES[group["projector_dtype"]]
        factors = [f.clone() for f in current]
        for j, i in enumerate(sub.tolist()):
            for m, f in enumerate(new_sub):
                states[i][f"factor{m}"] = f[j].to(store).clone()
                # Use the stored (possibly rounded) factor so DDP ranks and resumed runs agree.
                factors[m][i] = states[i][f"factor{m}"].float()
        return factors

    @staticmethod
    def _carry_or_reset(group, hist, mom, old, factors, ranks) -> None:
        """Move history/momentum of refreshed members into their new subspace (or zero them)."""
        sub, old_factors = old
        if group["refresh_policy"] == "reset":
            hist[sub] = 0
            mom[sub] = 0
            return
        new_sub = [f[sub] for f in factors]
        maps = projection.change_of_basis(new_sub, old_factors)
        Bd, k, s = len(sub), hist.shape[1], hist.shape[2]
        cols = hist[sub].transpose(1, 2).reshape(Bd * s, *ranks)
        moved = projection.project(cols, [m.repeat_interleave(s, dim=0) for m in maps])
        hist[sub] = moved.reshape(Bd, s, k).transpose(1, 2)
        mom[sub] = projection.project(mom[sub].view(Bd, *ranks), maps).reshape(Bd, k)

    @staticmethod
    def _woodbury_solve(hist: torch.Tensor, grad: torch.Tensor, group: dict,
                        filled: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(lam I + G G^T)^-1 g per member via Woodbury + batched Cholesky, retrying with a
        larger lam where the factorisation fails. Returns (result, lam used), in solve_dtype."""
        dtype = _DTYPES[group["solve_dtype"]]
        G, g = hist.to(dtype), grad.to(dtype)
        lam = group["damping"] * G.square().sum(dim=(1, 2)) / filled
        floor = torch.finfo(dtype).tiny ** 0.5
        lam = lam.clamp_min(floor)
        gram = G.transpose(1, 2) @ G                               # [B, s, s]
        rhs = (G.transpose(1, 2) @ g.unsqueeze(-1))                # [B, s, 1]
        eye = torch.eye(G.shape[2], dtype=dtype, device=G.device)
        scale = gram.diagonal(dim1=1, dim2=2).mean(dim=1).clamp_min(floor)
        for _ in range(group["max_retries"] + 1):
            chol, info = torch.linalg.cholesky_ex(gram + lam[:, None, None] * eye)
            failed = info != 0
            if not failed.any():
                break
            # Raise lam where it failed: x10, and at least 1e-6 of the Gram scale.
            lam = torch.where(failed, torch.maximum(lam * 10, 1e-6 * scale), lam)
        z = torch.cholesky_solve(rhs, torch.where(failed[:, None, None], eye, chol))
        z = torch.where(failed[:, None, None], torch.zeros_like(z), z)
        natural = (g - (G @ z).squeeze(-1)) / lam[:, None]
        return natural, lam

    # ------------------------------------------------------------------ fallback
    def _fallback_step(self, group: dict, params: list) -> None:
        adam_params = params
        if group["fallback"] == "factored":
            adam_params = [p for p in params if p.dim() < 2]
            for p in params:
                if p.dim() >= 2:
                    self._factored_step(group, p)
        if not adam_params:
            return
        states = []
        for p in adam_params:
            st = self.state[p]
            if "exp_avg" not in st:
                st["step"] = torch.tensor(0.0)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states.append(st)
        beta1, beta2 = group["fallback_betas"]
        functional_adam(adam_params, [p.grad for p in adam_params],
                        [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states],
                        [], [st["step"] for st in states], foreach=True,
                        decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                        lr=group["lr"], weight_decay=group["weight_decay"],
                        eps=group["fallback_eps"], maximize=False)

    def _factored_step(self, group: dict, p: torch.Tensor) -> None:
        """Adafactor-style update: rank-1 factored second moment over the last two modes."""
        st = self.state[p]
        g = p.grad.to(torch.float32)
        if "row" not in st:
            st["step"] = 0
            st["row"] = torch.zeros(p.shape[:-1], dtype=torch.float32, device=p.device)
            st["col"] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=torch.float32, device=p.device)
        st["step"] += 1
        beta2 = group["fallback_betas"][1]
        sq = g.square().add_(group["fallback_eps"])
        st["row"].mul_(beta2).add_(sq.mean(dim=-1), alpha=1 - beta2)
        st["col"].mul_(beta2).add_(sq.mean(dim=-2), alpha=1 - beta2)
        correction = 1 - beta2 ** st["step"]
        v = (st["row"].unsqueeze(-1) * st["col"].unsqueeze(-2)
             / st["row"].mean(dim=-1, keepdim=True).unsqueeze(-1)) / correction
        update = g / v.sqrt()
        update.div_((update.square().mean().sqrt()).clamp_min(1.0))   # RMS clip at 1
        lr = group["lr"]
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr)

    # ------------------------------------------------------------------ state dict
    def load_state_dict(self, state_dict: dict) -> None:
        """torch casts floating state to the parameter dtype; keep our fp32 statistics as saved
        and only move them to the parameter's device."""
        saved = state_dict["state"]
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            for key, value in saved.get(pid, {}).items():
                if torch.is_tensor(value) and key != "step":
                    self.state[p][key] = value.to(device=p.device).clone()
        self._layout = None
        self._step_cache.clear()
