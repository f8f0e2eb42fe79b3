"""`stage=pretrain`: joint D-JEPA + MLM + MIM pretraining of image encoder, text encoder and fusion.

One forward per batch serves all three losses, because the masking is complementary:

- the image encoder sees only the context units (`ctx_idx`, sparse Hiera forward); every other
  unit enters the fusion trunk as a learned mask token at its sin-cos position;
- the text encoder sees all OCR words — including the words inside the masked image blocks —
  except the MLM-corrupted ones, which the collator picks only among words in *visible* units
  (`data.text_masking.visible_only=true`);
- after fusion, each masked unit's slot holds what the context image and the words lying on
  it say about it. Three heads read the fused tokens:
  D-JEPA  the predictor takes the fused grid as context and predicts, per target block, the EMA
          target encoder's layer-normed features of the target units (smooth-L1);
  MLM     the MLM head predicts the corrupted words from the fused text tokens, which have seen
          the page pixels of those words (cross-entropy on corrupted positions only);
  MIM     a light pixel head reconstructs the (page-normalised) pixels of every masked unit
          from its fused slot (MSE on masked units only).

So the image is recovered from the text and the text from the image. `loss.<name>: 0` turns a
loss (and its compute) off. The target encoder is an EMA copy of the image encoder, momentum
linearly `ema.start` -> `ema.end` over the run; it is part of the checkpoint, so resuming restores it.

Two switches of the D-JEPA target and context, for studying what the image encoder learns from it
(docs/pretrain.md, "Failure modes"):
  target_norm        "layer" (I-JEPA): each target token layer-normed over its channels; most of
                     such a token is its unit's position, the same on every page. "page": then each
                     unit's mean over the batch's pages is removed and the rest scaled to unit
                     variance, so the loss is all page content.
  predictor_context  "grid": the predictor reads the whole fused grid, the masked slots the fusion
                     filled from the words on them included. "visible": only the context units'
                     fused tokens, so the words on a target unit reach it only through context.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from dociq.io.checkpoint import model_state_dict, read_checkpoint
from dociq.models.common import build_part
from dociq.models.document_model import DocumentModel
from dociq.models.heads import FeatureHead, PixelHead, normalise_units, patchify
from dociq.models.image_encoder import load_image_encoder_from_checkpoint
from dociq.models.jepa_predictor import JEPAPredictor
from dociq.models.text_encoder import MLMHead, load_text_encoder_from_checkpoint
from dociq.training.tasks.base import DociqTask
from dociq.training.tasks.collapse import (TARGET_NORMS, CollapseRegConfig, collapse_terms, page_content,
                                          unexplained_fraction)
from dociq.training.tasks.ema import ema_update, make_ema_target, task_momentum
from dociq.training.tasks.init_weights import load_part

log = logging.getLogger(__name__)

LOSS_NAMES = ("djepa", "mlm", "mim")
PREDICTOR_CONTEXTS = ("grid", "visible")


class PretrainTask(DociqTask):
    def __init__(self, model: Mapping[str, Any], init: Mapping[str, Any] | None = None,
                 loss: Mapping[str, float] | None = None,
                 ema: Mapping[str, float] | None = None, mim_norm_pix: bool = False,
                 reg: Mapping[str, float] | None = None, target_norm: str = "layer",
                 predictor_context: str = "grid", optimizer=None, scheduler=None) -> None:
        super().__init__(optimizer, scheduler)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.loss_weights = self._check_loss_weights(loss)
        for key, value, allowed in (("target_norm", target_norm, TARGET_NORMS),
                                    ("predictor_context", predictor_context, PREDICTOR_CONTEXTS)):
            if value not in allowed:
                raise ValueError(f"task.{key}={value!r}; allowed: {', '.join(allowed)}")
        self.target_norm, self.predictor_context = target_norm, predictor_context
        ema = dict(ema or {})
        unknown = set(ema) - {"start", "end"}
        if unknown:
            raise KeyError(f"unknown task.ema key(s) {sorted(unknown)}; allowed: start, end")
        self.ema_start, self.ema_end = float(ema.get("start", 0.996)), float(ema.get("end", 1.0))
        self.mim_norm_pix = mim_norm_pix
        self.reg = CollapseRegConfig.from_config(reg)

        self.model = DocumentModel.from_config(model)
        dim, encoder = self.model.dim, self.model.image_encoder
        self.predictor = build_part(JEPAPredictor, "predictor", model, in_dim=dim)
        self.feature_head = FeatureHead(dim, encoder.embed_dim)
        grid_h, grid_w = self.model.unit_grid
        unit_px = int(model["image_size"]) // grid_h
        if unit_px * grid_h != int(model["image_size"]) or grid_h != grid_w:
            raise ValueError(f"model.image_size={model['image_size']} is not a square grid of "
                             f"mask units ({grid_h}x{grid_w}); check model.mask_unit_px")
        self.pixel_head = PixelHead(dim, unit_px)
        text = self.model.text_encoder
        self.mlm_head = MLMHead(dim, text.vocab_size)
        self.mlm_head.tie_to(text.word_embeddings)

        self._load_init(dict(init or {}))
        # The target is copied after init so it starts from the same (maybe pretrained) weights.
        self.target_encoder = make_ema_target(encoder)
        self.target_encoder.eval()

    # ---- setup -------------------------------------------------------------------------------

    @staticmethod
    def _check_loss_weights(loss: Mapping[str, float] | None) -> dict[str, float]:
        weights = {"djepa": 1.0, "mlm": 1.0, "mim": 1.0} | dict(loss or {})
        unknown = set(weights) - set(LOSS_NAMES)
        if unknown:
            raise KeyError(f"unknown task.loss key(s) {sorted(unknown)}; allowed: {', '.join(LOSS_NAMES)}")
        if any(float(w) < 0 for w in weights.values()) or not any(float(w) > 0 for w in weights.values()):
            raise ValueError(f"task.loss weights must be >= 0 with at least one > 0, got {weights}")
        return {k: float(v) for k, v in weights.items()}

    def _load_init(self, init: dict[str, Any]) -> None:
        """Start the encoders from earlier stages' checkpoints, reporting keys that do not fit."""
        unknown = set(init) - {"image_encoder", "text_encoder", "from"}
        if unknown:
            raise KeyError(f"unknown init key(s) {sorted(unknown)}; allowed: image_encoder, text_encoder, from")
        self.init_report: dict[str, dict[str, list[str]]] = {}
        if init.get("from"):
            self.init_report["model"] = load_part(self.model, state_under(init["from"], "model."),
                                                  "model", init["from"])
        if init.get("image_encoder"):
            self.init_report["image encoder"] = load_part(
                self.model.image_encoder, _image_encoder_state(init["image_encoder"]),
                "image encoder", init["image_encoder"])
        if init.get("text_encoder"):
            self.init_report["text encoder"] = load_part(
                self.model.text_encoder, load_text_encoder_from_checkpoint(init["text_encoder"]),
                "text encoder", init["text_encoder"])

    def train(self, mode: bool = True):
        super().train(mode)
        self.target_encoder.eval()   # the EMA target never uses train-mode behaviour (drop path)
        return self

    # ---- the losses --------------------------------------------------------------------------

    def compute_losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        w = self.loss_weights
        need_image_mask = w["djepa"] > 0 or w["mim"] > 0
        for key, needed, fix in (("ctx_idx", need_image_mask, "data.image_masking"),
                                 ("tgt_idx", w["djepa"] > 0, "data.image_masking"),
                                 ("mlm_ids", w["mlm"] > 0, "data.text_masking"),
                                 ("mlm_labels", w["mlm"] > 0, "data.text_masking")):
            if needed and key not in batch:
                raise KeyError(f"pretrain batch has no `{key}`: set {fix} (configs/stage/pretrain.yaml) "
                               f"or turn that loss off with task.loss.<name>=0")
        ctx_idx = batch["ctx_idx"] if need_image_mask else None
        text_ids = batch["mlm_ids"] if w["mlm"] > 0 else batch["ocr_ids"]
        image_tokens = self.model.image_encoder(batch["image"], ctx_idx)
        fused_img, fused_txt = self.model.fuse(batch, image_tokens, keep_idx=ctx_idx, text_ids=text_ids)

        out: dict[str, torch.Tensor] = {}
        total = fused_img.new_zeros(())
        if self.reg.active:   # keeps the image encoder, which the D-JEPA target follows, from collapsing
            idx = ctx_idx if ctx_idx is not None else torch.arange(
                image_tokens.shape[1], device=image_tokens.device).expand(image_tokens.shape[:2])
            out.update(collapse_terms(image_tokens, idx, self.model.image_encoder.num_units, self.reg,
                                      step=self.global_step))
            total = total + self.reg.weighted(out)
        if w["djepa"] > 0:
            out.update(self._djepa(batch, fused_img))
            total = total + w["djepa"] * out["djepa"]
        if w["mlm"] > 0:
            out.update(self._mlm(batch, fused_txt))
            total = total + w["mlm"] * out["mlm"]
        if w["mim"] > 0:
            out.update(self._mim(batch, fused_img))
            total = total + w["mim"] * out["mim"]
        out["loss"] = total
        return out

    def _djepa(self, batch, fused_img: torch.Tensor) -> dict[str, torch.Tensor]:
        tgt_idx = batch["tgt_idx"]                                  # [B, M, Nt]
        B, M, Nt = tgt_idx.shape
        with torch.no_grad():
            features = self.target_encoder(batch["image"], None)    # [B, N, E], full page
            features = F.layer_norm(features, features.shape[-1:])
            target_std = features.float().std(dim=0).mean()
            if self.target_norm == "page":
                features = page_content(features)
        E, N = features.shape[-1], fused_img.shape[1]
        flat_idx = tgt_idx.reshape(B * M, Nt)
        target = features.repeat_interleave(M, dim=0).gather(1, flat_idx[..., None].expand(-1, -1, E))
        # No slot of the fused grid holds target pixels (they never reach the encoder); "grid" also
        # gives the predictor the masked slots the fusion filled from the words lying on them.
        if self.predictor_context == "grid":
            context, context_idx = fused_img, torch.arange(N, device=fused_img.device).expand(B, N)
        else:
            ctx_idx = batch["ctx_idx"]
            context = fused_img.gather(1, ctx_idx[..., None].expand(-1, -1, fused_img.shape[-1]))
            context_idx = ctx_idx
        pred = self.predictor(context.repeat_interleave(M, dim=0), context_idx.repeat_interleave(M, dim=0),
                              flat_idx, self.model.unit_grid)
        pred = self.feature_head(pred)
        return {"djepa": F.smooth_l1_loss(pred, target),
                # collapse signals: if these go to 0 every page maps to the same features
                # (as stage=ijepa: std across pages at a fixed unit / block slot)
                "target_std": target_std,
                "pred_std": pred.detach().float().reshape(B, M * Nt, -1).std(dim=0).mean(),
                "unexplained": unexplained_fraction(pred.detach(), target, features, flat_idx)}

    def _mlm(self, batch, fused_txt: torch.Tensor) -> dict[str, torch.Tensor]:
        labels = batch["mlm_labels"]
        chosen = labels != -100
        if not chosen.any():   # a batch of pages without eligible words: a zero that keeps the graph
            zero = fused_txt.sum() * 0.0
            return {"mlm": zero, "mlm_acc": zero.detach()}
        logits = self.mlm_head(fused_txt[chosen])
        target = labels[chosen]
        return {"mlm": F.cross_entropy(logits, target),
                "mlm_acc": (logits.argmax(-1) == target).float().mean()}

    def _mim(self, batch, fused_img: torch.Tensor) -> dict[str, torch.Tensor]:
        B, N, _ = fused_img.shape
        visible = torch.zeros(B, N, dtype=torch.bool, device=fused_img.device)
        visible.scatter_(1, batch["ctx_idx"], True)
        masked = ~visible
        pixels = patchify(batch["image"], self.model.unit_grid)
        if self.mim_norm_pix:
            pixels = normalise_units(pixels)
        pred = self.pixel_head(fused_img[masked])
        return {"mim": F.mse_loss(pred, pixels[masked])}

    # ---- Lightning hooks ---------------------------------------------------------------------

    def training_step(self, batch, batch_idx):
        out = self.compute_losses(batch)
        self.log_losses("train", out, batch["image"].shape[0])
        self.log("train/ema_momentum", self._momentum(), on_step=True, batch_size=1)
        return out["loss"]

    def validation_step(self, batch, batch_idx):
        out = self.compute_losses(batch)
        self.log_losses("val", out, batch["image"].shape[0])
        return out["loss"]

    def _momentum(self) -> float:
        return task_momentum(self, self.ema_start, self.ema_end)

    def optimizer_step(self, *args, **kwargs) -> None:
        # Once per optimizer step (not per micro-batch under gradient accumulation): the target
        # follows the online encoder right after its update.
        super().optimizer_step(*args, **kwargs)
        if self.loss_weights["djepa"] > 0:
            ema_update(self.target_encoder, self.model.image_encoder, self._momentum())

    def trainable_named_parameters(self):
        return [(n, p) for n, p in self.named_parameters()
                if p.requires_grad and not n.startswith("target_encoder.")]


def _image_encoder_state(path: str) -> dict[str, torch.Tensor]:
    """Image-encoder weights of any stage's checkpoint: stages that keep the encoder at the top
    (`image_encoder.*`, e.g. ijepa) via the encoder's own loader; DocumentModel stages
    (`model.image_encoder.*`: pretrain, finetune) by their prefix."""
    try:
        return load_image_encoder_from_checkpoint(path)
    except KeyError:
        state = state_under(path, "model.image_encoder.")
        if not state:
            raise
        return state


def state_under(path: str, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` in a Lightning checkpoint (or plain state dict) at `path`."""
    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist (init.from)")
    ckpt = read_checkpoint(path, option="init.from")
    state = ckpt.get("state_dict", ckpt)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a Lightning checkpoint or state dict (init.from)")
    return model_state_dict(state, prefix, tensors_only=True)
