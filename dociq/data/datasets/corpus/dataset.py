"""A built corpus read as `Page`s (map-style, random access), and a seeded mixture of data sets.

`CorpusDocuments` lists the pages of the committed shard manifests (not corpus.json, so a corpus
still being built can be read: it sees the shards committed when it was created) and reads a page
as litdata item -> `record_to_page`. Training draws pages by index (batch = f(seed, step)), so
every page must be reachable by index: each shard is a litdata `StreamingDataset`, used only
through `ds[i]`.

What litdata 0.2.76 does with a local shard folder (checked by reading its source and by listing
the shard folder, ~/.lightning and $LITDATA_CACHE_DIR before and after random reads, iteration and
DataLoader workers):
- No copy, no cache folder, nothing written: a local path gets litdata's "POSIX-fast" profile and
  its chunk files are mmapped in place. Only /teamspace/... paths and object-store URLs
  (s3://, gs://, hf://, local:) are copied into a cache (`cache_dir`, default ~/.lightning/chunks).
  With LITDATA_POSIX_FAST=0 it still reads the folder in place (no cache copy for a local path).
- No chunk is ever deleted from a local folder: deletion (cache eviction) lives in the prefetch
  thread, which litdata only starts for a remote or compressed data set; the store writes shards
  uncompressed (PNG pages are compressed already). Keep it so.
- `ds[i]` is a global index whatever the rank/worker; `len(ds)` is NOT (under torch.distributed it
  is the rank's share), so the page count comes from the manifest and litdata's index.json.
- Each opened shard holds one file descriptor and one mmap, released when the object is dropped:
  a process keeps at most `MAX_OPEN_SHARDS` open (least recently used closed first).
- A `StreamingDataset` opened in one process is not reused in another: readers are created lazily
  per process (a forked DataLoader worker starts with none) and never pickled.
- litdata's PyPI version check is off by default in this version (LITDATA_CHECK_UPDATES=1 turns
  it on), so opening a shard makes no network call.
- It logs two INFO lines per opened shard; `quiet_litdata` raises its loggers to WARNING.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np
from torch.utils.data import Dataset

from dociq.data.datasets.corpus.record import record_to_page
from dociq.data.datasets.corpus.store import SHARD_DIR, Shard, committed_shards
from dociq.data.errors import BadSample, BadSampleError, BadSamplePolicy
from dociq.data.mixture import MixedDocuments  # noqa: F401  (configs of earlier runs name it here)
from dociq.data.schema import Page

log = logging.getLogger("dociq.corpus")

MAX_OPEN_SHARDS = 32
_BUILD_HINT = "run `dociq corpus build SRC OUT` (or `make corpus`) to build one"
_SKIP_HINT = "or pass on_bad_sample='skip' to drop its pages"


def quiet_litdata() -> None:
    """Keep litdata's INFO lines out of every run: it logs two per opened shard (its POSIX-fast
    profile, its cache budget), tens of lines before training starts. Its warnings and errors still
    pass, and a level someone set on the `litdata` logger is left as it is."""
    logger = logging.getLogger("litdata")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


class CorpusDocuments(Dataset):
    """The pages of one split of a corpus built by `dociq corpus build` (`CorpusWriter`).

    root:          the corpus folder (OUT of the build).
    split:         "train", "val", ... or None for every split.
    max_pages:     keep this many pages, spread over documents: documents in a fixed order (a hash
                   of their id, so growing the corpus keeps the earlier choice), first page of each,
                   then second, ...; None keeps all.
    packages:      keep only the pages of these source packages; None keeps all.
    on_bad_sample: "raise" or "skip" (a page that cannot be read then reads as None, is logged once
                   and is listed in `bad_samples`).

    Pages come in storage order (shard, position). Each page's meta has page_id, doc_id, package,
    source, page_index, split, labeller, text_layer, original_size, and the shard it is stored in.
    """

    def __init__(self, root: str | Path, split: str | None = "train", max_pages: int | None = None,
                 packages: Sequence[str] | str | None = None, on_bad_sample: str = "raise") -> None:
        self.root = Path(root)
        self.split = split
        self.policy = BadSamplePolicy(on_bad_sample)
        if max_pages is not None and (not isinstance(max_pages, (int, np.integer)) or max_pages < 1):
            raise ValueError(f"max_pages={max_pages!r}: pass an int >= 1, or None for every page")
        if isinstance(packages, str):
            packages = [packages]
        self.packages = sorted(set(packages)) if packages is not None else None
        shards = self._find_shards()
        entries = [(s, position, page) for s, shard in enumerate(shards)
                   for position, page in enumerate(shard.manifest.get("pages", []))]
        if self.packages is not None:
            entries = self._of_packages(entries)
        if max_pages is not None:
            entries = _spread_over_documents(entries, int(max_pages))
        self._shard_names = [shard.name for shard in shards]
        self._shard_pages = [len(shard.manifest.get("pages", [])) for shard in shards]
        self._shard_of = np.array([s for s, _, _ in entries], dtype=np.int32)
        self._position = np.array([p for _, p, _ in entries], dtype=np.int32)
        self._pages = [page for _, _, page in entries]  # manifest entries: key, doc_id, page_id, package
        self._readers: OrderedDict = OrderedDict()
        self._reader_pid: int | None = None

    # -- the page list --------------------------------------------------------------------------
    def _find_shards(self) -> list[Shard]:
        if not (self.root / SHARD_DIR).is_dir():
            what = "does not exist" if not self.root.exists() else f"has no {SHARD_DIR}/ folder"
            raise FileNotFoundError(f"{self.root}: no corpus here (the folder {what}). Fix: {_BUILD_HINT}, or "
                                    "point root at the OUT folder of a build")
        shards = committed_shards(self.root, self.split)
        if not any(shard.manifest.get("pages") for shard in shards):
            present = sorted({s.split for s in committed_shards(self.root) if s.manifest.get("pages")})
            which = f"split {self.split!r}" if self.split is not None else "any split"
            raise ValueError(f"{self.root}: the corpus has no pages in {which} (splits with pages: "
                             f"{present or 'none'}). Fix: pick one of those splits, wait for the build "
                             f"to commit its first shards, or {_BUILD_HINT}")
        return shards

    def _of_packages(self, entries: list) -> list:
        known = {page.get("package") for _, _, page in entries}
        unknown = [p for p in self.packages if p not in known]
        kept = [e for e in entries if e[2].get("package") in self.packages]
        if not kept:
            raise ValueError(f"{self.root}: no pages of packages {self.packages} in split {self.split!r}. "
                             f"Fix: choose among {sorted(known, key=str)}")
        if unknown:
            log.warning("%s split %s has no pages of packages %s", self.root, self.split, unknown)
        return kept

    # -- Dataset --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pages)

    def __getitem__(self, index: int) -> Page | None:
        index = self._checked_index(index)
        return self.policy.run(index, lambda: self.load_page(index))

    def _checked_index(self, index) -> int:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"page index {index} out of range for {len(self)} pages")
        return index

    @property
    def bad_samples(self) -> list[BadSample]:
        """Pages skipped so far in this process (each DataLoader worker keeps its own list)."""
        return self.policy.bad_samples

    def page_meta(self, index: int) -> dict:
        """key, doc_id, page_id, package and shard of a page, without reading it."""
        index = self._checked_index(index)
        return {**self._pages[index], "shard": self._shard_names[self._shard_of[index]]}

    def stored_item(self, index: int) -> dict:
        """The page at `index` as stored: {"key", "png": image bytes, "json": the record}."""
        index = self._checked_index(index)
        shard, position = int(self._shard_of[index]), int(self._position[index])
        key = self._pages[index]["key"]
        item = self._reader(shard)[position]
        if not isinstance(item, dict) or item.get("key") != key:
            where = self.root / SHARD_DIR / self._shard_names[shard]
            found = item.get("key") if isinstance(item, dict) else type(item).__name__
            raise BadSampleError(where, f"item {position} is {found!r}, but the manifest lists page {key!r} there",
                                 f"{_rebuild_hint(where)}, {_SKIP_HINT}")
        return item

    def load_page(self, index: int) -> Page:
        """The page at `index`; raises BadSampleError whatever `on_bad_sample` says."""
        shard, position = int(self._shard_of[index]), int(self._position[index])
        key = self._pages[index]["key"]
        where = self.root / SHARD_DIR / self._shard_names[shard]
        item = self.stored_item(index)
        try:
            page = record_to_page(item["png"], item["json"])
        except (KeyError, IndexError, TypeError, ValueError, OSError) as err:
            raise BadSampleError(where, f"page {key!r} (item {position}) does not read as a page "
                                 f"({type(err).__name__}: {err})", f"{_rebuild_hint(where)}, {_SKIP_HINT}") from err
        page.meta["shard"] = self._shard_names[shard]
        return page

    # -- litdata readers, per process -------------------------------------------------------------
    def _reader(self, shard: int):
        if self._reader_pid != os.getpid():  # a forked worker: the parent's readers are not ours
            self._readers, self._reader_pid = OrderedDict(), os.getpid()
        reader = self._readers.get(shard)
        if reader is None:
            reader = self._open_shard(shard)
            self._readers[shard] = reader
            while len(self._readers) > MAX_OPEN_SHARDS:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(shard)
        return reader

    def _open_shard(self, shard: int):
        path = self.root / SHARD_DIR / self._shard_names[shard]
        index_file = path / "index.json"
        fix = f"{_rebuild_hint(path)}, {_SKIP_HINT}"
        try:
            chunks = json.loads(index_file.read_text(encoding="utf-8"))["chunks"]
            items = sum(int(chunk["chunk_size"]) for chunk in chunks)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BadSampleError(path, f"the shard's litdata index is missing or unreadable ({err})", fix) from err
        if items != self._shard_pages[shard]:
            raise BadSampleError(path, f"litdata's index lists {items} items but the manifest "
                                 f"{self._shard_pages[shard]} pages", fix)
        from litdata import StreamingDataset

        quiet_litdata()
        try:
            return StreamingDataset(str(path))
        except (OSError, ValueError) as err:
            raise BadSampleError(path, f"litdata cannot open the shard ({err})", fix) from err

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"], state["_reader_pid"] = OrderedDict(), None  # open mmaps stay in their process
        return state


def _rebuild_hint(shard_dir: Path) -> str:
    return (f"delete {shard_dir} and rerun `dociq corpus build` with the same SRC, OUT and flags "
            "(its documents are rebuilt)")


def _doc_rank(doc_id: str) -> str:
    return hashlib.sha1(str(doc_id).encode()).hexdigest()


def _spread_over_documents(entries: list, max_pages: int) -> list:
    """The first `max_pages` entries taking documents in hash order, one page of each per round;
    returned in storage order."""
    by_doc: dict[str, list[int]] = defaultdict(list)
    for i, (_, _, page) in enumerate(entries):
        by_doc[page.get("doc_id", "")].append(i)
    docs = sorted(by_doc, key=_doc_rank)
    chosen: list[int] = []
    depth = 0
    while len(chosen) < max_pages and len(chosen) < len(entries):
        for doc in docs:
            if depth < len(by_doc[doc]):
                chosen.append(by_doc[doc][depth])
                if len(chosen) == max_pages:
                    break
        depth += 1
    return [entries[i] for i in sorted(chosen)]
