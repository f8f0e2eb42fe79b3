"""How well tesseract's word boxes fit a text layer's, per side bearing: on level scans of corpus
pages, each word tesseract reads is matched to the text-layer word of the same (normalised,
case-folded) text whose box it overlaps most (IoU over 0.3), and the table gives the mean IoU of
the pairs with tesseract's font boxes widened by each share of their height on either side
(`TesseractOCR(side_bearing=...)`), and the mean offset of each edge at no widening; then, widened by
the default side bearing, with the boxes of words holding a letter reaching each (rise, drop) share of
their height higher and lower (as a text layer's box spans the font's ascent and descent; measured on
2026-12-06 and not applied: taller boxes change how the page's lines group into units, see
docs/finetune.md, "A font's ascent on a scan").

    python scripts/bench_word_boxes.py --corpus data/forms_train --split all --pages 60 --ocr-cache DIR
    python scripts/bench_word_boxes.py --corpus data/corpus --split train --pages 12 [--shares 0 0.02 0.04]

Pages are degraded as `dociq eval --scan` degrades them (same seed, same scan) and spread evenly
over the split; turned scans are left out, where an upright box cannot fit a turned word.
"""
from __future__ import annotations

import argparse

import numpy as np

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.lexical import normalise
from dociq.data.ocr import SIDE_BEARING, TesseractOCR
from dociq.data.scanned import degraded


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float [N]: IoU of boxes a [N, 4] and b [N, 4], row by row."""
    w = (np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0])).clip(min=0)
    h = (np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1])).clip(min=0)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return w * h / np.maximum(area(a) + area(b) - w * h, 1e-6)


def matched_boxes(read_words, read_boxes, words, boxes) -> tuple[np.ndarray, np.ndarray]:
    """(read [M, 4], truth [M, 4], texts [M]): each read word with the text-layer box of the same
    text it overlaps most, where that IoU is over 0.3."""
    keys = [normalise(w).casefold() for w in words]
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    pairs = []
    for word, box in zip(read_words, np.asarray(read_boxes, np.float64)):
        same = [k for k, key in enumerate(keys) if key == normalise(word).casefold()]
        if not same:
            continue
        ious = box_iou(np.repeat(box[None], len(same), 0), boxes[same])
        if ious.max() > 0.3:
            pairs.append((box, boxes[same[int(ious.argmax())]], word))
    if not pairs:
        return np.zeros((0, 4)), np.zeros((0, 4)), []
    read, truth, texts = zip(*pairs)
    return np.array(read), np.array(truth), list(texts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--split", default="val", help="a split, or 'all'")
    p.add_argument("--pages", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="which scan each page gets (as dociq eval --seed)")
    p.add_argument("--shares", nargs="+", type=float, default=[0.0, 0.02, SIDE_BEARING, 0.06, 0.08],
                   help="side bearings to compare, as shares of a word's height")
    p.add_argument("--reaches", nargs="+", default=["0,0", "0.02,0.01", "0.04,0.02", "0.06,0.02", "0.06,0.04"],
                   help="(rise,drop) of lettered words' boxes to compare, as shares of their height")
    p.add_argument("--ocr-cache", default=None, help="tesseract's cache (as dociq eval --ocr-cache)")
    args = p.parse_args()
    pages = CorpusDocuments(root=args.corpus, split=None if args.split == "all" else args.split)
    ocr = TesseractOCR(cache=args.ocr_cache, side_bearing=0.0)
    picked = np.unique(np.linspace(0, len(pages) - 1, min(args.pages, len(pages))).round().astype(int))
    read, truth, texts, used = [], [], [], 0
    for index in picked:
        page = pages[int(index)]
        if page is None or not page.words:
            continue
        scan = degraded(page, args.seed, int(index))
        if any(step.startswith("rotate") for step in scan.meta.get("degradations", [])):
            continue
        words = ocr.recognise(scan.image)
        a, b, t = matched_boxes(words.words, words.boxes, scan.words, scan.word_boxes)
        read.append(a), truth.append(b), texts.extend(t)
        used += 1
    read, truth = np.concatenate(read), np.concatenate(truth)
    offset = (read - truth).mean(0)
    print(f"{used} level scans, {len(read)} words matched; edge offsets at no widening (px, read - text layer): "
          f"x0 {offset[0]:+.2f}, y0 {offset[1]:+.2f}, x1 {offset[2]:+.2f}, y1 {offset[3]:+.2f}\n")
    print("| widened by (share of height, each side) | mean IoU with the text layer's box |\n|---|---|")
    height = read[:, 3] - read[:, 1]
    side = lambda share: np.stack([-share * height, 0 * height, share * height, 0 * height], 1)
    for share in args.shares:
        print(f"| {share:.2f}{' (default)' if share == SIDE_BEARING else ''} | {box_iou(read + side(share), truth).mean():.4f} |")
    wide = read + side(SIDE_BEARING)
    lettered = np.array([any(c.isalpha() for c in t) for t in texts], bool)
    print(f"\n| words holding a letter reach (rise, drop) | mean IoU, those {lettered.sum()} words | mean IoU, all |\n|---|---|---|")
    for reach in args.reaches:
        rise, drop = map(float, reach.split(","))
        tall = wide + np.stack([0 * height, -rise * height, 0 * height, drop * height], 1) * lettered[:, None]
        print(f"| {rise:.2f}, {drop:.2f} | {box_iou(tall[lettered], truth[lettered]).mean():.4f} "
              f"| {box_iou(tall, truth).mean():.4f} |")


if __name__ == "__main__":
    main()
