"""bf16 mixed precision that clips the gradients of a fused optimizer.

Lightning's `MixedPrecision.clip_gradients` refuses any optimizer that unscales its own gradients
(torch's fused AdamW says so of itself) because fp16's GradScaler would hand it scaled ones. bf16
autocast has no scaler: the gradients are the true ones, so clipping them before a fused step is
exactly what fp32 training does. Without this, `trainer=gpu` (bf16-mixed) with the default
optimizer (fused AdamW) and `gradient_clip_val` stops at its first step.
"""
from __future__ import annotations

from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType


class BF16MixedPrecision(MixedPrecision):
    def __init__(self, device: str) -> None:
        super().__init__(precision="bf16-mixed", device=device)

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=GradClipAlgorithmType.NORM) -> None:
        Precision.clip_gradients(self, optimizer, clip_val=clip_val, gradient_clip_algorithm=gradient_clip_algorithm)


def precision_plugins(trainer_kwargs: dict, strategy) -> list:
    """The bf16 plugin in place of `precision: bf16-mixed` (popped from `trainer_kwargs`), unless the
    strategy brings its own precision (FSDP, DeepSpeed)."""
    if str(trainer_kwargs.get("precision")) != "bf16-mixed":
        return []
    name = strategy if isinstance(strategy, str) else type(strategy).__name__
    if any(s in name.lower() for s in ("fsdp", "deepspeed")):
        return []
    accelerator = str(trainer_kwargs.get("accelerator", "auto"))
    if accelerator == "auto":
        import torch
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    trainer_kwargs.pop("precision")
    return [BF16MixedPrecision("cpu" if accelerator == "cpu" else "cuda")]
