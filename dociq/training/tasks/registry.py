"""The one registry of training stages: `stage=<name>` -> the LightningModule that trains it.

Entries are import paths, resolved lazily, so that a stage's heavy imports are paid only when it
is chosen. `configs/stage/<name>.yaml` holds the stage's arguments under `task:`.
"""
from __future__ import annotations

import importlib

STAGES: dict[str, str] = {
    "ijepa": "dociq.training.tasks.ijepa:IJEPATask",
    "mlm": "dociq.training.tasks.mlm:MLMTask",
    "distill": "dociq.training.tasks.distill:DistillTask",
    "pretrain": "dociq.training.tasks.pretrain:PretrainTask",
    "finetune": "dociq.training.tasks.finetune:FinetuneTask",
}


def resolve_stage(name: str) -> type:
    """The task class of stage `name`, with an error that lists the choices."""
    if name not in STAGES:
        raise KeyError(f"unknown stage '{name}'; choose one of: {', '.join(sorted(STAGES))} "
                       "(e.g. `python train.py stage=pretrain`)")
    module_name, _, class_name = STAGES[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
