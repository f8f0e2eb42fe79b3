"""Which reading of a scan to keep: as given, sharpened, or the surer of the two? Each scanned page is
read both ways (`TesseractOCR(sharpen=False / True)`) and each reading scored by word recall against
the page's text layer; the rules that choose between them see only what tesseract says of its words.

    python scripts/sharpen_readings.py --corpus data/corpus --split val --cache outputs/ocr_cache/corpus_val
    python scripts/sharpen_readings.py --corpus data/forms_html --split all --pages 100 --cache outputs/ocr_cache/forms_html

Pages are scanned as `dociq eval --scan` scans them (same seed, same scan; `--seed` defaults to
eval's), and both readings go through the cache eval reads, so filling it here makes the evals that
follow read from it. Prints the mean recall of each rule — never, always, the better of the two per
page (a ceiling no rule reaches: it reads the text layer), and the ones that compare the readings —
and writes every page's row to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# one tesseract thread per worker: the workers are the parallelism
os.environ.setdefault("OMP_THREAD_LIMIT", "1")

import numpy as np  # noqa: E402

from dociq.data.datasets.corpus.dataset import CorpusDocuments, quiet_litdata  # noqa: E402
from dociq.data.lexical import word_recall  # noqa: E402
from dociq.data.ocr import TesseractOCR, sure_words  # noqa: E402
from dociq.data.scanned import degraded  # noqa: E402
from dociq.data.scoring import VAL_SEED  # noqa: E402

READINGS = ("plain", "sharpened")


def reading_row(truth: list[str], read) -> dict:
    """What one reading got right (recall) and what tesseract says of it."""
    confidences = np.clip(np.asarray(read.confidences, np.float32), 0, 100)
    return {"recall": word_recall(truth, read.words), "words": len(read.words), "sure": sure_words(read),
            "mean_confidence": float(confidences.mean()) if confidences.size else 0.0,
            "confidence_sum": float(confidences.sum() / 100)}


def _rows(args: tuple[str, str | None, int, str, list[int]]) -> list[dict]:
    corpus, split, seed, cache, indices = args
    quiet_litdata()
    pages = CorpusDocuments(corpus, split=split)
    readers = dict(zip(READINGS, (TesseractOCR(cache=cache, sharpen=False), TesseractOCR(cache=cache, sharpen=True))))
    rows = []
    for index in indices:
        page = pages[index]
        if page is None or not page.words:
            continue
        scan = degraded(page, seed, index)
        rows.append({"index": index, "page_id": str(page.meta.get("page_id", index)),
                     "degradations": scan.meta.get("degradations", []),
                     **{name: reading_row(page.words, reader.recognise(scan.image)) for name, reader in readers.items()}})
    return rows


def rules(rows: list[dict]) -> list[tuple[str, np.ndarray]]:
    """(name, whether each page keeps its sharpened reading) for every rule worth a row; a rule that
    compares the readings keeps the plain one on a tie."""
    def more(key: str) -> np.ndarray:
        return np.array([r["sharpened"][key] > r["plain"][key] for r in rows])

    recall = {name: np.array([r[name]["recall"] for r in rows]) for name in READINGS}
    return [("never (`sharpen=False`)", np.zeros(len(rows), bool)), ("always (`sharpen=True`)", np.ones(len(rows), bool)),
            ("the better reading (a ceiling: reads the text layer)", recall["sharpened"] > recall["plain"]),
            ("more sure words (the default, `sharpen=\"surer\"`)", more("sure")),
            ("a higher sum of confidences", more("confidence_sum")),
            ("a higher mean confidence", more("mean_confidence")),
            ("more words", more("words"))]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--split", default="val", help="a split, or 'all'")
    p.add_argument("--pages", type=int, default=None, help="the first N pages (default: every page)")
    p.add_argument("--seed", type=int, default=VAL_SEED, help="which scan each page gets (as dociq eval --seed)")
    p.add_argument("--cache", required=True, help="the OCR cache (as dociq eval --ocr-cache)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default=None, help="every page's row as JSON (default: sharpen_readings.json in the cache)")
    args = p.parse_args(argv)
    quiet_litdata()
    split = None if args.split == "all" else args.split
    count = len(CorpusDocuments(args.corpus, split=split))
    count = count if args.pages is None else min(count, args.pages)
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    shares = [list(range(k, count, args.workers)) for k in range(args.workers)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        parts = pool.map(_rows, [(args.corpus, split, args.seed, args.cache, share) for share in shares])
        rows = sorted((row for part in parts for row in part), key=lambda row: row["index"])
    seconds = time.perf_counter() - start
    out = Path(args.out or Path(args.cache) / "sharpen_readings.json")
    out.write_text(json.dumps(rows, indent=1))
    recall = {name: np.array([r[name]["recall"] for r in rows]) for name in READINGS}
    print(f"{args.corpus} ({args.split}), {len(rows)} scanned pages, seed {args.seed}, {seconds:.0f} s "
          f"with {args.workers} workers; rows: {out}")
    print("| keep the sharpened reading when | pages | word recall | pages under 0.5 |\n|---|---|---|---|")
    for name, sharpened in rules(rows):
        kept = np.where(sharpened, recall["sharpened"], recall["plain"])
        print(f"| {name} | {sharpened.sum()} | {kept.mean():.3f} | {(kept < 0.5).sum()} |")


if __name__ == "__main__":
    main()
