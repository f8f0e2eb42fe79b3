"""`dociq export CKPT DIR [--overwrite] [--onnx]`: a stage=finetune checkpoint -> a model folder in the
Hugging Face layout (dociq.inference.model_folder.export_checkpoint; docs/model_folders.md); with --onnx also
its ONNX graphs for the torch-free runner (dociq.inference.onnx_export; docs/predict.md, "ONNX").

`main(["export", CKPT, DIR])` is also `python -m dociq.cli export CKPT DIR`. A user's
mistake is one line on stderr and exit status 2 (`--debug`: the traceback).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dociq.cli import report_errors
from dociq.inference.model_folder import export_checkpoint
from dociq.inference.onnx_export import check_export_dependencies, export_onnx


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dociq", description="Model folders in the Hugging Face layout.")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="a stage=finetune checkpoint -> a model folder")
    export.add_argument("checkpoint", help="<run>/checkpoints/last.ckpt of a `python train.py stage=finetune` run")
    export.add_argument("directory", help="the folder to write (new, or an earlier export with --overwrite)")
    export.add_argument("--overwrite", action="store_true", help="replace an earlier export in DIRECTORY")
    export.add_argument("--onnx", action="store_true",
                        help="also the ONNX graphs and tokenizers for the torch-free runner (DIR/onnx/; needs "
                             "`pip install 'dociq[export]'`)")
    export.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def run_export(args) -> int:
    if args.onnx:
        check_export_dependencies()      # before anything is written
    out = export_checkpoint(args.checkpoint, args.directory, overwrite=args.overwrite)
    if args.onnx:
        export_onnx(out)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    print(f"exported {args.checkpoint} -> {out} ({', '.join(files)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`dociq export CKPT DIR [--overwrite]` (argv: ["export", CKPT, DIR, ...]); 0 when done, 2 on a user's
    mistake. A config that cannot be written to config.json is a TypeError, also the user's."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:          # argparse printed its usage line; keep its status (2 for errors)
        return int(exit_.code or 0)
    return report_errors("export", lambda: run_export(args), debug=args.debug, also=(TypeError, ImportError))


if __name__ == "__main__":
    sys.exit(main())
