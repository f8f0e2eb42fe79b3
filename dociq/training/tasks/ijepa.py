"""`stage=ijepa`: I-JEPA pretraining of the Hiera image encoder (facebookresearch/ijepa).

Per batch the collator's `MultiBlockMasking` gives context units `ctx_idx` [B,Nc] and M target
blocks `tgt_idx` [B,M,Nt], with no target unit in the context:

- the context encoder (the online `image_encoder`) sees only the context units (Hiera's sparse
  forward drops the other units and zeroes their pixels);
- the target encoder, an EMA copy without gradients, encodes the full page; its last-stage
  tokens are layer-normed (no affine) and the target-block tokens are the targets
  (`target_norm="page"`: then only what varies across the batch's pages at each unit, scaled to
  unit variance, as stage=pretrain's option);
- the predictor gets the context tokens and one mask token per target unit, per block;
- loss = smooth-L1(prediction, target), averaged over blocks, units and channels.

The EMA momentum rises linearly `ema[0]` -> `ema[1]` over the run's optimizer steps
(`trainer.max_steps`; `ema.task_momentum`, as stage=pretrain). The checkpoint
holds `image_encoder.*` (the online encoder), which later stages load with
`init.image_encoder=PATH`, and `target_encoder.*`, so resuming restores the target too.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from dociq.io.checkpoint import model_state_dict, read_checkpoint
from dociq.models.common import build_part
from dociq.models.document_model import image_encoder_from_config
from dociq.models.jepa_predictor import JEPAPredictor
from dociq.training.tasks.base import DociqTask
from dociq.training.tasks.collapse import (TARGET_NORMS, CollapseRegConfig, collapse_terms, page_content,
                                          unexplained_fraction)
from dociq.training.tasks.ema import ema_update, make_ema_target, task_momentum

log = logging.getLogger(__name__)

LOSSES = {"smooth_l1": F.smooth_l1_loss, "mse": F.mse_loss}
BATCH_KEYS = ("image", "ctx_idx", "tgt_idx")


def parse_ema(ema: Sequence[float] | Mapping[str, float]) -> tuple[float, float]:
    """(start, end) from `[0.996, 1.0]` or `{start: 0.996, end: 1.0}` (the pretrain stage's form)."""
    if isinstance(ema, Mapping):
        unknown = set(ema) - {"start", "end"}
        if unknown:
            raise KeyError(f"unknown task.ema key(s) {sorted(unknown)}; allowed: start, end")
        start, end = float(ema.get("start", 0.996)), float(ema.get("end", 1.0))
    else:
        if len(ema) != 2:
            raise ValueError(f"task.ema must be [start, end], got {ema}")
        start, end = float(ema[0]), float(ema[1])
    if not 0.0 <= start <= end <= 1.0:
        raise ValueError(f"task.ema must satisfy 0 <= start <= end <= 1, got ({start}, {end})")
    return start, end


def select_units(tokens: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """tokens [B,N,D], idx [B,K] -> [B,K,D]."""
    return tokens.gather(1, idx.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


def check_disjoint(ctx_idx: torch.Tensor, tgt_idx: torch.Tensor, num_units: int) -> None:
    """Raise if a context unit is also a target unit: the prediction would be a copy."""
    B = ctx_idx.shape[0]
    in_ctx = torch.zeros(B, num_units, dtype=torch.bool, device=ctx_idx.device)
    in_ctx.scatter_(1, ctx_idx, True)
    if torch.gather(in_ctx, 1, tgt_idx.reshape(B, -1)).any():
        raise ValueError("batch ctx_idx overlaps tgt_idx: the context would see its targets; "
                         "use MultiBlockMasking with allow_overlap=false (data.image_masking)")


class IJEPATask(DociqTask):
    def __init__(self, model: Mapping[str, Any], init: Mapping[str, Any] | None = None,
                 ema: Sequence[float] | Mapping[str, float] = (0.996, 1.0), loss: str = "smooth_l1",
                 reg: Mapping[str, float] | None = None, target_norm: str = "layer",
                 optimizer=None, scheduler=None) -> None:
        super().__init__(optimizer, scheduler)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        if target_norm not in TARGET_NORMS:
            raise ValueError(f"task.target_norm={target_norm!r}; allowed: {', '.join(TARGET_NORMS)}")
        self.target_norm = target_norm
        self.ema_start, self.ema_end = parse_ema(ema)
        if loss not in LOSSES:
            raise KeyError(f"unknown task.loss '{loss}'; choose one of {sorted(LOSSES)}")
        self.loss_fn = LOSSES[loss]
        self.reg = CollapseRegConfig.from_config(reg)

        self.image_encoder = image_encoder_from_config(model)
        self.predictor = build_part(JEPAPredictor, "predictor", model, in_dim=self.image_encoder.embed_dim)
        self._load_init(dict(init or {}))
        # Copied after init so that the target starts from the same (maybe pretrained) weights.
        self.target_encoder = make_ema_target(self.image_encoder)
        self.target_encoder.eval()

    def _load_init(self, init: dict[str, Any]) -> None:
        unknown = set(init) - {"image_encoder", "text_encoder", "from"}
        if unknown:
            raise KeyError(f"unknown init key(s) {sorted(unknown)}; allowed: image_encoder, text_encoder, from")
        path = init.get("image_encoder") or init.get("from")
        if path:
            self.image_encoder.load_checkpoint(path)
            log.info("image encoder initialised from %s", path)
        if init.get("from"):
            self._load_predictor(init["from"])
        if init.get("text_encoder"):
            log.warning("init.text_encoder=%s ignored: stage=ijepa trains only the image encoder",
                        init["text_encoder"])

    def _load_predictor(self, path: str) -> None:
        """init.from: also take the predictor when the checkpoint is an ijepa run of the same size."""
        state = read_checkpoint(path, option="init.from").get("state_dict", {})
        weights = model_state_dict(state, "predictor.")
        own = self.predictor.state_dict()
        if weights and all(k in weights and weights[k].shape == v.shape for k, v in own.items()):
            self.predictor.load_state_dict(weights)
            log.info("predictor initialised from %s", path)
        else:
            log.warning("init.from=%s has no predictor of this size: the predictor starts fresh", path)

    def train(self, mode: bool = True):
        super().train(mode)
        self.target_encoder.eval()  # the EMA target never uses train-mode behaviour (drop path)
        return self

    # ---- the loss ----------------------------------------------------------------------------

    def compute_losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise KeyError(f"stage=ijepa needs batch keys {missing}: set data.image_masking to a "
                           "MultiBlockMasking (configs/stage/ijepa.yaml does)")
        image, ctx_idx, tgt_idx = batch["image"], batch["ctx_idx"], batch["tgt_idx"]
        B, M, Nt = tgt_idx.shape
        check_disjoint(ctx_idx, tgt_idx, self.image_encoder.num_units)
        with torch.no_grad():
            features = self.target_encoder(image)                          # [B, N, E], full page
            features = F.layer_norm(features, features.shape[-1:])
            target_std = features.std(dim=0).mean()
            if self.target_norm == "page":
                features = page_content(features)
            target = select_units(features, tgt_idx.reshape(B, M * Nt)).reshape(B * M, Nt, -1)
        context = self.image_encoder(image, ctx_idx)                       # [B, Nc, E]
        pred = self.predict_from_context(context, ctx_idx, tgt_idx)
        out = {"jepa": self.loss_fn(pred, target)}
        out["loss"] = out["jepa"]
        if self.reg.active:
            out.update(collapse_terms(context, ctx_idx, self.image_encoder.num_units, self.reg,
                                      step=self.global_step))
            out["loss"] = out["loss"] + self.reg.weighted(out)
        if B > 1:  # collapse signals: 0 when every page maps to the same features
            out["target_std"] = target_std   # before the page norm, which would make it 1
            out["pred_std"] = pred.detach().reshape(B, M * Nt, -1).std(dim=0).mean()
            out["unexplained"] = unexplained_fraction(pred.detach(), target, features, tgt_idx)
        return out

    def predict_targets(self, image: torch.Tensor, ctx_idx: torch.Tensor, tgt_idx: torch.Tensor) -> torch.Tensor:
        """Predicted features [B*M, Nt, E] of the M target blocks (row b*M + m = block m of page b),
        from the context units alone."""
        return self.predict_from_context(self.image_encoder(image, ctx_idx), ctx_idx, tgt_idx)

    def predict_from_context(self, context: torch.Tensor, ctx_idx: torch.Tensor, tgt_idx: torch.Tensor) -> torch.Tensor:
        """As `predict_targets`, from the context encoder's tokens [B, Nc, E]."""
        B, M, Nt = tgt_idx.shape
        # One predictor pass per target block: blocks go into the batch, the context is repeated.
        return self.predictor(context.repeat_interleave(M, dim=0), ctx_idx.repeat_interleave(M, dim=0),
                              tgt_idx.reshape(B * M, Nt), self.image_encoder.unit_grid)

    # ---- Lightning hooks ---------------------------------------------------------------------

    def training_step(self, batch, batch_idx):
        out = self.compute_losses(batch)
        self.log_losses("train", out, batch["image"].shape[0])
        self.log("train/ema_momentum", self.momentum(), on_step=True, batch_size=1)
        return out["loss"]

    def validation_step(self, batch, batch_idx):
        out = self.compute_losses(batch)
        self.log_losses("val", out, batch["image"].shape[0])
        return out["loss"]

    def momentum(self) -> float:
        return task_momentum(self, self.ema_start, self.ema_end)

    def optimizer_step(self, *args, **kwargs) -> None:
        # Once per optimizer step (not per micro-batch under gradient accumulation), right after the
        # online update and before any callback (a step checkpoint) sees the step: as stage=pretrain.
        super().optimizer_step(*args, **kwargs)
        ema_update(self.target_encoder, self.image_encoder, self.momentum())
