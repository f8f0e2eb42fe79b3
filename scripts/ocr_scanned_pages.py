"""Fill the OCR cache of the scanned pages `data=corpus_mixed_scanned` trains on, before training.

Each page is degraded as `dociq.data.scanned.ScannedPages` degrades it (drawn from its id and the
seed) and read by tesseract into the cache the training config names (`${paths.cache_dir}/ocr`,
`.cache/dociq/ocr` by default), one process per worker. Training then reads every scan from the
cache instead of waiting ~5 s per page for tesseract inside its data loader. Pages already in the
cache are skipped, so a killed run continues where it stopped.

    python scripts/ocr_scanned_pages.py --corpus data/corpus --max-pages 400 --seed 0 [--workers 2]

--max-pages and --seed must match the config's (`max_pages` of the scanned set, and `seed`).
"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# one tesseract thread per worker: the workers are the parallelism
os.environ.setdefault("OMP_THREAD_LIMIT", "1")

from dociq.data.datasets.corpus.dataset import CorpusDocuments, quiet_litdata  # noqa: E402
from dociq.data.scanned import ScannedPages  # noqa: E402


def _read(args: tuple[str, str, int | None, int, str, list[int]]) -> int:
    corpus, split, max_pages, seed, cache, indices = args
    quiet_litdata()
    scanned = ScannedPages(CorpusDocuments(corpus, split=split, max_pages=max_pages), seed=seed, cache_dir=cache)
    words = 0
    for i in indices:
        page = scanned[i]
        words += 0 if page is None else len(page.words)
    return words


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="data/corpus", help="the corpus folder (`make corpus` builds data/corpus)")
    p.add_argument("--split", default="train")
    p.add_argument("--max-pages", type=int, default=400, help="the scanned set's max_pages in the config")
    p.add_argument("--seed", type=int, default=0, help="the training run's seed (which scan each page gets)")
    p.add_argument("--cache", default=os.path.join(os.environ.get("DOCIQ_ROOT", "."), ".cache", "dociq", "ocr"),
                   help="the OCR cache (the config's ${paths.cache_dir}/ocr)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    quiet_litdata()
    count = len(CorpusDocuments(args.corpus, split=args.split, max_pages=args.max_pages))
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    shares = [list(range(k, count, args.workers)) for k in range(args.workers)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        words = sum(pool.map(_read, [(args.corpus, args.split, args.max_pages, args.seed, args.cache, s)
                                     for s in shares]))
    seconds = time.perf_counter() - start
    print(f"{count} scanned pages ({words} words read) in {seconds:.0f} s with {args.workers} workers "
          f"({count / max(seconds, 1e-9):.2f} pages/s); cache: {args.cache}")


if __name__ == "__main__":
    main()
