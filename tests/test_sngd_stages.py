"""Every stage trains with `optim=sngd`: a few steps from scratch, finite loss and finite weights.

Fine-tuning used to stop at step 1 ("weights are not finite after the optimizer step" in the
multimask hypernetworks): heads that a step's prompts do not use get exactly zero gradients.
"""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import open_dict

from dociq.training.config import compose

SMALL = ["optim=sngd", "model.image_size=128", "trainer.max_steps=3", "trainer.val_check_interval=3",
         "trainer.limit_val_batches=1", "data.batch_size=2", "data.num_workers=0",
         "data.tokenizer.max_length=64", "data.train_set.num_pages=16", "data.val_set.num_pages=2",
         "logger=csv", "print_config=false", "optim.scheduler.warmup_steps=1"]
# a 4x4 unit grid at 128 px holds two target blocks of ~4 units (configs/experiment/pretrain_smoke.yaml)
SMALL_MASKING = ["data.image_masking.num_targets=2", "data.image_masking.target_scale=[0.25,0.3]",
                 "data.image_masking.min_keep=1"]
STAGES = {"ijepa": SMALL_MASKING, "mlm": [], "distill": [], "pretrain": SMALL_MASKING, "finetune": []}


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_stage_trains_with_sngd(stage, tmp_path):
    from dociq.training.train import train

    cfg = compose([f"stage={stage}", f"paths.root_dir={tmp_path}"] + SMALL + STAGES[stage])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss"])
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 3
    bad = [name for name, value in state["state_dict"].items()
           if value.is_floating_point() and not torch.isfinite(value).all()]
    assert not bad, f"non-finite weights after 3 SubspaceNGD steps: {bad}"
