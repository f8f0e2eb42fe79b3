"""The smoke matrix a user composes from the README: every stage x {adamw, sngd} trains two steps
under `trainer=ddp_cpu` and `trainer=fsdp_cpu` (two gloo processes, replicated or sharded) with a
finite loss and finite weights. One process
per stage and optimizer is covered by tests/test_sngd_stages.py and the stage tests; pretraining
and fine-tuning under DDP also run in the default suite (test_ddp_resume.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from test_ddp_resume import _ddp_env
from test_sngd_stages import SMALL, STAGES


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["ddp_cpu", "fsdp_cpu"])
@pytest.mark.parametrize("optim", ["adamw", "sngd"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_every_stage_trains_on_two_processes(repo_root, tmp_path, stage, optim, trainer):
    overrides = [o for o in SMALL if not o.startswith(("optim=", "trainer.max_steps", "trainer.val_check_interval"))]
    cmd = [sys.executable, "train.py", f"stage={stage}", f"optim={optim}", f"trainer={trainer}",
           "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.enable_progress_bar=false",
           *overrides, *STAGES[stage], f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run"]
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=_ddp_env(repo_root))
    assert out.returncode == 0, out.stderr[-3000:]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 2
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["num_replicas"] == 2
    bad = [name for name, value in state["state_dict"].items()
           if value.is_floating_point() and not torch.isfinite(value).all()]
    assert not bad, f"non-finite weights after 2 {trainer} steps of {stage} with {optim}: {bad[:3]}"
