"""`python train.py trainer=ddp_cpu` as a user runs it: two gloo processes, each its share of every
step's batch (the step-keyed batch sampler split by rank)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch


def test_train_py_pretrains_under_ddp_on_two_cpu_processes(repo_root, tmp_path):
    cmd = [sys.executable, "train.py", "experiment=pretrain_smoke", "trainer=ddp_cpu", "trainer.max_steps=2",
           "trainer.enable_progress_bar=false", "logger=csv", f"paths.root_dir={tmp_path}",
           f"paths.output_dir={tmp_path}/run"]
    # a fresh rendezvous port on loopback: in-process DDP tests before this one leave MASTER_PORT set
    # (and may still hold it); the run must not inherit their process group's environment
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 2
    # the data order saved with the checkpoint records the two processes it was split over
    order = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert order == {"seed": 0, "batch_size": 2, "num_items": 64, "num_replicas": 2}
