"""What `trainer=gpu` (bf16-mixed) runs, tested where a CPU can: Lightning's bf16 autocast around a
whole training step (CPU autocast, fp32 weights), and SubspaceNGD on bf16 weights, whose state and
solves stay in fp32 / fp64. NCCL and the CUDA kernels themselves are listed in docs/scaling.md."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dociq.optim.sngd import SubspaceNGD
from test_ddp_resume import _ddp_env


def test_subspace_ngd_keeps_fp32_state_and_steps_bf16_weights_like_fp32_ones():
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(96, 64, generator=gen)
    grads = [torch.randn(96, 64, generator=gen) for _ in range(12)]
    weights = {}
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.nn.Parameter(start.clone().to(dtype))
        opt = SubspaceNGD([w], lr=1e-2, rank=8, history=4, refresh_every=5)
        for g in grads:
            w.grad = g.to(dtype)
            opt.step()
        st = opt.state[w]
        assert st["history"].dtype == st["momentum"].dtype == torch.float32
        assert w.dtype == dtype and torch.isfinite(w).all()
        weights[dtype] = w.detach().float()
    moved = (weights[torch.float32] - start).norm()
    # bf16 rounds each weight to 8 bits of mantissa; the steps themselves are the same
    assert (weights[torch.bfloat16] - weights[torch.float32]).norm() < 0.05 * moved + 0.01 * start.norm()


# adamw: torch's fused AdamW, the default optimizer, with the trainer's gradient clipping, which
# Lightning's own bf16 plugin refuses for a fused optimizer (dociq/training/precision.py)
@pytest.mark.parametrize("trainer,optim", [("default", "sngd"), ("default", "adamw"),
                                           pytest.param("fsdp_cpu", "sngd", marks=pytest.mark.slow)])
def test_a_bf16_mixed_training_step_keeps_fp32_weights(repo_root, tmp_path, trainer, optim):
    cmd = [sys.executable, "train.py", "experiment=pretrain_smoke", "++model.fusion.depth=1",
           "++model.predictor.depth=1", f"optim={optim}", "trainer.gradient_clip_val=1.0", f"trainer={trainer}", "trainer.precision=bf16-mixed",
           "trainer.max_steps=2", "trainer.enable_progress_bar=false", "logger=csv", f"paths.root_dir={tmp_path}",
           f"paths.output_dir={tmp_path}/run"]
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=_ddp_env(repo_root))
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
    floats = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in floats)
    import csv

    rows = list(csv.DictReader(open(tmp_path / "run" / "csv" / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
