"""Small corpus pages for the storage, reader and export tests: 64x48 PNGs with four words, three
regions and two questions, stored as record.py's records, and documents/reports as the build
hands them to `CorpusWriter`. Imported by plain name (tests/ folders have no __init__.py)."""
from __future__ import annotations

import hashlib

import numpy as np

from dociq.data.datasets.corpus.record import RECORD_VERSION, encode_png
from dociq.data.datasets.corpus.store import CorpusWriter

SIZE = (48, 64)  # H, W


def page_key(page_id: str) -> str:
    return hashlib.sha1(page_id.encode()).hexdigest()[:16]


def page_image(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = np.full((*SIZE, 3), 255, np.uint8)
    image[4:12, 4:40] = rng.integers(0, 120, size=(8, 36, 3), dtype=np.uint8)  # a "title"
    image[20:40, 4:60] = rng.integers(0, 200, size=(20, 56, 3), dtype=np.uint8)
    return image


def page_record(doc_id: str, page_index: int, split: str = "train", package: str = "pkg") -> dict:
    """A record as record.py describes it (words in reading order, regions with word ids)."""
    page_id = f"{doc_id}#p{page_index}"
    words = ["Install", f"step{page_index}", "run", doc_id.split("/")[-1]]
    word_boxes = [[4, 4, 20, 11.5], [22, 4, 39.25, 11.5], [4, 22, 18, 29], [20, 22, 58.5, 29]]
    return {
        "version": RECORD_VERSION, "page_id": page_id, "doc_id": doc_id, "package": package,
        "source": doc_id, "page_index": page_index, "split": split, "size": list(SIZE),
        "words": words, "word_boxes": word_boxes, "text_layer": "pdf",
        "regions": [
            {"label": "title", "box": [3.5, 3, 40, 12.25], "word_ids": [0, 1]},
            {"label": "paragraph", "box": [3, 20, 60, 30], "word_ids": [2, 3]},
            {"label": "figure", "box": [10, 33, 30, 45], "word_ids": []},
        ],
        "questions": [
            {"text": "segment every paragraph", "kind": "category", "region_ids": [1]},
            {"text": f"where is step{page_index}?", "kind": "layout", "region_ids": [0, 2]},
        ],
        "labeller": "structure",
    }


def page(doc_id: str, page_index: int, split: str = "train", package: str = "pkg") -> tuple[str, bytes, dict]:
    record = page_record(doc_id, page_index, split, package)
    seed = int(page_key(record["page_id"]), 16) % 2**32
    return page_key(record["page_id"]), encode_png(page_image(seed)), record


def document(doc_id: str, n_pages: int, split: str = "train", package: str = "pkg",
             dropped: dict | None = None) -> tuple[list, dict]:
    """(pages, report) of a labelled document, as the build passes them to add_document."""
    pages = [page(doc_id, i, split, package) for i in range(n_pages)]
    report = {"status": "ok" if pages else "empty", "reason": None, "package": package, "pages_kept": n_pages,
              "pages_dropped": dict(dropped or {}), "hashes": {key: "t:" + key[::-1] for key, _, _ in pages}}
    return pages, report


def bad_document(package: str = "pkg", reason: str = "print_failed") -> tuple[list, dict]:
    return [], {"status": "bad", "reason": reason, "package": package, "pages_kept": 0,
                "pages_dropped": {}, "hashes": {}}


# (doc_id, split, package, pages) of a small corpus: two packages, both splits, a bad document
DOCUMENTS = [
    ("alpha/guide.pdf", "train", "alpha", 3),
    ("alpha/faq.html", "train", "alpha", 2),
    ("beta/manual.pdf", "train", "beta", 3),
    ("beta/broken.pdf", "train", "beta", -1),  # -1: a bad document
    ("beta/notes.html", "val", "beta", 2),
    ("alpha/intro.html", "train", "alpha", 1),
]


def add_documents(writer: CorpusWriter, documents=DOCUMENTS, skip: set | None = None) -> None:
    for doc_id, split, package, n in documents:
        if skip and doc_id in skip:
            continue
        pages, report = bad_document(package) if n < 0 else document(doc_id, n, split, package)
        writer.add_document(doc_id, split, pages, report)


def build(root, shard_pages: int = 4, documents=DOCUMENTS, settings: dict | None = None) -> dict:
    """Write `documents` into a corpus at `root`; the summary of corpus.json."""
    writer = CorpusWriter(root, shard_pages=shard_pages, settings=settings)
    add_documents(writer, documents)
    return writer.close()


def expected_pages(split: str | None = "train", documents=DOCUMENTS) -> dict[str, tuple[bytes, dict]]:
    """page_id -> (png, record) of every page `build` stores in `split` (None: all)."""
    out = {}
    for doc_id, doc_split, package, n in documents:
        if split is not None and doc_split != split:
            continue
        for i in range(max(n, 0)):
            _, png, record = page(doc_id, i, doc_split, package)
            out[record["page_id"]] = (png, record)
    return out
