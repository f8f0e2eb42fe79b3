"""How many of a page's words tesseract reads back, per binarization, with or without the page's
ruling lines erased, and per confidence threshold, on clean or scanned corpus pages.

    python scripts/bench_ocr.py --corpus data/forms_html --split all --pages 20 --scan
    python scripts/bench_ocr.py --corpus data/corpus --split val --pages 16 [--scan] [--min-conf 50 30 0 -1]

Each page's text-layer words are the truth; a setting's recall is the share of them (normalised,
case-folded, counted with repeats) among the words `TesseractOCR(binarize=..., erase_rules=...,
min_conf=...)` reads from the page's image — degraded first with `--scan`, as `dociq eval --scan`
degrades it (same seed, same scan) — and its precision the share of the words read that are true.
Each page is read as given (`sharpen=False`; scripts/sharpen_readings.py compares it with the
sharpened reading). Pages are spread evenly over the split. Prints one row per setting: mean recall and precision,
pages read at under 20 %, and seconds per page (every setting reads the same pages in one process;
the thresholds filter one reading).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.lexical import word_precision, word_recall
from dociq.data.ocr import BINARIZATIONS, EVERY_WORD, TesseractOCR
from dociq.data.scanned import degraded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--split", default="val", help="a split, or 'all'")
    p.add_argument("--pages", type=int, default=16)
    p.add_argument("--scan", action="store_true", help="degrade each page as a scan first (dociq eval --scan)")
    p.add_argument("--seed", type=int, default=0, help="which scan each page gets (as dociq eval --seed)")
    p.add_argument("--binarize", nargs="+", choices=sorted(BINARIZATIONS), default=["otsu", "sauvola"])
    p.add_argument("--min-conf", nargs="+", type=float, default=[EVERY_WORD],
                   help="confidence thresholds (0..100): a word is kept above one (TesseractOCR's min_conf)")
    p.add_argument("--digits-min-conf", type=float, default=EVERY_WORD,
                   help="a word holding a digit is kept above this (TesseractOCR's min_conf_digits; default: "
                        "every one; give the --min-conf value to treat all words alike)")
    args = p.parse_args()
    pages = CorpusDocuments(root=args.corpus, split=None if args.split == "all" else args.split)
    picked = np.unique(np.linspace(0, len(pages) - 1, min(args.pages, len(pages))).round().astype(int))
    readers = {f"{name}{' + rules erased' if erase else ''}": TesseractOCR(binarize=name, erase_rules=erase, min_conf=-1,
                                                                           sharpen=False)
               for name in args.binarize for erase in (False, True)}
    rows = [(name, t) for name in readers for t in args.min_conf]
    recall, precision, seconds = {r: [] for r in rows}, {r: [] for r in rows}, Counter()
    for index in picked:
        page = pages[int(index)]
        if page is None or not page.words:
            continue
        image = degraded(page, args.seed, int(index)).image if args.scan else page.image
        for name, reader in readers.items():
            start = time.perf_counter()
            read = reader.recognise(image)
            seconds[name] += time.perf_counter() - start
            for t in args.min_conf:
                words = read.confident(t, args.digits_min_conf).words
                recall[name, t].append(word_recall(page.words, words))
                precision[name, t].append(word_precision(page.words, words))
    print(f"{args.corpus} ({args.split}), {len(next(iter(recall.values())))} pages, "
          f"{'scanned' if args.scan else 'clean'}")
    print("| tesseract reads with | confidence over | word recall | word precision | pages under 20 % | s / page |\n"
          "|---|---|---|---|---|---|")
    for name, t in rows:
        r = np.asarray(recall[name, t])
        print(f"| {name} | {t:g} | {r.mean():.3f} | {np.mean(precision[name, t]):.3f} | {(r < 0.2).sum()} | "
              f"{seconds[name] / max(len(r), 1):.2f} |")


if __name__ == "__main__":
    main()
