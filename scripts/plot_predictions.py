"""Figure of predicted masks for a few questions on held-out synthetic pages.

    python scripts/plot_predictions.py CKPT [--pages 2] [--questions 3]   # -> <run>/predictions.png
    python scripts/plot_predictions.py CKPT --out docs/img/predictions.png  # the docs figure: explicit
    python scripts/plot_predictions.py CKPT --clicks                        # one click per region instead
    python scripts/plot_predictions.py CKPT --boxes                         # one box per region (its tight box)
    python scripts/plot_predictions.py CKPT --corpus data/corpus --pages 4  # held-out real pages (val split)
    python scripts/plot_predictions.py CKPT --corpus data/corpus_unseen --split all --packages P  # unseen packages
    python scripts/plot_predictions.py CKPT --corpus data/corpus --scan outputs/ocr_cache/corpus_val  # scanned
    python scripts/plot_predictions.py CKPT --corpus data/corpus --segment-page --seeds ocr_blocks class_boxes

Without --out the figure goes next to the checkpoint's run (<run>/predictions.png for
<run>/checkpoints/*.ckpt), else to ./predictions.png; never into docs/ by default.

Each row is one question: the page with the target region (green outline) and the predicted mask
(red tint), titled with the question, its kind, the IoU and the predicted IoU. Pages come from
the validation seed of configs/data/synthetic.yaml, so they were never trained on.
With --clicks each row is one annotated region instead, prompted by a single positive click at a
random pixel of it (the yellow cross), target that region (SAM's click prompt); with --boxes,
by the region's tight box (yellow), SAM's box prompt.
With --segment-page each row is one page: its labels (left) and `dociq segment-page`'s regions
(right), each region tinted in its class's colour and labelled with its class.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path


VAL_SEED = 1000003   # configs/data/synthetic.yaml: val_set.seed


def held_out_pages(pages: int, seed: int, image_size: int, corpus: str | dict | None):
    """`pages` held-out pages: synthetic ones of `seed`, or a corpus's pages spread over it (`corpus`:
    its folder, whose val split is read, or CorpusDocuments' arguments: root, split, packages, and
    `scan`: an OCR cache folder to scan the pages and read them with tesseract, as `dociq eval --scan
    --ocr-cache` does with the same seed)."""
    if corpus is None:
        from dociq.data.synthetic.generator import SyntheticDocuments

        docs = SyntheticDocuments(num_pages=pages, image_size=image_size, seed=seed, degrade=0.3)
        return [docs[i] for i in range(pages)]
    from dociq.data.datasets.corpus.dataset import CorpusDocuments

    corpus = dict(corpus) if isinstance(corpus, dict) else {"root": corpus, "split": "val"}
    scan = corpus.pop("scan", None)
    docs = CorpusDocuments(**corpus)
    if scan is not None:
        from dociq.data.scanned import ScannedPages

        docs = ScannedPages(docs, seed, cache_dir=scan)
    picks = random.Random(seed).sample(range(len(docs)), k=min(pages, len(docs)))
    return [docs[i] for i in picks]


def collect(predictor, pages: int, questions: int, seed: int, image_size: int,
            corpus: str | dict | None = None) -> list[dict]:
    rows = []
    for page in held_out_pages(pages, seed, image_size, corpus):
        chosen, seen = [], set()
        for q in page.questions:      # one question per kind first, then the rest
            if q.kind not in seen and q.mask.any():
                chosen.append(q)
                seen.add(q.kind)
        chosen += [q for q in page.questions if q not in chosen and q.mask.any()]
        chosen = chosen[:questions]
        masks, scores = predictor.predict(page.image, question=[q.text for q in chosen],
                                          words=page.words, word_boxes=page.word_boxes)
        for q, m, s in zip(chosen, masks, scores):
            inter, union = (m & q.mask).sum(), (m | q.mask).sum()
            rows.append({"image": page.image, "question": q, "pred": m, "score": float(s),
                         "iou": float(inter / union) if union else 1.0})
    return rows


def collect_clicks(predictor, pages: int, per_page: int, seed: int, image_size: int,
                   corpus: str | dict | None = None) -> list[dict]:
    """One row per region: a single click at a random pixel of it, target that region."""
    return collect_regions(predictor, pages, per_page, seed, image_size, corpus, prompt="click")


def collect_boxes(predictor, pages: int, per_page: int, seed: int, image_size: int,
                  corpus: str | dict | None = None) -> list[dict]:
    """One row per region: its tight box as the prompt (SAM's box prompt), target that region."""
    return collect_regions(predictor, pages, per_page, seed, image_size, corpus, prompt="box")


def collect_regions(predictor, pages: int, per_page: int, seed: int, image_size: int,
                    corpus: str | dict | None = None, prompt: str = "click") -> list[dict]:
    """One row per region, prompted by a click at a random pixel of it or by its tight box."""
    import numpy as np

    from dociq.data.schema import Question

    rng = np.random.default_rng(seed)
    rows = []
    for page in held_out_pages(pages, seed, image_size, corpus):
        regions = [r for r in page.regions if r.mask.any()]
        picked = rng.choice(len(regions), size=min(per_page, len(regions)), replace=False)
        predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
        for j in picked:
            region = regions[j]
            ys, xs = np.nonzero(region.mask)
            if prompt == "box":
                drawn = {"box": [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]}
                masks, scores = predictor.predict(boxes=[drawn["box"]])
            else:
                k = rng.integers(len(ys))
                drawn = {"click": [float(xs[k]), float(ys[k])]}
                masks, scores = predictor.predict(points=[drawn["click"]], point_labels=[1])
            m = masks[0]
            inter, union = (m & region.mask).sum(), (m | region.mask).sum()
            rows.append({"image": page.image, "question": Question(f"{prompt} on a {region.label}", prompt, region.mask),
                         "pred": m, "score": float(scores[0]), "iou": float(inter / union) if union else 1.0,
                         **drawn})
    return rows


def plot_segmented(predictor, pages: int, seed: int, corpus: str | dict | None, out: Path, seeds: list[str],
                   snap: bool) -> list[int]:
    """Labels beside segment-page's regions, one page per row; returns the region count per page."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from dociq.inference.automatic import PageSegmenter, SegmentedRegion
    from dociq.inference.overlay import draw_overlay

    segmenter = PageSegmenter(predictor, seeds=seeds, snap=snap)
    rows = held_out_pages(pages, seed, predictor.image_size, corpus)
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 7.2 * len(rows)), squeeze=False)
    counts = []
    for (left, right), page in zip(axes, rows):
        labels = [SegmentedRegion(mask=r.mask, box=np.asarray(r.box, np.float32), score=1.0, stability=1.0,
                                  category=r.label) for r in page.regions if r.mask.any()]
        found = segmenter.segment(page.image, words=page.words, word_boxes=page.word_boxes)
        counts.append(len(found))
        for ax, regions, title in ((left, labels, f"labels: {len(labels)} regions"),
                                   (right, found, f"segment-page: {len(found)} regions")):
            ax.imshow(draw_overlay(page.image, regions))
            ax.set_title(f"{page.meta.get('page_id', '')}  {title}", fontsize=8)
            ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return counts


def plot(rows: list[dict], out: Path, columns: int = 3, source: str = "held-out synthetic pages") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dociq.inference.overlay import overlay

    n = len(rows)
    cols = min(columns, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 4.6 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows):
        q = row["question"]
        ax.imshow(overlay(row["image"], row["pred"][None], alpha=0.5))
        ax.contour(q.mask.astype(float), levels=[0.5], colors="limegreen", linewidths=1.2)
        if "click" in row:
            ax.plot(*row["click"], marker="x", color="yellow", markersize=9, markeredgewidth=2.5)
        if "box" in row:
            x0, y0, x1, y1 = row["box"]
            ax.plot([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0], color="yellow", linewidth=1.0)
        text = q.text if len(q.text) <= 48 else q.text[:45] + "..."
        ax.set_title(f"[{q.kind}] {text}\nIoU {row['iou']:.2f}  (predicted {row['score']:.2f})", fontsize=8)
    fig.suptitle(f"red: predicted mask, green: target ({source})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def default_out(checkpoint: str | Path) -> Path:
    """<run>/predictions.png for <run>/checkpoints/<name>.ckpt, else ./predictions.png."""
    path = Path(checkpoint)
    return path.parent.parent / "predictions.png" if path.parent.name == "checkpoints" else Path("predictions.png")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a stage=finetune checkpoint")
    p.add_argument("--out", type=Path, default=None,
                   help="the PNG to write (default: <run>/predictions.png, or ./predictions.png)")
    p.add_argument("--pages", type=int, default=2)
    p.add_argument("--questions", type=int, default=3, help="questions per page")
    p.add_argument("--seed", type=int, default=VAL_SEED)
    p.add_argument("--clicks", action="store_true", help="one click per region instead of the questions")
    p.add_argument("--boxes", action="store_true", help="one box per region (its tight box) instead of the questions")
    p.add_argument("--snap", default=None, choices=("blocks", "words", "none"),
                   help="the Predictor's snap mode (default: its own, 'blocks'); 'none': the decoder's masks; "
                        "with --segment-page any mode but 'none' snaps the regions to their words")
    p.add_argument("--segment-page", action="store_true",
                   help="one row per page: its labels and segment-page's regions (with --seeds, --snap)")
    p.add_argument("--seeds", nargs="+", default=["ocr_blocks", "class_boxes"],
                   help="segment-page seeds (with --segment-page)")
    p.add_argument("--corpus", default=None,
                   help="draw held-out real pages: a `dociq corpus build` folder (green: weak labels)")
    p.add_argument("--split", default="val",
                   help="the corpus's split (val: documents no training page comes from; all: every page, e.g. of "
                        "packages no training page comes from)")
    p.add_argument("--packages", nargs="+", default=None, help="only the corpus pages of these source packages")
    p.add_argument("--scan", default=None, metavar="OCR_CACHE",
                   help="with --corpus: draw the pages scanned and read by tesseract, as `dociq eval --scan "
                        "--ocr-cache OCR_CACHE` reads them (same seed, same scans)")
    args = p.parse_args(argv)
    if args.scan is not None and args.corpus is None:
        p.error("--scan degrades corpus pages: add --corpus, or drop --scan")
    corpus = None if args.corpus is None else {"root": args.corpus, "packages": args.packages,
                                               "split": None if args.split == "all" else args.split,
                                               **({"scan": args.scan} if args.scan else {})}
    args.out = args.out or default_out(args.checkpoint)
    from dociq.inference.predictor import Predictor

    predictor = Predictor.from_checkpoint(args.checkpoint)
    if args.segment_page:
        counts = plot_segmented(predictor, args.pages, args.seed, corpus, args.out, args.seeds,
                                args.snap not in (None, "none"))
        print(f"wrote {args.out}: regions per page {counts}")
        return
    if args.snap is not None:
        predictor.snap = None if args.snap == "none" else args.snap
    gather = collect_clicks if args.clicks else collect_boxes if args.boxes else collect
    rows = gather(predictor, args.pages, args.questions, args.seed, predictor.image_size, corpus)
    source = ("held-out synthetic pages" if args.corpus is None else "held-out real pages, weak labels"
              if args.scan is None else "held-out real pages scanned, tesseract's words")
    plot(rows, args.out, source=source)
    print(f"wrote {args.out}: " + ", ".join(f"{r['question'].kind} IoU {r['iou']:.2f}" for r in rows))


if __name__ == "__main__":
    main()
