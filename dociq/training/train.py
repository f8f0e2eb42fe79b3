"""Hydra entry point: compose the config, build data, task and trainer, fit, return the metric.

    python train.py stage=pretrain                      # the main job, model=tiny on the CPU
    python train.py stage=finetune init.from=PATH       # start from a pretrain checkpoint
    python train.py -m stage=pretrain optim=sngd,adamw  # a sweep, one output dir per job
    python train.py --cfg job stage=pretrain            # print the composed config
    python train.py stage=pretrain debug=fdr            # one step, one validation batch (configs/debug/)

A run prints its config as a tree (also saved to <output_dir>/config_tree.log); progress is the
rich bar in a terminal and plain lines in a log file (dociq/training/progress.py). `dociq train ...` (the
console script, dociq/cli/__init__.py) is the same entry point.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback as HydraCallback
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict

from dociq.io.checkpoint import read_checkpoint
from dociq.optim.strategy import allowing_unused_parameters, resolve_strategy  # registers dociq's strategies
from dociq.training.callbacks import LoggerRunIds, RngState, SkippedPages, StopOnNonFinite
from dociq.training.checkpoint_io import AtomicCheckpointIO
from dociq.training.precision import precision_plugins
from dociq.training.config import CONFIG_DIR, register_resolvers
from dociq.training.config_checks import check_config
from dociq.training.fsdp import FSDP2Strategy  # noqa: F401 - registers trainer.strategy=fsdp2
from dociq.training.progress import progress_callbacks
from dociq.training.tasks.registry import resolve_stage

log = logging.getLogger("dociq.training.train")


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


def remove_orphan_temp_files(checkpoint_dir: Path) -> list[Path]:
    """Delete `.<name>.ckpt.*.tmp` files that a killed save left behind (AtomicCheckpointIO writes a
    temporary file, then renames it). Called before the trainer starts, when no save is running."""
    orphans = sorted(checkpoint_dir.glob(".*.ckpt.*.tmp")) if checkpoint_dir.is_dir() else []
    for path in orphans:
        path.unlink(missing_ok=True)
        log.info("removed %s, left by an interrupted checkpoint save", path)
    return orphans


def resume_state(ckpt_path: str | None) -> dict:
    """What the loggers need to continue the checkpoint's run: its step and the wandb run id.

    Reading the whole checkpoint here, before any logger opens its files, means a checkpoint that
    cannot be loaded (truncated, corrupt) stops the run with every file as it was."""
    if ckpt_path is None:
        return {}
    ckpt = read_checkpoint(ckpt_path, option="ckpt_path")
    for key in ("global_step", "state_dict"):
        if key not in ckpt:
            raise ValueError(f"ckpt_path={ckpt_path} has no '{key}': it is not a Lightning training "
                             "checkpoint (a weights file?). Fix: start from its weights with "
                             "init.from=<path> instead of resuming it")
    ids = ckpt.get("callbacks", {}).get("LoggerRunIds", {})
    return {"step": int(ckpt["global_step"]), "wandb_id": ids.get("wandb")}


def resume_kwargs(target: str, resume: dict) -> dict:
    """Per-logger arguments that continue the previous run instead of starting over."""
    if not resume:
        return {}
    name = target.rsplit(".", 1)[-1]
    if name == "ResumableCSVLogger":
        return {"resume_step": resume["step"]}
    if name == "TensorBoardLogger":
        return {"purge_step": resume["step"]}   # hides events the resumed run writes again
    if name == "WandbLogger" and resume.get("wandb_id"):
        return {"id": resume["wandb_id"], "resume": "allow"}
    return {}


def build_strategy(cfg: DictConfig):
    """The Lightning strategy: the trainer's, adapted to what the optimizer wants (e.g. SubspaceNGD's
    projected-gradient DDP hook) and to a stage whose steps may leave parameters without a gradient."""
    trainer_strategy = cfg.trainer.get("strategy", "auto")
    optim_strategy = cfg.optim.get("strategy")
    strategy = (trainer_strategy if optim_strategy is None
                else resolve_strategy(trainer_strategy, optim_strategy, cfg.trainer.get("devices")))
    if (cfg.get("stage") or {}).get("unused_parameters"):
        strategy = allowing_unused_parameters(strategy)
    return strategy


def build_trainer(cfg: DictConfig, resume: dict | None = None) -> L.Trainer:
    loggers = [instantiate(c, **resume_kwargs(c.get("_target_", ""), resume or {}))
               for c in (cfg.get("logger") or {}).values() if c is not None]
    # checkpoints are saved when validation ends; without validation, every val_check_interval steps
    every_n = {} if has_validation(cfg) else {"every_n_train_steps": int(cfg.trainer.val_check_interval)}
    callbacks = [instantiate(c, **(every_n if str(c.get("_target_", "")).endswith(".ModelCheckpoint") else {}))
                 for c in (cfg.get("callbacks") or {}).values() if c is not None]
    # Built in, whatever `callbacks=` says: they guard against silent divergence and make resume exact.
    callbacks += [StopOnNonFinite(), RngState(), SkippedPages(), LoggerRunIds()]
    trainer_kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_kwargs["strategy"] = build_strategy(cfg)
    # the data module's StepBatchSampler splits each step's batch by rank itself (exact resume under
    # DDP); Lightning's DistributedSampler cannot wrap a batch sampler
    trainer_kwargs["use_distributed_sampler"] = False
    # A terminal gets the rich bar counting steps; a log file / CI gets plain progress lines instead.
    progress = cfg.get("progress") or {}
    extra, trainer_kwargs["enable_progress_bar"] = progress_callbacks(
        bool(trainer_kwargs.get("enable_progress_bar", True)), progress.get("every_n_steps", 50),
        progress.get("every_n_seconds", 60.0), existing=callbacks)
    callbacks += extra
    if isinstance(trainer_kwargs.get("profiler"), dict):   # e.g. debug=profiler: a profiler with a file
        trainer_kwargs["profiler"] = instantiate(cfg.trainer.profiler)
    plugins = [AtomicCheckpointIO(), *precision_plugins(trainer_kwargs, trainer_kwargs["strategy"])]
    return L.Trainer(**trainer_kwargs, logger=loggers, callbacks=callbacks, plugins=plugins)


def leave_process_group_together() -> None:
    """After a distributed fit, wait for every rank, then close the process group. A rank that
    exits while another still reads from it (rank 0 gathering and writing the last full
    checkpoint under FSDP) can reset their gloo connection, the likely cause of a rare
    "Connection reset by peer" on rank 0 mid-gather (seen once, not reproduced)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def finish_wandb_runs(trainer: L.Trainer) -> None:
    """End this job's wandb run. Lightning leaves it open, and the next `train()` in the same process
    (a Hydra multirun job, a test) would otherwise log into it instead of its own run."""
    for lg in trainer.loggers:
        # private on purpose: the public `lg.experiment` would start a run when none was started
        run = getattr(lg, "_experiment", None) if type(lg).__name__ == "WandbLogger" else None
        if run is not None and hasattr(run, "finish"):
            run.finish()


