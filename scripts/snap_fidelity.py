"""How much of an exact answer survives snapping: each held-out question's target mask is snapped
as the Predictor snaps a decoder's mask (`snap="words"`, `snap="blocks"`) and scored against
itself. A snapping rule that leaves a perfect answer at 100 can only help a model; every point
under 100 is what the rule costs a model that got the answer right.

    python scripts/snap_fidelity.py                                # 64 synthetic held-out pages
    python scripts/snap_fidelity.py --corpus data/corpus           # the corpus's held-out split

Prints mIoU x100 per question kind and mode (the same pages and questions as `dociq eval`).
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.masks import mask_iou
from dociq.data.scoring import VAL_SEED
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.text_blocks import page_blocks
from dociq.evaluation.answers import page_seed
from dociq.models.word_snap import snap_to_blocks, snap_to_words


def held_out_pages(args):
    if args.corpus:
        from dociq.data.datasets.corpus.dataset import CorpusDocuments

        return CorpusDocuments(root=args.corpus, split="val")
    return SyntheticDocuments(num_pages=args.pages, image_size=args.page_size, seed=VAL_SEED, degrade=0.3)


def fidelity(pages, max_questions: int = 8) -> dict[tuple[str, str], list[float]]:
    """{(kind, mode): [IoU of each snapped target with itself]} over `pages`."""
    scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i in range(len(pages)):
        page = pages[i]
        if page is None:
            continue
        g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
        questions = [page.questions[k] for k in choose_questions(page, max_questions, g)]
        boxes, words = np.asarray(page.word_boxes, np.float64).reshape(-1, 4), list(page.words)
        if not questions or not len(boxes):
            continue
        # the blocks as the Predictor groups them (snapping.snap_masks)
        blocks = page_blocks(np.asarray(page.image), boxes, words, ocr=page.word_confidences is not None)
        for q in questions:
            target = np.asarray(q.mask) > 0.5
            scores[(q.kind, "words")].append(mask_iou(snap_to_words(target, boxes), target))
            scores[(q.kind, "blocks")].append(mask_iou(snap_to_blocks(target, boxes, words, blocks=blocks), target))
    return scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=None, help="a corpus root: score its held-out split (default: synthetic pages)")
    p.add_argument("--pages", type=int, default=64, help="synthetic pages")
    p.add_argument("--page-size", type=int, default=256, help="synthetic page side, px")
    args = p.parse_args()
    scores = fidelity(held_out_pages(args))
    kinds = sorted({k for k, _ in scores})
    print("| snapped exact answer, mIoU x100 | " + " | ".join(f"{k} (n={len(scores[(k, 'words')])})" for k in kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for mode in ("words", "blocks"):
        print(f"| `snap=\"{mode}\"` | " + " | ".join(f"{100 * np.mean(scores[(k, mode)]):.1f}" for k in kinds) + " |")


if __name__ == "__main__":
    main()
