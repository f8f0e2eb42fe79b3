"""Hydra entry point: compose the config, build data, task and trainer, fit, return the metric.

    python train.py stage=pretrain                      # the main job, model=tiny on the CPU
    python train.py stage=finetune init.from=PATH       # start from a pretrain checkpoint
    python train.py -m stage=pretrain optim=sngd,adamw  # a sweep, one output dir per job
    python train.py --cfg job stage=pretrain            # print the composed config
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from dociq.config import CONFIG_DIR, register_resolvers
from dociq.tasks.checkpoint_io import AtomicCheckpointIO
from dociq.tasks.registry import resolve_stage

log = logging.getLogger("dociq.train")


def find_last_checkpoint(cfg: DictConfig) -> Path:
    """The newest `last.ckpt` among this task's runs (for `ckpt_path=last`)."""
    runs = Path(cfg.paths.log_dir) / cfg.task_name / "runs"
    candidates = sorted(runs.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(
            f"ckpt_path=last but no last.ckpt exists under {runs}/*/checkpoints/: "
            "start without ckpt_path, or give ckpt_path=/path/to/file.ckpt")
    return candidates[-1]


def resolve_checkpoint(cfg: DictConfig) -> str | None:
    """Turn `ckpt_path` into a file path. For `last`, the run continues in that run's directory."""
    if cfg.ckpt_path is None:
        return None
    if cfg.ckpt_path == "last":
        path = find_last_checkpoint(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(path.parent.parent)
        log.info("resuming %s in %s", path, cfg.paths.output_dir)
        return str(path)
    path = Path(cfg.ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={path} does not exist: give an existing .ckpt file or ckpt_path=last")
    return str(path)


def build_strategy(cfg: DictConfig):
    """The Lightning strategy: the trainer's, adapted to what the optimizer wants (e.g. SubspaceNGD's
    projected-gradient DDP hook)."""
    trainer_strategy = cfg.trainer.get("strategy", "auto")
    optim_strategy = cfg.optim.get("strategy")
    if optim_strategy is None:
        return trainer_strategy
    from dociq.optim.strategy import resolve_strategy  # registers the strategies

    return resolve_strategy(trainer_strategy, optim_strategy, cfg.trainer.get("devices"))


def build_trainer(cfg: DictConfig) -> L.Trainer:
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None]
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_kwargs["strategy"] = build_strategy(cfg)
    return L.Trainer(**trainer_kwargs, logger=loggers, callbacks=callbacks,
                     plugins=[AtomicCheckpointIO()])


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit the stage `cfg.stage.name`; return the trainer's final metrics."""
    L.seed_everything(cfg.seed, workers=True)
    ckpt_path = resolve_checkpoint(cfg)
    task_cls = resolve_stage(cfg.stage.name)

    datamodule = instantiate(cfg.data, _convert_="all")
    task_kwargs = instantiate(cfg.task, _convert_="all") if cfg.get("task") is not None else {}
    optimizer = instantiate(cfg.optim.optimizer)
    scheduler = instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None
    task = task_cls(**task_kwargs, optimizer=optimizer, scheduler=scheduler)

    trainer = build_trainer(cfg)
    log.info("stage=%s  model=%s  optim=%s  output_dir=%s", cfg.stage.name, cfg.model.size,
             cfg.optim.optimizer._target_.rsplit(".", 1)[-1], cfg.paths.output_dir)
    trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    ckpt_cb = trainer.checkpoint_callback
    if ckpt_cb is not None and trainer.is_global_zero:
        print(f"\n[dociq] checkpoints: {ckpt_cb.dirpath}  (best: {ckpt_cb.best_model_path or '-'}, "
              f"last: {ckpt_cb.last_model_path or '-'})")
        for lg in trainer.loggers:
            print(f"[dociq] {type(lg).__name__} logs: {lg.log_dir}")
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    register_resolvers()
    # Each job writes where Hydra put it: in a multirun every job has its own directory (even
    # jobs started within the same second).
    with open_dict(cfg):
        cfg.paths.output_dir = HydraConfig.get().runtime.output_dir
    metrics = train(cfg)
    metric_name = cfg.get("optimized_metric")
    if metric_name and metric_name in metrics:
        return metrics[metric_name]
    if metric_name:
        log.warning("optimized_metric '%s' was not logged; logged metrics: %s", metric_name, sorted(metrics))
    return None
