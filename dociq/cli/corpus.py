"""`dociq corpus`: fetch the Debian documents, build a corpus from any folder, export it as COCO.

    dociq corpus fetch data/debian --recipe          # Debian's doc packages (apt-get download)
    dociq corpus build data/debian data/corpus       # every PDF / HTML / Mallard page under it
    dociq corpus export data/corpus val.json --split val
    dociq corpus audit data/corpus docs/img/corpus_audit.png --pages 50
    dociq corpus shrink data/corpus data/corpus_384 --max-side 384   # a copy small enough to carry
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dociq.corpus.audit import draw_audit
from dociq.corpus.build import BuildSettings, build_corpus, default_workers
from dociq.corpus.export import export_coco
from dociq.corpus.label_document import LabelSettings
from dociq.corpus.shrink import shrink_corpus
from dociq.corpus.sources import DEBIAN_PACKAGES, RECIPE_PACKAGES, fetch_debian_packages


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dociq corpus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)

    fetch = sub.add_parser("fetch", help="download and unpack Debian's documentation packages")
    fetch.add_argument("dest", type=Path)
    fetch.add_argument("--recipe", action="store_true", help="the recipe's smaller packages")
    fetch.add_argument("--packages", nargs="+", default=[],
                       help="these packages (beside the recipe's with --recipe; neither: all the corpus knows)")

    build = sub.add_parser("build", help="label every PDF and HTML document under SRC into OUT")
    build.add_argument("src", type=Path)
    build.add_argument("out", type=Path)
    build.add_argument("--max-docs-per-package", type=int, default=None)
    build.add_argument("--max-pages-per-package", type=int, default=None)
    build.add_argument("--max-pages-per-doc", type=int, default=LabelSettings.max_pages_per_doc)
    build.add_argument("--page-size", type=int, default=LabelSettings.page_size,
                       help="longest side of the stored page images, pixels")
    build.add_argument("--min-coverage", type=float, default=LabelSettings.min_coverage)
    build.add_argument("--val-fraction", type=float, default=BuildSettings.val_fraction)
    build.add_argument("--shard-pages", type=int, default=BuildSettings.shard_pages)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--workers", type=int, default=default_workers())

    export = sub.add_parser("export", help="write a built corpus as COCO (with words and questions)")
    export.add_argument("corpus", type=Path)
    export.add_argument("annotations", type=Path)
    export.add_argument("--split", choices=["train", "val"], default=None)
    export.add_argument("--max-pages", type=int, default=None)

    shrink = sub.add_parser("shrink", help="copy a built corpus with smaller JPEG pages (boxes scaled)")
    shrink.add_argument("corpus", type=Path)
    shrink.add_argument("out", type=Path)
    shrink.add_argument("--max-side", type=int, default=512, help="longest side of a page, pixels")
    shrink.add_argument("--quality", type=int, default=85, help="JPEG quality, 1-95")
    shrink.add_argument("--max-pages", nargs="+", default=[], metavar="SPLIT=N",
                        help="keep N pages of SPLIT, spread over its documents (e.g. train=400)")

    audit = sub.add_parser("audit", help="draw the labels of pages from different documents")
    audit.add_argument("corpus", type=Path)
    audit.add_argument("out", type=Path, help="a PNG contact sheet; one PNG per page goes beside it")
    audit.add_argument("--pages", type=int, default=50)
    audit.add_argument("--per-package", type=int, default=None,
                       help="instead of --pages: this many pages of each package, one row per package")
    audit.add_argument("--split", choices=["train", "val"], default="train")
    audit.add_argument("--seed", type=int, default=0)
    return parser


def _check_positive(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive number")


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.action == "fetch":
        names = (list(RECIPE_PACKAGES) if args.recipe else []) + args.packages or list(DEBIAN_PACKAGES)
        for name, path in fetch_debian_packages(names, args.dest).items():
            print(f"[corpus] {name}: {path}")
        return 0
    if args.action == "build":
        for name in ("max_docs_per_package", "max_pages_per_package", "max_pages_per_doc", "page_size",
                     "shard_pages", "workers"):
            _check_positive(f"--{name.replace('_', '-')}", getattr(args, name))
        if not 0 <= args.val_fraction < 1 or not 0 <= args.min_coverage <= 1:
            raise ValueError("--val-fraction must be in [0, 1) and --min-coverage in [0, 1]")
        settings = BuildSettings(
            label=LabelSettings(page_size=args.page_size, max_pages_per_doc=args.max_pages_per_doc,
                                min_coverage=args.min_coverage, seed=args.seed),
            max_docs_per_package=args.max_docs_per_package, max_pages_per_package=args.max_pages_per_package,
            val_fraction=args.val_fraction, shard_pages=args.shard_pages, seed=args.seed)
        summary = build_corpus(args.src, args.out, settings, workers=args.workers)
        print(json.dumps({k: summary[k] for k in summary if k not in ("packages",)}, indent=1, default=str))
        return 0
    if args.action == "export":
        path = export_coco(args.corpus, args.annotations, split=args.split, max_pages=args.max_pages)
        print(f"[corpus] wrote {path}")
        return 0
    if args.action == "shrink":
        limits = {}
        for spec in args.max_pages:
            split, _, count = spec.partition("=")
            if not split or not count.isdigit() or int(count) < 1:
                raise ValueError(f"--max-pages {spec!r}: give SPLIT=N with N >= 1, e.g. train=400")
            limits[split] = int(count)
        summary = shrink_corpus(args.corpus, args.out, max_side=args.max_side, quality=args.quality,
                                max_pages=limits)
        print(f"[corpus] wrote {args.out}: {summary['pages']} pages")
        return 0
    if args.action == "audit":
        path = draw_audit(args.corpus, args.out, pages=args.pages, split=args.split, seed=args.seed,
                          per_package=args.per_package)
        print(f"[corpus] wrote {path}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
