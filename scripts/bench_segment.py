"""Speed of dociq on a laptop CPU against the issue "Whole documents in, fast on a laptop CPU".

1. Prompt after set_image: on the densest held-out page (most OCR words of the corpus's val split),
   the median wall ms of `set_image`, a first question and a second, different question on the same
   page, for the torch Predictor (and the ONNX runner with --onnx-dir). Target: the second question
   costs <= 10 % of set_image + first question.
2. Whole documents: `DocumentSegmenter` with `dociq segment`'s defaults (regions, no questions, 144
   dpi, ocr=auto) on the first --pages pages of a real PDF, s/page and pages/s, on torch and (with
   --onnx-dir) on the ONNX runner, against the off-the-shelf layout detector
   (dociq.evaluation.layout_detector, PP-PicoDet on onnxruntime) on the same rendered pages, one
   after the other on each page. Targets: dociq <= 5x the detector, <= 1 s/page.

Prints markdown tables, the machine load before and after, torch version and threads.

    python scripts/bench_segment.py [--ckpt CKPT] [--onnx-dir DIR] [--pdf PDF] [--pages 50]
        [--repeats 10] [--threads 2] [--profile]
    (DIR from `dociq export CKPT DIR --onnx`)

Results: docs/segment.md ("Speed").
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dociq.data.datasets.corpus.dataset import CorpusDocuments  # noqa: E402
from dociq.evaluation.layout_detector import LayoutDetector  # noqa: E402
from dociq.inference.documents import DocumentSegmenter, page_count  # noqa: E402
from dociq.inference.predictor import load_predictor  # noqa: E402

CKPT = "outputs/finetune/runs/recipe_2026-11-27_14-04-11/checkpoints/last.ckpt"
PDF_DIR = "data/debian/texlive-latex-recommended-doc"
FALLBACK_QUESTIONS = ("all section headings", "the page numbers")


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def densest_page(corpus: str, split: str):
    """The page of the split with the most OCR words (every page is read once) and its index."""
    pages = CorpusDocuments(root=corpus, split=split)
    counts = [len(pages.load_page(i).words) for i in range(len(pages))]
    best = int(np.argmax(counts))
    return pages.load_page(best), best, len(pages)


def two_questions(page) -> tuple[str, str]:
    """The page's first two distinct question texts (fixed layout questions if it has fewer)."""
    texts = list(dict.fromkeys(q.text for q in page.questions))
    return tuple(texts[:2]) if len(texts) >= 2 else FALLBACK_QUESTIONS


def prompt_after_set_image(predictor, page, questions: tuple[str, str], repeats: int) -> dict[str, float]:
    """Median ms of set_image, the first question and a second question on the same page (one warm-up)."""
    words, boxes = list(page.words), np.asarray(page.word_boxes)
    times: dict[str, list[float]] = {"set_image": [], "first question": [], "second question": []}
    for i in range(repeats + 1):
        t = [ms(lambda: predictor.set_image(page.image, words=words, word_boxes=boxes)),
             ms(lambda: predictor.predict(question=questions[0])),
             ms(lambda: predictor.predict(question=questions[1]))]
        if i:                                                   # the first round is the warm-up
            for key, value in zip(times, t):
                times[key].append(value)
    return {k: statistics.median(v) for k, v in times.items()}


def pick_pdf(folder: str, min_pages: int) -> tuple[Path, int]:
    """The largest PDF (bytes) under `folder` with at least `min_pages` pages, and its page count."""
    for path in sorted(Path(folder).rglob("*.pdf"), key=lambda p: p.stat().st_size, reverse=True):
        try:
            count = page_count(path)
        except Exception:  # noqa: BLE001 — an unreadable PDF is passed over
            continue
        if count >= min_pages:
            return path, count
    raise SystemExit(f"no PDF with >= {min_pages} pages under {folder}: give one with --pdf")


def documents(segmenters: dict[str, DocumentSegmenter], detector: LayoutDetector, pdf: Path, pages: int) -> dict:
    """Seconds per page of each backend's segment_page (render + words + regions), of read_page
    alone (render + words) and of the detector on the rendered page, one after the other on each
    page, after one warm-up page."""
    first = next(iter(segmenters.values()))
    for segmenter in segmenters.values():
        segmenter.segment_page(pdf, 1)
    detector(first.read_page(pdf, 1).image)
    out = {**{name: [] for name in segmenters}, "read": [], "detector": [], "boxes": [],
           **{f"{name} regions": [] for name in segmenters}}
    for n in range(1, pages + 1):
        for name, segmenter in segmenters.items():
            start = time.perf_counter()
            result = segmenter.segment_page(pdf, n)
            out[name].append(time.perf_counter() - start)
            out[f"{name} regions"].append(len(result.regions))
        out["read"].append(ms(lambda: first.read_page(pdf, n)) / 1000)
        start = time.perf_counter()
        boxes, _, _ = detector(result.image)
        out["detector"].append(time.perf_counter() - start)
        out["boxes"].append(len(boxes))
    return out


