"""Exact resume: a run that crashes after its step-4 checkpoint and resumes with `ckpt_path=last`
trains on the same batches, gets the same losses and ends with the same weights as a run that was
never interrupted — for AdamW and SubspaceNGD. Also: the metrics history survives the resume.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import open_dict

from test_resume import SMOKE

CRASH_STEP = 5        # the checkpoint before it is at step 4 (validation every 2 steps)
MAX_STEPS = 7


class LossRecorder(L.Callback):
    """Appends `{"step": global step after the update, "loss": float}` lines to a JSONL file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": trainer.global_step, "loss": float(outputs["loss"]),
                                "pages": [m["page_id"] for m in batch["meta"]]}) + "\n")


class CrashAt(L.Callback):
    """Raises at the end of global step `step`, like a process that dies mid-run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


def _run(root: Path, name: str, optim: str, extra: list[str]) -> dict:
    from dociq.training.config import compose
    from dociq.training.train import train

    cfg = compose(SMOKE + [f"paths.root_dir={root}", f"trainer.max_steps={MAX_STEPS}", f"optim={optim}",
                           "+callbacks.losses._target_=test_exact_resume.LossRecorder",
                           f"+callbacks.losses.path={root / (name + '.jsonl')}"] + extra)
    with open_dict(cfg):
        cfg.paths.output_dir = str(root / "outputs" / "pretrain" / "runs" / name)
    return train(cfg)


def _losses(path: Path) -> dict[int, tuple[float, list[str]]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: (r["loss"], r["pages"]) for r in rows}


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.parametrize("optim", ["adamw", "sngd"])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, optim):
    _run(tmp_path / "a", "straight", optim, [])
    b = tmp_path / "b"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(b, "crashed", optim, ["+callbacks.crash._target_=test_exact_resume.CrashAt",
                                   f"+callbacks.crash.step={CRASH_STEP}"])
    crashed_ckpt = b / "outputs/pretrain/runs/crashed/checkpoints/last.ckpt"
    assert torch.load(crashed_ckpt, weights_only=True)["global_step"] == 4
    _run(b, "resumed", optim, ["ckpt_path=last"])   # continues in runs/crashed

    straight = _losses(tmp_path / "a" / "straight.jsonl")
    crashed, resumed = _losses(b / "crashed.jsonl"), _losses(b / "resumed.jsonl")
    assert sorted(resumed) == list(range(5, MAX_STEPS + 1))
    for step in range(1, CRASH_STEP + 1):        # the same run up to the crash
        assert crashed[step] == straight[step], step
    for step in resumed:                         # same pages, bit-identical losses after resume
        assert resumed[step][1] == straight[step][1], f"step {step}: other pages after resume"
        assert resumed[step][0] == straight[step][0], f"step {step}: loss differs after resume"

    final_a = _weights(tmp_path / "a/outputs/pretrain/runs/straight/checkpoints/last.ckpt")
    final_b = _weights(crashed_ckpt)
    assert final_a.keys() == final_b.keys()
    for name in final_a:
        assert torch.equal(final_a[name], final_b[name]), name


def test_resume_keeps_the_metrics_history_and_drops_rows_it_replays(tmp_path):
    """Lightning's CSVLogger deletes metrics.csv on resume; ours keeps every row before the
    checkpoint, drops the rows logged after it (the resumed run logs them again) and ends with one
    row per step, in order."""
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path, "crashed", "adamw", ["+callbacks.crash._target_=test_exact_resume.CrashAt",
                                            f"+callbacks.crash.step={CRASH_STEP}"])
    metrics = tmp_path / "outputs/pretrain/runs/crashed/csv/metrics.csv"
    before = list(csv.DictReader(metrics.open()))
    train_steps = [int(r["step"]) for r in before if r.get("train/loss")]
    assert train_steps == list(range(CRASH_STEP - 1))   # logged up to the crash (step index 3)
    _run(tmp_path, "resumed", "adamw", ["ckpt_path=last"])
    after = list(csv.DictReader(metrics.open()))
    steps = [int(r["step"]) for r in after if r.get("train/loss")]
    assert steps == list(range(MAX_STEPS)), steps        # complete, no duplicates, monotone
    val_steps = [int(r["step"]) for r in after if r.get("val/loss")]
    assert val_steps == [1, 3, 5], val_steps
    # the rows before the checkpoint are the very rows the first run wrote
    kept = [r for r in after if int(r["step"]) < 4]
    assert [r["train/loss"] for r in kept if r.get("train/loss")] == \
           [r["train/loss"] for r in before if int(r["step"]) < 4 and r.get("train/loss")]


def test_resume_continues_the_tensorboard_history_and_the_wandb_run(tmp_path, monkeypatch):
    from omegaconf import OmegaConf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from test_resume import REPO

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = tmp_path / "outputs/pretrain/runs/crashed"

    def run(extra):
        from dociq.training.config import compose
        from dociq.training.train import train

        cfg = compose(SMOKE + [f"paths.root_dir={tmp_path}", f"trainer.max_steps={MAX_STEPS}",
                               "logger=many"] + extra)
        with open_dict(cfg):
            cfg.paths.output_dir = str(out)
            cfg.logger.wandb = OmegaConf.load(REPO / "configs/logger/wandb.yaml").wandb
            cfg.logger.wandb.save_dir = str(out)
        return train(cfg)

    with pytest.raises(RuntimeError, match="simulated crash"):
        run(["+callbacks.crash._target_=test_exact_resume.CrashAt", f"+callbacks.crash.step={CRASH_STEP}"])
    first_ids = {p.name.rsplit("-", 1)[-1] for p in out.glob("wandb/offline-run-*")}
    assert len(first_ids) == 1
    saved = torch.load(out / "checkpoints/last.ckpt", weights_only=True)["callbacks"]["LoggerRunIds"]
    assert saved == {"wandb": next(iter(first_ids))}
    run(["ckpt_path=last"])
    # the resumed run logs to the same wandb run id (a second offline folder of the same run)
    assert {p.name.rsplit("-", 1)[-1] for p in out.glob("wandb/offline-run-*")} == first_ids
    # TensorBoard: the events written after the checkpoint by the first run are purged
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == list(range(MAX_STEPS)), steps
