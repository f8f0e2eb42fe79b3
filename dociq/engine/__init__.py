"""The data engine (issue 14): model-assisted annotation that grows the data set and retrains.

- `dociq.engine.store`: `EngineStore`, the SQLite + PNG store of pages and annotations;
- `dociq.engine.importer`: pages from folders/PDFs/zips, COCO and FUNSD sets into a store;
- `dociq.engine.coco_export`: a store as COCO JSON that `data=coco` reads unchanged;
- `dociq.cli.engine`: `dociq engine import | export | progress | split`.

Only the store is imported eagerly (it needs no torch); the rest load on first use.
"""
from __future__ import annotations

import importlib

from dociq.engine.store import (
    AnnotationRecord, EngineStore, NotAStoreError, PageRecord, UnknownAnnotationError, UnknownPageError,
)

_LAZY = {
    "import_folder": "dociq.engine.importer", "import_coco": "dociq.engine.importer",
    "import_funsd": "dociq.engine.importer", "split_heldout": "dociq.engine.importer",
    "ImportResult": "dociq.engine.importer", "export_coco": "dociq.engine.coco_export",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dociq.engine' has no attribute {name!r}")


__all__ = ["EngineStore", "PageRecord", "AnnotationRecord", "UnknownPageError", "UnknownAnnotationError",
           "NotAStoreError", *_LAZY]
