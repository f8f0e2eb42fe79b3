"""Lightning strategies for SubspaceNGD, registered on import as `sngd` and `sngd_ddp`.

- `sngd`: one device. Checks at setup that the task's optimizer is a SubspaceNGD (the config
  asked for it), so a mismatched `optim=` fails before the first step.
- `sngd_ddp`: DDP whose communication hook all-reduces projected gradients (comm_hook.py).
  Lightning's DDPStrategy registers comm hooks only on CUDA; this one registers its hook on
  every device, so it works with gloo on CPU (`trainer=ddp_cpu`).

`resolve_strategy` maps (trainer strategy, optim strategy) to the `Trainer(strategy=...)` value.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry

from dociq.optim.comm_hook import ProjectedAllReduceState, projected_allreduce_hook
from dociq.optim.sngd import SubspaceNGD

SINGLE_DEVICE_NAMES = ("auto", "single_device", "sngd", None)
DDP_NAMES = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true",
             "ddp_find_unused_parameters_false", "sngd_ddp")
# Sharded strategies take any optimizer as it is: SubspaceNGD shards its own state over their mesh.
FSDP_NAMES = ("fsdp2",)


def _unwrap(optimizer):
    return optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def _require_sngd(strategy_name: str, optimizers: list) -> None:
    for opt in optimizers:
        if not isinstance(_unwrap(opt), SubspaceNGD):
            raise TypeError(
                f"strategy={strategy_name!r} needs a SubspaceNGD optimizer but the task built "
                f"{type(_unwrap(opt)).__name__}: use `optim=sngd`, or drop the optim config's "
                "`strategy: sngd` line for other optimizers.")


class _RequiresSNGD:
    """Mixin: after Lightning builds the optimizers, insist that they are SubspaceNGD."""

    strategy_name: str

    def setup_optimizers(self, trainer) -> None:
        super().setup_optimizers(trainer)
        _require_sngd(self.strategy_name, self.optimizers)


class SNGDSingleDeviceStrategy(_RequiresSNGD, SingleDeviceStrategy):
    strategy_name = "sngd"

    def __init__(self, device: Union[str, torch.device] = "cpu", **kwargs) -> None:
        super().__init__(device=device, **kwargs)

    def setup_environment(self) -> None:
        # The registry builds us before the accelerator is known; follow it to the GPU.
        if isinstance(self.accelerator, CUDAAccelerator) and self.root_device.type == "cpu":
            self._root_device = torch.device("cuda", torch.cuda.current_device())
        super().setup_environment()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="single device, SubspaceNGD optimizer",
                                   override=True)


class SNGDDDPStrategy(_RequiresSNGD, DDPStrategy):
    strategy_name = "sngd_ddp"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.comm_state = ProjectedAllReduceState(optimizer=self._current_optimizer)

    def _current_optimizer(self) -> Optional[SubspaceNGD]:
        optimizers = [_unwrap(o) for o in self.optimizers]
        return optimizers[0] if optimizers and isinstance(optimizers[0], SubspaceNGD) else None

    def _register_ddp_hooks(self) -> None:
        # Unlike DDPStrategy (CUDA only), register on every device: the hook only needs
        # dist.all_reduce, which gloo provides on CPU.
        self.comm_state.process_group = None
        self.model.register_comm_hook(self.comm_state, projected_allreduce_hook)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls,
                                   description="DDP with projected-gradient all-reduce for SubspaceNGD",
                                   override=True)
        strategy_registry.register("sngd_ddp_spawn", cls, start_method="spawn",
                                   description="sngd_ddp started with torch.multiprocessing spawn",
                                   override=True)
        for name, start_method in (("sngd_ddp", "popen"), ("sngd_ddp_spawn", "spawn")):
            strategy_registry.register(f"{name}_find_unused_parameters_true", cls, start_method=start_method,
                                       find_unused_parameters=True,
                                       description=f"{name} for models with parameters unused on some steps",
                                       override=True)


def register() -> None:
    SNGDSingleDeviceStrategy.register_strategies(StrategyRegistry)
    SNGDDDPStrategy.register_strategies(StrategyRegistry)


def resolve_strategy(trainer_strategy: Optional[str], optim_strategy: Optional[str],
                     devices: Union[int, str, None] = None) -> Optional[str]:
    """What to pass as `Trainer(strategy=...)`.

    trainer_strategy: the trainer config's `strategy` ("auto", "ddp", ...); optim_strategy: the
    optim config's `strategy` (None, or "sngd"). Without an optim strategy the trainer's wins;
    with "sngd", one device gives "sngd" and a DDP request (or "auto" with devices > 1) gives
    "sngd_ddp" (same start method)."""
    if optim_strategy is None:
        return trainer_strategy
    if optim_strategy != "sngd":
        raise ValueError(f"optim.strategy={optim_strategy!r} is unknown: configs/optim/*.yaml "
                         "may set `strategy: sngd` or `strategy: null`.")
    if trainer_strategy in FSDP_NAMES:
        return trainer_strategy
    multi = isinstance(devices, int) and devices > 1 or devices == -1
    if trainer_strategy in SINGLE_DEVICE_NAMES and not multi:
        return "sngd"
    if trainer_strategy in DDP_NAMES or (trainer_strategy in SINGLE_DEVICE_NAMES and multi):
        return "sngd_ddp_spawn" if trainer_strategy == "ddp_spawn" else "sngd_ddp"
    raise ValueError(f"trainer.strategy={trainer_strategy!r} cannot run SubspaceNGD: use "
                     "trainer.strategy=auto (one device), ddp (trainer=ddp_cpu) or fsdp2 (trainer=fsdp_cpu), or pick "
                     "another optimizer with optim=adamw.")


def allowing_unused_parameters(strategy: Optional[str]) -> Optional[str]:
    """The DDP strategy's variant that tolerates parameters without a gradient on a step
    (`<name>_find_unused_parameters_true`); a single-device strategy is returned as it is."""
    if not isinstance(strategy, str) or "ddp" not in strategy:
        return strategy
    base = strategy.removesuffix("_find_unused_parameters_false").removesuffix("_find_unused_parameters_true")
    variant = f"{base}_find_unused_parameters_true"
    if variant not in StrategyRegistry:
        raise ValueError(f"trainer.strategy={strategy!r} has no find_unused_parameters variant, and this "
                         "stage leaves some parameters without a gradient on some steps: use trainer=ddp_cpu "
                         "(strategy: ddp) or ddp_spawn")
    return variant


register()
