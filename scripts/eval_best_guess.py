"""Question mIoU of the Predictor with several `best_guess_margin`s on the same held-out prompts.

    python scripts/eval_best_guess.py CKPT --corpus data/corpus --split val --margins none 0 1 3 6 [--max-pages 80]
    python scripts/eval_best_guess.py CKPT --corpus data/corpus_unseen --split all \
        --packages texlive-publishers-doc debian-handbook --margins none 3 --json out.json

Prompts are drawn as `dociq eval` draws them (dociq.evaluation.answers: seed + page id,
`choose_questions`), each page is set once and its questions asked with each margin in turn, so the
"none" column reproduces `dociq eval`'s question numbers with the best guess off. One row per
package (or one for the whole split), with layout and reading mIoU ×100 and page-number mIoU.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import torch

from dociq.data.collate import choose_questions
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.evaluation.answers import page_seed
from dociq.data.scoring import VAL_SEED, layout_class
from dociq.inference.predictor import load_predictor


def score(predictor, pages, margins, max_pages: int | None = None, max_questions: int = 8) -> dict:
    """{margin: {"layout"|"reading"|"<layout class>": [mean IoU ×100, count]}} on the first
    `max_pages` of `pages` (None: all)."""
    ious = {m: defaultdict(list) for m in margins}
    for i in range(len(pages) if max_pages is None else min(max_pages, len(pages))):
        page = pages[i]
        if page is None:
            continue
        g = torch.Generator().manual_seed(page_seed(page, VAL_SEED))
        questions = [page.questions[k] for k in choose_questions(page, max_questions, g)]
        if not questions:
            continue
        predictor.set_image(page.image, words=list(page.words), word_boxes=np.asarray(page.word_boxes))
        for m in margins:
            predictor.best_guess_margin = m
            masks, _ = predictor.predict(question=[q.text for q in questions])
            for q, mask in zip(questions, masks):
                iou = float((mask & q.mask).sum() / max((mask | q.mask).sum(), 1))
                ious[m][q.kind].append(iou)
                if q.kind == "layout":
                    ious[m][layout_class(page, q)].append(iou)
    return {str(m): {k: [round(100 * float(np.mean(v)), 1), len(v)] for k, v in d.items()} for m, d in ious.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--corpus", default="data/corpus")
    p.add_argument("--split", default="val", help="val, train or all")
    p.add_argument("--packages", nargs="+", default=None, help="one row per package (default: the whole split)")
    p.add_argument("--margins", nargs="+", default=["none", "3"], help="'none' or a number, each")
    p.add_argument("--max-pages", type=int, default=None, help="the first N pages of each row only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    margins = [None if m.lower() == "none" else float(m) for m in args.margins]
    predictor = load_predictor(args.checkpoint)
    split = None if args.split == "all" else args.split
    results = {}
    for package in args.packages or [None]:
        pages = CorpusDocuments(root=args.corpus, split=split, packages=None if package is None else [package])
        results[package or args.split] = score(predictor, pages, margins, args.max_pages)
    print("| rows | margin | layout | reading | page number |\n|---|---|---|---|---|")
    for row, by_margin in results.items():
        for m, r in by_margin.items():
            cell = (lambda k: f"{r[k][0]} (n={r[k][1]})" if k in r else "-")
            print(f"| {row} | {m} | {cell('layout')} | {cell('reading')} | {cell('page_number')} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
