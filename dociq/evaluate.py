"""Held-out evaluation of a `stage=finetune` checkpoint: mIoU per question kind and per prompt.

    python -m dociq.evaluate CKPT [CKPT ...] --pages 128 --json results.json

Every question of `--pages` held-out synthetic pages (seed 1000003, the `data.val_set` of
training, which no training page shares) is prompted, one round, three ways:
- `question`: the question only (what a user types);
- `box`: the target's tight box only (SAM's box prompt);
- `question_no_ocr`: the question only, with the page's OCR words removed from the model's input
  (the same weights: how much of the answer comes from reading);
- `box_region`: the box of one annotated region (up to `max_questions` per page, drawn with a fixed
  seed), target that region's mask — SAM's box prompt, one object per box. (`box` uses the
  question targets, and a plural layout question's target is several regions inside one box.)
mIoU is the mean over prompts of each prompt's IoU (thresholded mask vs target), ×100 in the
printed table; counts per kind are reported next to it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Sequence

import torch

from dociq.data.collate import DocumentCollator
from dociq.data.schema import QUESTION_KINDS, Page, Question
from dociq.data.synthetic import SyntheticDocuments
from dociq.data.tokenize import QuestionTokenizer
from dociq.tasks.checkpoint_io import CheckpointError, read_checkpoint
from dociq.tasks.segment import SegmentTask
from dociq.tasks.segment_metrics import SegmentationMetrics

PROMPT_SETS = {"question": (("question",), True), "box": (("box",), True),
               "question_no_ocr": (("question",), False), "box_region": (("box",), True)}
VAL_SEED = 1000003


def load_task(path: str | Path) -> SegmentTask:
    """The SegmentTask of a finetune checkpoint, weights loaded, in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: pass a stage=finetune .ckpt")
    ckpt = read_checkpoint(path)
    hparams = dict(ckpt.get("hyper_parameters") or {})
    if "model" not in hparams or "state_dict" not in ckpt:
        raise CheckpointError(path, "is not a stage=finetune checkpoint (no hyper_parameters.model / state_dict)",
                              "give the checkpoint of a `python train.py stage=finetune` run")
    hparams["init"] = None                      # the weights come from this checkpoint
    task = SegmentTask(**hparams)
    task.load_state_dict(ckpt["state_dict"], strict=True)
    return task.eval()


@torch.no_grad()
def evaluate(task: SegmentTask, pages: int = 128, seed: int = VAL_SEED, batch_size: int = 8,
             max_questions: int = 8, prompt_sets: Sequence[str] = tuple(PROMPT_SETS)) -> dict:
    """{prompt set: {miou, dice, miou_<kind>, ..., count_<kind>}} on held-out synthetic pages."""
    image_size = int(task.hparams["model"]["image_size"])
    context = task.model.prompt_encoder.question_encoder.context_length
    data = SyntheticDocuments(num_pages=pages, image_size=image_size, seed=seed, degrade=0.3)
    collate = DocumentCollator(image_size, question_tokenizer=QuestionTokenizer(context), questions=True,
                               max_questions=max_questions, seed=seed)
    metrics = {name: SegmentationMetrics(kinds=("region",) if name == "box_region" else QUESTION_KINDS)
               for name in prompt_sets}
    use_ocr = task.use_ocr
    try:
        for start in range(0, pages, batch_size):
            page_list = [data[i] for i in range(start, min(pages, start + batch_size))]
            batch = collate(page_list)
            region_batch = collate([regions_as_prompts(p, max_questions, seed) for p in page_list]) \
                if "box_region" in prompt_sets else None
            for name in prompt_sets:
                prompt_kinds, with_ocr = PROMPT_SETS[name]
                task.use_ocr = use_ocr and with_ocr
                b = region_batch if name == "box_region" else batch
                kinds = [k for page in b["prompt_kind"] for k in page]
                out = task.run_rounds(b, 1, kinds=prompt_kinds)
                valid = out["valid"]
                metrics[name].update(out["masks"][valid] > 0, out["targets"][valid] > 0.5, kinds)
    finally:
        task.use_ocr = use_ocr
    results = {}
    for name, m in metrics.items():
        values = {k: float(v) for k, v in m.compute().items()}
        counts = {f"count_{k}": int(c.compute()) for k, c in m.count_by_kind.items() if f"miou_{k}" in values}
        results[name] = values | counts
    return results


def regions_as_prompts(page: Page, count: int, seed: int) -> Page:
    """The page with up to `count` of its regions (fixed draw per page) as its prompts, kind
    "region": for box prompts, one object per box."""
    regions = [r for r in page.regions if r.mask.any()]
    rng = random.Random(f"{seed}:{page.meta.get('page_id', '')}")
    chosen = rng.sample(regions, k=min(count, len(regions)))
    return dataclasses.replace(page, questions=[Question(text=r.label, kind="region", mask=r.mask) for r in chosen])


def format_table(results: dict[str, dict]) -> str:
    kinds = ["layout", "reading", "cell", "link", "region"]
    lines = ["| checkpoint | prompt | mIoU | " + " | ".join(f"mIoU {k}" for k in kinds) + " |",
             "|---|---|---|" + "---|" * len(kinds)]
    for ckpt, sets in results.items():
        for name, r in sets.items():
            cells = [f"{100 * r[f'miou_{k}']:.1f} (n={r.get(f'count_{k}', '?')})" if f"miou_{k}" in r else "-"
                     for k in kinds]
            lines.append(f"| {ckpt} | {name} | {100 * r.get('miou', float('nan')):.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--pages", type=int, default=128)
    p.add_argument("--seed", type=int, default=VAL_SEED, help="synthetic data seed of the held-out pages")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-questions", type=int, default=8)
    p.add_argument("--prompts", nargs="+", default=list(PROMPT_SETS), choices=list(PROMPT_SETS))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for path in args.checkpoints:
        try:
            task = load_task(path)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        results[path] = evaluate(task, args.pages, args.seed, args.batch_size, args.max_questions, args.prompts)
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
