"""ONNX runner vs the torch Predictor on held-out real pages: agreement and speed.

For each of `--pages` pages of the corpus split, both backends embed the page and answer the same
prompts, one call per prompt: each of up to `--prompts` of the page's questions, the tight box of
its target, and one click inside the target. Reported:
- agreement: mean / min IoU of the ONNX masks against the torch masks (default snapping, and the
  decoder's own masks with snap=None), and the max abs difference of the logits (low-res and at the
  page's size);
- speed: median wall ms of set_image per page and of predict per prompt, torch and onnxruntime
  with 1 and 2 threads, and each onnxruntime time as a ratio of torch's at the same thread count,
  measured in the same run (alternating backends page by page, so load drifts hit both).

    python scripts/bench_onnx.py MODEL_DIR --corpus data/corpus --split val --pages 10
    (MODEL_DIR from `dociq export CKPT MODEL_DIR --onnx`)

Results: docs/predict.md ("ONNX").
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dociq.data.datasets.corpus.dataset import CorpusDocuments  # noqa: E402
from dociq.inference.onnx_predictor import OnnxPredictor  # noqa: E402
from dociq.inference.predictor import Predictor  # noqa: E402


def page_prompts(page, count: int) -> list[dict]:
    """One question, one box and one click per target of the page's first `count` questions."""
    out = []
    for q in list(page.questions)[:count]:
        ys, xs = np.nonzero(q.mask)
        if not len(xs):
            continue
        k = int(np.argmin((xs - xs.mean()) ** 2 + (ys - ys.mean()) ** 2))     # the target pixel nearest its centre
        out += [("question", dict(question=q.text)),
                ("box", dict(boxes=[float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)])),
                ("point", dict(points=[[float(xs[k]), float(ys[k])]]))]
    return out


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def agreement(torch_p: Predictor, onnx_p: OnnxPredictor, prompts: list, stats: dict) -> None:
    for kind, prompt in prompts:
        ref, out = torch_p.predict(**prompt, return_logits=True), onnx_p.predict(**prompt, return_logits=True)
        stats["low_res"].append(float(np.abs(out[2] - ref[2]).max()))
        stats["page"].append(float(np.abs(out[0] - ref[0]).max()))
        for snap in ("blocks", None):
            with torch_p.snapping(snap):
                onnx_p.snap = snap
                stats[(kind, snap)].append(iou(torch_p.predict(**prompt)[0][0], onnx_p.predict(**prompt)[0][0]))
        onnx_p.snap = "blocks"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a model folder with onnx/ (dociq export CKPT DIR --onnx)")
    ap.add_argument("--corpus", default="data/corpus")
    ap.add_argument("--split", default="val")
    ap.add_argument("--pages", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=3, help="questions per page (each also as a box and a click)")
    args = ap.parse_args()
    pages = CorpusDocuments(root=args.corpus, split=args.split)
    torch_p = Predictor.from_pretrained(args.folder)
    onnx_ps = {n: OnnxPredictor(args.folder, threads=n) for n in (1, 2)}
    stats: dict = {k: [] for k in ("low_res", "page")}
    stats.update({(kind, snap): [] for kind in ("question", "box", "point") for snap in ("blocks", None)})
    times: dict = {(b, n, what): [] for b in ("torch", "onnx") for n in (1, 2) for what in ("set_image", "prompt")}
    words_per_page = []
    for i in range(min(args.pages, len(pages))):
        page = pages[i]
        if page is None:
            continue
        words, boxes = list(page.words), np.asarray(page.word_boxes)
        words_per_page.append(len(words))
        prompts = page_prompts(page, args.prompts)
        for n in (1, 2):
            torch.set_num_threads(n)
            for name, p in (("torch", torch_p), ("onnx", onnx_ps[n])):
                times[(name, n, "set_image")].append(timed(lambda: p.set_image(page.image, words=words,
                                                                               word_boxes=boxes)))
                times[(name, n, "prompt")] += [timed(lambda: p.predict(**prompt)) for _, prompt in prompts]
        agreement(torch_p, onnx_ps[2], prompts, stats)
    report(stats, times, words_per_page, args)


def report(stats: dict, times: dict, words_per_page: list[int], args) -> None:
    print(f"{len(words_per_page)} pages of {args.corpus} split={args.split} "
          f"({statistics.median(words_per_page):.0f} OCR words per page, median); "
          f"{len(stats[('question', 'blocks')])} prompts of each kind\n")
    print("| prompt | IoU onnx vs torch (snap=blocks) mean / min | (snap=None) mean / min |")
    print("|---|---|---|")
    for kind in ("question", "box", "point"):
        a, b = stats[(kind, "blocks")], stats[(kind, None)]
        print(f"| {kind} | {np.mean(a):.4f} / {min(a):.4f} | {np.mean(b):.4f} / {min(b):.4f} |")
    print(f"\nmax |logit difference|: low-res {max(stats['low_res']):.2e}, at the page's size {max(stats['page']):.2e}\n")
    print("| threads | step | torch ms | onnxruntime ms | onnx / torch |")
    print("|---|---|---|---|---|")
    for n in (1, 2):
        for what in ("set_image", "prompt"):
            t, o = statistics.median(times[("torch", n, what)]), statistics.median(times[("onnx", n, what)])
            print(f"| {n} | {what} | {t:.0f} | {o:.0f} | {o / t:.2f} |")


if __name__ == "__main__":
    main()
