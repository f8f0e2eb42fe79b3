"""Checks of the numbers a run is built from, before anything uses them.

A typo on the command line (`trainer.max_steps=abc`, `model.mask_unit_px=0`) otherwise surfaces as
a `TypeError` deep in Lightning or a `ZeroDivisionError` in a resolver, naming no key. Each check
here names the key, the value and what it must be.
"""
from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the fix."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(v) -> bool:
    return _is_int(v) and v > 0


def _non_negative_int(v) -> bool:
    return _is_int(v) and v >= 0


def _steps(v) -> bool:           # max_steps: a positive count, or -1 (= train by epochs)
    return _is_int(v) and (v > 0 or v == -1)


def _interval(v) -> bool:        # val_check_interval: steps (int >= 1) or a fraction of an epoch
    return _positive_int(v) or (isinstance(v, float) and 0.0 < v <= 1.0)


def _positive_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


# key -> (accepts, what the value must be, an example value)
CHECKS: dict[str, tuple[Callable[[object], bool], str, str]] = {
    "seed": (_non_negative_int, "a non-negative integer", "0"),
    "trainer.max_steps": (_steps, "a positive integer number of optimizer steps (or -1 to train by epochs)", "300"),
    "trainer.val_check_interval": (_interval, "a positive integer number of steps, or a fraction in (0, 1]", "100"),
    "trainer.log_every_n_steps": (_positive_int, "a positive integer", "10"),
    "trainer.accumulate_grad_batches": (_positive_int, "a positive integer", "1"),
    "data.batch_size": (_positive_int, "a positive integer", "8"),
    "data.num_workers": (_non_negative_int, "a non-negative integer (0: load in the main process)", "1"),
    "model.image_size": (_positive_int, "a positive integer number of pixels", "256"),
    "model.mask_unit_px": (_positive_int, "a positive integer number of pixels dividing model.image_size", "32"),
    "optim.optimizer.lr": (_positive_number, "a positive number", "1e-3"),
}


def check_config(cfg: DictConfig) -> None:
    """Raise `ConfigError` for the first value in `CHECKS` that is present and wrong."""
    for key, (accepts, must_be, example) in CHECKS.items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if value is None:
            continue
        if not accepts(value):
            raise ConfigError(f"{key}={value!r} is not valid: it must be {must_be}. "
                              f"Fix: pass e.g. {key}={example} on the command line or in the config")
    image, unit = (OmegaConf.select(cfg, k, default=None) for k in ("model.image_size", "model.mask_unit_px"))
    if image is not None and unit is not None and image % unit:
        raise ConfigError(f"model.mask_unit_px={unit} does not divide model.image_size={image}: "
                          "Hiera's mask units tile the page. Fix: pick a divisor, e.g. model.mask_unit_px=32")

