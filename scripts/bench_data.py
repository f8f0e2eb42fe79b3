"""Benchmark the data pipeline: synthetic pages generated per second (clean and degraded), and
pages per second written to / loaded back from disk with the COCO writer and reader.

    python scripts/bench_data.py [--pages 200] [--image-size 512] [--all-cores]

By default the process is pinned to one CPU core (the target is >= 20 pages/s generated at
512x512 on one core). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from dociq.data.datasets.coco import CocoDocuments, write_coco
from dociq.data.synthetic.generator import SyntheticDocuments, generate_page


def timed(fn, n: int) -> tuple[float, float]:
    """(pages per wall-clock second, pages per CPU second of this process). On a shared machine
    the CPU rate is what the code achieves on one core; the wall rate includes waiting for it."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return n / (time.perf_counter() - wall), n / max(time.process_time() - cpu, 1e-9)


def main(argv: list[str] | None = None) -> list[tuple[str, tuple[float, float]]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--image-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--all-cores", action="store_true", help="do not pin the process to one core")
    args = p.parse_args(argv)
    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    n, size = args.pages, args.image_size
    for i in range(5):  # warm the font and glyph caches, as a long-running loader would be
        generate_page(10_000_000 + i, args.seed, size)

    clean = SyntheticDocuments(n, size, args.seed)
    degraded = SyntheticDocuments(n, size, args.seed, degrade=1.0)
    rows = [("generate (clean)", timed(lambda: [clean[i] for i in range(n)], n)),
            ("generate (degrade=1.0)", timed(lambda: [degraded[i] for i in range(n)], n)),
            # Second epoch: every word's glyph is already in the per-process cache.
            ("generate (clean, 2nd epoch)", timed(lambda: [clean[i] for i in range(n)], n))]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("generate + write COCO", timed(lambda: write_coco((clean[i] for i in range(n)), tmp), n)))
        coco = CocoDocuments(os.path.join(tmp, "annotations.json"))
        rows.append(("load from COCO", timed(lambda: [coco[i] for i in range(n)], n)))

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{n} pages at {size}x{size}, {cores} core(s)\n")
    print(f"load average {os.getloadavg()[0]:.1f}\n")
    print("| stage | pages/s (wall) | pages/s (per CPU second) |")
    print("|---|---:|---:|")
    for name, (wall, cpu) in rows:
        print(f"| {name} | {wall:.1f} | {cpu:.1f} |")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
