"""`dociq eval CKPT [CKPT ...]`: held-out mIoU of fine-tuned checkpoints per question kind and
prompt set, on synthetic pages, a corpus split or a COCO layout set (with COCO mAP).

Held-out prompts are asked of the Predictor a user runs, with its default settings, and scored at
the page's size (dociq.evaluation.answers); `--baseline detector` asks the same prompts of an
off-the-shelf layout detector plus text search (dociq.evaluation.detector_baseline), so every
table reads against a peer that needs no model of ours. `--task-path` scores the training task's
batched path instead (dociq.training.heldout: the validation loop's numbers, with the text-free
heuristics and the painted-words diagnostic; it needs the `train` extra). A user's mistake (a missing checkpoint or corpus) is
one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Sequence

import torch

from dociq.cli import report_errors
from dociq.data.scoring import VAL_SEED, format_table
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.evaluation.answers import ANSWER_SETS, evaluate_answers, is_predictor
from dociq.evaluation.coco_eval import evaluate_coco, format_coco_table
from dociq.evaluation.detector_baseline import DetectorTextSearch
from dociq.evaluation.layout_detector import DetectorUnavailable
from dociq.data.ocr import TesseractOCR
from dociq.data.scanned import ScannedPages
from dociq.cli.segment_page import add_region_options, region_options
from dociq.inference.predictor import load_predictor

BASELINES = ("detector",)
# --ocr-sharpen: TesseractOCR's `sharpen` for each choice
SHARPENING = {"never": False, "always": True, "surer": "surer"}
# The side of the synthetic pages a baseline (which has no input size) is scored on: the recipe's.
SYNTHETIC_BASELINE_SIZE = 256


def _category_map(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--category-map {item!r}: write model_class=coco_category, e.g. figure=Picture")
        model_name, coco_name = item.split("=", 1)
        out[model_name.strip()] = coco_name.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq eval", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="*", help="stage=finetune checkpoints or model folders")
    p.add_argument("--baseline", choices=BASELINES, action="append", default=[],
                   help="also score a baseline that needs no model of ours on the same prompts: detector = "
                        "an off-the-shelf layout detector plus text search (dociq.evaluation.detector_baseline)")
    p.add_argument("--task-path", action="store_true",
                   help="score the training task's batched path (the validation loop's numbers) instead of the "
                        "Predictor; needed for --heuristics and --eval-size")
    p.add_argument("--data", choices=("synthetic", "corpus", "coco"), default="synthetic",
                   help="synthetic held-out pages (default), a real corpus's held-out split (--corpus), "
                        "or a COCO layout set (--annotations)")
    p.add_argument("--pages", type=int, default=None,
                   help="pages to evaluate (default: 128 synthetic, all of a corpus split)")
    p.add_argument("--seed", type=int, default=VAL_SEED, help="synthetic data seed of the held-out pages")
    p.add_argument("--page-size", type=int, default=None, metavar="PX",
                   help="side of the synthetic pages (default: the model's input size; the generator fills "
                        "a larger page with more text, so compare models of different input sizes on the same "
                        "--page-size)")
    p.add_argument("--batch-size", type=int, default=8, help="pages per batch (--task-path)")
    p.add_argument("--max-questions", type=int, default=8)
    p.add_argument("--box-margin", type=float, default=0.0, metavar="PX",
                   help="draw the box prompts (box, box_region) this many pixels of the page looser than "
                        "their targets' tight boxes on every side, as a hand draws them (default 0: tight)")
    p.add_argument("--prompts", nargs="+", default=list(ANSWER_SETS), choices=list(ANSWER_SETS))
    corpus = p.add_argument_group("--data corpus")
    corpus.add_argument("--corpus", default="data/corpus", help="a `dociq corpus build` folder")
    corpus.add_argument("--split", default="val", help="its split (val: documents no training page comes from; "
                        "'all' for every page, e.g. of packages no training page comes from)")
    corpus.add_argument("--packages", nargs="+", default=None, help="only these source packages")
    coco = p.add_argument_group("--data coco")
    coco.add_argument("--annotations", help="the COCO annotation JSON")
    coco.add_argument("--image-dir", help="where its file_names live (default: images/ beside it, or its folder)")
    coco.add_argument("--max-pages", type=int, default=None, help="evaluate the first N pages only")
    coco.add_argument("--ocr", default="groundtruth", help="words: groundtruth (the file's), tesseract or pdf")
    coco.add_argument("--category-map", nargs="+", default=[], metavar="MODEL=COCO",
                      help="extra class name pairs, e.g. figure=Picture paragraph=Text")
    coco.add_argument("--points-per-side", type=int, default=16)
    coco.add_argument("--seeds", nargs="+", default=None, help="segmenter seeds among grid ocr_lines ocr_blocks "
                      "class_boxes (default: ocr_blocks class_boxes)")
    add_region_options(coco, snap_flag="--snap-regions")
    coco.add_argument("--pred-iou-thresh", type=float, default=0.5)
    coco.add_argument("--stability-score-thresh", type=float, default=0.8)
    p.add_argument("--heuristics", action="store_true",
                   help="also score text-free heuristics on the same prompts (HEURISTIC_SETS; --task-path)")
    p.add_argument("--snap", action="store_true",
                   help="also score each prompt set with the decoder's masks as they are (<set>_raw), snapped to "
                        "the word boxes (<set>_snap: Predictor(snap='words')) and completed to text blocks "
                        "(<set>_blocks: Predictor(snap='blocks')); with --task-path, questions also painted from "
                        "the word grounding's relevant words (<set>_words)")
    p.add_argument("--no-class-answers", action="store_true",
                   help="answer layout questions that name a text class with the decoder's mask instead of the "
                        "text units the unit classifier names (Predictor.class_answers = False)")
    p.add_argument("--eval-size", type=int, default=None, metavar="PX",
                   help="score masks in a PX-pixel frame (the page letterboxed as the model's input is) "
                        "instead of the model's input size: e.g. 1024, the corpus pages' own resolution "
                        "(masks as a user gets them; the same frame for models of any input size)")
    p.add_argument("--scan", action="store_true",
                   help="ask the prompts of scanned pages: each page degraded (skew, blur, noise, JPEG) and its "
                        "words read by tesseract instead of the text layer (dociq.data.scanned)")
    p.add_argument("--ocr-cache", default=None, metavar="DIR",
                   help="with --scan: keep the scanned pages' OCR words in DIR (keyed by the page image's content), "
                        "so a later run on the same pages reads them instead of running tesseract again "
                        "(default: a temporary folder, one OCR per page for all checkpoints of the run)")
    p.add_argument("--ocr-min-conf", type=float, default=None, metavar="CONF",
                   help="with --scan: keep only the words tesseract reads with a confidence over CONF (0..100), "
                        "those with digits too (default: TesseractOCR's, every word)")
    p.add_argument("--ocr-sharpen", choices=sorted(SHARPENING), default=None,
                   help="with --scan: read each scanned page as given (never), sharpened (always), or both ways "
                        "keeping the reading with more sure words (surer, TesseractOCR's default)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the results here")
    return p


def _pages(args, image_size: int, ocr_cache: str | None = None):
    """The held-out pages of --data synthetic / corpus (scanned and OCR'd with --scan)."""
    if args.data == "corpus":
        # deferred: a corpus is read with litdata, which the lean install leaves to the `corpus` extra
        from dociq.data.datasets.corpus.dataset import CorpusDocuments

        pages = CorpusDocuments(root=args.corpus, split=None if args.split == "all" else args.split,
                                packages=args.packages)
    else:
        pages = SyntheticDocuments(num_pages=args.pages or 128, image_size=args.page_size or image_size,
                                   seed=args.seed, degrade=0.3)
    if not args.scan:
        return pages
    options = {} if args.ocr_min_conf is None else {"min_conf": args.ocr_min_conf, "min_conf_digits": args.ocr_min_conf}
    if args.ocr_sharpen is not None:
        options["sharpen"] = SHARPENING[args.ocr_sharpen]
    return ScannedPages(pages, args.seed, ocr=TesseractOCR(cache=ocr_cache, **options))


def _baseline(name: str):
    """A baseline that answers prompts as the Predictor does, with no model of ours."""
    return {"detector": DetectorTextSearch}[name]()


def run(args) -> int:
    results = {}
    if args.data != "coco" and not args.task_path:
        answerers = [(path, load_predictor, path) for path in args.checkpoints]
        answerers += [(f"baseline:{name}", _baseline, name) for name in args.baseline]
        # one OCR per scanned page
        cache = nullcontext(args.ocr_cache) if args.ocr_cache else tempfile.TemporaryDirectory(prefix="dociq-eval-ocr-")
        with cache as ocr_cache:
            for label, make, arg in answerers:
                answerer = make(arg)
                if args.no_class_answers and hasattr(answerer, "class_answers"):
                    answerer.class_answers = False
                pages = _pages(args, getattr(answerer, "image_size", SYNTHETIC_BASELINE_SIZE), ocr_cache)
                results[label] = evaluate_answers(answerer, pages, args.pages, args.max_questions, args.seed,
                                                  args.prompts, compare_snap=args.snap and is_predictor(answerer),
                                                  box_margin=args.box_margin)
        return _report(args, results)
    if args.task_path:
        # deferred: the training task's path needs the `train` extra (Lightning)
        from dociq.training.heldout import evaluate, load_task
    for path in args.checkpoints:
        if args.data == "coco":
            results[path] = evaluate_coco(
                load_predictor(path), args.annotations, args.image_dir, args.max_pages, args.ocr,
                _category_map(args.category_map), points_per_side=args.points_per_side,
                **({"seeds": args.seeds} if args.seeds else {}),
                pred_iou_thresh=args.pred_iou_thresh, stability_score_thresh=args.stability_score_thresh,
                **region_options(args))
            continue
        task = load_task(path)
        data = None if args.data == "synthetic" else _pages(args, 0)
        results[path] = evaluate(task, args.pages, args.seed, args.batch_size, args.max_questions, args.prompts,
                                 data=data, heuristics=args.heuristics, snap=args.snap,
                                 eval_size=args.eval_size, page_size=args.page_size)
    return _report(args, results)


def _report(args, results: dict) -> int:
    print(format_coco_table(results) if args.data == "coco" else format_table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"results written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`dociq eval ...`: 0 when done, 2 on a user's mistake (one line on stderr)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.data == "coco" and not args.annotations:
        p.error("--data coco needs --annotations <the COCO JSON>")
    if args.baseline and (args.data == "coco" or args.task_path):
        p.error("--baseline answers the held-out prompts of --data synthetic / corpus on the Predictor's path: "
                "drop --task-path (and --data coco)")
    if not args.checkpoints and not args.baseline:
        p.error("give a checkpoint (or model folder) to evaluate, or --baseline detector")
    if args.scan and (args.data == "coco" or args.task_path):
        p.error("--scan scans the held-out pages of --data synthetic / corpus on the Predictor's path: drop "
                "--task-path (a COCO set's words come from --ocr)")
    if (args.ocr_cache or args.ocr_min_conf is not None or args.ocr_sharpen) and not args.scan:
        p.error("--ocr-cache, --ocr-min-conf and --ocr-sharpen are for the OCR of scanned pages: add --scan, or drop them")
    if not args.task_path and args.data != "coco" and (args.heuristics or args.eval_size):
        p.error("--heuristics and --eval-size score the training task's path: add --task-path")
    return report_errors("eval", lambda: run(args), also=(DetectorUnavailable,))


if __name__ == "__main__":
    sys.exit(main())
