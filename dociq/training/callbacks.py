"""Callbacks every run gets (train.py adds them whatever `callbacks=` says): they keep a run honest.

- `StopOnNonFinite`: a step with non-finite gradients is skipped (ten in a row stop the run); a
  non-finite loss or weight stops the run with an error before anything is saved, so a good
  `last.ckpt` is never overwritten with NaNs.
- `RngState`: the global RNG states travel in the checkpoint and validation leaves them untouched,
  so a resumed run draws the same random numbers as an uninterrupted one (exact resume).
- `LoggerRunIds`: the wandb run id travels in the checkpoint, so a resume continues the same run.
- `SkippedPages`: counts pages the data sets skipped (`on_bad_sample=skip`), logs `data/skipped`.

Why not `EarlyStopping(check_finite=True)`: it looks at a logged metric only when validation ends,
stops with exit code 0, and by then `ModelCheckpoint` has already written the NaN weights.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger("dociq.training.train")


def pages_in_batch(batch: Mapping) -> int:
    """The number of pages in a collated batch (ThroughputMonitor's `batch_size_fn`)."""
    return int(batch["image"].shape[0])


class NonFiniteTrainingError(FloatingPointError):
    """The run diverged: its loss or weights are NaN/inf."""


def last_good_checkpoint(trainer: L.Trainer) -> str:
    cb = trainer.checkpoint_callback
    path = getattr(cb, "last_model_path", "") or getattr(cb, "best_model_path", "")
    return path or "none (no checkpoint was saved before this step)"


def tensor_norms(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """The norm of each named tensor, as one tensor on their device (no host sync); None for none."""
    return torch.stack(torch._foreach_norm([t.detach() for _, t in named])) if named else None


def non_finite_names(names: list[str], norms: torch.Tensor | None, limit: int = 3) -> list[str]:
    """The (up to `limit`) names whose norm is NaN/inf; one host sync when all are finite."""
    if norms is None:
        return []
    finite = torch.isfinite(norms)
    if bool(finite.all()):
        return []
    return [names[i] for i in torch.nonzero(~finite).flatten()[:limit].tolist()]


def non_finite_parameters(module: torch.nn.Module, limit: int = 3) -> list[str]:
    """Names of (up to `limit`) parameters holding NaN/inf; one host sync when all are finite."""
    named = list(module.named_parameters())
    return non_finite_names([n for n, _ in named], tensor_norms(named), limit)


class StopOnNonFinite(Callback):
    """Skip a step whose gradients are not finite; stop a run whose loss or weights are not.

    Gradients are checked after the backward pass, before clipping and the optimizer (one inf
    gradient turns every clipped gradient into NaN): where one is NaN/inf the step is skipped — the
    gradients are dropped, so the optimizer leaves the weights and its state as they were, as AMP's
    GradScaler and SubspaceNGD do — and a warning names the parameters. A lone bad backward pass
    (a kernel's glitch, one odd batch) so costs one step, not the run; `max_skips_in_row` skipped
    steps in a row mean the run diverged, and it stops. The check reads one flag from the device per
    step, as GradScaler's does.

    The loss and weights are checked in `on_train_batch_end`, before `ModelCheckpoint` (Lightning
    orders checkpoint callbacks last), so a diverged step is never saved. Either stop raises
    `NonFiniteTrainingError` naming the step, what went wrong, the last good checkpoint and the fix;
    the process exits non-zero.
    """

    def __init__(self, max_skips_in_row: int = 10) -> None:
        if not (isinstance(max_skips_in_row, int) and max_skips_in_row >= 1):
            raise ValueError(f"StopOnNonFinite: max_skips_in_row={max_skips_in_row!r}; need an int >= 1")
        self.max_skips_in_row = max_skips_in_row
        self.skips_in_row = 0
        self.skipped_steps = 0

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        named = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        bad = non_finite_names([n for n, _ in named], tensor_norms(named))
        # every process takes the same decision (sharded gradients can differ in finiteness)
        if not trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            self.skips_in_row = 0
            return
        for p in pl_module.parameters():
            p.grad = None
        self.skips_in_row += 1
        self.skipped_steps += 1
        where = f"the gradients of {', '.join(bad) or 'another process'} were not finite"
        if self.skips_in_row >= self.max_skips_in_row:
            raise NonFiniteTrainingError(self.message(
                trainer, f"{self.skips_in_row} optimizer steps in a row were skipped because their "
                         f"gradients were not finite (last: {where})"))
        log.warning("step %d: %s; the optimizer step was skipped, weights unchanged (%d in a row, "
                    "%d in all; the run stops after %d in a row)", trainer.global_step, where,
                    self.skips_in_row, self.skipped_steps, self.max_skips_in_row)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        what = None
        if torch.is_tensor(loss) and not bool(torch.isfinite(loss.detach()).all()):
            what = f"the training loss is {loss.detach().float().mean().item()}"
        elif bad := non_finite_parameters(pl_module):
            what = f"weights are not finite after the optimizer step ({', '.join(bad)})"
        if self.skipped_steps:   # a column only once a step was skipped
            pl_module.log("train/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False,
                          batch_size=1)
        if what is None:
            return
        raise NonFiniteTrainingError(self.message(trainer, what))

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.skipped_steps, "skips_in_row": self.skips_in_row}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.skips_in_row = int(state_dict.get("skips_in_row", 0))

    @staticmethod
    def message(trainer: L.Trainer, what: str) -> str:
        lrs = sorted({g["lr"] for opt in trainer.optimizers for g in opt.param_groups})
        lr = ", ".join(f"{x:g}" for x in lrs) or "?"
        last = last_good_checkpoint(trainer)
        return (f"training diverged at step {trainer.global_step}: {what}. The run was stopped and "
                f"nothing was saved after this step; the last good checkpoint is {last}. Fix: lower "
                f"optim.optimizer.lr (now {lr}) or keep trainer.gradient_clip_val set, then start "
                f"again (or resume with ckpt_path=<that checkpoint>)")


def _capture_rng() -> dict:
    """Global RNG states as tensors and ints only (loadable with torch.load(weights_only=True))."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": list(py_state), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RngState(Callback):
    """Global RNG states in the checkpoint, restored on resume; validation runs on a forked RNG.

    Forking matters twice: validation draws no numbers from the training stream (so how often it runs
    does not change training), and a resume that re-runs the validation of the checkpoint's step
    still continues training from the saved state.
    """

    def __init__(self) -> None:
        self._before_validation: dict | None = None

    def state_dict(self) -> dict:
        # during validation, the training stream is the one saved before it started
        return self._before_validation or _capture_rng()

    def load_state_dict(self, state_dict: dict) -> None:
        _restore_rng(state_dict)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before_validation = _capture_rng()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._before_validation is not None:
            _restore_rng(self._before_validation)
            self._before_validation = None


class SkippedPages(Callback):
    """Sum of `batch["skipped"]` (pages a data set dropped under `on_bad_sample=skip`), logged as
    `data/skipped` and kept across resumes; train.py prints the total at the end."""

    def __init__(self) -> None:
        self.total = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        skipped = int(batch.get("skipped", 0)) if isinstance(batch, Mapping) else 0
        self.total += skipped
        if self.total:   # a column only when something was skipped
            pl_module.log("data/skipped", float(self.total), on_step=True, on_epoch=False,
                          batch_size=1, reduce_fx="max")

    def state_dict(self) -> dict:
        return {"total": self.total}

    def load_state_dict(self, state_dict: dict) -> None:
        self.total = int(state_dict.get("total", 0))


class LoggerRunIds(Callback):
    """Run ids of the loggers that have one (wandb), saved in the checkpoint for train.py's resume."""

    def state_dict(self) -> dict:
        ids = {}
        trainer = getattr(self, "_trainer", None)
        for logger in trainer.loggers if trainer is not None else []:
            if type(logger).__name__ == "WandbLogger":
                ids["wandb"] = str(logger.version)
        return ids

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer   # this callback's own: Callback.state_dict() is given no trainer
