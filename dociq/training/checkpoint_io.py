"""Lightning's checkpoint writer, made atomic: every `Trainer` save goes through `atomic_torch_save`
(temporary file, fsync, rename), so a crash during a save leaves the previous checkpoint intact."""
from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from dociq.io.checkpoint import atomic_torch_save


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_torch_save(checkpoint, path)
