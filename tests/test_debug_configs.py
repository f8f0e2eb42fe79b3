"""What a run shows and how it can be cut down (issue 13, lightning-hydra-template's extras):

- the `debug` config group composes (default, fdr, overfit, limit, profiler) and `debug=fdr` runs;
- early stopping is in the default callbacks without changing today's recipes;
- a run prints its config as a tree and saves it to <output_dir>/config_tree.log;
- without a terminal, progress is plain lines with the step and an ETA (dociq/training/progress.py), and the
  terminal bar counts steps (`step k/max_steps`, not `Epoch 0/-2`).
"""
from __future__ import annotations

import io
import math
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from dociq.training.config import compose
from dociq.training.progress import LogProgress, StepProgressBar, format_duration, progress_callbacks

SMOKE = ["experiment=pretrain_smoke", "++model.fusion.depth=1", "++model.predictor.depth=1"]
DEBUG_CONFIGS = ["default", "fdr", "overfit", "limit", "profiler"]


@pytest.mark.parametrize("name", DEBUG_CONFIGS)
@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_each_debug_config_composes(name, stage):
    cfg = compose([f"stage={stage}", f"debug={name}"])
    OmegaConf.resolve(cfg)
    assert cfg.task_name == "debug"          # debug runs stay out of the stage's runs folder
    assert cfg.callbacks is None and cfg.trainer.enable_checkpointing is False
    assert cfg.trainer.accelerator == "cpu" and cfg.trainer.devices == 1
    assert cfg.trainer.deterministic is True and cfg.trainer.detect_anomaly is True
    assert cfg.data.num_workers == 0
    expected = {"default": ("max_steps", 10), "fdr": ("fast_dev_run", True), "overfit": ("overfit_batches", 1),
                "limit": ("limit_train_batches", 5)}
    if name in expected:
        key, value = expected[name]
        assert cfg.trainer[key] == value
    if name == "overfit":   # one batch of pages, so every step sees the same pages
        assert cfg.data.train_set.num_pages == cfg.data.batch_size
    if name == "profiler":
        profiler = instantiate(cfg.trainer.profiler)
        assert type(profiler).__name__ == "SimpleProfiler" and profiler.filename == "profile"


@pytest.fixture
def restore_determinism():
    yield
    torch.use_deterministic_algorithms(False)   # debug=* sets trainer.deterministic for the process


def test_debug_fdr_runs_prints_progress_and_saves_the_config_tree(tmp_path, capsys, restore_determinism):
    from dociq.training.train import train

    cfg = compose(SMOKE + ["debug=fdr", f"paths.root_dir={tmp_path}"])
    out = tmp_path / "run"
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    metrics = train(cfg)
    assert math.isfinite(metrics["val/loss"]) and math.isfinite(metrics["train/loss"])
    assert not (out / "checkpoints").exists()      # fast_dev_run saves nothing
    printed = capsys.readouterr().out
    # the config tree, on stdout and in the run folder
    assert "CONFIG" in printed and "fast_dev_run: true" in printed
    tree = (out / "config_tree.log").read_text()
    assert tree.startswith("CONFIG") and "├── trainer" in tree and "name: pretrain" in tree
    assert "fast_dev_run: true" in tree and not any(line.endswith(" ") for line in tree.splitlines())
    # pytest's captured stdout is not a terminal: plain progress lines, no rich bar
    lines = [line for line in printed.splitlines() if line.startswith("[dociq] step ")]
    assert lines and "step 1/1 (100%)" in lines[-1] and "ETA 0:00" in lines[-1] and "train/loss=" in lines[-1]
    assert "[dociq] validation at step 1: " in printed and "val/loss=" in printed


@pytest.mark.parametrize("name, extra", [
    ("limit", ["trainer.max_steps=7", "trainer.limit_val_batches=1"]),   # 5-batch epochs: crosses one
    ("profiler", ["trainer.max_steps=2"]),
    ("overfit", ["trainer.max_steps=3", "trainer.val_check_interval=3"]),
])
def test_debug_configs_run(name, extra, tmp_path, restore_determinism):
    import csv

    from dociq.training.train import train

    cfg = compose(SMOKE + [f"debug={name}", f"paths.root_dir={tmp_path}", "print_config=false"] + extra)
    out = tmp_path / "run"
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss"])
    rows = list(csv.DictReader(open(out / "csv" / "metrics.csv")))
    assert max(int(float(r["step"])) for r in rows) == cfg.trainer.max_steps - 1
    if name == "limit":
        assert max(int(r["epoch"]) for r in rows) == 1          # steps 5 and 6 are in the second epoch
    if name == "profiler":
        assert "run_training_batch" in (out / "fit-profile.txt").read_text()
    if name == "overfit":
        assert max(int(r["epoch"]) for r in rows) == 2          # one batch an epoch


def test_print_config_tree_prints_and_writes_every_group(tmp_path, capsys):
    from dociq.training.train import print_config_tree

    cfg = compose(SMOKE + [f"paths.root_dir={tmp_path}"])
    assert cfg.print_config is True     # on by default (print_config=false turns it off)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    path = print_config_tree(cfg)
    text = path.read_text()
    assert path == tmp_path / "run" / "config_tree.log" and text.startswith("CONFIG")
    for group in ("stage", "task", "model", "data", "optim", "trainer", "callbacks", "logger", "paths", "seed"):
        assert f"── {group}\n" in text, group
    assert "grid: 4" in text        # resolved: ${div:128,32}
    assert "├── optim" in capsys.readouterr().out


