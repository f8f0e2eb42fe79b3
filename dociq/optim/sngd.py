"""SubspaceNGD: natural gradient in a low-rank per-mode subspace, with a tiny optimizer state.

For every projected parameter W (n1 x ... x nd, d >= 2) and step t:

  1. g_low = g x1 U1^T ... xd Ud^T            (k = prod r_i values; projection.py)
  2. ring buffer G (k x s) of recent g_low     (s = `history`; includes the current g_low)
  3. F = lam I + G G^T, lam = damping * (1/s_stored) sum_j ||G_j||^2   (the "lambda rule")
  4. F^-1 g_low = (g_low - G z) / lam,  (lam I_s + G^T G) z = G^T g_low   (Woodbury)
  5. z by batched Cholesky (`cholesky_ex`, fp64 by default) of the whole lam ladder
     lam_j = max(10^j lam, 10^(j-1) 1e-6 Gram scale), j = 0..max_retries, in one call; the
     first ladder rung that factorises is used. When none does the member takes z = 0
     (plain g / lam) and `fallback_steps` counts it (on the device; a warning names the count).
  6. m = beta m + F^-1 g_low (momentum kept in the subspace); grafted update (below);
     W <- W (1 - lr wd) - lr * (u x1 U1 .. xd Ud), one in-place addmm per matrix.
  7. residual=True (default): also W -= lr c R, R = g - (g_low x1 U1 .. xd Ud) the gradient
     outside the subspace (Fira's idea), one in-place addcmul over g per matrix.

`preconditioner` picks step 4 (for ablations): "ngd" (above), "none" (g_low itself: NGD off,
i.e. damping -> inf), "adam" (Adam's second moment in the same subspace, state +k floats),
"sqrt" (F^-1/2 g_low, the GGT-style full-matrix-Adagrad power on the same history).

Lambda rule: lam = damping * (1/s_stored) * sum_j ||G_j||^2, the mean squared norm of a stored
gradient (s_stored = the number of non-zero history columns, so right after a `reset` refresh
emptied the history it is 1, not min(t+1, s)): the mean non-zero eigenvalue of G G^T. `damping`
is therefore scale-free: damping -> inf gives normalised momentum in the subspace, damping -> 0
the pure empirical-Fisher step restricted to the history span.

Grafting rule: NGD chooses the direction, the length is fixed per matrix so that the update's
RMS per weight is `scale` (x lr): ||u|| = scale * sqrt(n1...nd). Adam's normalised step
m/sqrt(v) has an RMS per weight of order 1, so `lr` transfers between `optim=adamw` and
`optim=sngd` (checked in docs/optim.md), and a badly estimated Fisher cannot blow the step up.
With the residual the whole update keeps that RMS: it is the gradient normalised to it, whose
in-subspace part is replaced by the momentum direction of the same norm,
  update = (target / ||g||) (||g_low|| (m / ||m||) x U + R),  target = scale sqrt(n1...nd),
the residual's norm growing by at most `residual_growth` per step (Fira's limiter; state: one
scalar per matrix). The DDP hook then needs full gradients (`subspace_of` returns None).

Refresh: each projector is renewed every `refresh_every` optimizer steps, parameter p at steps
where (t + offset_p) % refresh_every == 0, offset_p a hash of p's name (so refreshes are spread
over the period and do not move when other parameters are added or frozen). `tucker` computes
its first HOSVD at step 0. `refresh_policy="carry"` re-expresses history and momentum in the
new subspace with U_old^T U_new (per mode); "reset" zeros them.

Layout: the parameters of a param group whose subspaces have the same ranks (whatever their
shapes) form buckets of at most `max_bucket_bytes` (fp32 bytes of their weights); a bucket's
history / momentum live in one [B, k, s] / [B, k] tensor whose rows are the parameters' state
tensors (views), so its solves, momentum and graft are batched ops. Factors are cached per
parameter between refreshes and generated on its device. Gradients are projected and weights
updated one matrix at a time (no stacked copy of gradients or weights).

Host syncs: one per step — the non-finite check on the gradients' norms (which must reach the
host to skip the step and stop a diverged run after `max_skips_in_row`) reads the fallback
counter in the same copy.

Sharded parameters (FSDP2 DTensors, rows of dim 0 over a 1-D mesh; trainer.strategy=fsdp2): each
rank projects its rows of the gradient with the same rows of U (factors are functions of the name,
so no rank needs another's), the projections are summed over ranks, and history / momentum are
kept as DTensors sharded along k: the Woodbury Grams, the momentum norms and the core updates are
summed over ranks (one all-reduce each for all matrices), and each rank steps its own rows of W.
Checkpoints gather and re-shard them like any DTensor state (`init_state` makes the templates).

State (per parameter, plain tensors and ints; `torch.load(weights_only=True)` works):
projected: step (int), history [k, s], momentum [k] (+ residual_norm [] with the residual,
+ exp_avg_sq [k] for "adam"), and for
`projector="tucker"` the factors factor0..factor{d-1} [n_i, r_i]. `random` factors (DCT columns) and
`coordinates` index sets (U_i = I[:, S_i], projection.py) are a pure function of (seed, name,
refresh count) and never stored. Fallback parameters: AdamW's state
(torch's fused kernel where the device has one) or the factored second moment.
"""
from __future__ import annotations

import functools
import math
import warnings
from collections import defaultdict
from typing import Callable, Iterable, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.optim import Optimizer
from torch.optim.adam import adam as functional_adam

from dociq.optim import projection

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
PROJECTORS = ("random", "tucker", "coordinates")
FALLBACKS = ("adamw", "factored")
REFRESH_POLICIES = ("carry", "reset")
PRECONDITIONERS = ("ngd", "none", "adam", "sqrt")
# The group settings the fallback step reads.
_FALLBACK_KEYS = ("fallback", "lr", "weight_decay", "fallback_betas", "fallback_eps")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"SubspaceNGD: {name}={value!r} is not one of {choices}; "
                         f"set optimizer.{name} in configs/optim/sngd.yaml to one of them.")


def _fused_ok(params: list) -> bool:
    """torch's fused AdamW runs on CPU and CUDA for floating-point parameters."""
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a view: in-place ops on it update the DTensor); t itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def _hashable(value):
    """A group setting as a dict key (a loaded state dict gives lists where the config gave tuples;
    a tensor lr keys by identity)."""
    return tuple(value) if isinstance(value, list) else value


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t's storage as one 1-D view (t dense, any dim order: contiguous or channels-last)."""
    if t.is_contiguous():
        return t.view(-1)
    order = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)
    dense = 1
    for st, n in order:
        if st != dense:
            raise ValueError(f"SubspaceNGD: a parameter or gradient of shape {tuple(t.shape)} has strides "
                             f"{t.stride()} (not dense); make it contiguous (e.g. .contiguous()) before training")
        dense *= n
    return t.as_strided((t.numel(),), (1,))