def config_tree(cfg: DictConfig, first: Sequence[str] = ("stage", "task", "model", "data", "optim",
                                                          "trainer", "callbacks", "logger", "paths")):
    """The config as a rich Tree, one branch per top-level key (lightning-hydra-template's
    print_config_tree). Values are resolved where they can be; a branch that cannot be (an
    interpolation only Hydra's runtime knows) is shown as written."""
    import rich.syntax
    import rich.tree

    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    for key in [k for k in first if k in cfg] + [k for k in cfg if k not in first]:
        branch = tree.add(str(key), style="dim", guide_style="dim")
        node = cfg[key] if not OmegaConf.is_missing(cfg, key) else "???"
        if isinstance(node, DictConfig):
            try:
                text = OmegaConf.to_yaml(node, resolve=True)
            except Exception:  # noqa: BLE001 - show the unresolved branch rather than nothing
                text = OmegaConf.to_yaml(node, resolve=False)
        else:
            text = str(node)
        branch.add(rich.syntax.Syntax(text, "yaml"))
    return tree


@rank_zero_only
def print_config_tree(cfg: DictConfig) -> Path:
    """Print the composed config as a tree and save it to `<output_dir>/config_tree.log`."""
    import io

    import rich
    import rich.console

    tree = config_tree(cfg)
    rich.print(tree)
    text = io.StringIO()
    rich.console.Console(file=text, width=120, color_system=None).print(tree)
    path = Path(cfg.paths.output_dir) / "config_tree.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(line.rstrip() for line in text.getvalue().splitlines()) + "\n")
    return path


