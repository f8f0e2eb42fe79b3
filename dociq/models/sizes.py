"""Model sizes: each is one file, dociq/configs/model/<size>.yaml, read here as plain YAML.

Training composes the same file with Hydra (`model=tiny`, overrides like `model.fusion.depth=4`);
`build_model`, the Predictor's checkpoints and model folders, and `dociq convert-checkpoint` read it
here, so a size is defined once:

    size_config("tiny")["fusion"]                     # {'dim': 128, 'depth': 2, 'num_heads': 4}
    complete_model_config({"size": "tiny", "image_size": 128, "fusion": {"depth": 1}})

A model config is *complete* when it has every key of its size's file (and every key of each part
the file spells out); `SegmentationModel.from_config` builds only complete configs, and that is
what a checkpoint stores. `check_model_config` refuses anything less, naming the missing keys and
the fix; `checkpoint_model_config` says the same about a stored config, naming the file.

Imports only the standard library, PyYAML (which timm, transformers and huggingface_hub require)
and dociq.io, so every part module can read it.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Mapping

import yaml

from dociq.io.checkpoint import CheckpointError

MODEL_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"
# Parts a config may set to null to build the model without them.
OPTIONAL_PARTS = ("grounding",)
CONVERT_COMMAND = "dociq convert-checkpoint OLD.ckpt NEW.ckpt"
PREDATES = "it predates the complete model configs"

# Question towers open_clip does not ship, as open_clip model configs ({"embed_dim", "text_cfg",
# optional "quick_gelu"}); `prompt_encoder.question_model` may also name any open_clip model
# (e.g. "ViT-B-16").
QUESTION_TOWERS: dict[str, dict[str, Any]] = {
    "tiny": {
        "embed_dim": 128,
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2},
    },
}


class ModelConfigError(ValueError):
    """A model config that names no known size, lacks a key of its size's file, or sets one that
    is not a model key. `str(err)` reads "<problem>. Fix: <fix>"."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}. Fix: {fix}")

    def __reduce__(self):  # picklable across processes (DataLoader workers)
        return (type(self), (self.problem, self.fix))


class IncompleteModelConfig(ModelConfigError):
    """A model config that lacks keys of its size's file: one stored before model configs were
    complete (`dociq convert-checkpoint` converts it), or a partial one written in code."""


def list_sizes() -> list[str]:
    return sorted(path.stem for path in MODEL_CONFIG_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def _read_size(size: str) -> dict[str, Any]:
    return yaml.safe_load((MODEL_CONFIG_DIR / f"{size}.yaml").read_text(encoding="utf-8"))


def size_config(size: str) -> dict[str, Any]:
    """The complete model config of a named size: configs/model/<size>.yaml (a copy: callers may change it)."""
    if size not in list_sizes():
        raise ModelConfigError(f"unknown model size {size!r}", f"choose one of {list_sizes()} (a size is a "
                               f"file in {MODEL_CONFIG_DIR})")
    return copy.deepcopy(_read_size(size))


def complete_model_config(partial: Mapping[str, Any]) -> dict[str, Any]:
    """`partial` laid over its size's file: a top-level key replaces the file's, a part's keys
    replace single fields of that part (as `model.fusion.depth=1` does in Hydra), `grounding=None`
    builds no grounding. A top-level key the file does not have is refused, naming the valid ones;
    a part's unknown key is refused when the part is built (from_config)."""
    if "size" not in partial:
        raise ModelConfigError("model config has no `size`", f"give one of {list_sizes()}")
    config = size_config(partial["size"])
    unknown = sorted(set(partial) - set(config))
    if unknown:
        raise ModelConfigError(f"unknown model config key(s) {unknown}",
                               f"use the keys of configs/model/{partial['size']}.yaml: {sorted(config)}")
    for key, value in partial.items():
        if isinstance(config[key], dict) and isinstance(value, Mapping):
            config[key] = {**config[key], **copy.deepcopy(dict(value))}
        else:
            config[key] = copy.deepcopy(value)
    return config


def missing_model_keys(model: Mapping[str, Any]) -> list[str]:
    """The keys of the size's file that `model` lacks, dotted within a part ("grounding.box_words").
    Every shipped size has the same keys, so a size defined in a user's own config folder (not
    shipped, as its checkpoint says) is checked against them."""
    size = model["size"] if model["size"] in list_sizes() else list_sizes()[0]
    reference = size_config(size)
    missing = [key for key in reference if key not in model]
    for part, keys in reference.items():
        value = model.get(part)
        if not isinstance(keys, dict) or part not in model or (value is None and part in OPTIONAL_PARTS):
            continue
        given = value if isinstance(value, Mapping) else {}
        missing += [f"{part}.{key}" for key in keys if key not in given]
    return missing


def check_model_config(model: Mapping[str, Any]) -> None:
    """Raise a ModelConfigError unless `model` is complete (see the module doc)."""
    convert = (f"convert its checkpoint once with `{CONVERT_COMMAND}` (a config written in code: complete it "
               "with dociq.models.sizes.complete_model_config)")
    if not isinstance(model, Mapping) or "size" not in model:
        raise IncompleteModelConfig(f"model config has no `size`: {PREDATES}", convert)
    missing = missing_model_keys(model)
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise IncompleteModelConfig(f"model config lacks {', '.join(missing[:6])}{more}: {PREDATES}", convert)


def checkpoint_model_config(model: Any, path: str | Path) -> dict[str, Any]:
    """The model config the checkpoint at `path` stores, checked complete: an older one is a
    CheckpointError naming the command that converts it."""
    try:
        check_model_config(model)
    except IncompleteModelConfig as err:
        raise CheckpointError(path, err.problem, f"convert it once with `dociq convert-checkpoint {path} "
                              "NEW.ckpt` and use NEW.ckpt") from err
    except ModelConfigError as err:
        raise CheckpointError(path, err.problem, err.fix) from err
    return dict(model)
