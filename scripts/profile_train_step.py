"""Where one training step's time goes, outside Lightning: forward, backward and fused AdamW on one
collated batch (bf16 autocast on CUDA), after three warm-up steps, with torch.profiler tables of the
device time and the host time per operator, and the Python lines that synchronise with the device.

Lightning's SimpleProfiler averages over a run, first steps included; on a GPU those carry CUDA
initialisation and kernel planning and can read as ten times a real step. This is the real step.

    python scripts/profile_train_step.py pretrain 64                           # stage, batch size
    python scripts/profile_train_step.py finetune 16 model.image_size=384      # + Hydra overrides
    python scripts/profile_train_step.py pretrain 8 --corpus data/corpus       # on the CPU

docs/gpu/ keeps the tables from an H200 (docs/pretrain.md, "The first GPU run").
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import build  # noqa: E402

from dociq.training.heldout import to_device  # noqa: E402

SYNCS = ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaDeviceSynchronize", "aten::item", "aten::nonzero")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["pretrain", "finetune", "ijepa", "mlm", "distill"])
    p.add_argument("batch_size", type=int)
    p.add_argument("--corpus", default="data/corpus_384", help="corpus folder read by data=corpus_mixed")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = p.parse_intermixed_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, datamodule, task = build(args.stage, args.batch_size,
                                ["data=corpus_mixed", f"paths.corpus_dir={args.corpus}", *args.overrides])
    datamodule.setup("fit")
    batch = to_device(next(iter(datamodule.train_dataloader())), torch.device(device))
    task.log = task.log_dict = lambda *a, **k: None   # no Trainer to log to
    task.to(device).train()
    optimizer = torch.optim.AdamW(task.parameters(), lr=1e-4, fused=device == "cuda")

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = task.training_step(batch, 0)
        (out["loss"] if isinstance(out, dict) else out).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    print(f"== {args.stage} batch {args.batch_size} on {device}: "
          f"{(time.perf_counter() - start) / args.steps:.3f} s/step", flush=True)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, with_stack=True) as prof:
        step()
        sync()
    table = prof.key_averages()
    print("operators per step", sum(e.count for e in table))
    key = "device_time_total" if device == "cuda" else "self_cpu_time_total"
    print(table.table(sort_by=key, row_limit=18, max_name_column_width=60))
    print(table.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
    waits = [e for e in prof.key_averages(group_by_stack_n=6) if any(s in e.key for s in SYNCS)]
    for e in sorted(waits, key=lambda e: -e.cpu_time_total)[:12]:
        print(f"{e.key} x{e.count} {e.cpu_time_total / 1e3:.1f} ms")
        for frame in e.stack[:6]:
            print("    ", frame)


if __name__ == "__main__":
    main()
