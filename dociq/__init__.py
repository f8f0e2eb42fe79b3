"""dociq: promptable document segmentation.

The public API, imported on first use so `import dociq` stays light:

    from dociq import Predictor, PageSegmenter
    predictor = Predictor.from_checkpoint("last.ckpt")

Layout (docs/design.md maps it): `models` (nn.Modules), `data` (pages, batches, data sets),
`io` (checkpoints, mask codecs), `optim` (SubspaceNGD), `training` (Hydra entry, Lightning
stages), `inference` (Predictor, PageSegmenter, model folders), `evaluation`, `engine` (the data
engine), `cli` (the `dociq` command).
"""
from __future__ import annotations

import importlib

_PUBLIC = {
    "Predictor": "dociq.inference.predictor",
    "PageSegmenter": "dociq.inference.automatic",
    "build_model": "dociq.models.registry",
    "list_models": "dociq.models.registry",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dociq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = list(_PUBLIC)
