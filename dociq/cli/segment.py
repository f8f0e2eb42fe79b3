"""`dociq segment`: segment whole documents (PDFs, images, folders of them) and write every page's
regions and question answers as JSON, COCO, Label Studio tasks or a DoclingDocument.

    dociq segment CKPT paper.pdf scans/ --out results/ [--question "the total" ...] [--pages 1-3,5]
        [--format json coco labelstudio docling] [--overlay pictures/] [--no-regions] [--threads 2]
        [--backend onnx]     (CKPT: a folder from `dociq export CKPT DIR --onnx`; onnxruntime, no torch)

One page at a time through dociq.inference.documents.DocumentSegmenter; files as
dociq.cli.segment_outputs writes them. Resumable: a document whose files all exist is skipped.
A document that cannot be read is named on stderr and counted, and the run goes on. Exit status:
0 when at least one document was segmented or skipped, 1 when every document failed, 2 for a
usage error (one line on stderr; `--debug` shows the traceback). docs/segment.md has the formats.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from dociq.cli import one_line, report_errors
from dociq.cli.backend import add_backend_arguments, load_backend
from dociq.cli.page_input import check_dpi
from dociq.cli.segment_outputs import FORMATS, DocumentOutputs, Target, write_label_config
from dociq.data.ocr import TesseractOCR
from dociq.inference.automatic import DEFAULT_SEEDS, SEEDS
from dociq.inference.document_formats import new_docling
from dociq.inference.documents import OCR_MODES, DocumentSegmenter, document_kind, page_count
from dociq.io.track import track
from dociq.io.walk import Skipped, printable, skip_report, walk_documents

_PAGES_FORM = "give pages from 1 as a comma list of numbers and ranges, e.g. 1-3,5 or 4- (page 4 to the end)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dociq segment", description="Segment whole documents: PDFs, images and "
                                "folders of them (recursively).")
    p.add_argument("checkpoint", help="a stage=finetune checkpoint (.ckpt) or a from_pretrained folder")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="a PDF, an image, or a folder of them")
    p.add_argument("--out", required=True, type=Path, help="folder for the results (one file per document "
                   "and format)")
    p.add_argument("--question", action="append", default=[], help="ask this of every page (repeat for more)")
    p.add_argument("--format", nargs="+", default=["json"], choices=FORMATS,
                   help="formats to write besides dociq's JSON, which is always written (default: json)")
    p.add_argument("--pages", help="pages of every document, from 1: e.g. 1-3,5 or 4- (default: all)")
    p.add_argument("--overlay", type=Path, help="also draw every page with its regions and a legend into this folder")
    p.add_argument("--seeds", nargs="+", default=list(DEFAULT_SEEDS), choices=list(SEEDS),
                   help="how regions are found (as dociq segment-page; default: ocr_blocks class_boxes)")
    p.add_argument("--no-regions", action="store_true", help="only answer the questions: no automatic regions")
    p.add_argument("--ocr", default="auto", choices=OCR_MODES,
                   help="auto: a PDF's text layer, tesseract for pages without one and for images; tesseract: "
                        "every page; none: never tesseract (default: auto)")
    p.add_argument("--dpi", type=float, default=144.0, help="render PDF pages at this resolution (default 144)")
    add_backend_arguments(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks (and stop at the first failed document)")
    return p


def parse_pages(spec: str) -> list[tuple[int, int | None]]:
    """'1-3,5,9-' -> [(1, 3), (5, 5), (9, None)] (None: to the last page); a ValueError says what is wrong."""
    ranges = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:(-)\s*(\d*)\s*)?", part)
        if not match:
            raise ValueError(f"--pages {spec!r}: {part.strip()!r} is not a page or a range; {_PAGES_FORM}")
        first = int(match.group(1))
        last = (int(match.group(3)) if match.group(3) else None) if match.group(2) else first
        if first < 1:
            raise ValueError(f"--pages {spec!r}: pages are numbered from 1; {_PAGES_FORM}")
        if last is not None and last < first:
            raise ValueError(f"--pages {spec!r}: the range {first}-{last} runs backwards; write {last}-{first}")
        ranges.append((first, last))
    return ranges


def select_pages(ranges: list[tuple[int, int | None]] | None, count: int) -> list[int]:
    """The pages (from 1, sorted, each once) of a `count`-page document that `ranges` names."""
    if ranges is None:
        return list(range(1, count + 1))
    chosen = set()
    for first, last in ranges:
        chosen.update(range(first, min(count, last if last is not None else count) + 1))
    return sorted(chosen)


@dataclass
class Document:
    path: Path
    rel: tuple[str, ...]            # where its outputs go under OUT: folders, then the name
    pages: list[int] = field(default_factory=list)

    @property
    def source(self) -> str:
        return printable(self.path)


def collect_documents(inputs: list[str]) -> tuple[list[Document], list[Skipped]]:
    """The documents of the INPUTs (a file as it is; a folder walked by dociq.io.walk), and what the
    walks left out. Outputs are named by stem; documents whose stems clash keep their suffix."""
    docs, skipped = [], []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            walked = walk_documents(path, document_kind)
            skipped += walked.skipped
            docs += [Document(f.path, f.parts) for f in walked.files]
        elif path.is_file():
            docs.append(Document(path, (path.name,)))
        else:
            raise FileNotFoundError(f"{printable(path)}: no such file or folder; give PDFs, images or folders of them")
    stems = Counter((*d.rel[:-1], Path(d.rel[-1]).stem) for d in docs)
    for d in docs:
        if stems[(*d.rel[:-1], Path(d.rel[-1]).stem)] == 1:
            d.rel = (*d.rel[:-1], Path(d.rel[-1]).stem)
    first: dict[tuple[str, ...], Document] = {}
    for d in docs:
        other = first.setdefault(d.rel, d)
        if other is not d:
            raise ValueError(f"{other.source} and {d.source} would both write {'/'.join(d.rel)}.json under --out: "
                             "segment them in separate runs (or give their common folder as the INPUT)")
    return docs, skipped


def check_run(args, docs: list[Document]) -> None:
    """Usage errors found before the model loads: a missing optional library or program."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: give 1 or more")
    if args.no_regions and not args.question:
        raise ValueError("--no-regions without --question leaves nothing to segment: add --question or drop "
                         "--no-regions")
    if "docling" in args.format:
        new_docling("check")                           # the one-line error when docling-core is missing
    images = [d for d in docs if document_kind(d.path.name) == "image"]
    if images and args.ocr != "none":
        try:
            TesseractOCR()
        except RuntimeError as err:
            raise ValueError(f"{len(images)} image(s) need OCR, but {err}; or --ocr none") from err


