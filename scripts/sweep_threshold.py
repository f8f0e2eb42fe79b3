"""The Predictor's mask threshold swept through its own path: each held-out prompt set is decoded
once (`predict(return_logits=True)`), then every threshold gets the Predictor's other defaults
(the best guess for an empty mask, `snap="blocks"`) and is scored as `dociq eval` scores it (the
same pages, prompts and seeds).

    python scripts/sweep_threshold.py CKPT                                   # 64 held-out synthetic pages
    python scripts/sweep_threshold.py CKPT --corpus data/corpus              # the corpus's held-out split

Prints mIoU x100 per prompt set (questions per kind, box -> region, click -> region) and threshold.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.schema import QUESTION_KINDS
from dociq.data.scoring import REGION_SIZES, VAL_SEED, SegmentationMetrics, regions_as_prompts
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.evaluation.answers import one_click_each, page_seed, tight_boxes
from dociq.inference.predictor import Predictor
from dociq.inference.snapping import best_guess, snap_masks

THRESHOLDS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0)


def prompt_sets(page, max_questions: int = 8):
    """(name, predict kwargs, targets, kinds) of one page, drawn as dociq.evaluation.answers draws them."""
    g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
    questions = [page.questions[k] for k in choose_questions(page, max_questions, g)]
    regions = regions_as_prompts(page, max_questions, VAL_SEED).questions
    if questions:
        yield "question", dict(question=[q.text for q in questions]), [q.mask for q in questions], [q.kind for q in questions]
    if regions:
        targets, kinds = [r.mask for r in regions], [r.kind for r in regions]
        clicks = one_click_each(targets, g)
        yield "box_region", dict(boxes=tight_boxes(targets)), targets, kinds
        yield "point_region", dict(points=clicks, point_labels=np.ones(clicks.shape[:2], np.int64)), targets, kinds


def sweep(predictor: Predictor, pages, thresholds=THRESHOLDS) -> dict[tuple[str, float], dict]:
    """{(prompt set, threshold): SegmentationMetrics results} over `pages`."""
    metrics: dict[tuple[str, float], SegmentationMetrics] = {}
    for i in range(len(pages)):
        page = pages[i]
        if page is None:
            continue
        predictor.set_image(page.image, words=list(page.words), word_boxes=np.asarray(page.word_boxes))
        for name, prompt, targets, kinds in prompt_sets(page):
            logits = torch.from_numpy(np.asarray(predictor.predict(return_logits=True, **prompt)[0]))
            # the prompts as the Predictor parsed them (snapping needs their clicks and boxes)
            parsed = predictor._check_prompts(prompt.get("question"), prompt.get("points"), prompt.get("point_labels"),
                                              prompt.get("boxes"), None, predictor.page.original_size)
            target = torch.from_numpy(np.stack(targets).astype(bool))
            for threshold in thresholds:
                masks = best_guess(logits, (logits > threshold).numpy(), predictor.best_guess_margin)
                masks = snap_masks(masks, parsed, predictor.page, predictor.page.word_boxes, "blocks")
                key = (name, threshold)
                if key not in metrics:
                    metrics[key] = SegmentationMetrics(kinds=QUESTION_KINDS if name == "question"
                                                       else tuple(n for n, _ in REGION_SIZES))
                metrics[key].update(torch.from_numpy(masks), target, kinds)
    return {key: m.results() for key, m in metrics.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--corpus", default=None, help="a corpus root: its held-out split (default: synthetic pages)")
    p.add_argument("--pages", type=int, default=64, help="synthetic pages")
    args = p.parse_args()
    predictor = Predictor.from_checkpoint(args.checkpoint)
    if args.corpus:
        from dociq.data.datasets.corpus.dataset import CorpusDocuments

        pages = CorpusDocuments(root=args.corpus, split="val")
    else:
        pages = SyntheticDocuments(num_pages=args.pages, image_size=predictor.image_size, seed=VAL_SEED, degrade=0.3)
    results = sweep(predictor, pages)
    print("| mIoU x100 | " + " | ".join(f"{t:g}" for t in THRESHOLDS) + " |")
    print("|---" * (len(THRESHOLDS) + 1) + "|")
    columns = [("question", f"miou_{k}") for k in QUESTION_KINDS] + [("box_region", "miou"), ("point_region", "miou")]
    for name, metric in columns:
        row = [results.get((name, t), {}).get(metric) for t in THRESHOLDS]
        if any(v is not None and results[(name, THRESHOLDS[0])].get(f"count_{metric[5:]}", 1) for v in row):
            print(f"| {name} {metric} | " + " | ".join("-" if v is None else f"{100 * v:.1f}" for v in row) + " |")


if __name__ == "__main__":
    main()