def has_validation(cfg: DictConfig) -> bool:
    return cfg.data.get("val_set") is not None and cfg.trainer.get("limit_val_batches", 1) != 0


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit the stage `cfg.stage.name`; return the trainer's final metrics."""
    check_config(cfg)
    L.seed_everything(cfg.seed, workers=True)
    ckpt_path = resolve_checkpoint(cfg)
    resume = resume_state(ckpt_path)
    remove_orphan_temp_files(Path(cfg.paths.output_dir) / "checkpoints")
    if cfg.get("print_config", False):  # after the checks above: a failed resume changes no file
        print_config_tree(cfg)
    task_cls = resolve_stage(cfg.stage.name)

    datamodule = instantiate(cfg.data, _convert_="all")
    task_kwargs = instantiate(cfg.task, _convert_="all") if cfg.get("task") is not None else {}
    optimizer = instantiate(cfg.optim.optimizer)
    scheduler = instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None
    task = task_cls(**task_kwargs, optimizer=optimizer, scheduler=scheduler)

    trainer = build_trainer(cfg, resume)
    log.info("stage=%s  model=%s  optim=%s  output_dir=%s", cfg.stage.name, cfg.model.size,
             cfg.optim.optimizer._target_.rsplit(".", 1)[-1], cfg.paths.output_dir)
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path)
    finally:
        finish_wandb_runs(trainer)
    leave_process_group_together()

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if torch.is_tensor(v) and v.numel() == 1}
    ckpt_cb = trainer.checkpoint_callback
    if ckpt_cb is not None and trainer.is_global_zero:
        print(f"\n[dociq] checkpoints: {ckpt_cb.dirpath}  (best: {ckpt_cb.best_model_path or '-'}, "
              f"last: {ckpt_cb.last_model_path or '-'})")
        for lg in trainer.loggers:
            print(f"[dociq] {type(lg).__name__} logs: {lg.log_dir}")
        skipped = next((cb.total for cb in trainer.callbacks if isinstance(cb, SkippedPages)), 0)
        if skipped:
            print(f"[dociq] {skipped} bad pages were skipped (on_bad_sample=skip); "
                  "the warnings above name the files")
    return metrics


class OptunaSearchSpaceCheck(HydraCallback):
    """Stop an Optuna sweep before its first trial when it has no search space: no
    hparams_search/space/optuna_<stage>.yaml and no sweep override on the command line (it would
    run identical trials). Registered by configs/hparams_search/optuna.yaml."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if config.hydra.sweeper.get("params"):
            return
        overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        if any(o.is_sweep_override() for o in overrides):
            return
        stage = config.stage.name
        print(f"error: hparams_search=optuna has no search space for stage={stage}: add "
              f"configs/hparams_search/space/optuna_{stage}.yaml (like optuna_pretrain.yaml), or give one on "
              "the command line, e.g. 'optim.optimizer.lr=tag(log, interval(1e-4, 3e-3))'", file=sys.stderr)
        # Hydra turns a callback's exceptions into warnings and carries on; SystemExit is not an Exception
        raise SystemExit(2)


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