@dataclass
class Tally:
    done: int = 0
    skipped: int = 0
    failed: int = 0
    pages: int = 0


def fail(tally: Tally, doc: Document, err: BaseException) -> None:
    message = one_line(err)
    if message.startswith(str(doc.path) + ": "):
        message = message[len(str(doc.path)) + 2:]
    tqdm.write(f"dociq segment: failed {doc.source}: {message}", file=sys.stderr)
    tally.failed += 1


def plan(args, docs: list[Document], ranges, tally: Tally) -> list[tuple[Document, Target]]:
    """The documents to segment: their pages chosen, those already done counted as skipped."""
    todo = []
    for doc in docs:
        try:
            count = page_count(doc.path)
            doc.pages = select_pages(ranges, count)
            if not doc.pages:
                raise ValueError(f"--pages {args.pages} names none of its {count} page(s)")
        except Exception as err:  # noqa: BLE001 — any unreadable document is counted, the run goes on
            if args.debug:
                raise
            fail(tally, doc, err)
            continue
        target = Target(args.out.joinpath(*doc.rel), args.overlay.joinpath(*doc.rel) if args.overlay else None)
        if all(p.is_file() for p in target.files(args.format, doc.pages)):
            tally.skipped += 1
        else:
            todo.append((doc, target))
    return todo


def segment_all(args, segmenter: DocumentSegmenter, todo, tally: Tally, model_version: str) -> None:
    """Every page of every document to do, one at a time, with a progress bar (pages/s)."""
    jobs = [(doc, target, n) for doc, target in todo for n in doc.pages]
    outputs, broken = None, set()
    for doc, target, n in track(jobs, total=len(jobs), desc="segment", unit="page"):
        if doc.source in broken:
            continue
        try:
            if n == doc.pages[0]:
                outputs = DocumentOutputs(doc.source, target, args.format, segmenter.categories, args.question,
                                          model_version, args.out)
            outputs.add(segmenter.segment_page(doc.path, n))
            tally.pages += 1
            if n == doc.pages[-1]:
                outputs.write()
                tally.done += 1
        except Exception as err:  # noqa: BLE001 — a bad page fails its document, not the run
            if args.debug:
                raise
            broken.add(doc.source)
            fail(tally, doc, err)


def run(args) -> int:
    ranges = parse_pages(args.pages) if args.pages else None
    check_dpi(args.dpi)
    args.format = ["json", *(f for f in dict.fromkeys(args.format) if f != "json")]
    docs, skipped = collect_documents(args.inputs)
    for line in skip_report(skipped):
        print(f"dociq segment: {line}", file=sys.stderr)
    if not docs:
        raise ValueError(f"no PDF or image files in {', '.join(args.inputs)} ({len(skipped)} entries skipped); "
                         "give PDFs, images or folders that hold them")
    check_run(args, docs)
    segmenter = DocumentSegmenter(load_backend(args), questions=args.question,
                                  regions=not args.no_regions, seeds=args.seeds, dpi=args.dpi, ocr=args.ocr)
    if "labelstudio" in args.format:
        write_label_config(args.out, [*segmenter.categories[:-1], *args.question])
    tally = Tally()
    todo = plan(args, docs, ranges, tally)
    start = time.monotonic()
    segment_all(args, segmenter, todo, tally, f"dociq:{Path(args.checkpoint).name}")
    seconds = time.monotonic() - start
    print(f"dociq segment: {tally.done} documents done, {tally.skipped} skipped (already done), {tally.failed} "
          f"failed; {tally.pages} pages in {seconds:.1f} s ({tally.pages / max(seconds, 1e-9):.2f} pages/s); "
          f"results in {printable(args.out)}")
    return 1 if tally.failed == len(docs) else 0


def main(argv: list[str] | None = None) -> int:
    """`dociq segment ...`: 0 when a document was segmented or skipped, 1 when all failed, 2 on a usage error."""
    args = build_parser().parse_args(argv)
    return report_errors("segment", lambda: run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
