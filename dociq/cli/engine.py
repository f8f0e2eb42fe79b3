"""`dociq engine ...`: fill a store, see its progress, export it for training.

    dociq engine import   --data DIR SRC [--ocr auto|tesseract|none] [--dpi 150] [--split train]
    dociq engine export   --data DIR --out FILE.json [--split train|heldout] [--include-empty]
    dociq engine progress --data DIR [--json]
    dociq engine split    --data DIR [--fraction 0.2] [--seed 0]
    dociq engine serve    --data DIR [--checkpoint CKPT] [--port 8765]   # dociq.cli.engine_serve
    dociq engine retrain  --data DIR [--steps N] [--checkpoint CKPT]    # dociq.cli.engine_retrain

SRC of `import` is a folder (page images, PDFs, zips), one such file, a COCO JSON, or a FUNSD
folder (the one holding training_data/ and testing_data/). `import` creates the store when
missing; the other commands need an existing store.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from dociq.engine.coco_export import export_coco
from dociq.engine.importer import import_coco, import_folder, import_funsd, split_heldout
from dociq.engine.store import EngineStore, UnknownAnnotationError, UnknownPageError


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog or "dociq engine", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    imp = sub.add_parser("import", help="add pages (folder, PDF, zip, COCO JSON, FUNSD folder) to a store")
    imp.add_argument("--data", required=True, help="the store folder (created when missing)")
    imp.add_argument("src", help="folder / page image / PDF / zip / COCO .json / FUNSD root")
    imp.add_argument("--ocr", default="auto", help="folders: auto|tesseract|none (PDF text layers are always read, except with tesseract); COCO/FUNSD: "
                     "groundtruth (default for them)|tesseract")
    imp.add_argument("--dpi", type=int, default=150, help="PDF render resolution")
    imp.add_argument("--split", default=None, help="store split of the new pages (default train; FUNSD "
                     "testing_data: heldout)")
    imp.add_argument("--image-dir", default=None, help="COCO: where file_names live (default images/ beside)")
    imp.add_argument("--funsd-split", default="training_data", choices=("training_data", "testing_data"))

    exp = sub.add_parser("export", help="write accepted annotations as COCO JSON (+ images/ beside it)")
    exp.add_argument("--data", required=True)
    exp.add_argument("--out", required=True, help="the .json to write; images go to its folder's images/")
    exp.add_argument("--split", default=None, help="only pages of this split (default: all)")
    exp.add_argument("--include-empty", action="store_true", help="also pages without accepted annotations")
    exp.add_argument("--no-category-questions", action="store_true",
                     help="do not add 'segment every <category>' questions")

    prog_p = sub.add_parser("progress", help="pages, accepted/rejected annotations, clicks, rounds")
    prog_p.add_argument("--data", required=True)
    prog_p.add_argument("--json", action="store_true", help="print JSON")

    spl = sub.add_parser("split", help="hold out a fraction of pages (split 'heldout') for evaluation")
    spl.add_argument("--data", required=True)
    spl.add_argument("--fraction", type=float, default=0.2)
    spl.add_argument("--seed", type=int, default=0)

    sub.add_parser("serve", help="the annotation server (dociq.engine.server)", add_help=False)
    sub.add_parser("retrain", help="one retrain round: fine-tune on the accepted annotations, promote "
                   "if held-out mIoU does not drop (dociq.engine.retrain)", add_help=False)
    return parser


def _is_funsd(src: Path) -> bool:
    return src.is_dir() and any((src / s / "annotations").is_dir() for s in ("training_data", "testing_data"))


def run_import(ns) -> int:
    store = EngineStore(ns.data, create=True)
    src = Path(ns.src)
    if src.is_file() and src.suffix.lower() == ".json":
        kind = "COCO"
        result = import_coco(store, src, image_dir=ns.image_dir, split=ns.split or "train",
                             ocr="groundtruth" if ns.ocr == "auto" else ns.ocr)
    elif _is_funsd(src):
        kind = "FUNSD"
        result = import_funsd(store, src, split=ns.funsd_split, store_split=ns.split,
                              ocr="groundtruth" if ns.ocr == "auto" else ns.ocr)
    else:
        kind = "folder"
        result = import_folder(store, src, ocr=ns.ocr, dpi=ns.dpi, split=ns.split or "train")
    print(f"{kind} {src} -> {store.data_dir}: {len(result)} pages added, {len(result.existing)} already "
          f"in the store, {len(result.skipped)} skipped")
    for s in result.skipped:
        print(f"  skipped {s.name}: {s.reason}", file=sys.stderr)
    return 1 if result.skipped and not result and not result.existing else 0


def run_export(ns) -> int:
    store = EngineStore(ns.data)
    path = export_coco(store, ns.out, split=ns.split, category_questions=not ns.no_category_questions,
                       include_empty=ns.include_empty)
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    print(f"wrote {path}: {len(data['images'])} pages, {len(data['annotations'])} regions, "
          f"{sum(len(i['questions']) for i in data['images'])} questions; train on it with "
          f"data=coco data.annotation_file={path}")
    return 0


def run_progress(ns) -> int:
    progress = EngineStore(ns.data).progress()
    if ns.json:
        print(json.dumps(progress, indent=2))
        return 0
    mean = progress["mean_clicks_per_accepted"]
    print(f"pages {progress['pages']} ({', '.join(f'{k} {v}' for k, v in progress['pages_per_split'].items())}), "
          f"{progress['pages_with_accepted']} with accepted annotations")
    print(f"annotations: {progress['accepted']} accepted, {progress['rejected']} rejected, "
          f"{progress['undone']} undone; clicks per accepted: {'-' if mean is None else f'{mean:.2f}'}")
    print(f"rounds: {progress['rounds']}; checkpoint: {progress['checkpoint'] or '-'}")
    return 0


def run_split(ns) -> int:
    held = split_heldout(EngineStore(ns.data), fraction=ns.fraction, seed=ns.seed)
    print(f"{len(held)} pages held out: {' '.join(held)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = {"serve": "dociq.cli.engine_serve", "retrain": "dociq.cli.engine_retrain"}
    if argv and argv[0] in delegated:
        name = delegated[argv[0]]
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            raise ValueError(f"{name} is not part of this install yet: `dociq engine {argv[0]}` "
                             "is not available") from err
        return int(module.main(argv[1:]) or 0)
    ns = build_parser().parse_args(argv)
    try:
        return {"import": run_import, "export": run_export, "progress": run_progress,
                "split": run_split}[ns.command](ns)
    except (UnknownPageError, UnknownAnnotationError) as err:  # KeyErrors: show them as the user's mistake
        raise ValueError(str(err)) from err


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as err:
        print(f"dociq engine: error: {err}", file=sys.stderr)
        sys.exit(2)
