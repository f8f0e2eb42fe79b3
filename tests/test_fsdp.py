"""FSDP2 (`trainer=fsdp_cpu`: two gloo processes, every weight, gradient and optimizer state
sharded over them). Sharded training must be the same training as one process on the same global
batch, SubspaceNGD's state must be split between the ranks, checkpoints must resume exactly under
FSDP and load in one process (a resumed run, the Predictor), and the multi-node path must start."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_ddp_resume import MAX_STEPS, _ddp_env, _state, _train, assert_resume_is_exact, failure

FINETUNE_SMALL = ["stage=finetune", "trainer.max_steps=2", "trainer.val_check_interval=2",
                  "trainer.limit_val_batches=1", "model.image_size=128", "data.batch_size=2", "data.num_workers=0",
                  "data.train_set.num_pages=16", "data.val_set.num_pages=2", "trainer.enable_progress_bar=false",
                  "logger=csv"]


@pytest.mark.parametrize("optim", ["adamw", "sngd"])
def test_the_fsdp_trainer_configs_compose_to_the_fsdp2_strategy_for_every_optimizer(optim):
    from dociq.training.config import compose
    from dociq.training.train import build_strategy

    gpu = compose(["stage=finetune", "trainer=fsdp", f"optim={optim}"])
    assert (gpu.trainer.accelerator, gpu.trainer.precision, gpu.trainer.strategy) == ("gpu", "bf16-mixed", "fsdp2")
    cpu = compose(["stage=finetune", "trainer=fsdp_cpu", f"optim={optim}"])
    assert (cpu.trainer.accelerator, cpu.trainer.devices) == ("cpu", 2)
    # no DDP variant, no SubspaceNGD-only strategy: FSDP2 takes every optimizer as it is
    assert build_strategy(gpu) == build_strategy(cpu) == "fsdp2"


def test_fsdp_trains_as_one_process_does_on_the_same_global_batch(repo_root, tmp_path):
    out = tmp_path / "equivalence.json"
    run = subprocess.run([sys.executable, "tests/fsdp_equivalence.py", "--out", str(out), "--steps", "20"],
                         cwd=repo_root, capture_output=True, text=True, timeout=300, env=_ddp_env(repo_root))
    assert run.returncode == 0, failure(run)
    report = json.loads(out.read_text())
    assert set(report) == {"adamw", "sngd", "sngd_coordinates"}
    for name in report:
        r = report[name]
        single, sharded = torch.tensor(r["single_losses"]), torch.tensor(r["sharded_losses"])
        assert len(sharded) == 20
        torch.testing.assert_close(sharded, single, rtol=1e-4, atol=0)
        assert single[-5:].mean() < single[:5].mean(), f"{name}: the loss does not fall"
        assert r["max_weight_diff"] < 1e-5, f"{name}: weights drift from one process by {r['max_weight_diff']}"
    # SubspaceNGD's subspace state (history, momentum) is split along its coordinates, the fallback's
    # moments along the rows of their parameters: each rank holds about half.
    for name in ("sngd", "sngd_coordinates"):
        sngd = report[name]
        assert all(b <= 0.55 * sngd["single_state_bytes"] for b in sngd["sharded_state_bytes"]), sngd
        assert sum(sngd["sharded_state_bytes"]) >= sngd["single_state_bytes"]


@pytest.mark.parametrize("optim", [pytest.param("adamw", marks=pytest.mark.slow), "sngd"])
def test_an_fsdp_run_resumed_after_a_crash_equals_the_uninterrupted_run(repo_root, tmp_path, optim):
    assert_resume_is_exact(repo_root, tmp_path, optim, "fsdp_cpu")
    # The full checkpoint FSDP wrote also resumes in one process, as a one-process checkpoint does.
    last = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    one = _train(repo_root, tmp_path, "one", [f"optim={optim}", f"ckpt_path={last}",
                                               f"trainer.max_steps={MAX_STEPS + 2}"], "default")
    assert one.returncode == 0, failure(one)
    step, weights = _state(tmp_path / "one" / "checkpoints" / "last.ckpt")
    assert step == MAX_STEPS + 2
    assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


def test_fine_tuning_under_fsdp_gives_a_checkpoint_the_predictor_reads(repo_root, tmp_path):
    cmd = [sys.executable, "train.py", *FINETUNE_SMALL, "trainer=fsdp_cpu", "optim=sngd",
           f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run"]
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=_ddp_env(repo_root))
    assert out.returncode == 0, failure(out)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 2
    # whole tensors, as one process saves them (the same keys and shapes as the model's own)
    from dociq.inference.predictor import Predictor

    predictor = Predictor.from_checkpoint(last)
    own = {f"model.{k}": v.shape for k, v in predictor.model.state_dict().items()}
    saved = {k: v.shape for k, v in ckpt["state_dict"].items() if k in own}
    assert saved and saved == {k: own[k] for k in saved}
    import numpy as np

    image = np.full((128, 128, 3), 255, dtype=np.uint8)
    predictor.set_image(image, words=["total", "due"], word_boxes=[[10, 10, 40, 20], [45, 10, 70, 20]])
    masks, scores = predictor.predict(boxes=[5, 5, 80, 30])[:2]
    assert masks.shape[-2:] == (128, 128) and np.isfinite(scores).all()


def _csv_losses(run: Path) -> torch.Tensor:
    import csv

    rows = list(csv.DictReader(open(run / "csv" / "metrics.csv")))
    return torch.tensor([float(r["train/loss"]) for r in rows if r.get("train/loss")])


@pytest.mark.slow
def test_fsdp_and_ddp_train_the_same_run(repo_root, tmp_path):
    """Same seed, same per-rank batches: sharded and replicated training log the same losses."""
    for trainer in ("ddp_cpu", "fsdp_cpu"):
        run = _train(repo_root, tmp_path, trainer, ["optim=sngd"], trainer)
        assert run.returncode == 0, failure(run)
    ddp, fsdp = _csv_losses(tmp_path / "ddp_cpu"), _csv_losses(tmp_path / "fsdp_cpu")
    assert len(ddp) == MAX_STEPS
    torch.testing.assert_close(fsdp, ddp, rtol=1e-4, atol=0)


def _node(repo_root: Path, tmp_path: Path, env: dict, node_rank: int, strategy: str) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", "experiment=pretrain_smoke", "++model.fusion.depth=1",
           "++model.predictor.depth=1", "trainer.max_steps=2", "trainer.enable_progress_bar=false", "logger=csv",
           "trainer.num_nodes=2", "trainer.devices=1", f"trainer.strategy={strategy}",
           f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/{strategy}"]
    log = open(tmp_path / f"{strategy}_node{node_rank}.log", "w")
    return subprocess.Popen(cmd, cwd=repo_root, stdout=log, stderr=subprocess.STDOUT,
                            env={**env, "NODE_RANK": str(node_rank)})


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_nodes_on_loopback_train_together(repo_root, tmp_path, strategy):
    """Two `train.py` processes started as node 0 and node 1 of one job (MASTER_ADDR=127.0.0.1,
    NODE_RANK), one device each, as a cluster launcher starts them on two machines."""
    env = _ddp_env(repo_root)
    nodes = [_node(repo_root, tmp_path, env, rank, strategy) for rank in (0, 1)]
    try:
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    logs = [(tmp_path / f"{strategy}_node{r}.log").read_text()[-3000:] for r in (0, 1)]
    assert codes == [0, 0], logs
    ckpt = torch.load(tmp_path / strategy / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
    assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["num_replicas"] == 2
