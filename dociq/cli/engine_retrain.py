"""`dociq engine retrain`: one data-engine round (dociq.engine.retrain) on a store.

    dociq engine retrain --data DATA_DIR [--steps N] [--checkpoint CKPT] [HYDRA_OVERRIDES ...]
"""
from __future__ import annotations

import argparse
import sys

from dociq.engine.retrain import DEFAULT_HELDOUT_MIN, DEFAULT_LR, RoundFailedError, run_round
from dociq.engine.store import EngineStore


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dociq engine retrain",
        description="One data-engine round: fine-tune the store's checkpoint on its accepted train "
                    "annotations (mixed with synthetic pages), promote it only if held-out mIoU does not drop.")
    p.add_argument("--data", required=True, help="the engine store folder")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of the round (default 300)")
    p.add_argument("--checkpoint", default=None,
                   help="stage=finetune checkpoint to start from when the store has none promoted yet")
    p.add_argument("--synthetic-fraction", type=float, default=0.5,
                   help="share of synthetic pages in the training mix (default 0.5)")
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"peak learning rate (default {DEFAULT_LR})")
    p.add_argument("--heldout-min", type=int, default=DEFAULT_HELDOUT_MIN,
                   help=f"fewest held-out annotations a round needs (default {DEFAULT_HELDOUT_MIN})")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="promote when new mIoU >= old - tolerance (default 0)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for train.py (e.g. data.batch_size=2)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    store = EngineStore(args.data)
    try:
        result = run_round(store, base_checkpoint=args.checkpoint, steps=args.steps,
                           synthetic_fraction=args.synthetic_fraction, overrides=args.overrides,
                           heldout_min=args.heldout_min, tolerance=args.tolerance, lr=args.lr)
    except RoundFailedError as err:
        print(f"dociq engine retrain: error: {err}", file=sys.stderr)
        return 1
    print(f"round {result.round}: {result.train_annotations} train annotations on {result.train_pages} pages, "
          f"{result.steps} steps in {result.train_seconds:.0f} s; held-out mIoU {100 * result.miou_old:.1f} -> "
          f"{100 * result.miou_new:.1f} ({result.heldout_annotations} prompts): {result.status.upper()}")
    print(f"checkpoint: {result.checkpoint}")
    return 0
