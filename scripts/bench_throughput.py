"""Training throughput and model FLOPs utilisation (MFU) of `stage=ijepa`, `stage=mlm` and
`stage=finetune` (steps/s and prompts/s: question/box/click prompts answered per second).

For each stage the config is composed exactly as `python train.py stage=<name> model=tiny` would;
a Lightning Trainer then runs the real training step (forward, backward, optimizer, EMA, logging)
on pre-collated batches, so page rendering and collation are not in the timing. A callback times
each step from `on_train_batch_start` to `on_train_batch_end` and counts one step's FLOPs with
`torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions, attention; elementwise ops and
the optimizer count zero, as usual for MFU).

    MFU = (FLOPs per step / median step time) / peak
    peak = best fp32 matmul FLOP/s of this machine, measured in the same run with the same threads

Both are timed twice: by the wall clock and by this process's CPU time (`time.process_time`).
On a machine shared with other jobs the wall clock also counts the time the process waited for
a core, and the peak measured by wall clock moves with the load; the CPU-time MFU compares work
done per CPU-second on both sides and is the stable number. Use --threads 1 there: CPU time then
is the time on one core.

    python scripts/bench_throughput.py                      # both stages, writes docs/throughput.md
    python scripts/bench_throughput.py --stages finetune --batch-sizes 4 --no-write   # the fine-tune step
    python scripts/bench_throughput.py --stages mlm --batch-sizes 8 32 --steps 20 --no-write
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def matmul_peak(size: int = 1024, repeats: int = 20) -> tuple[float, float]:
    """Best FLOP/s of an fp32 [size x size] @ [size x size] matmul (2 n^3 FLOPs): (wall, CPU time)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        a @ b
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return 2 * size ** 3 / best_wall, 2 * size ** 3 / max(best_cpu, 1e-9)


def build(stage: str, batch_size: int, overrides: list[str]):
    from hydra.utils import instantiate

    from dociq.training.config import compose

    cfg = compose([f"stage={stage}", "model=tiny", f"data.batch_size={batch_size}",
                   "data.num_workers=0", *overrides], return_hydra_config=False)
    torch.manual_seed(cfg.seed)
    datamodule = instantiate(cfg.data, _convert_="all")
    task_cls = __import__("dociq.training.tasks.registry", fromlist=["resolve_stage"]).resolve_stage(cfg.stage.name)
    task = task_cls(**instantiate(cfg.task, _convert_="all"),
                    optimizer=instantiate(cfg.optim.optimizer),
                    scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None)
    return cfg, datamodule, task


def measure(stage: str, batch_size: int, steps: int, warmup: int, distinct: int, overrides: list[str]):
    import lightning as L
    from torch.utils.data import DataLoader
    from torch.utils.flop_counter import FlopCounterMode

    cfg, datamodule, task = build(stage, batch_size, overrides)
    loader = iter(datamodule.train_dataloader())
    batches = [next(loader) for _ in range(distinct)]
    total = warmup + steps
    feed = [batches[i % distinct] for i in range(total)]

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu_times: list[float] = []
            self.flops = 0
            self._counter = None

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == warmup - 1:  # count one (warm) step
                self._counter = FlopCounterMode(display=False)
                self._counter.__enter__()
            self._start, self._cpu = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            elapsed, cpu = time.perf_counter() - self._start, time.process_time() - self._cpu
            if self._counter is not None:
                self._counter.__exit__(None, None, None)
                self.flops = self._counter.get_total_flops()
                self._counter = None
            elif batch_idx >= warmup:
                self.times.append(elapsed)
                self.cpu_times.append(cpu)

    timer = Timer()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=total, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                        callbacks=[timer], gradient_clip_val=cfg.trainer.get("gradient_clip_val"))
    loader = DataLoader(feed, batch_size=None, collate_fn=lambda batch: batch)  # batches as they are
    trainer.fit(task, train_dataloaders=loader)
    step = statistics.median(timer.times)
    tokens = None
    if "ocr_mask" in batches[0]:
        tokens = float(sum(b["ocr_mask"].sum() for b in batches)) / distinct
    cpu_step = statistics.median(timer.cpu_times)
    prompts = None
    if "prompt_valid" in batches[0]:
        prompts = float(sum(b["prompt_valid"].sum() for b in batches)) / distinct
    return dict(stage=stage, batch=batch_size, step_s=step, cpu_step_s=cpu_step, prompts=prompts,
                samples_s=batch_size / step, gflop_step=timer.flops / 1e9,
                gflops=timer.flops / step / 1e9, cpu_gflops=timer.flops / cpu_step / 1e9, tokens=tokens)


