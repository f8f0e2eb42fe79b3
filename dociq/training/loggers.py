"""A CSV logger that keeps a run's history across resumes (Lightning's deletes it).

Lightning's CSVLogger removes an existing `metrics.csv` as soon as it opens the folder, so a run
resumed with `ckpt_path=last` (or a resume that fails) loses every row before the checkpoint. This
one appends instead: on resume it drops only the rows the resumed run will write again (steps at or
after the checkpoint's `global_step`, which Lightning does not replay), and does that at its first
write, i.e. only once the checkpoint has loaded. Every rewrite of the file is atomic.
"""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from dociq.io.atomic import atomic_write_text


def read_metrics(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a metrics.csv (empty when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _csv_text(keys: list[str], rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


class AppendingExperimentWriter(ExperimentWriter):
    """Appends to an existing metrics.csv; `resume_step` drops rows with step >= it at the first save."""

    def __init__(self, log_dir: str, resume_step: int | None = None) -> None:
        self.resume_step = resume_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        # Lightning deletes metrics.csv here; keep it and continue its header instead.
        keys, _ = read_metrics(self.metrics_file_path)
        self.metrics_keys = keys

    def save(self) -> None:
        if not self.metrics:
            return
        if self.resume_step is not None:
            self._drop_rows_from(self.resume_step)
            self.resume_step = None
        new_keys = set().union(*self.metrics) - set(self.metrics_keys)
        if new_keys or not os.path.isfile(self.metrics_file_path):
            keys, rows = read_metrics(self.metrics_file_path)
            self.metrics_keys = sorted(set(self.metrics_keys) | set(keys) | new_keys)
            # a new column means a new header: rewrite the whole file, atomically
            atomic_write_text(self.metrics_file_path, _csv_text(self.metrics_keys, rows + self.metrics))
        else:
            with open(self.metrics_file_path, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.metrics_keys).writerows(self.metrics)
                f.flush()
                os.fsync(f.fileno())
        self.metrics = []

    def _drop_rows_from(self, step: int) -> None:
        keys, rows = read_metrics(self.metrics_file_path)
        if not rows:
            return
        kept = [r for r in rows if r.get("step", "") == "" or int(float(r["step"])) < step]
        if len(kept) != len(rows):
            atomic_write_text(self.metrics_file_path, _csv_text(keys, kept))


class ResumableCSVLogger(CSVLogger):
    """`CSVLogger` that appends to the run's metrics.csv (see the module docstring).

    resume_step: the checkpoint's global_step when resuming (train.py sets it), else None.
    Flushes every `flush_logs_every_n_steps` logged steps (default 1: a killed run loses nothing
    it logged) and whenever a checkpoint is saved.
    """

    def __init__(self, *args, resume_step: int | None = None, flush_logs_every_n_steps: int = 1,
                 **kwargs) -> None:
        super().__init__(*args, flush_logs_every_n_steps=flush_logs_every_n_steps, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        # CSVLogger's own `_experiment` / `_fs` (no public setter): this override replaces its builder
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(self.log_dir, resume_step=self.resume_step)
        return self._experiment

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        self.save()
