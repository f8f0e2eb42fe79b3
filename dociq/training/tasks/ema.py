"""Exponential moving average of an online network into a target network (I-JEPA, D-JEPA).

target <- m * target + (1 - m) * online, with m rising linearly from `start` to `end` over the
run (I-JEPA: 0.996 -> 1.0), so the target freezes as training ends.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


def momentum_schedule(step: int, total_steps: int, start: float = 0.996, end: float = 1.0) -> float:
    """Linear momentum from `start` at step 0 to `end` at `total_steps` (held at `end` after)."""
    if total_steps <= 0:
        raise ValueError(f"momentum_schedule needs total_steps > 0, got {total_steps}: set trainer.max_steps")
    progress = min(max(step, 0) / total_steps, 1.0)
    return start + (end - start) * progress


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """target <- momentum * target + (1 - momentum) * online, parameter by parameter.

    Floating-point buffers follow the same average; integer buffers (counters) are copied.
    The two modules must have the same parameter names and shapes (target = a deepcopy of online).
    """
    online_params = dict(online.named_parameters())
    target_params = dict(target.named_parameters())
    if online_params.keys() != target_params.keys():
        missing = sorted(online_params.keys() ^ target_params.keys())[:5]
        raise ValueError(f"ema_update: online and target parameters differ (e.g. {missing}); "
                         "build the target with make_ema_target(online)")
    names = list(online_params)
    torch._foreach_lerp_([target_params[n].data for n in names],
                         [online_params[n].data for n in names], 1.0 - momentum)
    online_buffers = dict(online.named_buffers())
    for name, buf in target.named_buffers():
        src = online_buffers[name]
        if buf.is_floating_point():
            buf.lerp_(src, 1.0 - momentum)
        else:
            buf.copy_(src)


def make_ema_target(online: nn.Module) -> nn.Module:
    """A frozen copy of `online` (no gradients, kept in eval mode by its owner)."""
    target = copy.deepcopy(online)
    target.requires_grad_(False)
    return target
