"""`dociq engine serve`: the data engine's annotation server (dociq.engine.server) on a store.

    dociq engine serve --data DATA_DIR --checkpoint run.ckpt            # http://127.0.0.1:8765/
    dociq engine serve DATA_DIR --host 0.0.0.0 --token SECRET           # on a network: token required
"""
from __future__ import annotations

import argparse
import sys

from dociq.engine.server import DEFAULT_PORT, TOKEN_ENV, serve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq engine serve", description="The data engine: annotate pages in the browser "
                                "with the model's help (docs/engine.md).")
    p.add_argument("data_dir", nargs="?", help="the engine store folder (engine.sqlite + pages/)")
    p.add_argument("--data", dest="data_flag", default=None, help="the store folder (as the other "
                   "`dociq engine` commands take it; same as the positional DATA_DIR)")
    p.add_argument("--checkpoint", help="a stage=finetune .ckpt or model folder (default: the store's checkpoint)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--token", default=None, help=f"require 'Authorization: Bearer TOKEN' (or set {TOKEN_ENV})")
    p.add_argument("--create", action="store_true", help="create the store folder when it does not exist")
    p.add_argument("--cache-size", type=int, default=16, help="embedded pages kept in memory (default 16)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--ls-question", default=None,
                   help="Label Studio pre-annotation without clicks: this question instead of the page's proposals")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.data_dir) == bool(args.data_flag):
        parser.error("give the store folder once: DATA_DIR or --data DIR")
    try:
        serve(args.data_dir or args.data_flag, args.checkpoint, host=args.host, port=args.port, token=args.token,
              device=args.device, create=args.create, cache_size=args.cache_size, ls_question=args.ls_question)
    except (FileNotFoundError, ValueError) as err:
        if args.debug:
            raise
        print(f"dociq engine: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0
