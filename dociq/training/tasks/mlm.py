"""`stage=mlm`: masked language modelling on OCR text with the layout-aware text encoder.

The collator corrupts the OCR tokens (`data.text_masking`: 15% of word tokens, 80/10/10) into
`mlm_ids` and keeps the originals in `mlm_labels` (-100 elsewhere). The loss is cross-entropy on
the masked positions only; the head runs only there, which skips ~85% of the vocabulary matmul.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from dociq.models.document_model import text_encoder_from_config
from dociq.models.text_encoder import MLMHead, TextEncoder, load_text_encoder_weights
from dociq.training.tasks.base import DociqTask

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
MLM_BATCH_KEYS = ("mlm_ids", "mlm_labels", "ocr_boxes", "ocr_mask")


def mlm_loss(features: torch.Tensor, labels: torch.Tensor,
             head: MLMHead) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, accuracy, logits) over positions whose label is not -100.

    `logits` are [N_masked, vocab] in the order of `labels != -100`. A batch with nothing masked
    gives a zero loss that still depends on the graph (so DDP sees every parameter)."""
    chosen = labels != IGNORE_INDEX
    if not chosen.any():
        zero = features.sum() * 0.0
        return zero, zero.detach(), features.new_zeros(0, head.decoder.out_features)
    logits = head(features[chosen])
    target = labels[chosen]
    loss = F.cross_entropy(logits.float(), target)
    accuracy = (logits.argmax(-1) == target).float().mean()
    return loss, accuracy, logits


def require_keys(batch: Mapping[str, Any], keys: tuple[str, ...], stage: str) -> None:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise KeyError(f"stage={stage} needs batch keys {missing}: set data.text_masking "
                       "(configs/stage/<stage>.yaml sets an MLMMasking by default)")


def init_text_encoder(encoder: TextEncoder, init: Mapping[str, Any] | None) -> None:
    """Start from an earlier stage's checkpoint: `init.text_encoder`, else `init.from`."""
    init = dict(init or {})
    unknown = set(init) - {"image_encoder", "text_encoder", "from"}
    if unknown:
        raise KeyError(f"unknown init key(s) {sorted(unknown)}; allowed: image_encoder, text_encoder, from")
    path = init.get("text_encoder") or init.get("from")
    if path:
        load_text_encoder_weights(encoder, path)
        log.info("text encoder initialised from %s", path)
    if init.get("image_encoder"):
        log.warning("init.image_encoder=%s ignored: this stage trains only the text encoder",
                    init["image_encoder"])


class MLMTask(DociqTask):
    """Text encoder + MLM head (decoder tied to the word embeddings)."""

    def __init__(self, model: Mapping[str, Any], init: Mapping[str, Any] | None = None,
                 optimizer=None, scheduler=None) -> None:
        super().__init__(optimizer, scheduler)
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.text_encoder = text_encoder_from_config(model)
        self.mlm_head = MLMHead(self.text_encoder.hidden_size, self.text_encoder.vocab_size)
        self.mlm_head.tie_to(self.text_encoder.word_embeddings)
        init_text_encoder(self.text_encoder, init)

    def forward(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        require_keys(batch, MLM_BATCH_KEYS, "mlm")
        features = self.text_encoder(batch["mlm_ids"], batch["ocr_boxes"], batch["ocr_mask"])
        loss, accuracy, _ = mlm_loss(features, batch["mlm_labels"], self.mlm_head)
        return {"loss": loss, "mlm_acc": accuracy}

    def _step(self, batch: Mapping[str, Any], split: str) -> torch.Tensor:
        out = self(batch)
        size = batch["mlm_ids"].shape[0]
        self.log(f"{split}/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log(f"{split}/mlm_acc", out["mlm_acc"], batch_size=size)
        return out["loss"]

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        return self._step(batch, "val")
