"""Cost of a prompt after `Predictor.set_image` vs the first prompt of a page (SAM's promise: embed
the page once, then each prompt is cheap).

One synthetic page (with its OCR words) is embedded `--repeats` times; each time the first prompt
is timed with its `set_image` (the page's image + OCR encoders, fusion trunk and neck). Then
`--prompts` prompts of each kind (one question, one click, one box, and Q questions in one call)
are timed on the cached page: question tower + word grounding + mask decoder + resizing the masks
to the page. Reported: medians in ms, by the wall clock and by this process's CPU time
(`time.process_time`: on a shared machine the wall clock also counts waiting for a core; with
`--threads 1` CPU time is the time on one core), and each prompt's cost as a share of the first.

    python scripts/bench_predictor.py                        # model=tiny, random init (configs/model/tiny.yaml)
    python scripts/bench_predictor.py CKPT_OR_FOLDER         # a stage=finetune .ckpt or a from_pretrained folder
    python scripts/bench_predictor.py --model base --repeats 1 --prompts 5    # model=base, 1024 px, random init
    python scripts/bench_predictor.py --json                 # one JSON object instead of the table
    python scripts/bench_predictor.py CKPT --corpus data/corpus   # the densest held-out real page

Results: docs/predict.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # random init: nothing may reach a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def build_predictor(checkpoint: str | None, model: str, device: str):
    """A checkpoint (file or from_pretrained folder), or a randomly initialised model of configs/model/<model>.yaml
    (what `python train.py stage=finetune model=<model>` builds)."""
    from dociq.inference.predictor import Predictor, load_predictor

    if checkpoint:
        return load_predictor(checkpoint, device)
    from dociq.models.segmenter import SegmentationModel
    from dociq.models.sizes import size_config

    torch.manual_seed(0)
    cfg = size_config(model)
    return Predictor(SegmentationModel.from_config(cfg), int(cfg["image_size"]), device=device)


def bench_page(height: int, width: int, seed: int):
    """A synthetic page with OCR words, questions, and click/box prompts on its words."""
    from dociq.data.synthetic.generator import SyntheticDocuments

    return SyntheticDocuments(1, image_size=(height, width), seed=seed)[0]


def densest_corpus_page(root: str):
    """The held-out (val) page of a `dociq corpus build` with the most OCR words."""
    from dociq.data.datasets.corpus.dataset import CorpusDocuments

    docs = CorpusDocuments(root=root, split="val")
    best = max(range(len(docs)), key=lambda i: len(docs[i].words))
    return docs[best]


class Timer:
    def __init__(self):
        self.wall, self.cpu = [], []

    def __call__(self, fn):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        self.wall.append(1e3 * (time.perf_counter() - w))
        self.cpu.append(1e3 * (time.process_time() - c))
        return out

    def median(self) -> dict:
        return {"wall_ms": statistics.median(self.wall), "cpu_ms": statistics.median(self.cpu), "n": len(self.wall)}


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    predictor = build_predictor(args.checkpoint, args.model, args.device)
    page = densest_corpus_page(args.corpus) if args.corpus else bench_page(args.page_height, args.page_width, args.seed)
    rng = np.random.default_rng(args.seed)
    questions = [q.text for q in page.questions] or ["the title"]
    boxes = page.word_boxes if len(page.word_boxes) else np.array([[10, 10, 200, 60]], np.float32)
    h, w = page.size
    n = args.prompts
    pick = rng.integers(0, len(boxes), size=n)
    clicks = [[[float((boxes[i, 0] + boxes[i, 2]) / 2), float((boxes[i, 1] + boxes[i, 3]) / 2)]] for i in pick]
    # a box around each picked word and its neighbours (a line), clipped to the page
    prompt_boxes = [[max(0.0, float(boxes[i, 0]) - 40), max(0.0, float(boxes[i, 1]) - 5),
                     min(float(w), float(boxes[i, 2]) + 120), min(float(h), float(boxes[i, 3]) + 5)] for i in pick]
    ask = [questions[i % len(questions)] for i in range(n)]
    many = [questions[i % len(questions)] for i in range(args.batch_questions)]

    def set_image():
        predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)

    with torch.inference_mode():
        set_image()                                   # warm-up: first-call allocations, lazy imports
        predictor.predict(question=ask[0])
        predictor.predict(points=clicks[0])
        embed, first = Timer(), Timer()
        for r in range(args.repeats):
            predictor.reset_image()
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            embed(set_image)
            predictor.predict(question=ask[r % n])
            first.wall.append(1e3 * (time.perf_counter() - start_wall))
            first.cpu.append(1e3 * (time.process_time() - start_cpu))
        kinds = {"question": Timer(), "click": Timer(), "box": Timer(), f"{len(many)} questions, one call": Timer()}
        for i in range(n):
            kinds["question"](lambda: predictor.predict(question=ask[i]))
            kinds["click"](lambda: predictor.predict(points=clicks[i]))
            kinds["box"](lambda: predictor.predict(boxes=prompt_boxes[i]))
            kinds[f"{len(many)} questions, one call"](lambda: predictor.predict(question=many))
    first_m = first.median()
    rows = {name: {**t.median(), "share_of_first": t.median()["wall_ms"] / first_m["wall_ms"],
                   "share_of_first_cpu": t.median()["cpu_ms"] / first_m["cpu_ms"]} for name, t in kinds.items()}
    params = sum(p.numel() for p in predictor.model.parameters())
    tokens = predictor.collator.ocr_tokenizer(page.words, np.zeros((len(page.words), 4), np.int64))
    return {"model": "checkpoint" if args.checkpoint else args.model, "checkpoint": args.checkpoint,
            "image_size": predictor.image_size, "params_M": params / 1e6, "page_hw": [h, w],
            "ocr_words": len(page.words), "ocr_tokens": len(tokens.ids), "ocr_words_cut": tokens.truncated_words,
            "threads": args.threads, "device": args.device,
            "set_image": embed.median(), "first_prompt": first_m, "after_set_image": rows,
            "target": "a prompt after set_image <= 10% of the first",
            "meets_target": all(r["share_of_first"] <= 0.10 for k, r in rows.items() if "one call" not in k),
            "load_average": list(os.getloadavg())}


def table(result: dict) -> str:
    lines = [f"model={result['model']} ({result['params_M']:.1f} M parameters, {result['image_size']}-px input), "
             f"page {result['page_hw'][0]}x{result['page_hw'][1]} px with {result['ocr_words']} OCR words "
             f"({result['ocr_tokens']} tokens, {result['ocr_words_cut']} words cut), "
             f"{result['threads']} thread(s), {result['device']}, load average "
             f"{' '.join(f'{v:.2f}' for v in result['load_average'])}", "",
             "| step | wall ms (median) | CPU ms (median) | n | share of the first prompt (wall / CPU) |",
             "|---|---:|---:|---:|---:|"]
    s, f = result["set_image"], result["first_prompt"]
    lines.append(f"| set_image (embed the page) | {s['wall_ms']:.1f} | {s['cpu_ms']:.1f} | {s['n']} | "
                 f"{s['wall_ms'] / f['wall_ms']:.0%} / {s['cpu_ms'] / f['cpu_ms']:.0%} |")
    lines.append(f"| first prompt (set_image + 1 question) | {f['wall_ms']:.1f} | {f['cpu_ms']:.1f} | {f['n']} | "
                 "100% |")
    for name, r in result["after_set_image"].items():
        lines.append(f"| after set_image: {name} | {r['wall_ms']:.1f} | {r['cpu_ms']:.1f} | {r['n']} | "
                     f"{r['share_of_first']:.1%} / {r['share_of_first_cpu']:.1%} |")
    lines += ["", f"Target ({result['target']}, single prompts): "
              f"{'met' if result['meets_target'] else 'NOT met'}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="a stage=finetune .ckpt or a from_pretrained folder "
                                                 "(default: random init of --model)")
    p.add_argument("--model", default="tiny", choices=["tiny", "base"], help="configs/model/<name>.yaml for random init")
    p.add_argument("--prompts", type=int, default=20, help="prompts of each kind after set_image (median)")
    p.add_argument("--repeats", type=int, default=3, help="set_image + first prompt repeats (median)")
    p.add_argument("--batch-questions", type=int, default=8, help="questions in the one-call batch row")
    p.add_argument("--corpus", default=None, help="bench on the densest held-out page of this corpus folder instead")
    p.add_argument("--page-height", type=int, default=1100)
    p.add_argument("--page-width", type=int, default=850)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time = time on one core)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the markdown table")
    args = p.parse_args(argv)
    if args.prompts < 1 or args.repeats < 1:
        p.error("--prompts and --repeats must be >= 1")
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
