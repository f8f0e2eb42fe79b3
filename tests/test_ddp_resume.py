"""`python train.py trainer=ddp_cpu` as a user runs it: two gloo processes, each its share of every
step's batch (the step-keyed batch sampler split by rank). A pretraining run that dies after a
checkpoint and resumes with `ckpt_path=last` ends with the same weights as a run that was never
interrupted, for AdamW and SubspaceNGD; and fine-tuning trains under DDP as pretraining does."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SMOKE = ["experiment=pretrain_smoke", "++model.fusion.depth=1", "++model.predictor.depth=1",
         "trainer.enable_progress_bar=false", "logger=csv"]
CRASH_STEP = 5        # the checkpoint before it is at step 4 (a checkpoint every 2 steps)
MAX_STEPS = 6


def _ddp_env(repo_root: Path) -> dict[str, str]:
    """A fresh loopback rendezvous port; tests/ on the path for the crash callback."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    env["PYTHONPATH"] = os.pathsep.join([str(repo_root / "tests"), env.get("PYTHONPATH", "")])
    return env


def _train(repo_root: Path, root: Path, run: str, extra: list[str],
           trainer: str = "ddp_cpu") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", *SMOKE, f"trainer={trainer}", f"trainer.max_steps={MAX_STEPS}", f"paths.root_dir={root}",
           f"paths.output_dir={root}/{run}", *extra]
    return subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600,
                          env=_ddp_env(repo_root))


def failure(run: subprocess.CompletedProcess) -> str:
    """What a failed multi-process run printed: the first traceback (the rank that failed first)
    and the end (the rank that waited on it, whose error alone would hide the cause)."""
    first = run.stderr.find("Traceback")
    head = run.stderr[first:first + 4000] if first >= 0 else ""
    return head + "\n...\n" + run.stderr[-3000:]


def _state(path: Path) -> tuple[int, dict[str, torch.Tensor]]:
    ckpt = torch.load(path, weights_only=True)
    return ckpt["global_step"], ckpt["state_dict"]


def assert_resume_is_exact(repo_root: Path, tmp_path: Path, optim: str, trainer: str) -> None:
    """A run killed after its step-4 checkpoint and resumed ends with the uninterrupted run's weights."""
    straight = _train(repo_root, tmp_path, "straight", [f"optim={optim}"], trainer)
    assert straight.returncode == 0, failure(straight)
    crashed = _train(repo_root, tmp_path, "crashed", [f"optim={optim}",
                                                      "+callbacks.crash._target_=test_exact_resume.CrashAt",
                                                      f"+callbacks.crash.step={CRASH_STEP}"], trainer)
    assert crashed.returncode != 0 and "simulated crash" in crashed.stderr, failure(crashed)
    last = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    assert _state(last)[0] == CRASH_STEP - 1
    resumed = _train(repo_root, tmp_path, "crashed", [f"optim={optim}", f"ckpt_path={last}"], trainer)
    assert resumed.returncode == 0, failure(resumed)

    # the data order saved with the checkpoint records the two processes each step's batch was split over
    order = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)[
        "loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert order == {"seed": 0, "batch_size": 2, "num_items": 64, "num_replicas": 2}
    step_a, weights_a = _state(tmp_path / "straight" / "checkpoints" / "last.ckpt")
    step_b, weights_b = _state(last)
    assert step_a == step_b == MAX_STEPS
    assert weights_a.keys() == weights_b.keys()
    differing = [name for name in weights_a if not torch.equal(weights_a[name], weights_b[name])]
    assert not differing, f"{len(differing)} tensors differ after the {trainer} resume, e.g. {differing[:3]}"


@pytest.mark.parametrize("optim", ["adamw", pytest.param("sngd", marks=pytest.mark.slow)])
def test_a_ddp_run_resumed_after_a_crash_equals_the_uninterrupted_run(repo_root, tmp_path, optim):
    assert_resume_is_exact(repo_root, tmp_path, optim, "ddp_cpu")


@pytest.mark.parametrize("optim", ["adamw", pytest.param("sngd", marks=pytest.mark.slow)])
def test_finetuning_trains_under_ddp_on_two_cpu_processes(repo_root, tmp_path, optim):
    cmd = [sys.executable, "train.py", "stage=finetune", "trainer=ddp_cpu", f"optim={optim}", "trainer.max_steps=2",
           "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "model.image_size=128",
           "data.batch_size=2", "data.num_workers=0", "data.train_set.num_pages=16", "data.val_set.num_pages=2",
           "trainer.enable_progress_bar=false", "logger=csv", f"paths.root_dir={tmp_path}",
           f"paths.output_dir={tmp_path}/run"]
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=_ddp_env(repo_root))
    assert out.returncode == 0, failure(out)
    step, weights = _state(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert step == 2 and all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    order = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)[
        "loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert order["num_replicas"] == 2
