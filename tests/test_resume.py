"""Resume and faults of `python train.py stage=pretrain`.

- A killed run resumes with `ckpt_path=last`: same global step, optimizer state and EMA target
  (fast: in-process through dociq.training.train.train; slow: a real subprocess SIGKILLed mid-epoch).
- A checkpoint is never half-written: a writer killed in the middle of saving leaves the previous
  last.ckpt loadable (train.py's trainer saves through AtomicCheckpointIO).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

# Small and quick: 128-px pages, 2 pages a batch, a checkpoint every step.
SMOKE = ["experiment=pretrain_smoke", "++model.fusion.depth=1", "++model.predictor.depth=1",
         "trainer.enable_progress_bar=false", "logger=csv"]


class StateProbe(L.Callback):
    """Saves what the run starts from (after any checkpoint was restored) to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        torch.save({"global_step": trainer.global_step,
                    "optimizer": trainer.optimizers[0].state_dict(),
                    "target_encoder": {k: v.clone() for k, v in pl_module.target_encoder.state_dict().items()},
                    "image_encoder": {k: v.clone() for k, v in
                                      pl_module.model.image_encoder.state_dict().items()}},
                   self.path)


def assert_starts_from(probe_path: Path, ckpt_path: Path) -> int:
    """The resumed run's starting state equals the checkpoint's; returns its global step."""
    probe = torch.load(probe_path, weights_only=True)
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert probe["global_step"] == ckpt["global_step"] > 0
    state = ckpt["state_dict"]
    for name, value in probe["target_encoder"].items():
        torch.testing.assert_close(value, state[f"target_encoder.{name}"], rtol=0, atol=0)
    # the EMA target is its own state, not a copy of the online encoder
    assert any(not torch.equal(v, state[f"model.image_encoder.{k}"])
               for k, v in probe["target_encoder"].items() if v.is_floating_point())
    saved_opt = ckpt["optimizer_states"][0]["state"]
    resumed_opt = probe["optimizer"]["state"]
    assert saved_opt.keys() == resumed_opt.keys() and len(saved_opt) > 10
    for idx in saved_opt:
        for key, value in saved_opt[idx].items():
            torch.testing.assert_close(resumed_opt[idx][key], value, rtol=0, atol=0)
    return probe["global_step"]


def test_resume_restores_step_optimizer_and_ema_in_process(tmp_path):
    from omegaconf import open_dict

    from dociq.training.config import compose
    from dociq.training.train import train

    def run(extra):
        cfg = compose(SMOKE + [f"paths.root_dir={tmp_path}", "trainer.max_steps=2"] + extra,
                      return_hydra_config=False)
        with open_dict(cfg):  # what Hydra's ${now:...} run dir would be
            cfg.paths.output_dir = str(tmp_path / "outputs" / "pretrain" / "runs" / "first")
        return train(cfg)

    run([])
    last = tmp_path / "outputs" / "pretrain" / "runs" / "first" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2
    snapshot = tmp_path / "step2.ckpt"
    snapshot.write_bytes(last.read_bytes())
    probe = tmp_path / "probe.pt"
    metrics = run(["ckpt_path=last", "trainer.max_steps=4",
                   "+callbacks.probe._target_=test_resume.StateProbe", f"+callbacks.probe.path={probe}"])
    assert assert_starts_from(probe, snapshot) == 2
    assert "val/loss" in metrics
    assert torch.load(last, weights_only=True)["global_step"] == 4  # continued in the same run dir


