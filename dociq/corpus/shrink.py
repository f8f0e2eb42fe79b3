"""A smaller copy of a built corpus: pages scaled down and stored as JPEG, every box scaled with them.

    dociq corpus shrink data/corpus data/corpus_512 --max-side 512 --quality 85

A model reads pages at 256-384 px, so the 1,024-px PNGs a build stores are mostly bytes it never
sees. The copy keeps the corpus format (shards, manifests, corpus.json), the documents, splits and
page order, so every `data=corpus*` config and `dociq eval --corpus` read it as they read the
original; it is what travels to a machine the documents and the build tools cannot reach (a GPU
host with a size limit on what it is sent). Words, regions and questions are unchanged; word and
region boxes are multiplied by the scale, and the record's `size` is the new one.

A page is never enlarged. `max_pages` keeps that many pages of a split, spread over its documents
as `CorpusDocuments(max_pages=...)` spreads them.
"""
from __future__ import annotations

import io
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
from PIL import Image

from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.datasets.corpus.record import decode_png
from dociq.data.datasets.corpus.store import SUMMARY_FILE, CorpusWriter, committed_shards


def scaled_record(record: dict, scale: float, size: tuple[int, int]) -> dict:
    """The record of a page resized by `scale` to `size` (H, W): boxes scaled, nothing else changed."""
    out = dict(record)
    out["size"] = [int(size[0]), int(size[1])]
    out["word_boxes"] = [[round(float(v) * scale, 2) for v in box] for box in record["word_boxes"]]
    out["regions"] = [{**r, "box": [round(float(v) * scale, 2) for v in r["box"]]} for r in record["regions"]]
    return out


def shrink_image(image: np.ndarray, max_side: int) -> tuple[Image.Image, float]:
    """The page as a PIL image whose longer side is at most `max_side`, and the scale applied."""
    h, w = image.shape[:2]
    scale = min(1.0, max_side / max(h, w))
    pil = Image.fromarray(image)
    if scale < 1.0:
        pil = pil.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS)
        scale = pil.size[0] / w   # the rounding's own scale, so boxes land on the resized pixels
    return pil, scale


def encode_jpeg(image: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=int(quality), optimize=True)
    return buf.getvalue()


def shrink_corpus(src: str | Path, out: str | Path, max_side: int = 512, quality: int = 85,
                  max_pages: dict[str, int] | None = None, shard_pages: int = 256) -> dict:
    """Write the smaller copy of corpus `src` into `out`; returns its corpus.json summary."""
    src, out = Path(src), Path(out)
    if not (src / SUMMARY_FILE).is_file():
        raise FileNotFoundError(f"{src} has no {SUMMARY_FILE}: give the OUT folder of a finished `dociq corpus build`")
    if max_side < 32 or not 1 <= quality <= 95:
        raise ValueError(f"max_side={max_side} (>= 32) and quality={quality} (1..95) out of range")
    if out.resolve() == src.resolve():
        raise ValueError(f"OUT {out} is the source corpus: pass a new folder")
    max_pages = dict(max_pages or {})
    splits = sorted({s.split for s in committed_shards(src) if s.manifest.get("pages")})
    unknown = sorted(set(max_pages) - set(splits))
    if unknown:
        raise ValueError(f"max_pages names splits {unknown} that {src} does not have (it has {splits})")
    reports = {doc["doc_id"]: doc["report"] for s in committed_shards(src) for doc in s.manifest.get("documents", [])}
    settings = {"shrunk_from": str(src.resolve()), "max_side": int(max_side), "quality": int(quality),
                "max_pages": {k: int(v) for k, v in sorted(max_pages.items())}}
    with CorpusWriter(out, shard_pages=shard_pages, settings=settings) as writer:
        done = writer.done_documents
        for split in splits:
            data = CorpusDocuments(src, split=split, max_pages=max_pages.get(split))
            documents: OrderedDict[str, list] = OrderedDict()
            for index in range(len(data)):
                documents.setdefault(data.page_meta(index)["doc_id"], []).append(index)
            for doc_id, indices in documents.items():
                if doc_id in done:
                    continue
                pages = []
                for index in indices:
                    item = data.stored_item(index)
                    record = json.loads(item["json"])
                    image, scale = shrink_image(decode_png(item["png"]), max_side)
                    pages.append((item["key"], encode_jpeg(image, quality),
                                  scaled_record(record, scale, (image.size[1], image.size[0]))))
                writer.add_document(doc_id, split, pages, reports.get(doc_id, {}))
        return writer.close()