def test_early_stopping_follows_the_stage_and_cannot_stop_todays_recipes():
    recipes = [["stage=pretrain"], ["stage=finetune"], ["stage=pretrain", "trainer=gpu"],
               ["stage=finetune", "trainer=gpu"], ["experiment=pretrain_gpu"], ["experiment=pretrain_sngd"],
               ["experiment=pretrain_real"]]
    for overrides in recipes:
        cfg = compose(overrides)
        es = cfg.callbacks.early_stopping
        assert (es.monitor, es.mode) == (cfg.stage.monitor, cfg.stage.mode), overrides
        checks = cfg.trainer.max_steps // cfg.trainer.val_check_interval
        # EarlyStopping stops after `patience` checks without improvement that follow a best one
        assert es.patience >= checks, (overrides, checks)
    es = instantiate(compose(["stage=finetune"]).callbacks.early_stopping)
    assert type(es).__name__ == "EarlyStopping" and es.mode == "max"


def _fake_trainer(step: int, max_steps: int, **metrics) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps, max_epochs=-1, is_global_zero=True,
                           sanity_checking=False, progress_bar_metrics=dict(metrics),
                           callback_metrics={})


def test_log_progress_prints_every_n_steps_with_speed_and_eta(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("dociq.training.progress.time.monotonic", lambda: clock[0])
    stream = io.StringIO()
    cb = LogProgress(every_n_steps=10, every_n_seconds=1000, stream=stream)
    trainer = _fake_trainer(0, 300)
    cb.on_train_start(trainer, None)
    for step in range(1, 31):
        clock[0] += 0.5                     # 2 steps a second
        trainer.global_step = step
        trainer.progress_bar_metrics = {"train/loss": torch.tensor(5.0 - step / 10)}
        cb.on_train_batch_end(trainer, None, None, None, step - 1)
        if step == 20:
            trainer.callback_metrics = {"val/loss": torch.tensor(1.25), "val/mlm": torch.tensor(9.5),
                                        "train/loss": torch.tensor(3.0)}
            trainer.progress_bar_metrics["val/loss"] = torch.tensor(1.25)   # prog_bar=True
            cb.on_validation_end(trainer, None)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[dociq] training from step 0 to 300 (progress every 10 steps or 1000 s)"
    steps = [line for line in lines if line.startswith("[dociq] step ")]
    assert [line.split()[2] for line in steps] == ["10/300", "20/300", "30/300"]
    # 30 steps in 15 s: 2 it/s, 270 steps left: 2:15
    assert "2.00 it/s" in steps[-1] and "elapsed 0:15" in steps[-1] and "ETA 2:15" in steps[-1]
    assert "train/loss=2" in steps[-1] and "val/loss=1.25 (step 20)" in steps[-1]
    assert "val/mlm" not in steps[-1]     # step lines: the bar's metrics; the validation line: all
    assert "[dociq] validation at step 20: val/loss=1.25  val/mlm=9.5" in lines


def test_log_progress_also_prints_after_every_n_seconds(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("dociq.training.progress.time.monotonic", lambda: clock[0])
    stream = io.StringIO()
    cb = LogProgress(every_n_steps=1000, every_n_seconds=60, stream=stream)
    trainer = _fake_trainer(40, 100)     # a resumed run: the rate counts this process's steps only
    cb.on_train_start(trainer, None)
    for step in range(41, 47):
        clock[0] += 25.0                 # slow steps: one line a minute at most
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, 0)
    steps = [line for line in stream.getvalue().splitlines() if line.startswith("[dociq] step ")]
    assert [line.split()[2] for line in steps] == ["43/100", "46/100"]
    assert "0.04 it/s" in steps[-1] and f"ETA {format_duration(54 * 25)}" in steps[-1]
    with pytest.raises(ValueError, match="every_n_steps"):
        LogProgress(every_n_steps=0)


def test_progress_choice_follows_the_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    added, bar = progress_callbacks(True, 5, 30.0)
    assert [type(c).__name__ for c in added] == ["LogProgress"] and bar is False
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    added, bar = progress_callbacks(True)
    assert [type(c).__name__ for c in added] == ["StepProgressBar"] and bar is True
    assert progress_callbacks(False) == ([], False)       # trainer.enable_progress_bar=false: nothing
    own = StepProgressBar()
    assert progress_callbacks(True, existing=[own]) == ([], True)   # a bar in callbacks= is kept


def test_step_progress_bar_counts_steps_not_epochs():
    bar = StepProgressBar()
    bar._trainer = SimpleNamespace(global_step=120, max_steps=300, max_epochs=-1, current_epoch=3,
                                   num_training_batches=500)
    assert bar._get_train_description(3).strip() == "step 120/300"
    assert bar.total_train_batches == 300
    bar._trainer = SimpleNamespace(global_step=120, max_steps=-1, max_epochs=5, current_epoch=3,
                                   num_training_batches=500)
    assert bar._get_train_description(3).strip() == "Epoch 3/4"   # epoch-bounded runs: Lightning's label
    assert bar.total_train_batches == 500