def prompts_per_s(row: dict) -> str:
    """Prompts answered per second (finetune: the batch's valid question slots), '-' otherwise."""
    return f"{row['prompts'] / row['step_s']:.1f}" if row.get("prompts") else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=["ijepa", "mlm"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--steps", type=int, default=15, help="timed steps per row (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=3, help="distinct pre-collated batches cycled")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "throughput.md"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. optim=sngd")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    # The peak is measured before every row and at the end; on a shared machine it moves, so MFU
    # is taken against the best of them (the conservative choice).
    peaks = [matmul_peak()]
    rows = []
    for stage in args.stages:
        for batch_size in args.batch_sizes:
            peaks.append(matmul_peak())
            row = measure(stage, batch_size, args.steps, args.warmup, args.distinct, args.overrides)
            rows.append(row)
            print(f"  {stage} batch {batch_size}: {row['samples_s']:.1f} samples/s, "
                  f"{row['gflops']:.1f} GFLOP/s (wall), {row['cpu_gflops']:.1f} (CPU time)", flush=True)
    peaks.append(matmul_peak())
    peak = max(p[0] for p in peaks)
    cpu_peak = max(p[1] for p in peaks)
    for row in rows:
        row["mfu"] = row["gflops"] * 1e9 / peak
        row["cpu_mfu"] = row["cpu_gflops"] * 1e9 / cpu_peak

    header = ("| stage | model | batch | step wall / CPU (ms) | steps/s | samples/s (wall) | prompts/s | "
              "GFLOP/step | GFLOP/s wall / CPU | MFU wall | MFU CPU time |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [header] + [
        f"| {r['stage']} | tiny | {r['batch']} | {1000 * r['step_s']:.0f} / {1000 * r['cpu_step_s']:.0f} | "
        f"{1 / r['step_s']:.2f} | {r['samples_s']:.1f} | "
        f"{prompts_per_s(r)} | "
        f"{r['gflop_step']:.2f} | {r['gflops']:.1f} / {r['cpu_gflops']:.1f} | "
        f"{100 * r['mfu']:.1f}% | {100 * r['cpu_mfu']:.1f}% |" for r in rows]
    load = os.getloadavg()
    walls = [p[0] for p in peaks]
    context = (f"peak fp32 matmul (1024², best of 20; max of {len(peaks)} measurements during the "
               f"run): {peak / 1e9:.1f} GFLOP/s wall (range {min(walls) / 1e9:.1f}-{peak / 1e9:.1f}), "
               f"{cpu_peak / 1e9:.1f} GFLOP/s per CPU-second; "
               f"torch {torch.__version__}, {threads} thread(s), "
               f"{os.cpu_count()} CPU(s), load average {load[0]:.1f}")
    table = "\n".join(lines)
    print()
    print(table)
    print(context)
    if not args.no_write:
        command = "python scripts/bench_throughput.py " + " ".join(sys.argv[1:])
        write_section(Path(args.out), render_section(table, context, command.strip(), rows))
        print(f"written to {args.out}")


START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def write_section(path: Path, section: str) -> None:
    """Replace the generated part of `path` (between the markers), keeping the analysis around it."""
    block = f"{START}\n{section}\n{END}"
    if path.exists() and START in (text := path.read_text()) and END in text:
        head, rest = text.split(START, 1)
        path.write_text(head + block + rest.split(END, 1)[1])
    else:
        path.write_text(f"# Training throughput at `model=tiny` (CPU)\n\n{block}\n")


def render_section(table: str, context: str, command: str, rows: list[dict]) -> str:
    tokens = "".join(f" mlm batch {r['batch']}: {r['tokens']:.0f} OCR tokens per batch."
                     for r in rows if r["stage"] == "mlm" and r["tokens"])
    return f"""Generated by `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).

{table}

{context}.{tokens}

Measured as follows: the config is composed as `python train.py stage=<name> model=tiny` would
(default optimizer, AdamW); a Lightning Trainer runs the real training step on pre-collated batches
(page rendering and collation excluded). Step time = median from `on_train_batch_start` to
`on_train_batch_end`; FLOPs of one step (forward + backward) from
`torch.utils.flop_counter.FlopCounterMode`; MFU = achieved FLOP/s / the fp32 matmul peak measured
in the same run, by wall clock and by process CPU time (the latter is immune to waiting for a
core on a shared machine). Samples are pages."""


if __name__ == "__main__":
    main()
