"""Lightning strategies `sngd` / `sngd_ddp`, and resolve_strategy."""
import warnings
from functools import partial

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import StrategyRegistry

from dociq.optim import factory
from dociq.optim.strategy import (SNGDDDPStrategy, SNGDSingleDeviceStrategy, allowing_unused_parameters,
                                  resolve_strategy)
from dociq.training.tasks.base import DociqTask


class Regression(DociqTask):
    def __init__(self, **kw):
        super().__init__(**kw)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                       torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 2))
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss


def _loader():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=gen)
    y = torch.stack([x[:, 0] * 2, torch.tanh(x[:, 1])], dim=1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


def _fit(strategy, optimizer, steps=25):
    task = Regression(optimizer=optimizer,
                      scheduler=partial(factory.warmup_cosine, warmup_steps=2, total_steps=steps))
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(task, _loader())
    return task, trainer


SNGD = partial(factory.sngd, lr=0.03, rank=4, history=4, refresh_every=5, min_numel=64)
# The projected all-reduce needs residual=False: the residual is the gradient outside the subspace.
SNGD_PROJECTED = partial(SNGD, residual=False)


def test_strategies_are_registered():
    assert StrategyRegistry["sngd"]["strategy"] is SNGDSingleDeviceStrategy
    assert StrategyRegistry["sngd_ddp"]["strategy"] is SNGDDDPStrategy


def test_sngd_strategy_trains():
    task, trainer = _fit("sngd", SNGD)
    assert isinstance(trainer.strategy, SNGDSingleDeviceStrategy)
    assert task.losses[-1] < 0.85 * task.losses[0], task.losses[::5]


def test_sngd_ddp_strategy_registers_hook_on_cpu():
    """One gloo process: Lightning would skip comm hooks on CPU; ours must reduce k numbers
    per projected matrix and the full size of the rest, every step."""
    steps = 6
    task, trainer = _fit("sngd_ddp", SNGD_PROJECTED, steps=steps)
    state = trainer.strategy.comm_state
    opt = trainer.strategy.optimizers[0]
    projected = [p for g in opt.param_groups for p in g["params"] if opt.is_projected(p, g)]
    k = sum(min(4, p.shape[0]) * min(4, p.shape[1]) for p in projected)
    rest = sum(p.numel() for p in task.parameters()) - sum(p.numel() for p in projected)
    assert len(projected) == 4                        # 32x16 and two 32x32 (ranks 4x4: one bucket), 2x32
    assert sorted(len(m) for m in opt.layout["buckets"].values()) == [1, 3]
    assert state.traffic == steps * (k + rest)
    assert state.full_size == steps * sum(p.numel() for p in task.parameters())
    assert task.losses[-1] < task.losses[0]


def test_sngd_ddp_reduces_full_gradients_when_the_residual_is_on():
    """residual=True uses the gradient outside the subspace: the hook must not drop it."""
    steps = 3
    task, trainer = _fit("sngd_ddp", SNGD, steps=steps)
    state = trainer.strategy.comm_state
    assert state.traffic == state.full_size == steps * sum(p.numel() for p in task.parameters())


def test_sngd_strategy_rejects_other_optimizers():
    with pytest.raises(TypeError, match="optim=sngd"):
        _fit("sngd", partial(factory.adamw, lr=1e-3), steps=3)


@pytest.mark.parametrize("trainer_strategy,optim_strategy,devices,expected", [
    ("auto", None, 1, "auto"),
    ("ddp", None, 2, "ddp"),
    ("auto", "sngd", 1, "sngd"),
    ("auto", "sngd", 2, "sngd_ddp"),
    ("ddp", "sngd", 2, "sngd_ddp"),
    ("ddp_spawn", "sngd", 2, "sngd_ddp_spawn"),
])
def test_resolve_strategy(trainer_strategy, optim_strategy, devices, expected):
    assert resolve_strategy(trainer_strategy, optim_strategy, devices) == expected


def test_resolve_strategy_errors_name_the_key():
    with pytest.raises(ValueError, match="optim.strategy"):
        resolve_strategy("auto", "muon")
    with pytest.raises(ValueError, match="trainer.strategy='fsdp'"):
        resolve_strategy("fsdp", "sngd")


@pytest.mark.parametrize("strategy, expected", [
    ("ddp", "ddp_find_unused_parameters_true"), ("ddp_spawn", "ddp_spawn_find_unused_parameters_true"),
    ("ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true"),
    ("sngd_ddp", "sngd_ddp_find_unused_parameters_true"), ("auto", "auto"), ("sngd", "sngd"), (None, None)])
def test_a_stage_with_unused_parameters_gets_the_tolerant_ddp_variant(strategy, expected):
    assert allowing_unused_parameters(strategy) == expected
    if expected and "ddp" in expected:
        built = StrategyRegistry.get(expected)
        assert built._ddp_kwargs.get("find_unused_parameters") is True
    with pytest.raises(ValueError, match="trainer.strategy='ddp_weird'"):
        allowing_unused_parameters("ddp_weird")


def test_finetune_under_ddp_asks_for_the_tolerant_variant():
    from dociq.training.config import compose
    from dociq.training.train import build_strategy

    assert build_strategy(compose(["stage=finetune", "trainer=ddp_cpu"])) == "ddp_find_unused_parameters_true"
    assert build_strategy(compose(["stage=finetune", "trainer=ddp_cpu", "optim=sngd"])) == \
        "sngd_ddp_find_unused_parameters_true"
    assert build_strategy(compose(["stage=pretrain", "trainer=ddp_cpu"])) == "ddp"
    assert build_strategy(compose(["stage=finetune"])) == "auto"
