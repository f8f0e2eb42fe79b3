"""Figure: layout questions that name a class, answered by the decoder's mask (left) and by the
Predictor's default (right): the text units the unit classifier names for a text class
(dociq.inference.class_answers), the page's pictures for figures (dociq.inference.figure_answers).

    python scripts/plot_class_answers.py CKPT --corpus data/corpus_unseen --split all --rows 8 \
        --out docs/img/class_answers_unseen.png
    python scripts/plot_class_answers.py CKPT --classes figure --rows 6 --out docs/img/figure_answers.png
    python scripts/plot_class_answers.py CKPT --corpus data/forms_html --classes signature form_key --scan \
        --ocr-cache outputs/ocr_cache/forms_html --out docs/img/signatures_scanned.png

One row per question, drawn from pages spread over the corpus split (a fixed seed), one question
per page, classes taken in turn so that each row shows another class. Green: the target; red: the answer.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from dociq.data.masks import mask_iou


def pick_questions(pages, rows: int, seed: int, classes=None) -> list[tuple]:
    """(page, question) pairs: pages in a seeded order, one class-naming question each, classes in
    turn (only `classes` when given; by default the text classes the units answer)."""
    from dociq.inference.class_answers import QUESTION_CLASSES, named_class, phrased_classes

    phrasings = QUESTION_CLASSES if classes is None else \
        {text: name for text, name in phrased_classes(skip=()).items() if name[0] in classes}

    order = list(range(len(pages)))
    random.Random(seed).shuffle(order)
    by_class: dict[str, list[tuple]] = {}
    for i in order:
        page = pages[i]
        for q in page.questions:
            name = named_class(q.text, phrasings) if q.kind == "layout" else None
            if name and q.mask.any():
                by_class.setdefault(name[0], []).append((page, q))
                break
    picked = []
    while len(picked) < rows and any(by_class.values()):
        for label in sorted(by_class):
            if by_class[label] and len(picked) < rows:
                picked.append(by_class[label].pop(0))
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--corpus", default="data/corpus_unseen")
    parser.add_argument("--split", default="all")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", nargs="+", default=None,
                        help="only questions naming these classes (e.g. figure; default: the text classes)")
    parser.add_argument("--scan", action="store_true",
                        help="the pages scanned and read by tesseract, as `dociq eval --scan` asks them")
    parser.add_argument("--ocr-cache", default=None, help="with --scan: the OCR cache folder `dociq eval` keeps")
    parser.add_argument("--out", type=Path, default=Path("class_answers.png"))
    args = parser.parse_args()
    if args.ocr_cache and not args.scan:
        parser.error("--ocr-cache keeps the OCR of scanned pages: add --scan, or drop --ocr-cache")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.inference.overlay import overlay
    from dociq.inference.predictor import load_predictor

    predictor = load_predictor(args.checkpoint)
    pages = CorpusDocuments(args.corpus, split=None if args.split == "all" else args.split)
    if args.scan:
        from dociq.data.scanned import ScannedPages

        pages = ScannedPages(pages, args.seed, cache_dir=args.ocr_cache)
    picked = pick_questions(pages, args.rows, args.seed, args.classes)
    fig, axes = plt.subplots(len(picked), 2, figsize=(9, 5.6 * len(picked)), squeeze=False)
    for (left, right), (page, q) in zip(axes, picked):
        predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
        answers = {}
        for on in (False, True):
            predictor.class_answers = on
            answers[on] = predictor.predict(question=q.text)[0][0]
        for ax, on, who in ((left, False, "decoder"), (right, True, "the Predictor's default")):
            ax.imshow(overlay(page.image, answers[on][None], alpha=0.5))
            ax.contour(q.mask.astype(float), levels=[0.5], colors="limegreen", linewidths=1.2)
            ax.set_title(f"{page.meta.get('package', '')}: \"{q.text}\"\n{who}: IoU {mask_iou(answers[on], q.mask):.2f}",
                         fontsize=8)
            ax.axis("off")
    fig.suptitle("red: the answer, green: the target", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(f"{len(picked)} questions -> {args.out}")


if __name__ == "__main__":
    main()
