"""Every stage's checkpoint stores the complete model config it was built from, and that config
rebuilds the task (strict `from_config`) so that the checkpoint's weights load strictly."""
import lightning as L
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dociq.io.checkpoint import read_checkpoint
from dociq.models.sizes import check_model_config, complete_model_config
from dociq.training.config import compose
from dociq.training.tasks.registry import resolve_stage

SMALL = ["model.image_size=128", "model.text_encoder.num_hidden_layers=1", "model.fusion.depth=1",
         "model.predictor.depth=1"]


@pytest.mark.parametrize("stage", ["ijepa", "mlm", "distill", "pretrain", "finetune"])
def test_a_checkpoint_stores_the_complete_model_config(stage, tmp_path):
    overrides = [f"stage={stage}", *SMALL]
    if stage == "distill":
        from dociq.models.teacher import build_tiny_teacher

        teacher = build_tiny_teacher(tmp_path / "teacher", hidden_size=48, layers=1, heads=2)
        overrides.append(f"task.teacher.path={teacher}")
    cfg = compose(overrides)
    task_cls = resolve_stage(stage)
    task = task_cls(**instantiate(cfg.task, _convert_="all"))
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(task)                     # a checkpoint as Lightning writes it, without training
    trainer.save_checkpoint(tmp_path / "last.ckpt")

    ckpt = read_checkpoint(tmp_path / "last.ckpt")
    stored = ckpt["hyper_parameters"]["model"]
    check_model_config(stored)
    assert stored == OmegaConf.to_container(cfg.model, resolve=True) == complete_model_config(
        {"size": "tiny", "image_size": 128, "text_encoder": {"num_hidden_layers": 1}, "fusion": {"depth": 1},
         "predictor": {"depth": 1}})
    rebuilt = task_cls(**{**ckpt["hyper_parameters"], "init": None})
    rebuilt.load_state_dict(ckpt["state_dict"], strict=True)