def profile_page(segmenter: DocumentSegmenter, pdf: Path, page: int, top: int = 10) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(segmenter.segment_page, pdf, page)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=CKPT)
    ap.add_argument("--onnx-dir", type=Path, help="also the ONNX runner (dociq export CKPT DIR --onnx)")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--split", default="val")
    ap.add_argument("--pdf", type=Path, help=f"default: the largest PDF of >= --pages pages under {PDF_DIR}")
    ap.add_argument("--pages", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds of set_image + 2 questions")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="also cProfile one page of the PDF (top 10 cumulative)")
    args = ap.parse_args()

    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
          f"checkpoint {args.ckpt}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}\n")

    page, index, total = densest_page(args.corpus, args.split)
    questions = two_questions(page)
    h, w = page.image.shape[:2]
    print(f"1. densest of {total} {args.split} pages: #{index} {page.meta.get('page_id', '')} "
          f"({len(page.words)} words, {w}x{h} px); questions {questions[0]!r}, then {questions[1]!r}; "
          f"median of {args.repeats} after a warm-up\n")
    predictor = load_predictor(args.ckpt)
    backends = [("torch", predictor)]
    if args.onnx_dir:
        from dociq.inference.onnx_predictor import OnnxPredictor
        backends.append(("onnx", OnnxPredictor(args.onnx_dir, threads=args.threads)))
    print("| backend | set_image ms | first question ms | second question ms | second / (set_image + first) |")
    print("|---|---|---|---|---|")
    for name, p in backends:
        t = prompt_after_set_image(p, page, questions, args.repeats)
        ratio = t["second question"] / (t["set_image"] + t["first question"])
        print(f"| {name} | {t['set_image']:.0f} | {t['first question']:.0f} | {t['second question']:.0f} | "
              f"{100 * ratio:.1f} % (target <= 10 %) |")

    pdf, count = (args.pdf, page_count(args.pdf)) if args.pdf else pick_pdf(PDF_DIR, args.pages)
    pages = min(args.pages, count)
    segmenters = {name: DocumentSegmenter(p) for name, p in backends}     # `dociq segment`'s defaults
    detector = LayoutDetector(threads=args.threads)
    r = documents(segmenters, detector, pdf, pages)
    det, read = sum(r["detector"]) / pages, sum(r["read"]) / pages
    regions = ", ".join(f"{np.mean(r[f'{name} regions']):.1f} (dociq, {name})" for name in segmenters)
    print(f"\n2. {pdf} ({count} pages; pages 1-{pages}, 144 dpi, after a warm-up on page 1); regions per page "
          f"{regions}, {np.mean(r['boxes']):.1f} (detector)\n")
    print("| what | s/page (mean) | s/page (median) | pages/s | / detector |")
    print("|---|---|---|---|---|")
    rows = [(f"dociq segment_page, {name} (render + words + regions)", name) for name in segmenters]
    rows += [("of which: render + words (read_page)", "read"),
             ("layout detector (PP-PicoDet, ONNX), rendered page", "detector")]
    for label, key in rows:
        mean = sum(r[key]) / pages
        print(f"| {label} | {mean:.3f} | {statistics.median(r[key]):.3f} | {1 / mean:.2f} | {mean / det:.1f}x |")
    for name in segmenters:
        d = sum(r[name]) / pages
        print(f"\ndociq ({name}) / detector: {d / det:.1f}x (target <= 5x); without render + words: "
              f"{(d - read) / det:.1f}x; {d:.2f} s/page (target <= 1 s/page)")

    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.profile:
        median_page = int(np.argsort(r["torch"])[len(r["torch"]) // 2]) + 1      # the median page
        print(f"\ncProfile of segment_page (torch) on page {median_page} (the median page), top 10 cumulative:\n")
        print(profile_page(segmenters["torch"], pdf, median_page))


if __name__ == "__main__":
    main()
