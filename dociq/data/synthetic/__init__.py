"""The synthetic page generator: content, layout, fonts, rendering and questions.

`dociq.data.synthetic` was one module before the package regroup; its names (SyntheticDocuments,
generate_page, ...) now live in `dociq.data.synthetic.generator` and are still found here, with
a FutureWarning, for one release.
"""
from __future__ import annotations

import importlib
import warnings

_GENERATOR_NAMES = ("SyntheticDocuments", "generate_page", "page_seed", "parse_image_size", "parse_degrade",
                    "MIN_SIDE")


def __getattr__(name: str):
    if name in _GENERATOR_NAMES:
        warnings.warn(f"dociq.data.synthetic.{name} moved to dociq.data.synthetic.generator.{name}; import "
                      "it from there (the old path goes in the next release)", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module("dociq.data.synthetic.generator"), name)
    raise AttributeError(f"module 'dociq.data.synthetic' has no attribute {name!r}")
