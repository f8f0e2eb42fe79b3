"""Training progress for people and for log files.

- `StepProgressBar`: Lightning's rich bar, counting optimizer steps against `trainer.max_steps`.
  dociq's runs are step-bounded (`max_epochs=-1`), where Lightning's bar says `Epoch 0/-2` and
  restarts at every data epoch; this one says `step 120/300` and runs once over the whole run.
- `LogProgress`: plain lines for a stdout that is not a terminal (nohup, CI, `> train.log`), where
  the rich bar draws nothing until the run ends: every N steps or M seconds, the step, speed, ETA,
  the losses of the progress bar and the last validation metrics.

`progress_callbacks` picks one of them for `dociq.training.train.build_trainer`.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ProgressBar, RichProgressBar


def total_steps(trainer: L.Trainer) -> float:
    """The run's length in optimizer steps (`inf` when neither steps nor epochs bound it)."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    try:
        return float(trainer.estimated_stepping_batches)
    except Exception:   # no data loader yet / an infinite one
        return math.inf


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _scalar(value: Any) -> float | None:
    if torch.is_tensor(value):
        return float(value) if value.numel() == 1 else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_metrics(metrics: dict[str, Any]) -> str:
    parts = []
    for name in sorted(metrics):
        value = _scalar(metrics[name])
        if value is not None:
            parts.append(f"{name}={value:.4g}")
    return "  ".join(parts)


class StepProgressBar(RichProgressBar):
    """The rich bar with `step k/max_steps` for step-bounded runs (epoch-bounded: Lightning's)."""

    def _step_bounded(self) -> bool:
        trainer = self.trainer
        return trainer.max_epochs in (None, -1) and trainer.max_steps is not None and trainer.max_steps > 0

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self._step_bounded() else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        if not self._step_bounded():
            return super()._get_train_description(current_epoch)
        text = f"step {self.trainer.global_step}/{self.trainer.max_steps}"
        return f"{text:{len(self.validation_description)}}"   # no flicker next to "Validation"

    def _styled(self, description: str) -> str:
        return f"[{self.theme.description}]{description}" if self.theme.description else description

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._step_bounded() and self.train_progress_bar_id is not None and not self._leave:
            return   # one bar for the whole run: steps count on across data epochs
        super().on_train_epoch_start(trainer, pl_module)
        if self._step_bounded() and self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, completed=trainer.global_step)  # resumed runs

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if not self._step_bounded():
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        if self.progress is not None and self.is_enabled and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, completed=trainer.global_step,
                                 description=self._styled(self._get_train_description(trainer.current_epoch)))
        self._update_metrics(trainer, pl_module)
        self.refresh()


class LogProgress(Callback):
    """Print one progress line every `every_n_steps` optimizer steps or `every_n_seconds` seconds
    (whichever comes first), one after each validation, and one at the end; rank zero only.

        [dociq] step 120/300 (40%)  1.02 it/s  elapsed 1:58  ETA 2:56  train/loss=3.142  val/loss=2.5 (step 100)
    """

    def __init__(self, every_n_steps: int = 50, every_n_seconds: float = 60.0, stream: TextIO | None = None) -> None:
        if every_n_steps < 1 or every_n_seconds <= 0:
            raise ValueError(f"progress.every_n_steps must be >= 1 and progress.every_n_seconds > 0, got "
                             f"{every_n_steps} and {every_n_seconds}")
        self.every_n_steps, self.every_n_seconds = int(every_n_steps), float(every_n_seconds)
        self.stream = stream
        self._start_time = self._start_step = None
        self._last_time = self._last_step = None
        self._val: dict[str, float] = {}
        self._val_step: int | None = None

    def _print(self, line: str) -> None:
        # sys.stdout at call time (not import time), so redirections and pytest's capsys see it
        print(line, file=self.stream or sys.stdout, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now = time.monotonic()
        self._start_time = self._last_time = now
        self._start_step = self._last_step = trainer.global_step
        if trainer.is_global_zero:
            total = total_steps(trainer)
            total_text = str(int(total)) if math.isfinite(total) else "?"
            self._print(f"[dociq] training from step {trainer.global_step} to {total_text} "
                        f"(progress every {self.every_n_steps} steps or {self.every_n_seconds:g} s)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self._start_time is None or not trainer.is_global_zero:
            return
        step, now = trainer.global_step, time.monotonic()
        due = (step - self._last_step >= self.every_n_steps or now - self._last_time >= self.every_n_seconds
               or step >= total_steps(trainer))
        if due and step > self._last_step:
            self._print(self.line(trainer, now))
            self._last_step, self._last_time = step, now

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        every = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/") and _scalar(v) is not None}
        # the step lines repeat what the progress bar shows (val/loss, val/miou), or all if it shows none
        self._val = {k: v for k, v in every.items() if k in trainer.progress_bar_metrics} or every
        self._val_step = trainer.global_step
        if trainer.is_global_zero and every:
            self._print(f"[dociq] validation at step {trainer.global_step}: {format_metrics(every)}")

    def line(self, trainer: L.Trainer, now: float | None = None) -> str:
        """The progress line at the trainer's current step."""
        now = time.monotonic() if now is None else now
        step, total = trainer.global_step, total_steps(trainer)
        elapsed = now - self._start_time
        done = step - self._start_step
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - step) / rate if rate > 0 and math.isfinite(total) else math.inf
        if math.isfinite(total):
            where = f"step {step}/{int(total)} ({100 * step / max(total, 1):.0f}%)"
        else:
            where = f"step {step}"
        train = {k: v for k, v in trainer.progress_bar_metrics.items() if not k.startswith("val/")}
        parts = [where, f"{rate:.2f} it/s", f"elapsed {format_duration(elapsed)}", f"ETA {format_duration(eta)}"]
        if train:
            parts.append(format_metrics(train))
        if self._val:
            parts.append(f"{format_metrics(self._val)} (step {self._val_step})")
        return "[dociq] " + "  ".join(parts)


def progress_callbacks(enabled: bool, every_n_steps: int = 50, every_n_seconds: float = 60.0,
                       existing: list[Callback] = ()) -> tuple[list[Callback], bool]:
    """(callbacks to add, the Trainer's `enable_progress_bar`).

    A terminal gets the rich step bar; anything else (a file, a pipe, CI) gets `LogProgress` lines
    and no bar. `enabled=False` (trainer.enable_progress_bar=false) shows neither. A progress bar
    already in the callbacks is kept as it is."""
    if not enabled:
        return [], False
    if any(isinstance(cb, ProgressBar) for cb in existing):
        return [], True
    if sys.stdout.isatty():
        return [StepProgressBar()], True
    return [LogProgress(every_n_steps, every_n_seconds)], False
