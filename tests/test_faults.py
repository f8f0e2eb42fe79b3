"""Fault loop: `python train.py` is SIGKILLed at random moments (during start-up, training steps,
validation and checkpoint writes), resumed with `ckpt_path=last` each time, and must end exactly
where an uninterrupted run ends.

After every kill: the last checkpoint loads and the metrics history is in step order without
duplicates. After every resume: no orphan temporary checkpoint files. At the end: every training
step and validation is in the history exactly once, and the final weights equal the uninterrupted
run's bit for bit. Bounded: at most `KILLS` kills; a share during start-up, the rest a random 0-2.5 s after the run
is training again (a step, a validation or a checkpoint write), so every kill can land anywhere
and the run still progresses.
"""
from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_resume import REPO, SMOKE

MAX_STEPS = 40
VAL_EVERY = 2
KILLS = 10
STARTUP_KILLS = 0.3            # share of kills during start-up (imports, model build, restore)
TRAINING_KILL_DELAY = (0.0, 2.5)  # seconds after training resumed: a step, a validation or a save
RUN = SMOKE + [f"trainer.max_steps={MAX_STEPS}", f"trainer.val_check_interval={VAL_EVERY}",
               "data.num_workers=1", "trainer.limit_val_batches=2"]


def _launch(root: Path, extra: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, DOCIQ_ROOT=str(root), PYTHONPATH=str(REPO), WANDB_MODE="offline",
               PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), *RUN, *extra], cwd=root, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _last_checkpoint(root: Path) -> Path | None:
    found = sorted(root.glob("outputs/pretrain/runs/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "csv" / "metrics.csv"
    return list(csv.DictReader(path.open())) if path.is_file() else []


def _training_started(log: Path, proc: subprocess.Popen, timeout: float = 120.0) -> bool:
    """Wait until the run prints its model summary: Lightning does that when fit starts, after a
    checkpoint was restored, right before the first training step."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.is_file() and "Total params" in log.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def _check_history(rows: list[dict]) -> None:
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), f"history out of step order: {steps}"
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert len(train_steps) == len(set(train_steps)), f"duplicate training rows: {train_steps}"


@pytest.mark.slow
def test_random_sigkills_then_resume_end_where_an_uninterrupted_run_ends(tmp_path):
    reference_root = tmp_path / "reference"
    reference_root.mkdir()
    ref = _launch(reference_root, [], reference_root / "run.log")
    assert ref.wait(timeout=900) == 0, (reference_root / "run.log").read_text()[-3000:]
    reference = torch.load(_last_checkpoint(reference_root), weights_only=True)
    assert reference["global_step"] == MAX_STEPS

    from dociq.io.checkpoint import read_checkpoint

    root = tmp_path / "faults"
    root.mkdir()
    rng = random.Random(0)
    kills, steps_at_kill = 0, []
    for attempt in range(KILLS):
        last = _last_checkpoint(root)
        if last is not None and read_checkpoint(last)["global_step"] == MAX_STEPS:
            break                            # finished: nothing left to interrupt
        extra = ["ckpt_path=last"] if last is not None else []
        log = root / f"attempt{attempt}.log"
        proc = _launch(root, extra, log)
        # a kill during start-up, or a few steps into training (when the step/validation/save happen)
        if rng.random() < STARTUP_KILLS:
            time.sleep(rng.uniform(0.5, 4.0))
        elif _training_started(log, proc):
            time.sleep(rng.uniform(*TRAINING_KILL_DELAY))
        if proc.poll() is not None:          # finished before the kill: nothing left to interrupt
            assert proc.returncode == 0, (root / f"attempt{attempt}.log").read_text()[-3000:]
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        last = _last_checkpoint(root)
        if last is not None:
            steps_at_kill.append(read_checkpoint(last)["global_step"])   # loadable after every kill
            _check_history(_rows(last.parent.parent))
    final = _launch(root, ["ckpt_path=last"] if _last_checkpoint(root) else [], root / "final.log")
    assert final.wait(timeout=900) == 0, (root / "final.log").read_text()[-3000:]
    mid_training = [s for s in steps_at_kill if 0 < s < MAX_STEPS]
    assert kills >= 5 and len(set(mid_training)) >= 3, \
        f"{kills} kills, checkpoint steps at each kill {steps_at_kill}: adjust TRAINING_KILL_DELAY / MAX_STEPS"

    last = _last_checkpoint(root)
    run_dir = last.parent.parent
    assert not list(run_dir.glob("checkpoints/.*.tmp")), "orphan temporary checkpoint files"
    rows = _rows(run_dir)
    _check_history(rows)
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert train_steps == list(range(MAX_STEPS)), train_steps
    val_steps = [int(r["step"]) for r in rows if r.get("val/loss")]
    assert val_steps == list(range(VAL_EVERY - 1, MAX_STEPS, VAL_EVERY)), val_steps

    state = read_checkpoint(last)
    assert state["global_step"] == MAX_STEPS
    assert state["state_dict"].keys() == reference["state_dict"].keys()
    for name, value in reference["state_dict"].items():
        assert torch.equal(state["state_dict"][name], value), f"{name} differs from the uninterrupted run"
    # the logged losses equal the uninterrupted run's, step for step
    ref_rows = _rows(_last_checkpoint(reference_root).parent.parent)
    ref_losses = {r["step"]: r["train/loss"] for r in ref_rows if r.get("train/loss")}
    assert {r["step"]: r["train/loss"] for r in rows if r.get("train/loss")} == ref_losses
