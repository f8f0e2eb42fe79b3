"""Corpus storage: labelled pages in litdata shards that are committed whole, so a build resumes.

Layout of a corpus folder (OUT_DIR):

    build.json                    the build settings; a resumed build must use the same ones
    corpus.json                   the summary, written by `CorpusWriter.close()` (absent while a
                                  build is running or after it was killed)
    shards/train-00000/           one committed shard: litdata's chunk-*.bin + index.json (absent
           manifest.json          when the shard has no pages) and the manifest of its documents
    shards/train-00001.tmp/       a shard being written; removed by the next writer

A shard is written into `<name>.tmp/`, fsynced, then renamed to `<name>/` (`os.replace` of a
folder is atomic), so a kill at any moment leaves committed shards and at most a `.tmp` leftover.
A document never straddles two shards and counts as done only once its shard is committed: the
manifests are the build's journal, and a resumed build skips the documents they list.

Manifest (shards/<split>-<n>/manifest.json):
    {"version", "shard", "split",
     "documents": [{"doc_id", "report"}],                    reports as `add_document` got them
     "pages": [{"key", "doc_id", "page_id", "package"}]}      in litdata item order

litdata items are {"key": str, "png": bytes, "json": str} (the record of `record.py`).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dociq.io.atomic import atomic_write_text

log = logging.getLogger("dociq.corpus")

MANIFEST_VERSION = 1
SHARD_DIR = "shards"
MANIFEST = "manifest.json"
BUILD_FILE = "build.json"
SUMMARY_FILE = "corpus.json"
LOCK_FILE = ".writer.lock"
TMP_SUFFIX = ".tmp"
# PNG pages are already compressed; litdata compression would only cost CPU, and an uncompressed
# local shard is read in place (see dataset.py).
CHUNK_BYTES = "64MB"

_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<number>\d{5,})$")


# -- committed shards (shared with the reader) ---------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """A committed shard: its folder and its manifest."""

    path: Path
    split: str
    number: int
    manifest: dict

    @property
    def name(self) -> str:
        return self.path.name


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}"


def committed_shards(root: str | Path, split: str | None = None) -> list[Shard]:
    """The committed shards under `root/shards` (of `split`, or all), by split then number.

    `.tmp` folders and folders without a manifest are not committed and are ignored."""
    shard_root = Path(root) / SHARD_DIR
    if not shard_root.is_dir():
        return []
    out = []
    for path in shard_root.iterdir():
        match = _SHARD_NAME.match(path.name)
        if match is None or not path.is_dir() or (split is not None and match["split"] != split):
            continue
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            continue
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"{manifest_path}: unreadable shard manifest ({err}). Fix: delete {path} and "
                             "rerun `dociq corpus build` with the same flags (its documents are rebuilt)") from err
        out.append(Shard(path, match["split"], int(match["number"]), manifest))
    return sorted(out, key=lambda s: (s.split, s.number))


# -- settings ------------------------------------------------------------------------------------

_MISSING = object()


def _normalised(settings: dict | None) -> dict:
    """The settings as JSON reads them back (tuples -> lists, int keys -> str)."""
    return json.loads(json.dumps(settings or {}, sort_keys=True))


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def settings_differences(built: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two settings dicts (nested dicts compared per key)."""
    a, b = _flatten(built), _flatten(now)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))


# -- the writer ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _PendingPage:
    key: str
    png: bytes
    record_json: str  # serialised when added: a record that is not JSON fails there, not at commit
    page_id: str
    package: str


@dataclass
class _PendingDocument:
    doc_id: str
    report: dict
    pages: list[_PendingPage]


@dataclass
class _SplitBuffer:
    documents: list[_PendingDocument] = field(default_factory=list)
    pages: int = 0


