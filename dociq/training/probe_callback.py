"""The unit-class linear probe (dociq/training/probe.py) logged at every validation of an
image-encoder stage (pretrain, ijepa): a curve of what the encoder carries about a page's layout,
beside losses that also fall when it collapses.

Pages: the first `train_pages` of the run's training set fit the probe, the first `test_pages` of
its validation set score it (a corpus's held-out split under data=corpus / corpus_mixed). They are
read and labelled once; when training starts (step 0: the encoders the run starts from) and at
each validation they are encoded with the online image encoder and with the EMA target, one
logistic regression is fitted to each, and `val/probe_bacc` and `val/probe_bacc_target` (balanced
accuracy) are logged.
"""
from __future__ import annotations

import logging

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from dociq.training.probe import encode_images, input_frames, token_probe_accuracy, unit_labels

log = logging.getLogger("dociq.training.train")


def image_encoders(task: L.LightningModule) -> dict[str, torch.nn.Module]:
    """{"": online encoder, "_target": EMA target} of a pretrain or ijepa task."""
    online = task.model.image_encoder if hasattr(task, "model") else task.image_encoder
    out = {"": online}
    if getattr(task, "target_encoder", None) is not None:
        out["_target"] = task.target_encoder
    return out


def is_sharded(module: torch.nn.Module) -> bool:
    """True when FSDP holds the module's weights as shards (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


class UnitClassProbe(Callback):
    def __init__(self, train_pages: int = 48, test_pages: int = 24, max_iter: int = 100) -> None:
        if train_pages < 1 or test_pages < 1:
            raise ValueError(f"UnitClassProbe needs train_pages and test_pages >= 1, got {train_pages}, {test_pages}")
        self.train_pages, self.test_pages, self.max_iter = int(train_pages), int(test_pages), int(max_iter)
        self._pages: tuple | None = None

    def _prepare(self, trainer: L.Trainer, task: L.LightningModule) -> tuple | None:
        data = trainer.datamodule
        sets = (getattr(data, "train_set", None), getattr(data, "val_set", None))
        if any(s is None or len(s) == 0 for s in sets):
            log.warning("UnitClassProbe: the run has no training or validation pages; the probe is off")
            return None
        model = task.hparams["model"]
        image_size = int(model["image_size"])
        unit_px = int(model["mask_unit_px"])
        prepared = []
        for dataset, n in zip(sets, (self.train_pages, self.test_pages)):
            pages = [page for page in (dataset[i] for i in range(min(n, len(dataset)))) if page is not None]
            labels = torch.stack([unit_labels(p, image_size, unit_px) for p in pages]).reshape(-1)
            prepared.append((input_frames(pages, image_size), labels))
        return tuple(prepared)

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        if is_sharded(pl_module):
            if self._pages is None:
                log.warning("UnitClassProbe is off under FSDP (the encoder's weights are sharded): probe a "
                            "checkpoint with scripts/probe_encoder.py instead")
                self._pages = ()
            return {}
        if self._pages is None:
            self._pages = self._prepare(trainer, pl_module) or ()
        if not self._pages:
            return {}
        (train_images, train_labels), (test_images, test_labels) = self._pages
        out = {}
        device = pl_module.device
        # the probe's fit seeds torch's RNG: forked, so the run's random stream is untouched
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for suffix, encoder in image_encoders(pl_module).items():
                tokens = [encode_images(encoder, images.to(device)).cpu() for images in (train_images, test_images)]
                _, balanced = token_probe_accuracy(tokens[0], train_labels, tokens[1], test_labels, self.max_iter)
                out[f"val/probe_bacc{suffix}"] = balanced
        return out

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the encoders the run starts from: the curve's first point (not again on a resume)
        if trainer.global_step == 0:
            values = self._measure(trainer, pl_module)
            for logger in trainer.loggers if values else ():
                logger.log_metrics(values, step=0)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        for name, value in self._measure(trainer, pl_module).items():
            pl_module.log(name, value, on_epoch=True, sync_dist=False, rank_zero_only=False)