@functools.lru_cache(maxsize=None)
def _ladder_constants(s: int, retries: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """I_s and the ladder's powers 10^0 .. 10^(retries+1), made once per size, dtype and device."""
    return (torch.eye(s, dtype=dtype, device=device),
            10.0 ** torch.arange(retries + 2, dtype=dtype, device=device))


def _chunk(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s rows when n rows are split as torch.chunk and DTensor's Shard(0) split them."""
    size = -(-n // world)
    start = min(n, rank * size)
    return start, min(n, start + size)


class _Sharding:
    """The FSDP mesh the parameters are sharded over (rows of dim 0, one mesh dimension). The
    subspace state of every matrix is sharded the same way, along its k projected coordinates:
    each rank holds k / world rows of its history and momentum."""

    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.group = mesh.get_group()
        self.world = mesh.size()
        self.rank = mesh.get_local_rank()

    def rows(self, n: int) -> tuple[int, int]:
        return _chunk(n, self.world, self.rank)

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        return t

    def sum_all(self, tensors: list) -> list:
        """All-reduce (sum) several tensors in one collective; the sums come back in their shapes."""
        if not tensors:
            return tensors
        flat = self.sum_(torch.cat([t.reshape(-1) for t in tensors]))
        return [f.view_as(t) for f, t in zip(torch.split(flat, [t.numel() for t in tensors]), tensors)]

    def wrap(self, local: torch.Tensor, shape: tuple) -> DTensor:
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)


class SubspaceNGD(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, rank: int = 32, history: int = 10,
                 damping: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 refresh_every: int = 100, projector: str = "random",
                 tucker_method: str = "randomized", refresh_policy: str = "carry",
                 seed: int = 0, min_numel: int = 1024, scale: float = 1.0,
                 solve_dtype: str = "float64", projector_dtype: str = "float32",
                 max_retries: int = 6, fallback: str = "adamw",
                 fallback_betas: tuple[float, float] = (0.9, 0.999), fallback_eps: float = 1e-8,
                 project: bool = True, max_skips_in_row: int = 10, preconditioner: str = "ngd",
                 max_bucket_bytes: int = 64 * 2 ** 20, residual: bool = True,
                 residual_growth: float = 1.01, max_share: float = 1.0) -> None:
        if not 0 < max_share <= 1:
            raise ValueError(f"SubspaceNGD: max_share={max_share!r}; set optim.optimizer.max_share in (0, 1] "
                             "(the largest share of a matrix its subspace may hold; 1: every matrix it does not fill)")
        if lr < 0 or rank < 1 or history < 1 or refresh_every < 1 or damping < 0:
            raise ValueError(f"SubspaceNGD: need lr >= 0, rank >= 1, history >= 1, "
                             f"refresh_every >= 1, damping >= 0; got lr={lr}, rank={rank}, "
                             f"history={history}, refresh_every={refresh_every}, damping={damping}")
        if not (isinstance(max_bucket_bytes, int) and max_bucket_bytes > 0):
            raise ValueError(f"SubspaceNGD: max_bucket_bytes={max_bucket_bytes!r}; set "
                             "optim.optimizer.max_bucket_bytes to a positive int (bytes)")
        _check_choice("projector", projector, PROJECTORS)
        _check_choice("fallback", fallback, FALLBACKS)
        _check_choice("refresh_policy", refresh_policy, REFRESH_POLICIES)
        _check_choice("solve_dtype", solve_dtype, ("float32", "float64"))
        _check_choice("projector_dtype", projector_dtype, tuple(_DTYPES))
        _check_choice("tucker_method", tucker_method, ("svd", "randomized"))
        _check_choice("preconditioner", preconditioner, PRECONDITIONERS)
        defaults = dict(lr=lr, rank=rank, history=history, damping=damping, momentum=momentum,
                        weight_decay=weight_decay, refresh_every=refresh_every,
                        projector=projector, tucker_method=tucker_method,
                        refresh_policy=refresh_policy, seed=seed, min_numel=min_numel,
                        scale=scale, solve_dtype=solve_dtype, projector_dtype=projector_dtype,
                        max_retries=max_retries, fallback=fallback,
                        fallback_betas=tuple(fallback_betas), fallback_eps=fallback_eps,
                        project=project, preconditioner=preconditioner, residual=residual,
                        residual_growth=residual_growth, max_share=max_share)
        self.max_bucket_bytes = max_bucket_bytes
        super().__init__(params, defaults)
        self._layout: Optional[dict] = None
        self._cache: dict = {}        # per (bucket, member set): the batched state buffers
        self._factors: dict = {}      # per parameter: the factors in force (between refreshes)
        self._offsets: dict = {}      # per parameter: its block's storage offsets (coordinates)
        self.skipped_steps = 0
        # Non-finite gradients skip a step; this many in a row means the run diverged: stop (0: never).
        if not (isinstance(max_skips_in_row, int) and max_skips_in_row >= 0):
            raise ValueError(f"SubspaceNGD: max_skips_in_row={max_skips_in_row!r}; set "
                             "optim.optimizer.max_skips_in_row to a non-negative int (0: never stop)")
        self.max_skips_in_row = max_skips_in_row
        self.skips_in_row = 0
        self._fallback_count: Optional[torch.Tensor] = None   # device counter, read with the finite check
        self._fallback_seen = 0
        self._fallback_warned = False

    # ------------------------------------------------------------------ layout
    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._layout = None
        self._cache = {}
        self._factors = {}
        self._offsets = {}

    def is_projected(self, p: torch.Tensor, group: dict) -> bool:
        if not group["project"] or p.dim() < 2 or p.numel() < group["min_numel"]:
            return False
        # A subspace holding a large share of a narrow matrix saves little state and leaves most of
        # its update without a per-weight scale: such matrices take the fallback (AdamW).
        k = math.prod(projection.mode_ranks(p.shape, group["rank"]))
        return k < p.numel() and k <= group.get("max_share", 1.0) * p.numel()

    def param_name(self, group_index: int, position: int, global_index: int) -> str:
        """The parameter's name (from named parameters), or `param<global index>` without one."""
        names = self.param_groups[group_index].get("param_names")
        return names[position] if names else f"param{global_index}"

    def _build_layout(self) -> dict:
        """Name key, refresh offset, ranks and bucket of every projected parameter. A bucket is
        the parameters of one group whose subspaces have the same ranks (r_1..r_d), on one
        device: their history / momentum live in one [B, k, s] / [B, k] tensor and their
        solves, momentum and graft are single batched ops, whatever their shapes. Buckets hold
        at most max_bucket_bytes of fp32 weights (the weights are never stacked; the cap bounds
        the batched state buffers and the work of one batched op)."""
        info, groups = {}, defaultdict(list)
        sharding = self._find_sharding()
        index = 0
        for gi, group in enumerate(self.param_groups):
            for pos, p in enumerate(group["params"]):
                name = self.param_name(gi, pos, index)
                index += 1
                if not self.is_projected(p, group):
                    continue
                period = group["refresh_every"]
                ranks = projection.mode_ranks(p.shape, group["rank"])
                info[p] = dict(name=name, key=projection.name_key(name), ranks=ranks,
                               offset=projection.name_key(name, "offset") % period,
                               rows=sharding.rows(p.shape[0]) if sharding else (0, p.shape[0]))
                groups[(gi, ranks, p.device)].append(p)
        buckets = {}
        for key, members in groups.items():
            chunk, size, part = [], 0, 0
            for p in members:
                if chunk and size + 4 * p.numel() > self.max_bucket_bytes:
                    buckets[key + (part,)] = chunk
                    chunk, size, part = [], 0, part + 1
                chunk.append(p)
                size += 4 * p.numel()
            buckets[key + (part,)] = chunk
        for bucket, members in buckets.items():
            for p in members:
                info[p]["bucket"] = bucket
        return dict(info=info, buckets=buckets, sharding=sharding)

    def _find_sharding(self) -> Optional[_Sharding]:
        """The mesh when the parameters are FSDP-sharded DTensors (trainer.strategy=fsdp2), else None."""
        params = [p for g in self.param_groups for p in g["params"]]
        sharded = [p for p in params if isinstance(p, DTensor)]
        if not sharded:
            return None
        if len(sharded) != len(params):
            raise ValueError("SubspaceNGD: some parameters are DTensors and some are not; shard the whole "
                             "model (trainer.strategy=fsdp2 shards every parameter of the task)")
        mesh = sharded[0].device_mesh
        for p in sharded:
            if p.device_mesh != mesh or mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
                raise ValueError(f"SubspaceNGD: a parameter is sharded as {p.placements} on a {mesh.ndim}-D "
                                 "mesh; it supports FSDP's row sharding (Shard(0)) on one mesh dimension "
                                 "(trainer.strategy=fsdp2), not tensor parallelism")
        for group in self.param_groups:
            for key, bad, fix in (("projector", "tucker", "random"), ("preconditioner", "sqrt", "ngd"),
                                  ("fallback", "factored", "adamw")):
                if group[key] == bad:
                    raise ValueError(f"SubspaceNGD: {key}={bad} needs whole gradients and is not supported "
                                     f"with sharded parameters (trainer.strategy=fsdp2); set "
                                     f"optim.optimizer.{key}={fix}")
        return _Sharding(mesh)

    @property
    def layout(self) -> dict:
        if self._layout is None:
            self._layout = self._build_layout()
        return self._layout

    # ------------------------------------------------------------------ projectors
    def _refresh_count(self, group: dict, p: torch.Tensor, t: int) -> tuple[int, bool]:
        """(refresh count, refresh due at step t) of p: host ints, no device work."""
        shifted = self.layout["info"][p]["offset"] + t
        return shifted // group["refresh_every"], shifted % group["refresh_every"] == 0

    def _random(self, group: dict, ps: list, counts: list[int]) -> list[list[torch.Tensor]]:
        """Random factors of `ps` at these refresh counts: per parameter, a list per mode (DCT
        columns, or index sets for projector="coordinates"). Same-shaped parameters are
        generated in one batched call, on their device."""
        out: list = [None] * len(ps)
        by_shape = defaultdict(list)
        for i, p in enumerate(ps):
            by_shape[tuple(p.shape)].append(i)
        info = self.layout["info"]
        for shape, idx in by_shape.items():
            device = ps[idx[0]].device
            keys = torch.tensor([info[ps[i]]["key"] for i in idx], device=device)
            make = projection.coordinate_factors if group["projector"] == "coordinates" else projection.random_factors
            stacks = make(shape, info[ps[idx[0]]]["ranks"], group["seed"], keys,
                          torch.tensor([counts[i] for i in idx], device=device))
            for j, i in enumerate(idx):
                out[i] = [f[j] for f in stacks]
        return out

    def _factors_in_force(self, group: dict, ps: list, t: int) -> tuple[list, list[int], dict]:
        """Per member: the factors (fp32, one tensor per mode) that step t projects with; the
        members due a refresh at t; and {member index: the factors its refresh just replaced}
        (for the carry). random: a function of the refresh count, cached per parameter between
        refreshes and regenerated only when the count moves. tucker: the stored HOSVD factors;
        a member without any (step 0, or a new parameter) is due now."""
        cache, due, factors, replaced = self._factors, [], [], {}
        stale, stale_counts = [], []
        for i, p in enumerate(ps):
            count, now = self._refresh_count(group, p, t)
            if group["projector"] != "tucker":
                if now and t > 0:
                    due.append(i)
                entry = cache.get(p)
                if entry is not None and now and entry[0] == count - 1:
                    replaced[i] = entry[1]
                if entry is None or entry[0] != count:
                    stale.append(i)
                    stale_counts.append(count)
                    factors.append(None)
                else:
                    factors.append(entry[1])
            else:
                st = self.state[p]
                if now or "factor0" not in st:
                    due.append(i)
                entry = cache.get(p)
                if "factor0" in st and (entry is None or entry[0] is not st["factor0"]):
                    fs = [st[f"factor{m}"].float() for m in range(p.dim())]
                    cache[p] = entry = (st["factor0"], fs)
                factors.append(entry[1] if entry is not None and "factor0" in st else None)
        if stale:
            fresh = self._random(group, [ps[i] for i in stale], stale_counts)
            for i, c, fs in zip(stale, stale_counts, fresh):
                cache[ps[i]] = (c, fs)
                factors[i] = fs
        return factors, due, replaced

    def factors_of(self, p: torch.Tensor) -> Optional[list[torch.Tensor]]:
        """Factors [n_i, r_i] that the next step() projects p's gradient with, or None when p
        is not projected or its subspace depends on the gradient itself (a tucker refresh)."""
        info = self.layout["info"].get(p)
        if info is None:
            return None
        group = self.param_groups[info["bucket"][0]]
        t = self.state[p].get("step", 0) if p in self.state else 0
        factors, due, _ = self._factors_in_force(group, [p], t)
        if group["projector"] == "tucker" and due:
            return None
        return factors[0]

    def subspace_of(self, p: torch.Tensor) -> Optional[list[torch.Tensor]]:
        """What the DDP hook may all-reduce p's gradient in: `factors_of(p)`, or None when the
        step needs p's full gradient — not projected, a tucker refresh, or a group with
        `residual` (it uses the part of the gradient outside the subspace too)."""
        info = self.layout["info"].get(p)
        if info is None or self.param_groups[info["bucket"][0]]["residual"]:
            return None
        return self.factors_of(p)

    def cache_bytes(self) -> int:
        """Bytes held between steps outside the state: cached factors (random: all of them;
        tucker: only the fp32 copies of factors stored in another dtype)."""
        in_state = {_local(v).untyped_storage().data_ptr() for st in self.state.values()
                    for v in st.values() if torch.is_tensor(v)}
        seen, total = set(), 0
        tensors = [f for _, fs in self._factors.values() for f in fs]
        for entry in self._cache.values():
            tensors += list(entry.get("bufs", {}).values())
        for t in tensors:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in in_state and ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
        return total

    # ------------------------------------------------------------------ counters
    @property
    def fallback_steps(self) -> int:
        """(member, step) pairs where every Cholesky retry failed and z = 0 was used (a host read)."""
        return 0 if self._fallback_count is None else int(self._fallback_count.item())

    def _note_fallbacks(self, count: int) -> None:
        self._fallback_seen = count
        if count and not self._fallback_warned:
            self._fallback_warned = True
            warnings.warn(f"SubspaceNGD: the Cholesky solve failed after max_retries for {count} "
                          "(matrix, step) pair(s); those steps used plain g/lam. Fix: raise "
                          "optim.optimizer.damping or max_retries, or use solve_dtype=float64. "
                          "(warned once; the count is optimizer.fallback_steps)",
                          RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        """Three phases: (1) the norm of every gradient (one multi-tensor op: the finiteness
        check, and the residual's scale); (2) one host read: skip the step, or (3) the fallback
        step, then per bucket: refreshes, projection, history, one batched solve for all
        buckets, momentum, graft and the in-place updates."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        info = self.layout["info"]
        rest = [[p for p in group["params"] if p.grad is not None and p not in info]
                for group in self.param_groups]
        plans = []
        for bucket, members in self.layout["buckets"].items():
            by_step = defaultdict(list)
            for p in members:
                if p.grad is not None:
                    by_step[self.state[p].get("step", 0) if p in self.state else 0].append(p)
            plans += [dict(bucket=bucket, ps=ps, t=t) for t, ps in by_step.items()]
        grads = [p.grad for ps in rest for p in ps] + [p.grad for plan in plans for p in plan["ps"]]
        if not grads:
            return loss
        sharding = self.layout["sharding"]
        norms = torch.stack(torch._foreach_norm([_local(g) for g in grads])).float()
        if sharding is not None:
            # Whole-gradient norms (every rank then takes the same skip / zero decisions).
            norms = sharding.sum_(norms.square()).sqrt()
        bad, zero = self._host_read(norms)
        if bad:
            return self._skip(loss)
        start = sum(len(ps) for ps in rest)
        for plan in plans:
            plan["grad_norm"] = norms[start:start + len(plan["ps"])]
            start += len(plan["ps"])
        self.skips_in_row = 0
        if any(zero):
            rest, plans = self._without_zero_gradients(rest, plans, zero)
        # Groups whose fallback settings agree step together (one fused kernel call).
        same = defaultdict(list)
        for group, params in zip(self.param_groups, rest):
            if params:
                same[tuple(_hashable(group[k]) for k in _FALLBACK_KEYS)].append((group, params))
        for members in same.values():
            self._fallback_step(members[0][0], [p for _, params in members for p in params])
        for plan in plans:
            self._prepare(plan)
        self._project_all(plans)
        self._precondition_all(plans)
        for plan, (update, res_gain) in zip(plans, self._core_updates(plans)):
            self._apply(plan, update, res_gain)
        return loss

    def _project_all(self, plans: list) -> None:
        """Phase 3a': the projected gradients into the history. Sharded, each rank projected its
        own rows of the gradients: the sum over ranks is the projection (one all-reduce)."""
        sharding = self.layout["sharding"]
        if sharding is not None:
            for plan, low in zip(plans, sharding.sum_all([plan["low"] for plan in plans])):
                plan["low"] = low
        for plan in plans:
            self._record(plan)

    def _core_updates(self, plans: list) -> list:
        """Phase 3c: momentum, then per plan (the core update [B, k], the residual's gain). Sharded,
        the momentum norms and the core updates are summed over the ranks' rows of k (one
        all-reduce each): every rank needs the whole core update to step its rows of the weights."""
        sharding = self.layout["sharding"]
        squares = [self._momentum(plan) for plan in plans]
        if sharding is not None:
            squares = sharding.sum_all(squares)
        cores = [self._core_update(plan, sq.sqrt()) for plan, sq in zip(plans, squares)]
        if sharding is None:
            return cores
        whole = []
        for plan, (update, _) in zip(plans, cores):
            w = update.new_zeros(update.shape[0], math.prod(plan["ranks"]))
            w[:, slice(*plan["k_rows"])] = update
            whole.append(w)
        return [(summed, gain) for summed, (_, gain) in zip(sharding.sum_all(whole), cores)]

    def _host_read(self, norms: torch.Tensor) -> tuple[bool, list[bool]]:
        """The one host sync of a step: any non-finite gradient? which gradients are exactly
        zero? (+ the fallback counter)."""
        flags = [norms.sum().isfinite().logical_not().long().view(1), (norms == 0).long()]
        if self._fallback_count is not None:
            flags.append(self._fallback_count.to(norms.device).long().view(1))
        values = torch.cat(flags).tolist()
        bad, zero = bool(values[0]), [bool(v) for v in values[1:1 + len(norms)]]
        if self._fallback_count is not None and values[-1] != self._fallback_seen:
            self._note_fallbacks(values[-1])
        return bad, zero

    @staticmethod
    def _without_zero_gradients(rest: list, plans: list, zero: list) -> tuple[list, list]:
        """Drop parameters whose gradient is exactly zero this step, as if it were None: they
        did not reach the loss (e.g. the multimask heads on a step of single-mask prompts). A
        graft would otherwise turn a zero or vanishing gradient into a full-sized step along the
        old momentum, and an all-zero history into a 0/0 solve."""
        flags = iter(zero)
        rest = [[p for p in ps if not next(flags)] for ps in rest]
        kept = []
        for plan in plans:
            alive = [not next(flags) for _ in plan["ps"]]
            if not any(alive):
                continue
            index = torch.tensor([i for i, a in enumerate(alive) if a], device=plan["grad_norm"].device)
            kept.append(dict(plan, ps=[p for p, a in zip(plan["ps"], alive) if a],
                             grad_norm=plan["grad_norm"].index_select(0, index)))
        return rest, kept

    def _skip(self, loss):
        warnings.warn("SubspaceNGD: non-finite gradient, skipping this optimizer step "
                      "(weights and state unchanged).", RuntimeWarning, stacklevel=3)
        self.skipped_steps += 1
        self.skips_in_row += 1
        if self.max_skips_in_row and self.skips_in_row >= self.max_skips_in_row:
            raise FloatingPointError(
                f"SubspaceNGD: {self.skips_in_row} optimizer steps in a row had non-finite "
                f"gradients ({self.skipped_steps} skipped in all): the run diverged. Fix: lower "
                "optim.optimizer.lr, or raise optim.optimizer.max_skips_in_row (0: never stop)")
        return loss

    def _bucket_state(self, bucket, group: dict, ps: list, k: int, s: int) -> dict:
        """[B, k, s] history / [B, k] momentum (+ [B, k] exp_avg_sq, [B] residual_norm) whose
        rows ARE the members' state tensors. Rebuilt when the member set changes or after a
        load_state_dict (which gives every parameter its own tensors)."""
        names = ("history", "momentum") + (("exp_avg_sq",) if group["preconditioner"] == "adam" else ()) \
            + (("residual_norm",) if group["residual"] else ())
        ckey = (bucket, tuple(id(p) for p in ps))
        entry = self._cache.setdefault(ckey, {})
        bufs = entry.get("bufs")
        first, last = self.state[ps[0]], self.state[ps[-1]]
        if bufs is not None and all(first.get(n) is not None and last.get(n) is not None
                                    and _local(first[n]).data_ptr() == bufs[n][0].data_ptr()
                                    and _local(last[n]).data_ptr() == bufs[n][-1].data_ptr() for n in names):
            return bufs
        device = ps[0].device
        sharding = self.layout["sharding"]
        # Sharded: this rank's rows of the k projected coordinates; residual_norm is one number, replicated.
        start, stop = sharding.rows(k) if sharding else (0, k)
        local = stop - start
        shapes = {"history": (local, s), "momentum": (local,), "exp_avg_sq": (local,), "residual_norm": ()}
        whole = {"history": (k, s), "momentum": (k,), "exp_avg_sq": (k,)}
        bufs = {}
        for n in names:
            # residual_norm starts at inf: the growth limit has nothing to compare with yet.
            rows = [_local(self.state[p][n]).to(device, torch.float32) if n in self.state[p]
                    else torch.full(shapes[n], math.inf if n == "residual_norm" else 0.0, device=device)
                    for p in ps]
            bufs[n] = torch.stack(rows)
            for i, p in enumerate(ps):
                row = bufs[n][i]
                self.state[p][n] = sharding.wrap(row, whole[n]) if sharding and n in whole else row
        for p in ps:
            self.state[p].setdefault("step", 0)
        entry["bufs"] = bufs
        return bufs

    def _prepare(self, plan: dict) -> None:
        """Phase 3a for one bucket at step t: factors in force, refreshes (random: carry or
        reset; tucker: HOSVD of the current gradient), projected gradients, history column."""
        bucket, ps, t = plan["bucket"], plan["ps"], plan["t"]
        group = self.param_groups[bucket[0]]
        ranks = bucket[1]
        k, s = math.prod(ranks), group["history"]
        bufs = self._bucket_state(bucket, group, ps, k, s)
        factors, due, replaced = self._factors_in_force(group, ps, t)
        hist, mom = bufs["history"], bufs["momentum"]
        if due and group["projector"] == "tucker":
            factors = self._refresh_tucker(group, ps, due, factors, hist, mom, t)
        elif due:
            # The carry maps from the factors just replaced (cached), or regenerated ones when the
            # cache does not hold them (after a load_state_dict).
            missing = [i for i in due if i not in replaced]
            if missing:
                replaced.update(zip(missing, self._random(
                    group, [ps[i] for i in missing],
                    [self._refresh_count(group, ps[i], t)[0] - 1 for i in missing])))
            self._carry_all(group, hist, mom, due, replaced, factors, k)
        sharding = self.layout["sharding"]
        info = self.layout["info"]
        low = torch.empty(len(ps), k, device=ps[0].device)
        for i, p in enumerate(ps):
            # Sharded: this rank's rows of the gradient against the same rows of U (the sum over
            # ranks, taken in step(), is the projection of the whole gradient).
            g = _local(p.grad)
            fs = self._row_factors(factors[i], info[p]["rows"])
            if projection.is_index(fs):
                # U_i = I[:, S_i]: the projection is the S_1 x .. x S_d block of g (a gather, no matmul).
                if g.shape[0] == 0:          # a rank without rows of this matrix
                    low[i] = 0
                    continue
                flat = self._block_offsets(p, g, fs[:g.dim()])
                if len(fs) > g.dim():        # sharded: zero the entries of other ranks' rows
                    block = _flat(g).index_select(0, flat).view(ranks) * fs[-1].view(-1, *[1] * (g.dim() - 1))
                    low[i] = block.reshape(-1)
                else:
                    torch.index_select(_flat(g), 0, flat, out=low[i])
            elif g.dim() == 2:
                u, v = fs
                # (G V) first: the long inner dimension on G's contiguous rows (measured faster
                # than U^T G), then U^T (G V), an r x r product.
                torch.mm(u.t(), torch.mm(g.float(), v), out=low[i].view(ranks))
            else:
                low[i] = projection.project(g.unsqueeze(0).float(), [f.unsqueeze(0) for f in fs]).reshape(-1)
        plan.update(group=group, ranks=ranks, factors=factors, bufs=bufs, low=low, t=t,
                    k_rows=sharding.rows(k) if sharding else (0, k))

    def _block_offsets(self, p: torch.Tensor, t: torch.Tensor, index: list) -> torch.Tensor:
        """The storage offsets in t (p's gradient or p itself) of p's S_1 x .. x S_d block (index
        factors), in the block's row-major order: one index_select gathers the block, one index_add_
        steps it. Made once per subspace and layout (a refresh gives new factor tensors)."""
        key = (index[0], t.stride())
        entry = self._offsets.get(p)
        if entry is None or entry[0][0] is not key[0] or entry[0][1] != key[1]:
            d = len(index)
            offsets = sum(idx.view(*[idx.shape[0] if j == i else 1 for j in range(d)]) * t.stride(i)
                          for i, idx in enumerate(index))
            self._offsets[p] = entry = (key, offsets.reshape(-1))
        return entry[1]

    def _row_factors(self, factors: list, rows: tuple[int, int]) -> list:
        """The factors restricted to a rank's rows [start, stop) of mode 0 (all of them in one
        process). Index factors keep all r_0 entries, each moved to a local row (clamped into range)
        and followed by a 0/1 weight per entry, 1 where the row is this rank's:
        [S_0 - start, S_1, .., S_d, weight]."""
        if self.layout["sharding"] is None:
            return factors
        start, stop = rows
        if projection.is_index(factors):
            mine = (factors[0] >= start) & (factors[0] < stop)
            local = (factors[0] - start).clamp(0, max(0, stop - start - 1))
            return [local, *factors[1:], mine.to(torch.float32)]
        return [factors[0][start:stop], *factors[1:]]

    def _record(self, plan: dict) -> None:
        """The projected gradient's column in the history ring (sharded: this rank's rows of it)."""
        hist = plan["bufs"]["history"]
        plan["low_full"] = plan["low"]
        plan["low"] = plan["low"][:, slice(*plan["k_rows"])]
        hist[:, :, plan["t"] % hist.shape[2]] = plan["low"]

    def _carry_all(self, group, hist, mom, due: list, replaced: dict, factors: list, k: int) -> None:
        """Refresh members `due` into their new subspaces. Sharded, the carry mixes all k
        coordinates: gather those members' history and momentum, carry, keep this rank's rows."""
        sharding = self.layout["sharding"]
        if sharding is None or group["refresh_policy"] == "reset":
            for i in due:
                self._carry_or_reset(group, hist, mom, i, replaced[i], factors[i])
            return
        start, stop = sharding.rows(k)
        whole_h = hist.new_zeros(len(due), k, hist.shape[2])
        whole_m = mom.new_zeros(len(due), k)
        whole_h[:, start:stop] = hist[due]
        whole_m[:, start:stop] = mom[due]
        whole_h, whole_m = sharding.sum_all([whole_h, whole_m])
        for j, i in enumerate(due):
            self._carry_or_reset(group, whole_h, whole_m, j, replaced[i], factors[i])
        hist[due] = whole_h[:, start:stop]
        mom[due] = whole_m[:, start:stop]

    def _momentum(self, plan: dict) -> torch.Tensor:
        """m = beta m + direction; returns ||m||^2 per member (sharded: of this rank's rows)."""
        mom = plan["bufs"]["momentum"]
        mom.mul_(plan["group"]["momentum"]).add_(plan["direction"].to(torch.float32))
        return mom.square().sum(dim=1)

    def _core_update(self, plan: dict, mom_norm: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The update in the subspace (its rows of k) and the residual's gain, from ||m||."""
        group, ps = plan["group"], plan["ps"]
        mom, low = plan["bufs"]["momentum"], plan["low"]
        numel = torch.tensor([float(p.numel()) for p in ps], device=mom.device)
        target = group["scale"] * numel.sqrt()                   # ||update|| = scale sqrt(n1..nd)
        if not group["residual"]:
            # Graft: the update's RMS per weight is `scale` (so lr is AdamW's lr).
            return mom * (target / mom_norm.clamp_min(1e-30))[:, None], None   # mom = 0 -> update = 0
        # The gradient normalised to RMS `scale` per weight, with its in-subspace part
        # U g_low V^T replaced by the momentum direction of the same norm; the rest
        # R = g - U g_low V^T (orthogonal to the subspace) is kept, its norm growing by at
        # most `residual_growth` per step (Fira's limiter, for when the subspace goes stale).
        g_norm = plan["grad_norm"].clamp_min(1e-30)
        low_norm = torch.linalg.vector_norm(plan["low_full"], dim=1)
        gain = target / g_norm
        res_norm = gain * (g_norm.square() - low_norm.square()).clamp_min(0).sqrt()
        prev = plan["bufs"]["residual_norm"]
        cap = group["residual_growth"] * prev
        res_gain = gain * torch.where(res_norm > cap, cap / res_norm, torch.ones_like(res_norm))
        prev.copy_(torch.minimum(res_norm, cap))
        coef = gain * low_norm / mom_norm.clamp_min(1e-30)
        return mom * coef[:, None] - low * res_gain[:, None], res_gain

    def _apply(self, plan: dict, update: torch.Tensor, res_gain: Optional[torch.Tensor]) -> None:
        """W <- W (1 - lr wd) - lr (U update V^T [+ res_gain g]), in place, on this rank's rows."""
        group, ps, ranks = plan["group"], plan["ps"], plan["ranks"]
        lr, wd = group["lr"], group["weight_decay"]
        decay = 1.0 - lr * wd
        info = self.layout["info"]
        # -lr x the core updates and the residual gains, each member's row taken in one op.
        steps = update.mul(-lr).unbind() if projection.is_index(plan["factors"][0]) else None
        gains = res_gain.unbind() if res_gain is not None else None
        for i, p in enumerate(ps):
            fs = self._row_factors(plan["factors"][i], info[p]["rows"])
            w = _local(p)
            if projection.is_index(fs):
                # U core V^T lives on the S_0 x .. x S_d block: decay everything, add into the block.
                if wd != 0:
                    w.mul_(decay)
                core = steps[i].to(w.dtype)
                if len(fs) > w.dim():        # sharded: only this rank's rows
                    core = (core.view(ranks) * fs[-1].view(-1, *[1] * (w.dim() - 1)).to(w.dtype)).reshape(-1)
                if w.shape[0] > 0:
                    _flat(w).index_add_(0, self._block_offsets(p, w, fs[:w.dim()]), core)
            elif p.dim() == 2:
                u, v = fs
                # W <- decay W - lr U (core V^T): one in-place addmm, no full-size temporary.
                right = torch.mm(update[i].view(ranks), v.t())
                w.addmm_(u.to(w.dtype), right.to(w.dtype), beta=decay, alpha=-lr)
            else:
                full = projection.project_back(update[i].view(1, *ranks), [f.unsqueeze(0) for f in fs])[0]
                if wd != 0:
                    w.mul_(decay)
                w.add_(full.to(w.dtype), alpha=-lr)
            if gains is not None:
                w.addcmul_(_local(p.grad), gains[i].to(w.dtype), value=-lr)
            self.state[p]["step"] = plan["t"] + 1

    def _refresh_tucker(self, group, ps, due, factors, hist, mom, t) -> list:
        """HOSVD of the gradients of members whose refresh is due (one at a time: no stacked
        copy of gradients): store the new factors, move history/momentum into them."""
        store = _DTYPES[group["projector_dtype"]]
        factors = list(factors)
        for i in due:
            p = ps[i]
            ranks = self.layout["info"][p]["ranks"]
            new = [f[0] for f in projection.tucker_factors(p.grad.unsqueeze(0).float(), ranks,
                                                             method=group["tucker_method"])]
            old = factors[i]
            if old is None and t > 0:
                # A parameter added after step 0 starts from its random subspace.
                old = self._random(group, [p], [0])[0]
            st = self.state[p]
            for m, f in enumerate(new):
                st[f"factor{m}"] = f if store == torch.float32 else f.to(store)
            # Use the stored (possibly rounded) factors so DDP ranks and resumed runs agree.
            fs = [st[f"factor{m}"].float() for m in range(len(new))]
            self._factors[p] = (st["factor0"], fs)
            factors[i] = fs
            if old is not None:
                self._carry_or_reset(group, hist, mom, i, old, fs)
        return factors

    @staticmethod
    def _carry_or_reset(group, hist, mom, i: int, old_factors, factors) -> None:
        """Move member i's history/momentum into its new subspace (or zero them)."""
        if group["refresh_policy"] == "reset":
            hist[i] = 0
            mom[i] = 0
            return
        ranks = [f.shape[-1] for f in factors]
        maps = projection.change_of_basis([f.unsqueeze(0) for f in factors],
                                          [f.unsqueeze(0) for f in old_factors])
        s = hist.shape[2]
        cols = hist[i].t().reshape(s, *ranks)
        moved = projection.project(cols, [m.expand(s, -1, -1) for m in maps])
        hist[i] = moved.reshape(s, -1).t()
        mom[i] = projection.project(mom[i].view(1, *ranks), maps).reshape(-1)

    # ------------------------------------------------------------------ preconditioners
    def _precondition_all(self, plans: list) -> None:
        """Phase 3b: each plan's direction. The NGD solves of all buckets that share solve
        settings go through ONE batched Cholesky ladder (their s x s systems have one size)."""
        ngd = defaultdict(list)
        for plan in plans:
            group, hist, low = plan["group"], plan["bufs"]["history"], plan["low"]
            kind = group["preconditioner"]
            if kind == "none":
                plan["direction"] = low
            elif kind == "adam":
                beta2 = group["fallback_betas"][1]
                v = plan["bufs"]["exp_avg_sq"]
                v.mul_(beta2).addcmul_(low, low, value=1 - beta2)
                plan["direction"] = low / (v / (1 - beta2 ** (plan["t"] + 1))).sqrt().add_(group["fallback_eps"])
            elif kind == "sqrt":
                plan["direction"] = self._inverse_sqrt(hist, low, group)
            else:
                ngd[(group["damping"], group["solve_dtype"], group["max_retries"])].append(plan)
        for (damping, solve_dtype, retries), members in ngd.items():
            settings = {"damping": damping, "solve_dtype": solve_dtype, "max_retries": retries}
            sharding = self.layout["sharding"]
            results, _, failed = self._woodbury_many(
                [(pl["bufs"]["history"], pl["low"]) for pl in members], settings,
                reduce=sharding.sum_all if sharding else None)
            for pl, natural in zip(members, results):
                pl["direction"] = natural
            count = failed.sum()
            self._fallback_count = count if self._fallback_count is None else self._fallback_count + count

    @staticmethod
    def _lambda(G: torch.Tensor, damping: float) -> torch.Tensor:
        """damping x mean squared norm of the stored (non-zero) history columns, per member."""
        return SubspaceNGD._lambda_from_columns(torch.linalg.vector_norm(G, dim=1).square(), damping)

    @staticmethod
    def _lambda_from_columns(cols: torch.Tensor, damping: float) -> torch.Tensor:
        """The lambda rule from the squared column norms [B, s] (the Gram diagonal)."""
        stored = (cols > 0).sum(dim=1).clamp_min(1).to(cols.dtype)
        floor = torch.finfo(cols.dtype).tiny ** 0.5
        return (damping * cols.sum(dim=1) / stored).clamp_min(floor)

    @staticmethod
    def _woodbury_solve(hist: torch.Tensor, grad: torch.Tensor,
                        group: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(lam I + G G^T)^-1 g per member of one bucket; see _woodbury_many."""
        results, lam, failed = SubspaceNGD._woodbury_many([(hist, grad)], group)
        return results[0], lam, failed

    @staticmethod
    def _woodbury_many(pairs: list, group: dict, reduce: Optional[Callable] = None
                       ) -> tuple[list, torch.Tensor, torch.Tensor]:
        """(lam I + G G^T)^-1 g for every member of several buckets ([B_i, k_i, s] histories,
        [B_i, k_i] gradients) via Woodbury: (g - G z) / lam with (lam I_s + G^T G) z = G^T g.
        The s x s systems of all buckets are factorised together, and the retries are a ladder
        of lam values in the same batched call (no host sync); the first rung that factorises
        wins. Returns (per-bucket results in the history dtype, lam used, all rungs failed) — the last
        two concatenated over buckets. `reduce` sums [Grams, G^T g] over ranks when the histories
        are sharded by rows (each rank then solves the same s x s systems)."""
        dtype = _DTYPES[group["solve_dtype"]]
        # The k x s products run in the history's own dtype (fp32 in the optimizer: no fp64 copy
        # of the history); only the s x s systems are promoted to solve_dtype. lam comes from the
        # Gram's diagonal (the squared column norms).
        Gs = [hist for hist, _ in pairs]
        gs = [grad.to(hist.dtype) for hist, grad in pairs]
        # G^T [G | g] in one product per bucket: the Gram [B, s, s] and the right side [B, s, 1].
        both = [torch.bmm(G.transpose(1, 2), torch.cat([G, g.unsqueeze(-1)], dim=2)) for G, g in zip(Gs, gs)]
        both = (both[0] if len(both) == 1 else torch.cat(both)).to(dtype)
        gram, rhs = both[..., :-1], both[..., -1:]
        if reduce is not None:
            gram, rhs = reduce([gram, rhs])
        diag = gram.diagonal(dim1=1, dim2=2)
        lam = SubspaceNGD._lambda_from_columns(diag, group["damping"])
        s, R = gram.shape[2], group["max_retries"]
        eye, powers = _ladder_constants(s, R, dtype, gram.device)
        # Rung j >= 1: lam raised x10 per retry and to at least 1e-6 of the Gram scale, i.e.
        # 10^j max(lam, 1e-7 scale). Rung R+1 is the lam of a member whose every try failed.
        scale = diag.mean(dim=1).clamp_min(torch.finfo(dtype).tiny ** 0.5)
        ladder = torch.maximum(lam, scale.mul_(1e-7)).unsqueeze(1) * powers
        ladder[:, 0] = lam
        chol, info = torch.linalg.cholesky_ex(torch.addcmul(gram.unsqueeze(1), ladder[:, :R + 1, None, None], eye))
        ok = info == 0                                             # [B, R+1]
        failed = ~ok.any(dim=1)
        first = torch.where(failed, R + 1, ok.to(torch.int8).argmax(dim=1))
        lam = ladder.gather(1, first.unsqueeze(1)).squeeze(1)
        pick = chol[torch.arange(chol.shape[0], device=chol.device), first.clamp_max(R)]
        # A member whose every rung failed takes z = 0 (its pick holds no factor: solve, then drop).
        z = torch.cholesky_solve(rhs, pick).masked_fill_(failed[:, None, None], 0.0)
        results, start = [], 0
        for G, g in zip(Gs, gs):
            stop = start + G.shape[0]
            # lam may lie below the history dtype's range (an fp64 floor for a vanishing
            # history): floor it there too, or g / lam is 0 / 0.
            lams = lam[start:stop, None].to(G.dtype).clamp_min(torch.finfo(G.dtype).tiny ** 0.5)
            results.append(torch.baddbmm(g.unsqueeze(-1), G, z[start:stop].to(G.dtype), alpha=-1).squeeze(-1).div_(lams))
            start = stop
        return results, lam, failed

    @staticmethod
    def _inverse_sqrt(hist: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """F^-1/2 g with F = lam I + G G^T, via the eigendecomposition of the s x s Gram:
        on span(G) the eigenvalues are lam + sigma^2, on its complement lam."""
        dtype = _DTYPES[group["solve_dtype"]]
        G, g = hist.to(dtype), grad.to(dtype)
        lam = SubspaceNGD._lambda(G, group["damping"])
        sig2, V = torch.linalg.eigh(G.transpose(1, 2) @ G)           # [B, s], [B, s, s]
        keep = sig2 > sig2.amax(dim=1, keepdim=True).clamp_min(1e-300) * 1e-10
        inv_sig = torch.where(keep, sig2.clamp_min(1e-300).rsqrt(), torch.zeros_like(sig2))
        Ug = (G @ V) * inv_sig[:, None, :]                            # orthonormal span of G
        coef = (Ug.transpose(1, 2) @ g.unsqueeze(-1)).squeeze(-1)     # [B, s]
        inside = (Ug @ ((lam[:, None] + sig2).rsqrt() * coef).unsqueeze(-1)).squeeze(-1)
        outside = (g - (Ug @ coef.unsqueeze(-1)).squeeze(-1)) * lam[:, None].rsqrt()
        return inside + outside

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
        fused = _fused_ok(adam_params)
        states = [self._adam_state(p, fused) for p in adam_params]
        beta1, beta2 = group["fallback_betas"]
        # On this rank's part of sharded parameters and their (equally sharded) moments.
        functional_adam([_local(p) for p in adam_params], [_local(p.grad) for p in adam_params],
                        [_local(st["exp_avg"]) for st in states], [_local(st["exp_avg_sq"]) for st in states],
                        [], [st["step"] for st in states], foreach=not fused, fused=fused,
                        decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                        lr=group["lr"], weight_decay=group["weight_decay"],
                        eps=group["fallback_eps"], maximize=False)

    def _adam_state(self, p: torch.Tensor, fused: bool) -> dict:
        st = self.state[p]
        if "exp_avg" not in st:
            # fused kernels want the step counter on the parameter's device
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif fused and st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
        return st

    @torch.no_grad()
    def init_state(self) -> None:
        """Create every parameter's state as its first step would (zeros), without stepping. torch's
        distributed checkpoint loading fills a checkpoint into the state that exists (under FSDP, each
        rank's shards), and creates none itself for an optimizer that skips all-zero gradients."""
        info = self.layout["info"]
        for group in self.param_groups:
            for p in group["params"]:
                if p not in info and (group["fallback"] == "adamw" or p.dim() < 2):
                    self._adam_state(p, _fused_ok([p]))
        for bucket, members in self.layout["buckets"].items():
            group = self.param_groups[bucket[0]]
            self._bucket_state(bucket, group, members, math.prod(bucket[1]), group["history"])

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its shards of sharded state)."""
        return sum(_local(v).numel() * _local(v).element_size()
                   for st in self.state.values() for v in st.values() if torch.is_tensor(v))

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
        """Load by parameter NAME when both sides have names (a frozen or new parameter then
        leaves the others' state alone), else by position as torch does. torch casts floating
        state to the parameter dtype; keep our fp32 statistics as saved, on the parameter's device."""
        state_dict = self._match_by_name(state_dict)
        saved = state_dict["state"]
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            for key, value in saved.get(pid, {}).items():
                if torch.is_tensor(value) and key != "step":
                    self.state[p][key] = value.to(device=p.device).clone()
                elif torch.is_tensor(value) and _fused_ok([p]):
                    self.state[p][key] = value.to(device=p.device)
        self._layout = None
        self._cache = {}
        self._factors = {}
        self._offsets = {}

    def _match_by_name(self, state_dict: dict) -> dict:
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or not all(
                "param_names" in s and "param_names" in g for s, g in zip(saved_groups, self.param_groups)):
            return state_dict
        if all(s["param_names"] == g["param_names"] for s, g in zip(saved_groups, self.param_groups)):
            return state_dict
        state, groups, next_id = {}, [], 0
        for s, g in zip(saved_groups, self.param_groups):
            by_name = dict(zip(s["param_names"], s["params"]))
            ids = []
            for name in g["param_names"]:
                if name in by_name and by_name[name] in state_dict["state"]:
                    state[next_id] = state_dict["state"][by_name[name]]
                ids.append(next_id)
                next_id += 1
            groups.append({**s, "params": ids, "param_names": list(g["param_names"])})
        return {"state": state, "param_groups": groups}
