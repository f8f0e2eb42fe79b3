"""Sweeps (Hydra multirun, Optuna) and loggers (CSV, TensorBoard, W&B offline) of train.py.

Fast (default suite): the Optuna search config composes for each stage (space and direction follow
it); one short in-process run logs to all three loggers at once and each leaves its run files; the
figure scripts write into the run folder. Slow:
a pretraining and a 2-trial fine-tuning Optuna sweep (val/miou maximised), one CLI run per logger.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf, open_dict

REPO = Path(__file__).resolve().parent.parent
SMOKE = ["experiment=pretrain_smoke", "++model.fusion.depth=1", "++model.predictor.depth=1",
         "trainer.enable_progress_bar=false"]


@pytest.mark.parametrize("stage, direction, metric, searched, not_searched", [
    ("pretrain", "minimize", "val/loss", "task.ema.start", "task.rounds"),
    ("finetune", "maximize", "val/miou", "task.rounds", "task.ema.start"),
])
def test_optuna_search_follows_the_stage(stage, direction, metric, searched, not_searched):
    from dociq.training.config import compose

    cfg = compose(["hparams_search=optuna", f"stage={stage}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == direction
    assert cfg.optimized_metric == metric == cfg.stage.monitor
    assert cfg.hydra.runtime.choices["hparams_search/space"] == f"optuna_{stage}"
    assert "optim.optimizer.lr" in sweeper.params and searched in sweeper.params
    assert not_searched not in sweeper.params
    # every searched key exists in this stage's config (a missing one fails each trial)
    for key in sweeper.params:
        assert key.startswith("++") or OmegaConf.select(cfg, key) is not None, key
    if stage == "pretrain":   # loss weights must not be searched: the metric is their weighted sum
        assert not any(key.startswith("task.loss") for key in sweeper.params)


def test_optuna_without_a_search_space_for_the_stage_stops_naming_the_file(capsys):
    from hydra.utils import instantiate

    from dociq.training.config import compose

    cfg = compose(["hparams_search=optuna", "stage=ijepa"], return_hydra_config=True)
    check = instantiate(cfg.hydra.callbacks.search_space_check)
    with pytest.raises(SystemExit) as exit_info:   # Hydra would only warn about an exception
        check.on_multirun_start(cfg)
    assert exit_info.value.code == 2
    assert "configs/hparams_search/space/optuna_ijepa.yaml" in capsys.readouterr().err
    with open_dict(cfg):   # a space given as a sweep override on the command line is enough
        cfg.hydra.overrides.task = ["stage=ijepa", "optim.optimizer.lr=tag(log, interval(1e-4, 3e-3))"]
    check.on_multirun_start(cfg)
    check.on_multirun_start(compose(["hparams_search=optuna", "stage=finetune"], return_hydra_config=True))


def _run_dir_files(output_dir: Path) -> dict[str, list[Path]]:
    return {"csv": list(output_dir.glob("csv/metrics.csv")),
            "tensorboard": list(output_dir.glob("tensorboard/**/events.out.tfevents.*")),
            "wandb": list(output_dir.glob("wandb/offline-run-*/run-*.wandb"))}


def test_all_three_loggers_write_their_run_files(tmp_path, monkeypatch):
    from dociq.training.config import compose
    from dociq.training.train import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = compose(SMOKE + ["logger=many", f"paths.root_dir={tmp_path}", "trainer.max_steps=2",
                           "trainer.log_every_n_steps=1"], return_hydra_config=False)
    out = tmp_path / "run"
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        # logger=many is csv + tensorboard; add the wandb group's logger next to them
        cfg.logger.wandb = OmegaConf.load(REPO / "configs/logger/wandb.yaml").wandb
        cfg.logger.wandb.save_dir = str(out)
    metrics = train(cfg)
    assert math.isfinite(metrics["val/loss"])
    files = _run_dir_files(out)
    assert all(files.values()), files
    header = files["csv"][0].read_text().splitlines()[0].split(",")
    for key in ("train/loss", "train/djepa", "train/mlm", "train/mim", "train/target_std", "val/loss"):
        assert key in header, key
    assert files["wandb"][0].stat().st_size > 0


def _train_cli(args: list[str], root: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, DOCIQ_ROOT=str(root), WANDB_MODE="offline", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_multirun_2x2_fast_dev_run_gives_one_output_dir_per_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = _train_cli(["-m", *SMOKE, "optim=adamw,sngd", "optim.optimizer.lr=1e-3,3e-4",
                      "++trainer.fast_dev_run=true", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1", "2", "3"]
    combos = set()
    for job in jobs:
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        combos.add(tuple(o for o in overrides if o.startswith(("optim=", "optim.optimizer.lr="))))
        assert (job / "train.log").exists()
        cfg = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        assert cfg["trainer"]["fast_dev_run"] is True
    assert len(combos) == 4
    # train.py logs the directory its checkpoints and logs go to; each job needs its own
    output_dirs = {re.search(r"output_dir=(\S+)", (j / "train.log").read_text()).group(1) for j in jobs}
    assert len(output_dirs) == 4, f"jobs share output dirs: {output_dirs}"


@pytest.mark.slow
def test_optuna_sweep_runs_trials_and_reports_the_best(tmp_path):
    sweep_dir = tmp_path / "optuna"
    out = _train_cli(["-m", "hparams_search=optuna", *SMOKE, "trainer.max_steps=2",
                      "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.n_startup_trials=2",
                      f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["name"] == "optuna"
    assert math.isfinite(results["best_value"]) and "optim.optimizer.lr" in results["best_params"]
    trials = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    assert len(trials) == 3
    for trial in trials:  # every trial keeps its own checkpoints and logs
        assert (trial / "checkpoints" / "last.ckpt").exists() and (trial / "csv" / "metrics.csv").exists()


@pytest.mark.slow
def test_optuna_finetune_sweep_maximises_miou(tmp_path):
    """Two fine-tuning trials of two steps on 128-px pages: the fine-tune space, maximised val/miou
    (25-65 s on two shared cores: slow)."""
    sweep_dir = tmp_path / "optuna_ft"
    out = _train_cli(["-m", "hparams_search=optuna", "stage=finetune", "model.image_size=128",
                      "++model.text_encoder.num_hidden_layers=1", "++model.fusion.depth=1",
                      "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
                      "trainer.enable_progress_bar=false", "data.batch_size=2", "data.num_workers=0",
                      "data.train_set.num_pages=8", "data.val_set.num_pages=2", "data.tokenizer.max_length=48",
                      "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=2",
                      f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert 0.0 <= results["best_value"] <= 1.0          # an mIoU
    assert {"task.rounds", "task.loss.dice", "optim.optimizer.lr"} <= set(results["best_params"])
    assert "Directions: ['maximize']" in (out.stdout + out.stderr)
    trials = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(trials) == 2
    for trial in trials:
        header = (trial / "csv" / "metrics.csv").read_text().splitlines()[0]
        assert "val/miou" in header.split(",")


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["csv", "tensorboard", "wandb"])
def test_each_logger_from_the_command_line(logger, tmp_path):
    out = _train_cli([*SMOKE, f"logger={logger}", "trainer.max_steps=2"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = next(tmp_path.glob("outputs/pretrain/runs/*"))
    files = _run_dir_files(run_dir)
    assert files[logger], (logger, sorted(p.name for p in run_dir.rglob("*")))
    assert "logs:" in out.stdout   # train.py says where the logs are


def test_plot_losses_turns_a_csv_log_into_a_png(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import plot_losses
    finally:
        sys.path.pop(0)
    rows = ["epoch,step,train/djepa,train/mlm,train/mim,train/loss,train/target_std,train/pred_std,val/loss"]
    for step in range(0, 50, 10):
        rows.append(f"0,{step},{1 / (step + 1)},{10 - step / 10},{2 - step / 50},{13 - step / 5},0.2,0.1,")
    rows.append(f"0,49,,,,,,,{9.0}")
    csv_path = tmp_path / "run" / "csv" / "metrics.csv"
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "losses.png"
    assert plot_losses.main([str(tmp_path / "run"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "train/mlm" in table and "10.0000" in table and "6.0000" in table
    assert plot_losses.main([str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # the probe and MLM accuracy, when the run logged them, get panels of their own
    series = plot_losses.read_series(csv_path)
    assert "unit-class probe (balanced acc.)" not in plot_losses.plot(series, out, "run")
    series |= {"val/probe_bacc": ([0, 49], [0.2, 0.3]), "val/probe_bacc_target": ([0, 49], [0.2, 0.25]),
               "val/mlm_acc": ([49], [0.25])}
    titles = plot_losses.plot(series, out, "run")
    assert titles[-1] == "unit-class probe (balanced acc.)" and "MLM accuracy (masked words)" in titles
    # without --out: into the run folder, not docs/img
    assert plot_losses.main([str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "losses.png").read_bytes()[:4] == b"\x89PNG"
    assert f"wrote {tmp_path / 'run' / 'losses.png'}" in capsys.readouterr().out


def test_plot_losses_draws_miou_for_a_finetune_run(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import plot_losses
    finally:
        sys.path.pop(0)
    cols = ["epoch", "step", "train/loss", "train/focal", "train/dice_loss", "train/iou_mse", "train/word_bce",
            "val/loss", "val/miou", "val/miou_field", "val/miou_table", "val/box_miou", "val/box_miou_field"]
    rows = [",".join(cols)]
    for step in range(0, 40, 10):
        rows.append(f"0,{step},{3 - step / 20},{0.5 - step / 100},{0.9 - step / 50},0.1,0.6" + "," * 6)
    for step, miou in ((19, 0.2), (39, 0.35)):
        rows.append(f"0,{step},,,,,,1.5,{miou},{miou + 0.1},{miou - 0.1},{miou + 0.3},{miou + 0.35}")
    csv_path = tmp_path / "ft" / "csv" / "metrics.csv"
    csv_path.parent.mkdir(parents=True)
    csv_path.write_text("\n".join(rows) + "\n")
    series = plot_losses.read_series(csv_path)
    assert plot_losses.detect_stage(series) == "finetune"
    titles = plot_losses.plot(series, tmp_path / "ft.png", "ft")
    assert titles[:5] == ["focal", "dice", "IoU head (MSE)", "word grounding (BCE)", "total (weighted, all rounds)"]
    assert titles[5:] == ["val mIoU per prompt set", "val mIoU per region kind (question prompts)"]
    assert "collapse signals" not in titles
    assert plot_losses.miou_columns(series) == (["val/miou", "val/box_miou"], ["val/miou_field", "val/miou_table"])
    assert plot_losses.main([str(csv_path)]) == 0
    table = capsys.readouterr().out
    assert "val/miou" in table and "0.3500" in table and (tmp_path / "ft" / "losses.png").exists()
    # a pretraining log keeps its collapse panel
    assert plot_losses.detect_stage({"train/djepa": ([0], [1.0]), "val/loss": ([0], [1.0])}) == "pretrain"


def test_figure_scripts_do_not_write_into_docs_by_default(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import plot_predictions
        import render_sample
    finally:
        sys.path.pop(0)
    run = tmp_path / "outputs" / "finetune" / "runs" / "r1"
    assert plot_predictions.default_out(run / "checkpoints" / "last.ckpt") == run / "predictions.png"
    assert plot_predictions.default_out(tmp_path / "model.ckpt") == Path("predictions.png")
    monkeypatch.chdir(tmp_path)
    written = render_sample.main(["--index", "0", "--image-size", "128"])
    assert written == Path("synthetic_page.png") and (tmp_path / "synthetic_page.png").stat().st_size > 0


def test_every_run_logs_its_step_time_after_the_first_steps(tmp_path):
    """callbacks.throughput: pages per second over the last 10 steps, which is what the GPU study
    turns its time budget into steps with (a mean over a short run counts the first steps' costs)."""
    import csv

    from dociq.training.config import compose
    from dociq.training.train import train

    cfg = compose(SMOKE + [f"paths.root_dir={tmp_path}", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
                           "data.batch_size=2"], return_hydra_config=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    train(cfg)
    rows = list(csv.DictReader((tmp_path / "run" / "csv" / "metrics.csv").open()))
    rates = [(int(r["step"]), float(r["train/device/batches_per_sec"]), float(r["train/device/samples_per_sec"]))
             for r in rows if r.get("train/device/batches_per_sec")]
    assert [step for step, _, _ in rates] == [9, 10, 11]      # once 10 steps fill the window
    for _, batches, samples in rates:
        assert batches > 0 and samples == pytest.approx(2 * batches)