def test_last_ckpt_is_the_last_validated_step_when_the_metric_stops_improving(tmp_path):
    """The best checkpoint stays at its step; last.ckpt follows every validation (Lightning's own
    ModelCheckpoint leaves it at the best step)."""
    from omegaconf import open_dict

    from dociq.training.config import compose
    from dociq.training.train import train

    # monitoring `step` in min mode: the first validation is the best, every later one is worse
    cfg = compose(SMOKE + [f"paths.root_dir={tmp_path}", "trainer.max_steps=6", "trainer.val_check_interval=2",
                           "callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=min"],
                  return_hydra_config=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    train(cfg)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == ["last.ckpt", "step_000002.ckpt"]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 6
    assert torch.load(checkpoints / "step_000002.ckpt", weights_only=True)["global_step"] == 2


def _fork_and_kill_during_save(path: Path, obj) -> None:
    """Fork a child that saves `obj` to `path` through train.py's checkpoint IO with a slow disk;
    SIGKILL it once the write has started."""
    from dociq.io import checkpoint as checkpoint_io
    from dociq.training.checkpoint_io import AtomicCheckpointIO

    started = path.parent / "started"
    pid = os.fork()
    if pid == 0:  # child: write a few bytes, signal, then hang mid-write
        real_save = torch.save

        def slow_save(o, f, *a, **k):
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
            started.touch()
            time.sleep(60)
            real_save(o, f, *a, **k)

        checkpoint_io.torch.save = slow_save
        try:
            AtomicCheckpointIO().save_checkpoint(obj, path)
        finally:
            os._exit(0)
    deadline = time.time() + 30
    while not started.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert started.exists(), "the child never started writing"


def test_kill_during_save_leaves_previous_last_ckpt_loadable(tmp_path):
    from dociq.training.checkpoint_io import AtomicCheckpointIO

    last = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 5, "w": torch.arange(4.0)}, last)
    _fork_and_kill_during_save(last, {"global_step": 6, "w": torch.zeros(4)})
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 5 and torch.equal(ckpt["w"], torch.arange(4.0))
    # only a hidden temporary file is left; it does not look like a checkpoint
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["last.ckpt"]


def test_train_py_saves_through_the_atomic_checkpoint_io():
    from dociq.training.checkpoint_io import AtomicCheckpointIO
    from dociq.training.config import compose
    from dociq.training.train import build_trainer

    cfg = compose(SMOKE + ["paths.root_dir=/tmp/unused", "callbacks=none"],
                  return_hydra_config=False)
    trainer = build_trainer(cfg)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def _launch(tmp_path: Path, extra: list[str], log_name: str) -> subprocess.Popen:
    env = dict(os.environ, DOCIQ_ROOT=str(tmp_path), PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}",
               WANDB_MODE="offline")
    log = open(tmp_path / log_name, "w")
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), *SMOKE, *extra],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_with_ckpt_path_last(tmp_path):
    """A real `python train.py` run is SIGKILLed mid-epoch (64 pages / 2 = 32 steps an epoch) after
    a few checkpoints; `ckpt_path=last` continues from that checkpoint."""
    proc = _launch(tmp_path, ["trainer.max_steps=200", "data.num_workers=1"], "first.log")
    ckpt_glob = "outputs/pretrain/runs/*/checkpoints/last.ckpt"
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None:
            found = list(tmp_path.glob(ckpt_glob))
            if found and torch.load(found[0], weights_only=True)["global_step"] >= 3:
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    last = next(tmp_path.glob(ckpt_glob))
    killed_at = torch.load(last, weights_only=True)
    assert 3 <= killed_at["global_step"] < 32, "not killed mid-epoch"
    snapshot = tmp_path / "killed_last.ckpt"
    snapshot.write_bytes(last.read_bytes())

    probe = tmp_path / "probe.pt"
    resumed = _launch(tmp_path, ["ckpt_path=last", f"trainer.max_steps={killed_at['global_step'] + 2}",
                                 "+callbacks.probe._target_=test_resume.StateProbe",
                                 f"+callbacks.probe.path={probe}"], "resume.log")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert assert_starts_from(probe, snapshot) == killed_at["global_step"]
    assert torch.load(last, weights_only=True)["global_step"] == killed_at["global_step"] + 2
    assert len(list(tmp_path.glob("outputs/pretrain/runs/*/checkpoints"))) == 1
