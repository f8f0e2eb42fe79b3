"""What the rule scripts share: masks packed to bits for a pickle, and one command line.

Each rule script (class_answer_rules.py, figure_answers.py, click_choice_rules.py) collects rows
from a corpus split (with or without a checkpoint), can save them with --dump, and prints its
table from a saved collection with --load — so a rule can be changed and rescored without
running the model again.
"""
from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Callable

import numpy as np


def pack(mask: np.ndarray) -> tuple:
    return mask.shape, np.packbits(mask)


def unpack(packed: tuple) -> np.ndarray:
    shape, bits = packed
    return np.unpackbits(bits, count=shape[0] * shape[1]).reshape(shape).astype(bool)


def run(description: str, collect: Callable[[str | None, str, str], list[dict]],
        table: Callable[[list[dict]], None], *, needs_checkpoint: bool = True,
        checkpoint_help: str | None = None) -> None:
    """Parse `[CKPT] --corpus --split --dump --load`, collect or load the rows, print the table.

    `collect(checkpoint, corpus, split)` gets None for the checkpoint when none was given.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("checkpoint", nargs="?", help=checkpoint_help)
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--split", default="val")
    parser.add_argument("--dump", type=Path, help="save what was collected (pickle) for --load")
    parser.add_argument("--load", type=Path, help="score a saved collection instead of collecting it again")
    args = parser.parse_args()
    if args.load:
        rows = pickle.loads(args.load.read_bytes())
    else:
        if needs_checkpoint and not args.checkpoint:
            parser.error("give a checkpoint, or --load a saved collection")
        rows = collect(args.checkpoint, args.corpus, args.split)
        if args.dump:
            args.dump.parent.mkdir(parents=True, exist_ok=True)
            args.dump.write_bytes(pickle.dumps(rows))
    table(rows)
