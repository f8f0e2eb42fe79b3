"""How many of a page's words tesseract reads back, per binarization and with or without the page's
ruling lines erased, on clean or scanned corpus pages.

    python scripts/bench_ocr.py --corpus data/forms_html --split all --pages 20 --scan
    python scripts/bench_ocr.py --corpus data/corpus --split val --pages 16 [--scan]

Each page's text-layer words are the truth; a setting's recall is the share of them (normalised,
case-folded, counted with repeats) among the words `TesseractOCR(binarize=..., erase_rules=...)`
reads from the page's image — degraded first with `--scan`, as `dociq eval --scan` degrades it (same
seed, same scan). Pages are spread evenly over the split. Prints one row per setting: mean recall,
pages read at under 20 %, and seconds per page (every setting reads the same pages in one process).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.lexical import normalise
from dociq.data.ocr import BINARIZATIONS, TesseractOCR
from dociq.data.scanned import degraded


def word_recall(truth: list[str], read: list[str]) -> float:
    """Share of the true words (with repeats) among the words read."""
    want = Counter(normalise(w).casefold() for w in truth)
    got = Counter(normalise(w).casefold() for w in read)
    return sum((want & got).values()) / max(sum(want.values()), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--split", default="val", help="a split, or 'all'")
    p.add_argument("--pages", type=int, default=16)
    p.add_argument("--scan", action="store_true", help="degrade each page as a scan first (dociq eval --scan)")
    p.add_argument("--seed", type=int, default=0, help="which scan each page gets (as dociq eval --seed)")
    p.add_argument("--binarize", nargs="+", choices=sorted(BINARIZATIONS), default=["otsu", "sauvola"])
    args = p.parse_args()
    pages = CorpusDocuments(root=args.corpus, split=None if args.split == "all" else args.split)
    picked = np.unique(np.linspace(0, len(pages) - 1, min(args.pages, len(pages))).round().astype(int))
    readers = {f"{name}{' + rules erased' if erase else ''}": TesseractOCR(binarize=name, erase_rules=erase)
               for name in args.binarize for erase in (False, True)}
    recall, seconds = {n: [] for n in readers}, Counter()
    for index in picked:
        page = pages[int(index)]
        if page is None or not page.words:
            continue
        image = degraded(page, args.seed, int(index)).image if args.scan else page.image
        for name, reader in readers.items():
            start = time.perf_counter()
            read = reader.recognise(image).words
            seconds[name] += time.perf_counter() - start
            recall[name].append(word_recall(page.words, read))
    print(f"{args.corpus} ({args.split}), {len(next(iter(recall.values())))} pages, "
          f"{'scanned' if args.scan else 'clean'}")
    print("| tesseract reads with | word recall | pages under 20 % | s / page |\n|---|---|---|---|")
    for name in readers:
        r = np.asarray(recall[name])
        print(f"| {name} | {r.mean():.3f} | {(r < 0.2).sum()} | {seconds[name] / max(len(r), 1):.2f} |")


if __name__ == "__main__":
    main()
