"""Base class of every stage's LightningModule: the optimizer arrives from the config.

Tasks know nothing of `dociq.optim`: `optimizer` is a factory (a Hydra partial) that takes the
trainable `(name, parameter)` pairs and returns a `torch.optim.Optimizer`; `scheduler` takes
that optimizer and returns an LR scheduler stepped every optimizer step.
"""
from __future__ import annotations

from typing import Callable

import lightning as L
import torch

from dociq.training.fsdp import data_parallel_mesh, shard_task

OptimizerFactory = Callable[[list[tuple[str, torch.nn.Parameter]]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class DociqTask(L.LightningModule):
    # ThroughputMonitor reports model FLOP/s when a task sets this; none is counted yet
    flops_per_batch: int | None = None

    def __init__(self, optimizer: OptimizerFactory | None = None,
                 scheduler: SchedulerFactory | None = None) -> None:
        super().__init__()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler

    def trainable_named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """Parameters the optimizer updates (frozen parts and EMA targets excluded)."""
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]

    def configure_model(self) -> None:
        """Under `trainer.strategy=fsdp2`, shard the task's weights over the processes
        (dociq/training/fsdp.py); otherwise nothing to do."""
        mesh = data_parallel_mesh(self)
        if mesh is not None and not getattr(self, "_sharded", False):
            shard_task(self, mesh)
            self._sharded = True

    def log_losses(self, split: str, out: dict[str, torch.Tensor], batch_size: int) -> None:
        """Every loss term as `<split>/<name>`: per step in training, per epoch in validation."""
        for name, value in out.items():
            self.log(f"{split}/{name}", value.detach(), prog_bar=name == "loss",
                     on_step=split == "train", on_epoch=split == "val", batch_size=batch_size)

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer: pass `optimizer=` (a factory taking "
                "named parameters), e.g. select one with `optim=adamw` on the command line."
            )
        optimizer = self.optimizer_factory(self.trainable_named_parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
