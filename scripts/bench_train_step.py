"""A training step split into forward, backward and optimizer, per optimizer, on one stage's real
step (model=tiny by default): where SubspaceNGD's time goes against fused AdamW, and what state
each keeps. Both optimizers run in the same process on the same pre-collated batches.

For each optimizer a Lightning Trainer runs the stage's real training step. A callback reads the
clock at the step's start, before and after the backward, before the optimizer step and at the
step's end: "optimizer" is gradient clipping, the step itself and the scheduler (Lightning runs
zero_grad and the forward inside the optimizer's closure, before them). Medians over the timed steps are printed as a table
with ratios against the first optimizer, by the wall clock and by this process's CPU time.

    python scripts/bench_train_step.py                                   # stage=finetune, adamw vs sngd
    python scripts/bench_train_step.py --steps 20 data=corpus_mixed      # the recipe's real pages
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import build  # noqa: E402


def measure(stage: str, optim: str, batch_size: int, steps: int, warmup: int, distinct: int,
            overrides: list[str]) -> dict:
    import lightning as L
    from torch.utils.data import DataLoader

    cfg, datamodule, task = build(stage, batch_size, [f"optim={optim}", *overrides])
    loader = iter(datamodule.train_dataloader())
    batches = [next(loader) for _ in range(distinct)]
    feed = [batches[i % distinct] for i in range(warmup + steps)]

    class PhaseTimer(L.Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []
            self.marks: dict = {}

        def _mark(self, name):
            self.marks[name] = (time.perf_counter(), time.process_time())

        def on_train_batch_start(self, *args):
            self.marks = {}
            self._mark("start")

        def on_before_backward(self, *args):
            self._mark("forward")

        def on_after_backward(self, *args):
            self._mark("backward")

        def on_before_optimizer_step(self, *args):
            self._mark("before_step")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self._mark("end")
            if batch_idx >= warmup:
                row = {}
                for clock, suffix in ((0, ""), (1, "_cpu")):
                    m = {k: v[clock] for k, v in self.marks.items()}
                    row.update({f"forward{suffix}": m["forward"] - m["start"],
                                f"backward{suffix}": m["backward"] - m["forward"],
                                f"optimizer{suffix}": m["end"] - m["before_step"],
                                f"total{suffix}": m["end"] - m["start"]})
                self.rows.append(row)

    timer = PhaseTimer()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=warmup + steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer],
                        gradient_clip_val=cfg.trainer.get("gradient_clip_val"))
    trainer.fit(task, train_dataloaders=DataLoader(feed, batch_size=None, collate_fn=lambda b: b))
    optimizer = trainer.optimizers[0]
    state = sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
                if torch.is_tensor(v))
    params = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    row = {k: statistics.median(r[k] for r in timer.rows) * 1e3 for k in timer.rows[0]}
    return dict(optim=optim, **row, state_mb=state / 2 ** 20, state_b_per_param=state / params, params=params)


def table(rows: list[dict]) -> str:
    """Wall-clock ms / this process's CPU ms per phase (CPU time is the stable number on a shared machine)."""
    base = rows[0]
    lines = ["| optim | forward ms | backward ms | optimizer ms | step ms | step / "
             f"{base['optim']} | optimizer / {base['optim']} | state MB | state B/param |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [f"{r[k]:.0f} / {r[k + '_cpu']:.0f}" for k in ("forward", "backward", "optimizer", "total")]
        ratios = [f"{r[k] / base[k]:.2f}x / {r[k + '_cpu'] / base[k + '_cpu']:.2f}x" for k in ("total", "optimizer")]
        lines.append(f"| {r['optim']} | {' | '.join(cells)} | {' | '.join(ratios)} | {r['state_mb']:.1f} | "
                     f"{r['state_b_per_param']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", default="finetune")
    parser.add_argument("--optims", nargs="+", default=["adamw", "sngd"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=15, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=3, help="distinct pre-collated batches cycled")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. data=corpus_mixed")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(args.stage, o, args.batch_size, args.steps, args.warmup, args.distinct, args.overrides)
            for o in args.optims]
    print(f"stage={args.stage} model=tiny batch={args.batch_size} threads={torch.get_num_threads()} "
          f"steps={args.steps} (median) {' '.join(args.overrides)}")
    print(table(rows))


if __name__ == "__main__":
    main()
