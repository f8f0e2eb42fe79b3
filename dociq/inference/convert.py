"""`dociq convert-checkpoint OLD NEW`: a stage=finetune checkpoint (or an exported model folder)
stored before model configs were complete, given the complete config of the model it holds.

Such a checkpoint's `hyper_parameters.model` held only what differed from its size's table (a
part's keys were empty maps) and said nothing of switches added later, which then meant "off" so
that it kept loading. This module is the one place that knows that older meaning of an absent key:

    box_maps                               on
    click_maps, word_classes               off
    text_encoder.relative_height           off
    grounding                              on (false: none)
    grounding.click_words / text_blocks / box_words   off
    anything else                          the size's value (configs/model/<size>.yaml)

The converted config must build a model that loads OLD's weights strictly (a disagreement is a
CheckpointError and nothing is written). NEW is written atomically (dociq.io) and must not exist;
OLD is never changed. Everything else in OLD (optimizer state, loops, callbacks) is kept, so NEW
also resumes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Mapping

from dociq.inference.model_folder import CONFIG_NAME, DociqSegmenter, read_folder_config, without_file_paths
from dociq.io.atomic import atomic_folder, atomic_write_text
from dociq.io.checkpoint import CheckpointError, atomic_torch_save, model_state_dict, read_finetune_checkpoint
from dociq.models.segmenter import SegmentationModel
from dociq.models.sizes import complete_model_config, missing_model_keys

# What an absent key meant when the config was stored (the table above); other absent keys: the size's value.
ABSENT_MEANT: dict[str, bool] = {
    "box_maps": True, "click_maps": False, "word_classes": False,
    "text_encoder.relative_height": False,
    "grounding.click_words": False, "grounding.text_blocks": False, "grounding.box_words": False,
}


def complete_old_model_config(old: Mapping[str, Any]) -> dict[str, Any]:
    """The complete model config of a model built from the stored config `old` (module doc)."""
    missing = [key for key in ("size", "image_size") if key not in old]
    if missing:
        raise ValueError(f"the stored model config lacks {', '.join(missing)}: it is not a dociq model config")
    model = {key: dict(value) if isinstance(value, Mapping) else value for key, value in old.items()}
    if model.get("grounding", {}) is False:
        model["grounding"] = None
    for dotted, meant in ABSENT_MEANT.items():
        part, _, key = dotted.rpartition(".")
        if not part:
            model.setdefault(key, meant)
        elif model.setdefault(part, {}) is not None:
            model[part].setdefault(key, meant)
    return complete_model_config(model)


def convert_checkpoint(old: str | Path, new: str | Path) -> Path:
    """Convert OLD (a .ckpt file or a model folder) into NEW, the same kind; -> NEW."""
    old, new = Path(old), Path(new)
    if new.exists() or new.is_symlink():
        raise FileExistsError(f"{new} already exists: give a new path for the converted copy (OLD is never changed)")
    if old.is_dir():
        return _convert_folder(old, new)
    return _convert_lightning_checkpoint(old, new)


def _convert_lightning_checkpoint(old: Path, new: Path) -> Path:
    ckpt = read_finetune_checkpoint(old)
    model = _converted(ckpt["hyper_parameters"]["model"], old, "NEW.ckpt")
    built = SegmentationModel.from_config(without_file_paths(model))   # the weights are the checkpoint's
    result = built.load_state_dict(model_state_dict(ckpt["state_dict"]), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(old, f"its weights do not fit the converted model config (missing "
                              f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]})",
                              "give a stage=finetune checkpoint whose hyper_parameters.model is the one it was "
                              "trained with")
    ckpt["hyper_parameters"] = {**ckpt["hyper_parameters"], "model": model}
    atomic_torch_save(ckpt, new)
    return new


def _convert_folder(old: Path, new: Path) -> Path:
    config = read_folder_config(old)
    config["model"] = _converted(config["model"], old, "NEW_FOLDER")
    with atomic_folder(new) as tmp:
        shutil.copytree(old, tmp, dirs_exist_ok=True)
        atomic_write_text(tmp / CONFIG_NAME, json.dumps(config, indent=2))
        try:
            DociqSegmenter.from_pretrained(tmp)        # strict: every weight of the converted model
        except ValueError as err:
            raise ValueError(f"model folder {old}: its weights do not fit the converted model config "
                             f"({' '.join(str(err).split())[:300]}); nothing was written") from err
    return new


def _converted(stored: Any, old: Path, new_hint: str) -> dict[str, Any]:
    """The complete config for `stored`, OLD's model config; a config that needs no conversion or
    cannot have one is a CheckpointError naming OLD."""
    try:
        if not isinstance(stored, Mapping):
            raise ValueError(f"it is a {type(stored).__name__}, not a mapping")
        complete = "size" in stored and not missing_model_keys(stored)
        converted = complete_old_model_config(stored)
    except ValueError as err:
        raise CheckpointError(old, f"its model config cannot be completed ({' '.join(str(err).split())})",
                              "give a checkpoint or model folder written by dociq") from err
    if complete:
        raise CheckpointError(old, "already stores a complete model config: there is nothing to convert",
                              f"use it as it is (no {new_hint} is needed)")
    return converted
