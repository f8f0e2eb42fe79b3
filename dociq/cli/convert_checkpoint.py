"""`dociq convert-checkpoint OLD NEW`: give a checkpoint (or an exported model folder) stored before
model configs were complete the complete config of the model it holds (dociq.inference.convert).

    dociq convert-checkpoint outputs/finetune/runs/<run>/checkpoints/last.ckpt last_complete.ckpt
    dociq convert-checkpoint models/dociq-tiny models/dociq-tiny-complete

NEW must not exist; OLD is never changed. A user's mistake is one line on stderr and exit status 2
(`--debug`: the traceback).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dociq.cli import report_errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dociq convert-checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", help="a stage=finetune .ckpt, or a model folder written by `dociq export`")
    parser.add_argument("new", help="where to write the converted copy (a .ckpt for a .ckpt, a folder for a folder)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def run(args: argparse.Namespace) -> int:
    # deferred: the models (timm, open_clip, transformers) load only once the arguments are good
    from dociq.inference.convert import convert_checkpoint

    new = convert_checkpoint(args.old, args.new)
    print(f"converted {args.old} -> {new}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`dociq convert-checkpoint OLD NEW`: 0 when done, 2 on a user's mistake (one line on stderr)."""
    args = build_parser().parse_args(argv)
    return report_errors("convert-checkpoint", lambda: run(args), debug=args.debug, also=(FileExistsError,))


if __name__ == "__main__":
    sys.exit(main())
