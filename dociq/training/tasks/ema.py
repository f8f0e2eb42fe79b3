"""Exponential moving average of an online network into a target network (I-JEPA, D-JEPA).

target <- m * target + (1 - m) * online, with m rising linearly from `start` to `end` over the
run (I-JEPA: 0.996 -> 1.0), so the target freezes as training ends. `task_momentum` is that
schedule for a task in a Lightning run (stage=ijepa and stage=pretrain use it).
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


def task_momentum(task, start: float, end: float) -> float:
    """`momentum_schedule` at `task`'s (a LightningModule's) optimizer step, over the optimizer
    steps of its run: Lightning's `estimated_stepping_batches`, i.e. `trainer.max_steps`, or the
    steps of `trainer.max_epochs` epochs when those end the run first. A task outside a Trainer
    (e.g. a test calling `optimizer_step` itself) is at step 0."""
    try:
        trainer = task.trainer
    except RuntimeError:   # not attached to a Trainer: Lightning has no public "is attached" check
        return momentum_schedule(0, 1, start, end)
    total = trainer.estimated_stepping_batches
    if not total or total == float("inf"):
        raise ValueError("the EMA momentum schedule needs a finite run: set trainer.max_steps")
    return momentum_schedule(trainer.global_step, int(total), start, end)


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
