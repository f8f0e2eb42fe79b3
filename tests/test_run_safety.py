"""A run never fails silently and never damages what it already wrote (issue 11):

- divergence (NaN/inf loss or weights) stops the run with an error naming the step and the last
  good checkpoint; `last.ckpt` keeps the good weights; the CLI exits non-zero;
- a step with NaN/inf gradients is skipped and named; ten in a row stop the run;
- SubspaceNGD's skipped steps stop the run after `max_skips_in_row` in a row;
- a resume from a broken checkpoint stops before touching any file of the run;
- two runs never share an output folder; orphan temporary checkpoint files are removed;
- config values that cannot work name their key; skipped pages are counted in the logs.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import open_dict

from test_resume import REPO, SMOKE


def _cfg(root: Path, name: str, extra: list[str]):
    from dociq.training.config import compose

    cfg = compose(SMOKE + [f"paths.root_dir={root}"] + extra)
    with open_dict(cfg):
        cfg.paths.output_dir = str(root / "outputs" / "pretrain" / "runs" / name)
    return cfg


def _train(root: Path, name: str, extra: list[str]):
    from dociq.training.train import train

    return train(_cfg(root, name, extra))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_divergence_stops_the_run_and_keeps_the_good_last_ckpt(tmp_path):
    from dociq.training.callbacks import NonFiniteTrainingError

    # lr=1e3 (the case): step 1 leaves finite but huge weights, every later step's gradients
    # overflow and are skipped (weights unchanged) until ten in a row stop the run
    with pytest.raises(NonFiniteTrainingError) as err:
        _train(tmp_path, "run", ["trainer.max_steps=14", "trainer.val_check_interval=1",
                                 "optim.optimizer.lr=1e3"])
    last = tmp_path / "outputs/pretrain/runs/run/checkpoints/last.ckpt"
    message = str(err.value)
    assert "training diverged at step 10: 10 optimizer steps in a row were skipped" in message
    assert f"the last good checkpoint is {last}" in message and "Fix: lower optim.optimizer.lr" in message
    assert torch.load(last, weights_only=True)["global_step"] == 10   # saved before the stopping step
    state = torch.load(last, weights_only=True)["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


class _Regression(L.LightningModule):
    """y = 2x by one linear layer; the gradients of the steps in `poisoned` are made NaN."""

    def __init__(self, poisoned: set[int]) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.poisoned = poisoned
        self.weights_before: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(batch_idx))
        self.weights_before.append(self.net.weight.detach().clone())
        return torch.nn.functional.mse_loss(self.net(x), 2 * x.sum(1, keepdim=True))

    def on_after_backward(self) -> None:
        if self.global_step in self.poisoned:     # what a glitching kernel's backward leaves
            self.net.weight.grad[0, 1] = float("nan")

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(64), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)


def _fit(module: L.LightningModule, steps: int, stop) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, callbacks=[stop], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0)
    trainer.fit(module)
    return trainer


def test_a_step_with_non_finite_gradients_is_skipped_and_named(caplog):
    from dociq.training.callbacks import StopOnNonFinite

    module, stop = _Regression(poisoned={2}), StopOnNonFinite()
    with caplog.at_level("WARNING", logger="dociq.training.train"):
        trainer = _fit(module, 5, stop)
    assert trainer.global_step == 5
    w = module.weights_before + [module.net.weight.detach()]
    assert torch.equal(w[2], w[3])                       # the poisoned step left the weights as they were
    assert all(not torch.equal(w[i], w[i + 1]) for i in (0, 1, 3, 4))
    assert all(torch.isfinite(t).all() for t in w)
    opt_state = trainer.optimizers[0].state[module.net.weight]
    assert int(opt_state["step"]) == 4                   # AdamW counted only the steps it took
    assert stop.skipped_steps == 1 and stop.skips_in_row == 0
    assert "step 2: the gradients of net.weight were not finite; the optimizer step was skipped" in caplog.text


def test_non_finite_gradients_in_a_row_stop_the_run():
    from dociq.training.callbacks import NonFiniteTrainingError, StopOnNonFinite

    module = _Regression(poisoned={1, 2, 3, 4})
    with pytest.raises(NonFiniteTrainingError) as err:
        _fit(module, 6, StopOnNonFinite(max_skips_in_row=3))
    message = str(err.value)
    assert "training diverged at step 3: 3 optimizer steps in a row were skipped" in message
    assert "the gradients of net.weight were not finite" in message and "Fix: lower optim.optimizer.lr" in message
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_divergence_exits_non_zero_on_the_command_line(tmp_path):
    env = dict(os.environ, DOCIQ_ROOT=str(tmp_path), PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    out = subprocess.run([sys.executable, str(REPO / "train.py"), *SMOKE, "optim.optimizer.lr=1e3",
                          "trainer.max_steps=14"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "training diverged at step" in out.stderr + out.stdout
    for ckpt in tmp_path.glob("outputs/pretrain/runs/*/checkpoints/*.ckpt"):
        state = torch.load(ckpt, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), ckpt


def test_sngd_stops_after_max_skips_in_row():
    from dociq.optim.sngd import SubspaceNGD

    w = torch.nn.Parameter(torch.randn(64, 64))
    opt = SubspaceNGD([w], lr=1e-3, rank=8, max_skips_in_row=3)
    for i in range(2):
        w.grad = torch.full_like(w, float("nan"))
        with pytest.warns(RuntimeWarning, match="non-finite gradient"):
            opt.step()
    w.grad = torch.randn_like(w)
    opt.step()                                   # a good step resets the count
    assert opt.skips_in_row == 0 and opt.skipped_steps == 2
    for i in range(2):
        w.grad = torch.full_like(w, float("inf"))
        with pytest.warns(RuntimeWarning):
            opt.step()
    w.grad = torch.full_like(w, float("nan"))
    with pytest.warns(RuntimeWarning), pytest.raises(FloatingPointError, match="3 optimizer steps in a row"):
        opt.step()
    with pytest.raises(ValueError, match="max_skips_in_row"):
        SubspaceNGD([w], max_skips_in_row=-1)


@pytest.mark.parametrize("damage", ["truncate", "empty", "text"])
def test_failed_resume_leaves_every_file_as_it_was(tmp_path, damage):
    from dociq.io.checkpoint import CheckpointError

    _train(tmp_path, "run", ["trainer.max_steps=2"])
    run = tmp_path / "outputs/pretrain/runs/run"
    last = run / "checkpoints/last.ckpt"
    data = last.read_bytes()
    last.write_bytes({"truncate": data[: len(data) // 2], "empty": b"", "text": b"step: 2\n"}[damage])
    before = _snapshot(run)
    assert any(name.endswith("metrics.csv") for name in before)
    with pytest.raises(CheckpointError, match="last.ckpt"):
        _train(tmp_path, "run", ["ckpt_path=last", "trainer.max_steps=4"])
    assert _snapshot(run) == before


def test_resume_of_a_weights_file_names_init_from(tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    with pytest.raises(ValueError, match="init.from"):
        _train(tmp_path, "run", [f"ckpt_path={weights}"])


def test_orphan_temporary_checkpoints_are_removed_on_resume(tmp_path):
    _train(tmp_path, "run", ["trainer.max_steps=2"])
    ckpts = tmp_path / "outputs/pretrain/runs/run/checkpoints"
    orphan = ckpts / ".last.ckpt.abc123.tmp"   # what a save killed mid-write leaves
    orphan.write_bytes(b"PK\x03\x04 half")
    _train(tmp_path, "run", ["ckpt_path=last", "trainer.max_steps=4"])
    assert not orphan.exists()
    assert not list(ckpts.glob(".*.tmp"))


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    """Both runs name their folder from the same timestamp; the second gets a suffix."""
    env = dict(os.environ, DOCIQ_ROOT=str(tmp_path), PYTHONPATH=str(REPO))
    same = "paths.output_dir=${unique_dir:" + str(tmp_path / "runs" / "2026-01-01_00-00-00") + "}"
    for _ in range(2):
        out = subprocess.run([sys.executable, str(REPO / "train.py"), *SMOKE, same,
                              "++trainer.fast_dev_run=true"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["2026-01-01_00-00-00", "2026-01-01_00-00-00_1"]
    for run in runs:
        assert (tmp_path / "runs" / run / ".hydra" / "config.yaml").is_file()


def test_claim_run_dir_is_atomic_across_processes(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    from dociq.training.config import claim_run_dir

    with ProcessPoolExecutor(2) as pool:
        claimed = list(pool.map(claim_run_dir, [str(tmp_path / "run")] * 8))
    assert len(set(claimed)) == 8
    assert sorted(Path(c).name for c in claimed) == ["run"] + [f"run_{i}" for i in range(1, 8)]


@pytest.mark.parametrize("override, key", [
    ("trainer.max_steps=abc", "trainer.max_steps='abc'"),
    ("trainer.max_steps=0", "trainer.max_steps=0"),
    ("model.mask_unit_px=0", "model.mask_unit_px=0"),
    ("model.mask_unit_px=48", "model.mask_unit_px=48 does not divide model.image_size=128"),
    ("data.batch_size=-2", "data.batch_size=-2"),
    ("optim.optimizer.lr=fast", "optim.optimizer.lr='fast'"),
])
def test_config_values_that_cannot_work_name_their_key(tmp_path, override, key):
    from dociq.training.config_checks import ConfigError

    with pytest.raises(ConfigError) as err:
        _train(tmp_path, "run", [override])
    assert key in str(err.value) and "Fix:" in str(err.value)


def test_skipped_pages_are_logged_and_counted(tmp_path):
    """Pages a data set skips (`on_bad_sample=skip`) show up as `data/skipped` in metrics.csv."""
    from dociq.training.callbacks import SkippedPages

    cfg = _cfg(tmp_path, "run", ["trainer.max_steps=3", "data.batch_size=4"])
    with open_dict(cfg):
        cfg.data.train_set = {"_target_": "test_run_safety.EveryFourthPageBad",
                              "num_pages": 64, "image_size": 128, "seed": 0}
    from dociq.training.train import train

    train(cfg)
    rows = list(csv.DictReader((tmp_path / "outputs/pretrain/runs/run/csv/metrics.csv").open()))
    skipped = [float(r["data/skipped"]) for r in rows if r.get("data/skipped")]
    assert skipped == [1.0, 2.0, 3.0]   # one bad page in each of the first three batches


class EveryFourthPageBad(torch.utils.data.Dataset):
    """Synthetic pages where every fourth one is 'bad' (None, as a data set under skip returns)."""

    def __init__(self, num_pages: int, image_size: int, seed: int) -> None:
        from dociq.data.synthetic.generator import SyntheticDocuments

        self.inner = SyntheticDocuments(num_pages=num_pages, image_size=image_size, seed=seed)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        return None if index % 4 == 1 else self.inner[index]