class CorpusWriter:
    """Writes labelled documents into committed shards of `out_dir`; resumes a killed build.

    out_dir:     the corpus folder (created).
    shard_pages: a split's buffered documents are committed as one shard once they hold this many
                 pages (whole documents: a shard may run over by one document's pages).
    settings:    the build settings, stored in build.json on the first run; a later writer with
                 other settings raises (its pages would not match the committed ones). None = {}.

    One writer per folder at a time (a lock file enforces it). Use it as a context manager, or call
    `close()`: that commits what is buffered and writes corpus.json. Leaving the `with` block by an
    exception commits nothing more (buffered documents are redone by the next build), as a kill would.
    """

    def __init__(self, out_dir: str | Path, shard_pages: int = 256, settings: dict | None = None) -> None:
        if not isinstance(shard_pages, int) or shard_pages < 1:
            raise ValueError(f"shard_pages={shard_pages!r}: pass an int >= 1")
        _check_single_process()
        self.out_dir = Path(out_dir)
        self.shard_root = self.out_dir / SHARD_DIR
        self.shard_root.mkdir(parents=True, exist_ok=True)
        self.shard_pages = shard_pages
        self._lock = _lock_folder(self.out_dir)
        try:
            self.settings = self._check_settings(_normalised(settings))
            self._remove_leftovers()
            self._shards = committed_shards(self.out_dir)
        except BaseException:
            self._lock.close()
            raise
        self._next_number: dict[str, int] = defaultdict(int)
        for shard in self._shards:
            self._next_number[shard.split] = max(self._next_number[shard.split], shard.number + 1)
        self._buffers: dict[str, _SplitBuffer] = defaultdict(_SplitBuffer)
        self._pending_ids: set[str] = set()
        self._done_ids = {doc["doc_id"] for s in self._shards for doc in s.manifest.get("documents", [])}
        self._closed = False
        self._summary: dict | None = None

    # -- setup ---------------------------------------------------------------------------------
    def _check_settings(self, settings: dict) -> dict:
        path = self.out_dir / BUILD_FILE
        if not path.is_file():
            atomic_write_text(path, json.dumps(settings, indent=1, sort_keys=True))
            return settings
        try:
            built = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{path} is not valid JSON ({err}). Fix: restore it, or pass a new OUT_DIR") from err
        differing = settings_differences(built, settings)
        if differing:
            detail = ", ".join(f"{k}: built with {_flatten(built).get(k, '<unset>')!r}, now "
                               f"{_flatten(settings).get(k, '<unset>')!r}" for k in differing)
            raise ValueError(
                f"{self.out_dir} holds a corpus built with other settings ({detail}). Fix: pass a new "
                f"OUT_DIR for these settings, or rerun with the same flags to resume the build "
                f"(the settings are in {path})")
        return settings

    def _remove_leftovers(self) -> None:
        """A killed build's half-written shards, and the summary of an older finished build (a
        corpus.json present means the build finished)."""
        for path in self.shard_root.glob(f"*{TMP_SUFFIX}"):
            log.info("removing %s, left by a killed build", path)
            shutil.rmtree(path)
        (self.out_dir / SUMMARY_FILE).unlink(missing_ok=True)

    # -- what is done ---------------------------------------------------------------------------
    @property
    def done_documents(self) -> dict[str, dict]:
        """doc_id -> report of every document in a committed shard (a resumed build skips them)."""
        return {doc["doc_id"]: doc["report"] for s in self._shards for doc in s.manifest.get("documents", [])}

    @property
    def seen_hashes(self) -> dict[str, str]:
        """Near-duplicate page hash -> page_id of every committed page (so dedup survives a resume)."""
        out = {}
        for shard in self._shards:
            page_ids = {p["key"]: p.get("page_id", p["key"]) for p in shard.manifest.get("pages", [])}
            for doc in shard.manifest.get("documents", []):
                for key, digest in (doc["report"].get("hashes") or {}).items():
                    if key in page_ids:
                        out.setdefault(digest, page_ids[key])
        return out

    @property
    def shards(self) -> list[Shard]:
        return list(self._shards)

    # -- writing --------------------------------------------------------------------------------
    def add_document(self, doc_id: str, split: str, pages: list[tuple[str, bytes, dict]], report: dict) -> None:
        """Buffer one document's pages (key, PNG bytes, record) and its report; a split whose buffer
        reaches `shard_pages` pages is committed as a shard. Documents without pages are kept too
        (their reports count in corpus.json) and are committed with their split's next shard."""
        if self._closed:
            raise RuntimeError("CorpusWriter is closed")
        if not isinstance(split, str) or not _SPLIT_NAME.match(split):
            raise ValueError(f"split={split!r}: use letters, digits and '_' (e.g. 'train', 'val')")
        if doc_id in self._done_ids or doc_id in self._pending_ids:
            raise ValueError(f"document {doc_id!r} was added already; skip the ids in `done_documents`")
        try:
            report = json.loads(json.dumps(report))  # fail here, not at commit time, on a bad report
        except (TypeError, ValueError) as err:
            raise ValueError(f"the report of {doc_id!r} is not JSON-serialisable ({err})") from err
        pages = [_pending_page(doc_id, page, report) for page in pages]
        keys = [p.key for p in pages]
        if len(set(keys)) != len(keys):
            raise ValueError(f"document {doc_id!r} has repeated page keys: {sorted(k for k in keys if keys.count(k) > 1)}")
        buffer = self._buffers[split]
        buffer.documents.append(_PendingDocument(doc_id, report, pages))
        buffer.pages += len(pages)
        self._pending_ids.add(doc_id)
        if buffer.pages >= self.shard_pages:
            self.flush(split)

    def flush(self, split: str | None = None) -> None:
        """Commit the buffered documents of `split` (or of every split) now, whatever their count."""
        for name in [split] if split is not None else sorted(self._buffers):
            buffer = self._buffers.get(name)
            if buffer is None or not buffer.documents:
                continue
            shard = self._commit_shard(name, buffer.documents)
            self._shards.append(shard)
            self._next_number[name] = shard.number + 1
            for doc in buffer.documents:
                self._pending_ids.discard(doc.doc_id)
                self._done_ids.add(doc.doc_id)
            self._buffers[name] = _SplitBuffer()

    def _commit_shard(self, split: str, documents: list[_PendingDocument]) -> Shard:
        number = self._next_number[split]
        name = shard_name(split, number)
        final = self.shard_root / name
        tmp = self.shard_root / (name + TMP_SUFFIX)
        if final.exists():
            raise RuntimeError(f"{final} exists already: another build is writing to {self.out_dir}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        pages = [(doc.doc_id, page) for doc in documents for page in doc.pages]
        if pages:
            _write_litdata(tmp, [page for _, page in pages])
        manifest = {
            "version": MANIFEST_VERSION, "shard": name, "split": split,
            "documents": [{"doc_id": doc.doc_id, "report": doc.report} for doc in documents],
            "pages": [{"key": page.key, "doc_id": doc_id, "page_id": page.page_id, "package": page.package}
                      for doc_id, page in pages],
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        _fsync_tree(tmp)
        _commit(tmp, final)
        log.info("committed shard %s: %d documents, %d pages", name, len(documents), len(pages))
        return Shard(final, split, number, manifest)

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> dict:
        """Commit every buffer, write corpus.json (atomically) and return its summary; a second
        call returns the same summary."""
        if self._summary is not None:
            return self._summary
        if self._closed:
            raise RuntimeError("CorpusWriter was abandoned: nothing more is committed")
        try:
            self.flush()
            summary = summarise(self._shards)
            atomic_write_text(self.out_dir / SUMMARY_FILE, json.dumps(summary, indent=1, sort_keys=True))
        finally:
            self._closed = True
            self._lock.close()
        self._summary = summary
        return summary

    def abandon(self) -> None:
        """Release the folder without committing what is buffered (as a kill would)."""
        if not self._closed:
            self._closed = True
            self._lock.close()

    def __enter__(self) -> CorpusWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abandon()
        elif not self._closed:
            self.close()


def summarise(shards: list[Shard]) -> dict:
    """corpus.json: pages and documents per split and package, bad documents and dropped pages by
    reason, counted from the committed manifests."""
    splits: dict[str, dict] = {}
    packages: dict[str, Counter] = defaultdict(Counter)
    statuses, bad, dropped = Counter(), Counter(), Counter()
    for shard in shards:
        entry = splits.setdefault(shard.split, {"pages": 0, "documents": 0, "shards": []})
        entry["shards"].append(shard.name)
        entry["pages"] += len(shard.manifest.get("pages", []))
        pages_of = Counter(p["doc_id"] for p in shard.manifest.get("pages", []))
        for doc in shard.manifest.get("documents", []):
            report = doc["report"]
            entry["documents"] += 1
            package = str(report.get("package", ""))
            packages[package]["documents"] += 1
            packages[package]["pages"] += pages_of[doc["doc_id"]]
            status = str(report.get("status", "ok"))
            statuses[status] += 1
            if status == "bad":
                bad[str(report.get("reason") or "unknown")] += 1
            dropped.update({str(k): int(v) for k, v in (report.get("pages_dropped") or {}).items()})
    return {
        "version": MANIFEST_VERSION,
        "pages": sum(s["pages"] for s in splits.values()),
        "documents": sum(s["documents"] for s in splits.values()),
        "splits": splits,
        "packages": {name: {"pages": c["pages"], "documents": c["documents"]} for name, c in sorted(packages.items())},
        "statuses": dict(sorted(statuses.items())),
        "bad_documents": dict(sorted(bad.items())),
        "dropped_pages": dict(sorted(dropped.items())),
    }


# -- helpers -------------------------------------------------------------------------------------

def _pending_page(doc_id: str, page, report: dict) -> _PendingPage:
    try:
        key, png, record = page
    except (TypeError, ValueError) as err:
        raise ValueError(f"a page of {doc_id!r} is not (key, png bytes, record dict)") from err
    if not isinstance(key, str) or not key or not isinstance(png, (bytes, bytearray)) or not isinstance(record, dict):
        raise ValueError(f"a page of {doc_id!r} is not (key: str, png: bytes, record: dict): "
                         f"got ({type(key).__name__}, {type(png).__name__}, {type(record).__name__})")
    try:
        record_json = json.dumps(record)
    except (TypeError, ValueError) as err:
        raise ValueError(f"the record of page {key!r} of {doc_id!r} is not JSON-serialisable ({err})") from err
    return _PendingPage(key, bytes(png), record_json, str(record.get("page_id", key)),
                        str(record.get("package", report.get("package", ""))))


def _write_litdata(folder: Path, pages: list[_PendingPage]) -> None:
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(folder), chunk_bytes=CHUNK_BYTES)
    for i, page in enumerate(pages):
        writer.add_item(i, {"key": page.key, "png": page.png, "json": page.record_json})
    writer.done()
    writer.merge()  # one writer, rank 0: turns 0.index.json into index.json


def _fsync_tree(folder: Path) -> None:
    """Every file of `folder`, then the folder itself, on disk before the commit rename."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: Path, final: Path) -> None:
    """The commit point: the rename makes the shard, all of it, visible at once."""
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _check_single_process() -> None:
    # BinaryWriter names chunks by rank and merge() waits for every rank's index: under
    # torch.distributed it would wait forever for ranks that never write this shard.
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError("CorpusWriter runs in one process: build the corpus outside distributed training")
    except ImportError:
        pass


class _FolderLock:
    def __init__(self, handle) -> None:
        self._handle = handle

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases the flock
            self._handle = None


def _lock_folder(out_dir: Path) -> _FolderLock:
    """An exclusive lock on out_dir for this writer's lifetime (released by the OS on a kill): a
    second writer would delete the first one's .tmp shard and reuse its shard numbers."""
    import fcntl

    handle = open(out_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"{out_dir} is being written by another corpus build. Fix: wait for it to "
                           "finish, or stop it, then rerun (the build resumes)") from None
    return _FolderLock(handle)

