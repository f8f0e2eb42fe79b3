"""What the fine-tuning loss grid keeps of each region class: the share of regions that no cell of
the grid holds at 0.5 or more under `task.loss_targets=area` (the decoder is then taught to leave
them out), and their median size in input pixels.

    python scripts/target_cells.py --corpus data/corpus --split train --pages 300 --image-size 384

The regions go through the collator's geometry (longest side to `--image-size`, zero padding) and
`loss_grid_targets` at `--image-size / 4`, the recipe's `task.loss_size`.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from dociq.data.collate import _masks_to_input_frame
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.training.tasks.segment_losses import loss_grid_targets


def region_cells(pages, image_size: int) -> dict[str, list[tuple[float, int]]]:
    """{class: [(largest cell share on the loss grid, pixels in the input frame), ...]}."""
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for page in pages:
        if not page.regions:
            continue
        frame = _masks_to_input_frame(np.stack([r.mask for r in page.regions]), image_size)
        cells = loss_grid_targets(frame, image_size // 4, "area")
        for region, peak, pixels in zip(page.regions, cells.amax((-2, -1)).tolist(), frame.sum((-2, -1)).tolist()):
            out[region.label].append((peak, int(pixels)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--split", default="train")
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=384)
    args = parser.parse_args()
    pages = CorpusDocuments(args.corpus, split=args.split, max_pages=args.pages)
    stats = region_cells((pages[i] for i in range(len(pages))), args.image_size)
    print(f"| class | regions | no loss cell >= 0.5 | median input px |\n|---|---|---|---|")
    for label, rows in sorted(stats.items(), key=lambda kv: -np.mean([r[0] < 0.5 for r in kv[1]])):
        a = np.array(rows)
        print(f"| {label} | {len(a)} | {(a[:, 0] < 0.5).mean():.0%} | {np.median(a[:, 1]):.0f} |")


if __name__ == "__main__":
    main()
