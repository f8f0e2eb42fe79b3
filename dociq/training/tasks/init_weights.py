"""Starting a task's modules from earlier checkpoints (`task.init.*`): load one part, report the fit.

`load_part` is what stage=pretrain and stage=finetune do for each of `init.from`,
`init.image_encoder` and `init.text_encoder`: load non-strictly, say how many tensors fitted and
which keys are missing or unexpected, and fail when nothing fits.
"""
from __future__ import annotations

import logging
from typing import Sequence

from torch import nn

from dociq.models.image_encoder import ImageEncoder

log = logging.getLogger(__name__)


def load_part(module: nn.Module, state: dict, what: str, path: str,
              expected_missing: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Load `state` into `module` (not strictly) and return the report
    {"missing": [...], "unexpected": [...]} (+ "new" when `expected_missing` is given).

    expected_missing: top-level parts of `module` the checkpoint is not expected to hold (e.g. the
    fine-tuning heads); their keys are reported as "new" rather than "missing".
    Raises ValueError when tensors do not fit (shape mismatch: another model size) and KeyError
    when nothing in `state` fits `module`."""
    state = _resize_image_pos_embeds(module, state)
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as err:   # shape mismatches
        raise ValueError(f"init {what} from {path}: tensors do not fit ({err}); the checkpoint was "
                         "trained with another model size: set model=<its size>") from err
    missing = list(result.missing_keys)
    new_parts = [k for k in missing if k.split(".")[0] in (expected_missing or ())]
    missing = [k for k in missing if k not in new_parts]
    unexpected = list(result.unexpected_keys)
    report = {"missing": missing, "unexpected": unexpected}
    if expected_missing is not None:
        report["new"] = new_parts
    loaded = len(state) - len(unexpected)
    msg = (f"init {what} from {path}: {loaded} tensors loaded, {len(missing)} missing, "
           f"{len(unexpected)} unexpected")
    if new_parts:
        parts = sorted({k.split('.')[0] for k in new_parts})
        msg += f", {len(new_parts)} new (fine-tuning parts {', '.join(parts)} start from scratch)"
    if missing:
        msg += f"\n  missing: {', '.join(missing)}"
    if unexpected:
        msg += f"\n  unexpected: {', '.join(unexpected)}"
    if loaded == 0:
        raise KeyError(f"{msg}\nnothing in {path} fits the {what}: check model.size against "
                       "the checkpoint's stage and size")
    (log.warning if missing or unexpected else log.info)(msg)
    print(msg)   # also visible when logging is not configured (compose() outside Hydra)
    return report


def _resize_image_pos_embeds(module: nn.Module, state: dict) -> dict:
    """Resample every image encoder's position embedding in `state` to the module's resolution,
    so a checkpoint made at one `model.image_size` starts a run at another."""
    for name, sub in module.named_modules():
        if isinstance(sub, ImageEncoder):
            state = sub.resize_pos_embeds(state, prefix=f"{name}." if name else "")
    return state
