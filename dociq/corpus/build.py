"""Build a corpus: every PDF and HTML document under a folder → labelled pages in shards.

Documents are processed by a pool of worker processes (each keeps one Chromium for HTML and one
tesseract); results come back in document order and the main process alone writes shards, so a
build is deterministic for its settings and a killed build resumes where its last committed
shard ended (`CorpusWriter`). Near-duplicate pages are dropped against every page kept so far.
A document's split (train / val) is a function of its id, never of its pages.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dociq.corpus.html_print import HtmlPrinter, PrintError, sample_style
from dociq.corpus.label_document import DocumentResult, LabelSettings, label_pdf
from dociq.corpus.sources import SourceDocument, SourceError, list_documents, materialize
from dociq.io.walk import skip_report
from dociq.data.datasets.corpus.store import CorpusWriter
from dociq.data.ocr import TesseractOCR

log = logging.getLogger("dociq.corpus")
# pdfminer warns once per malformed font descriptor, thousands of times over a build
logging.getLogger("pdfminer").setLevel(logging.ERROR)


@dataclass
class BuildSettings:
    label: LabelSettings = field(default_factory=LabelSettings)
    max_docs_per_package: int | None = None
    max_pages_per_package: int | None = None
    val_fraction: float = 0.1
    shard_pages: int = 256
    seed: int = 0
    print_timeout_s: float = 30.0  # Chromium's limit for loading and printing one HTML document

    def to_json(self) -> dict:
        out = asdict(self)
        out["label"] = self.label.to_json()
        return out


def split_of(doc_id: str, val_fraction: float, seed: int = 0) -> str:
    """'val' for a fixed share of documents, chosen by a hash of the document id."""
    # salted: the per-package document cap ranks documents by another hash of the same id, and
    # an unsalted split would send exactly the capped-in documents to 'val'
    u = int(hashlib.sha1(f"split:{seed}:{doc_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if u < val_fraction else "train"


def _style_seed(doc_id: str, seed: int) -> int:
    return int(hashlib.sha1(f"style:{seed}:{doc_id}".encode()).hexdigest()[:8], 16)


# -- one document, in a worker process ---------------------------------------------------------

_WORKER: dict = {}


def _printer(timeout_s: float):
    if "printer" not in _WORKER:
        from multiprocessing.util import Finalize

        printer = HtmlPrinter(timeout_s=timeout_s).__enter__()
        _WORKER["printer"] = printer
        # pool workers leave through multiprocessing's exit hooks, not atexit: close Chromium there
        Finalize(printer, printer.__exit__, args=(None, None, None), exitpriority=10)
    return _WORKER["printer"]


def _close_worker_tools() -> None:
    printer = _WORKER.pop("printer", None)
    if printer is not None:
        printer.__exit__(None, None, None)


def _tesseract():
    if "tesseract" not in _WORKER:
        try:
            _WORKER["tesseract"] = TesseractOCR()
        except (RuntimeError, ImportError) as err:  # no tesseract: image-only pages are dropped
            log.warning("tesseract unavailable (%s); pages without a text layer are dropped", err)
            _WORKER["tesseract"] = None
    return _WORKER["tesseract"]


def process_document(doc: SourceDocument, split: str, settings: BuildSettings) -> DocumentResult:
    """Labelled pages of one document; every failure is a reported reason, never an exception."""
    work = Path(tempfile.mkdtemp(prefix="dociq-corpus-"))
    try:
        try:
            path = materialize(doc, work)
        except (SourceError, ValueError, OSError) as err:
            return DocumentResult(status="bad", reason=f"unreadable_source: {str(err)[:200]}")
        if doc.kind in ("html", "mallard"):
            pdf = work / "printed.pdf"
            try:
                style = sample_style(_style_seed(doc.doc_id, settings.seed))
                # print a few pages more than are labelled: the cap spreads its picks over them
                _printer(settings.print_timeout_s).print_pdf(
                    path, pdf, style, title=Path(doc.doc_id).stem, package=doc.package,
                    max_pages=settings.label.max_pages_per_doc + 4)
            except PrintError as err:
                return DocumentResult(status="bad", reason=f"print_failed: {str(err.reason)[:200]}")
            path = pdf
        return label_pdf(path, doc.doc_id, doc.package, doc.doc_id, split, settings.label,
                         seen_hashes=None, tesseract=_tesseract())
    except Exception as err:  # a bug on one document must not stop a build of thousands
        log.exception("document %s failed", doc.doc_id)
        return DocumentResult(status="bad", reason=f"error: {type(err).__name__}: {str(err)[:200]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _process(args):
    return process_document(*args)


# -- the build ---------------------------------------------------------------------------------

def _reason_key(reason: str | None) -> str:
    return (reason or "").split(":")[0]


def build_corpus(src_dir, out_dir, settings: BuildSettings | None = None, workers: int = 2,
                 progress=print) -> dict:
    """Build (or resume) the corpus of `src_dir` in `out_dir`; returns the summary of corpus.json."""
    settings = settings or BuildSettings()
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if not src_dir.is_dir():
        raise FileNotFoundError(f"{src_dir}: no such folder. Fix: pass a folder of PDF/HTML files "
                                "(or run `make corpus` to fetch the Debian documents)")
    docs, skipped = list_documents(src_dir, settings.max_docs_per_package, settings.seed)
    for line in skip_report(skipped):
        progress(f"[corpus] {line}")
    if not docs:
        raise ValueError(f"{src_dir}: no PDF, HTML or Mallard files found under it ({len(skipped)} entries "
                         "skipped, listed above). Fix: point `dociq corpus build` at a folder that holds documents")
    start = time.time()
    with CorpusWriter(out_dir, shard_pages=settings.shard_pages, settings=settings.to_json()) as writer:
        done = writer.done_documents
        seen = dict(writer.seen_hashes)
        package_pages = Counter()
        for report in done.values():
            package_pages[report.get("package", "")] += int(report.get("pages_kept", 0))
        todo = [d for d in docs if d.doc_id not in done]
        progress(f"[corpus] {len(docs)} documents under {src_dir} ({len(docs) - len(todo)} already built)")
        jobs = [(d, split_of(d.doc_id, settings.val_fraction, settings.seed), settings) for d in todo]
        pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
        results = pool.map(_process, jobs, chunksize=1) if pool else map(_process, jobs)
        try:
            for n, ((doc, split, _), result) in enumerate(zip(jobs, results), start=1):
                _commit(writer, doc, split, result, seen, package_pages, settings)
                if n % 25 == 0 or n == len(jobs):
                    progress(f"[corpus] {n}/{len(jobs)} documents, {sum(package_pages.values())} pages, "
                             f"{time.time() - start:.0f} s")
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
            else:
                _close_worker_tools()  # in-process: Chromium must not outlive the build
        summary = writer.close()
    summary["seconds"] = round(time.time() - start, 1)
    return summary


def _commit(writer, doc: SourceDocument, split: str, result: DocumentResult, seen: dict,
            package_pages: Counter, settings: BuildSettings) -> None:
    cap = settings.max_pages_per_package
    kept, dropped, hashes = [], Counter(result.dropped), {}
    for key, png, record in result.pages:
        h = result.hashes[key]
        if h in seen:
            dropped["near_duplicate"] += 1
            continue
        if cap is not None and package_pages[doc.package] + len(kept) >= cap:
            dropped["package_cap"] += 1
            continue
        seen[h] = record["page_id"]
        hashes[key] = h
        kept.append((key, png, record))
    package_pages[doc.package] += len(kept)
    status = result.status if kept or result.status == "bad" else "empty"
    report = {"status": status, "reason": _reason_key(result.reason) or None, "detail": result.reason,
              "package": doc.package, "kind": doc.kind, "pages_kept": len(kept),
              "pages_dropped": dict(dropped), "hashes": hashes, "labellers": dict(result.labellers)}
    writer.add_document(doc.doc_id, split, kept, report)


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))
