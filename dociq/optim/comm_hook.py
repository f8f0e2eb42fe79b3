"""DDP communication hook: all-reduce SubspaceNGD's projected gradients, not the full ones.

For a projected parameter the optimizer only ever uses g_low = g x1 U1^T ... xd Ud^T. The
projection is linear and U is identical on every rank (random: a function of the seed and
step; tucker: computed from the all-reduced gradient at its refresh step, so that step's
gradient goes through a full all-reduce), hence mean(g_low) = project(mean(g)): reducing k
numbers per matrix instead of n1*...*nd is exact. The hook writes project_back(mean(g_low))
into the bucket; the optimizer projects it again and gets mean(g_low) (U is orthonormal).
Parameters without a known subspace (fallback ones, tucker refresh steps) are reduced in full.

Works on any backend (gloo on CPU included): it only uses `dist.all_reduce`.
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist

from dociq.optim import projection


@dataclass
class ProjectedAllReduceState:
    """`optimizer` returns the SubspaceNGD in use (looked up lazily: DDP wraps the model
    before the optimizer exists). `traffic` counts the elements this rank all-reduced."""
    optimizer: Callable[[], Optional[object]]
    process_group: Optional[dist.ProcessGroup] = None
    traffic: int = 0
    full_size: int = 0
    calls: int = 0
    history: list = field(default_factory=list)


def projected_allreduce_hook(state: ProjectedAllReduceState,
                             bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    optimizer = state.optimizer()
    params, grads = bucket.parameters(), bucket.gradients()
    subspaces = [optimizer.subspace_of(p) if optimizer is not None and hasattr(optimizer, "subspace_of")
                 else None for p in params]
    pieces = []
    for g, factors in zip(grads, subspaces):
        if factors is None:
            pieces.append(g.reshape(-1))
        else:
            low = projection.project(g.unsqueeze(0).to(torch.float32), [f.unsqueeze(0) for f in factors])
            pieces.append(low.reshape(-1).to(g.dtype))
    flat = torch.cat(pieces).div_(world)
    state.traffic += flat.numel()
    state.full_size += bucket.buffer().numel()
    state.calls += 1
    future = dist.all_reduce(flat, group=group, async_op=True).get_future()

    def unpack(fut: torch.futures.Future) -> torch.Tensor:
        reduced = fut.value()[0]
        offset = 0
        for g, factors, piece in zip(grads, subspaces, pieces):
            chunk = reduced[offset:offset + piece.numel()]
            offset += piece.numel()
            if factors is None:
                g.copy_(chunk.view_as(g))
            else:
                ranks = [f.shape[-1] for f in factors]
                full = projection.project_back(chunk.view(1, *ranks).to(torch.float32),
                                               [f.unsqueeze(0) for f in factors], shape=g.shape)
                g.copy_(full[0].to(g.dtype))
        return bucket.buffer()

    return future.then(unpack)
