"""Lightning's ModelCheckpoint with a `last.ckpt` that is the run's last state.

Lightning 2.6 writes `last.ckpt` only at steps where it also writes a top-k checkpoint. Once the
monitored metric stops improving, `last.ckpt` stays at the best step: the fine-tuned model a run
reports as its last is an older one, and `ckpt_path=last` replays the steps after it. Here
`last.ckpt` is written at every validation (every `trainer.val_check_interval` steps) as well; the
best checkpoint is kept as before. The class keeps Lightning's name so the callback's state key in
checkpoints (`ModelCheckpoint{...}`) is unchanged.
"""
from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint


class ModelCheckpoint(LightningModelCheckpoint):
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # skipped when this step was saved already (a top-k save writes last.ckpt too)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer) \
                and not self._should_save_on_train_epoch_end(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
