"""The data engine's store: pages, their words, and the masks annotators accept or reject.

Layout of a store folder `<data>/`:
  engine.sqlite      pages, annotations, history, rounds, settings (SQLite, WAL mode)
  pages/<id>.png     the page images, written atomically (temp file + os.replace)

Why SQLite (stdlib `sqlite3`) and not JSON files:
- every save is one transaction (`BEGIN IMMEDIATE ... COMMIT`): it is in the store completely or
  not at all, so a killed server or a crashed annotator's browser never leaves half an annotation;
- WAL journal with `synchronous=FULL`: a committed save survives a crash of the process (and of
  the machine), and readers never block the writer;
- several writers (server workers, an import, a retrain round recording its metrics) are
  serialised by SQLite's write lock; a waiting writer retries for `BUSY_TIMEOUT_S` seconds;
- `history` is append-only (triggers refuse UPDATE/DELETE): undo and relabel add events, nothing
  an annotator did is ever overwritten, so a round can be audited or replayed.

sqlite3 connections cannot be shared between threads (nor across fork), so each thread of each
process opens its own, lazily (`threading.local`, re-opened when the process id changes).

Masks are stored as compressed COCO RLE (`dociq.io.rle`) in JSON: small, exact, and what the COCO
export writes unchanged.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from pycocotools import mask as mask_util

from dociq.data.errors import check_boxes_in_page
from dociq.data.image_io import load_page_image
from dociq.io.atomic import atomic_write_bytes
from dociq.io.rle import decode_rle, encode_rle   # the one COCO RLE codec; also this module's names

DB_NAME = "engine.sqlite"
PAGES_DIR = "pages"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0
STATUSES = ("accepted", "rejected")
# Question kinds, as in dociq.data.schema.QUESTION_KINDS (kept in step by a test).
KINDS = ("layout", "reading", "cell", "category", "link")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pages (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    width      INTEGER NOT NULL,
    height     INTEGER NOT NULL,
    source     TEXT NOT NULL,
    split      TEXT NOT NULL,
    words      TEXT NOT NULL,          -- JSON list of str
    word_boxes TEXT NOT NULL,          -- JSON [[x0, y0, x1, y1], ...] page pixels
    sha256     TEXT NOT NULL,          -- of the decoded pixels: re-imports find their page
    created    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pages_sha ON pages(sha256);
CREATE TABLE IF NOT EXISTS annotations (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    page_id  TEXT NOT NULL REFERENCES pages(id),
    question TEXT NOT NULL,
    category TEXT,
    status   TEXT NOT NULL,
    clicks   INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    author   TEXT NOT NULL,
    seconds  REAL,
    created  REAL NOT NULL,
    rle      TEXT NOT NULL,            -- JSON compressed COCO RLE {"size": [H, W], "counts": str}
    area     INTEGER NOT NULL,
    bbox     TEXT NOT NULL,            -- JSON [x, y, w, h] (COCO)
    undone   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS annotations_page ON annotations(page_id);
CREATE TABLE IF NOT EXISTS history (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    time          REAL NOT NULL,
    event         TEXT NOT NULL,
    page_id       TEXT,
    annotation_id INTEGER,
    detail        TEXT NOT NULL        -- JSON object
);
CREATE INDEX IF NOT EXISTS history_page ON history(page_id);
CREATE TRIGGER IF NOT EXISTS history_no_update BEFORE UPDATE ON history
    BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER IF NOT EXISTS history_no_delete BEFORE DELETE ON history
    BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TABLE IF NOT EXISTS rounds (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    metrics TEXT NOT NULL              -- JSON object
);
"""


class NotAStoreError(FileNotFoundError):
    """The folder holds no engine.sqlite (and create=False)."""


class _UnknownIdError(KeyError):
    """A KeyError whose message reads as written (KeyError's own str() quotes it)."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownPageError(_UnknownIdError):
    def __init__(self, page_id: str, data_dir: str | Path = ""):
        self.page_id = page_id
        where = f" in the store {data_dir}" if data_dir else ""
        super().__init__(f"no page {page_id!r}{where}. Fix: use an id from store.pages() "
                         "(ids look like 'p000001')")


class UnknownAnnotationError(_UnknownIdError):
    def __init__(self, annotation_id: int, data_dir: str | Path = ""):
        self.annotation_id = annotation_id
        where = f" in the store {data_dir}" if data_dir else ""
        super().__init__(f"no annotation {annotation_id!r}{where}. Fix: use an id returned by "
                         "save_annotation() or listed by store.annotations(status=None)")


@dataclass
class PageRecord:
    id: str
    width: int
    height: int
    source: str
    split: str
    num_words: int
    num_accepted: int

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) in pixels."""
        return self.height, self.width


@dataclass
class AnnotationRecord:
    id: int
    page_id: str
    question: str
    category: str | None
    status: str
    clicks: int
    kind: str
    author: str
    created: float
    rle: dict
    seconds: float | None = None
    area: int = 0
    bbox: list[float] = field(default_factory=list)  # COCO [x, y, w, h]
    _mask: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def mask(self) -> np.ndarray:
        """bool [H, W], decoded from `rle` on first use."""
        if self._mask is None:
            self._mask = decode_rle(self.rle)
        return self._mask

    def to_json(self) -> dict:
        """JSON-safe dict without the decoded mask (the server sends this)."""
        return {"id": self.id, "page_id": self.page_id, "question": self.question, "category": self.category,
                "status": self.status, "clicks": self.clicks, "kind": self.kind, "author": self.author,
                "created": self.created, "seconds": self.seconds, "area": self.area, "bbox": self.bbox,
                "rle": self.rle}


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def _page_id(seq: int) -> str:
    return f"p{seq:06d}"


class EngineStore:
    """Pages and annotations of one data-engine folder (see the module doc for why SQLite).

    EngineStore(data_dir, create=False): open `data_dir/engine.sqlite`; with create=True make the
    folder and the store when missing. Safe to use from many threads and processes at once.
    """

    def __init__(self, data_dir: str | Path, create: bool = False):
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.db_path = self.data_dir / DB_NAME
        self.pages_dir = self.data_dir / PAGES_DIR
        self._local = threading.local()
        if not self.db_path.is_file():
            if not create:
                raise NotAStoreError(
                    f"{self.data_dir} is not a dociq engine store (it has no {DB_NAME}). Fix: create one "
                    f"with `dociq engine import --data {self.data_dir} <pages folder>` or "
                    "EngineStore(path, create=True)")
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self.pages_dir.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        # WAL is a property of the database file: set it once (idempotent), before the schema.
        conn.execute("PRAGMA journal_mode=WAL")
        # The schema in one transaction: concurrent openers of a new store wait on the lock.
        conn.executescript("BEGIN IMMEDIATE;\n" + _SCHEMA +
                           f"INSERT OR IGNORE INTO settings(key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');\n"
                           "COMMIT;")
        version = self._setting("schema_version")
        if version != str(SCHEMA_VERSION):
            raise RuntimeError(f"{self.db_path} has schema version {version}, this dociq reads "
                               f"{SCHEMA_VERSION}. Fix: use the dociq version that wrote it")

    def __repr__(self) -> str:
        return f"EngineStore({str(self.data_dir)!r})"

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (a new one after fork: sqlite3 handles must not cross it)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=True)
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.row_factory = sqlite3.Row
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this thread's connection (others close when their thread's store is collected)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock up front (no deadlock
        between two readers upgrading), COMMIT makes it durable, any exception rolls back."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        return self._conn().execute(sql, params).fetchall()

    def _setting(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    @staticmethod
    def _event(conn, event: str, page_id: str | None, annotation_id: int | None, **detail) -> None:
        conn.execute("INSERT INTO history(time, event, page_id, annotation_id, detail) VALUES (?, ?, ?, ?, ?)",
                     (time.time(), event, page_id, annotation_id, json.dumps(detail)))

    def integrity_check(self) -> str:
        """SQLite's `PRAGMA integrity_check`: 'ok' for a sound database file."""
        return self._query("PRAGMA integrity_check")[0][0]

    # -- pages ---------------------------------------------------------------------------------
    def add_page(self, image: np.ndarray, words: list[str], word_boxes: np.ndarray, source: str,
                 split: str = "train") -> str:
        """Store a page image (uint8 [H, W, 3]) with its words (boxes float [N, 4] x0,y0,x1,y1 px);
        returns its id ('p000001', ...), stable for the life of the store."""
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape[:2]:
            raise ValueError(f"image: need uint8 [H, W, 3] RGB, got {image.dtype} {list(image.shape)}. "
                             "Fix: load it with dociq.data.image_io.load_page_image")
        words = [str(w) for w in words]
        boxes = np.asarray(word_boxes, dtype=np.float64).reshape(-1, 4) if len(words) else np.zeros((0, 4))
        if len(boxes) != len(words):
            raise ValueError(f"word_boxes: {len(boxes)} boxes for {len(words)} words. Fix: one box per word")
        if not isinstance(split, str) or not split:
            raise ValueError(f"split: {split!r} is not a split name (e.g. 'train', 'heldout')")
        h, w = image.shape[:2]
        # Boxes a little outside the page (rounding, OCR) are clipped; far outside or inverted is an
        # error naming the word, so everything stored reads back through data=coco.
        boxes = check_boxes_in_page(boxes, (h, w), source, lambda i: f"word_boxes[{i}] ({words[i]!r})")
        digest = image_sha256(image)
        png = encode_png(image)  # before the write lock: encoding a big page takes a while
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO pages(id, width, height, source, split, words, word_boxes, sha256, created) "
                "VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?)",
                (w, h, str(source), split, json.dumps(words), json.dumps(boxes.tolist()), digest, time.time()))
            page_id = _page_id(cur.lastrowid)
            c.execute("UPDATE pages SET id = ? WHERE seq = ?", (page_id, cur.lastrowid))
            # The image is written inside the transaction: a crash before COMMIT leaves at worst an
            # unlisted PNG (overwritten when the id is next used), never a listed page without one.
            atomic_write_bytes(self.page_path(page_id), png)
            self._event(c, "page_added", page_id, None, source=str(source), split=split)
        return page_id

    def _page_row(self, page_id: str) -> sqlite3.Row:
        rows = self._query("SELECT * FROM pages WHERE id = ?", (str(page_id),))
        if not rows:
            raise UnknownPageError(page_id, self.data_dir)
        return rows[0]

    _PAGE_SQL = ("SELECT p.id, p.width, p.height, p.source, p.split, json_array_length(p.words) AS num_words, "
                 "(SELECT COUNT(*) FROM annotations a WHERE a.page_id = p.id AND a.status = 'accepted' "
                 "AND a.undone = 0) AS num_accepted FROM pages p")

    def pages(self, split: str | None = None) -> list[PageRecord]:
        """Every page in the order added (only `split` when given)."""
        if split is None:
            rows = self._query(self._PAGE_SQL + " ORDER BY p.seq")
        else:
            rows = self._query(self._PAGE_SQL + " WHERE p.split = ? ORDER BY p.seq", (split,))
        return [PageRecord(**dict(r)) for r in rows]

    def page(self, page_id: str) -> PageRecord:
        rows = self._query(self._PAGE_SQL + " WHERE p.id = ?", (str(page_id),))
        if not rows:
            raise UnknownPageError(page_id, self.data_dir)
        return PageRecord(**dict(rows[0]))

    def page_path(self, page_id: str) -> Path:
        return self.pages_dir / f"{page_id}.png"

    def page_image(self, page_id: str) -> np.ndarray:
        self._page_row(page_id)
        return load_page_image(self.page_path(page_id), max_page_pixels=None)

    def page_words(self, page_id: str) -> tuple[list[str], np.ndarray]:
        """(words, float32 [N, 4] x0, y0, x1, y1 page pixels)."""
        row = self._page_row(page_id)
        return json.loads(row["words"]), np.array(json.loads(row["word_boxes"]), np.float32).reshape(-1, 4)

    def page_by_hash(self, sha256: str) -> str | None:
        """The id of a page with these pixels (`image_sha256`), or None."""
        rows = self._query("SELECT id FROM pages WHERE sha256 = ? ORDER BY seq LIMIT 1", (sha256,))
        return rows[0]["id"] if rows else None

    def set_split(self, page_ids: list[str], split: str) -> None:
        """Move pages to `split` ('train', 'heldout', ...), in one transaction."""
        if not isinstance(split, str) or not split:
            raise ValueError(f"split: {split!r} is not a split name (e.g. 'train', 'heldout')")
        with self._write() as c:
            for pid in page_ids:
                if c.execute("UPDATE pages SET split = ? WHERE id = ?", (split, str(pid))).rowcount != 1:
                    raise UnknownPageError(pid, self.data_dir)
                self._event(c, "split_set", str(pid), None, split=split)

    # -- annotations ---------------------------------------------------------------------------
    def save_annotation(self, page_id: str, mask: np.ndarray, question: str, category: str | None = None,
                        status: str = "accepted", clicks: int = 0, kind: str = "layout", author: str = "",
                        seconds: float | None = None) -> int:
        """Store one annotator decision on a page: the mask (bool [H, W]) for `question`, accepted or
        rejected; returns the annotation id. One transaction, with its 'saved' history event."""
        page = self._page_row(page_id)
        mask = self._check_mask(mask, (page["height"], page["width"]), page_id)
        if status not in STATUSES:
            raise ValueError(f"status: {status!r} is not one of {STATUSES}")
        if status == "accepted" and not mask.any():
            raise ValueError(f"mask: an accepted annotation on page {page_id} needs at least one pixel. "
                             "Fix: draw the region, or save it with status='rejected'")
        if not isinstance(question, str):
            raise ValueError(f"question: need a str, got {type(question).__name__}")
        if category is not None and (not isinstance(category, str) or not category.strip()):
            raise ValueError(f"category: {category!r} is not a category name (or None)")
        if not question.strip() and category is None:
            raise ValueError("question: an annotation needs a question or a category. Fix: pass the "
                             "question it answers, or category=<class name>")
        if kind not in KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {KINDS}")
        if isinstance(clicks, bool) or not isinstance(clicks, (int, np.integer)) or clicks < 0:
            raise ValueError(f"clicks: {clicks!r} is not a count of clicks (int >= 0)")
        if seconds is not None and (not isinstance(seconds, (int, float)) or not np.isfinite(seconds)
                                    or seconds < 0):
            raise ValueError(f"seconds: {seconds!r} is not a duration in seconds (>= 0 or None)")
        rle = encode_rle(mask)
        area = int(mask.sum())
        bbox = [float(v) for v in mask_util.toBbox({"size": rle["size"], "counts": rle["counts"].encode()})]
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO annotations(page_id, question, category, status, clicks, kind, author, seconds, "
                "created, rle, area, bbox) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (str(page_id), question, category, status, int(clicks), kind, str(author),
                 None if seconds is None else float(seconds), time.time(), json.dumps(rle), area,
                 json.dumps(bbox)))
            ann_id = int(cur.lastrowid)
            self._event(c, "saved", str(page_id), ann_id, status=status, question=question, category=category,
                        clicks=int(clicks), kind=kind, author=str(author), area=area)
        return ann_id

    @staticmethod
    def _check_mask(mask, size: tuple[int, int], page_id: str) -> np.ndarray:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            if mask.dtype.kind not in "iu" or not np.isin(mask, (0, 1)).all():
                raise ValueError(f"mask: need bool [H, W] (or 0/1 integers), got {mask.dtype}")
            mask = mask.astype(bool)
        if mask.shape != tuple(size):
            raise ValueError(f"mask: shape {list(mask.shape)} but page {page_id} is {size[0]}x{size[1]} (HxW). "
                             "Fix: predict/draw the mask at the page's size")
        return mask

    def annotations(self, page_id: str | None = None, status: str | None = "accepted",
                    include_undone: bool = False) -> list[AnnotationRecord]:
        """Annotations in save order; `status=None` gives accepted and rejected. Undone ones are left
        out unless include_undone."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status: {status!r} is not one of {STATUSES} or None")
        where, params = [], []
        if page_id is not None:
            self._page_row(page_id)
            where.append("page_id = ?")
            params.append(str(page_id))
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if not include_undone:
            where.append("undone = 0")
        sql = "SELECT * FROM annotations" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [self._record(r) for r in self._query(sql, tuple(params))]

    def annotation(self, annotation_id: int) -> AnnotationRecord:
        rows = self._query("SELECT * FROM annotations WHERE id = ?", (int(annotation_id),))
        if not rows:
            raise UnknownAnnotationError(annotation_id, self.data_dir)
        return self._record(rows[0])

    @staticmethod
    def _record(r: sqlite3.Row) -> AnnotationRecord:
        return AnnotationRecord(id=r["id"], page_id=r["page_id"], question=r["question"], category=r["category"],
                                status=r["status"], clicks=r["clicks"], kind=r["kind"], author=r["author"],
                                created=r["created"], rle=json.loads(r["rle"]), seconds=r["seconds"],
                                area=r["area"], bbox=json.loads(r["bbox"]))

    def undo(self, annotation_id: int) -> None:
        """Withdraw an annotation: it stays in the database, marked undone, with an 'undone' event."""
        with self._write() as c:
            rows = c.execute("SELECT page_id, undone FROM annotations WHERE id = ?", (int(annotation_id),)).fetchall()
            if not rows:
                raise UnknownAnnotationError(annotation_id, self.data_dir)
            if rows[0]["undone"]:
                raise ValueError(f"annotation {annotation_id} is already undone")
            c.execute("UPDATE annotations SET undone = 1 WHERE id = ?", (int(annotation_id),))
            self._event(c, "undone", rows[0]["page_id"], int(annotation_id))

    def relabel(self, annotation_id: int, category: str | None = None, question: str | None = None) -> None:
        """Change the category and/or the question of an annotation (None: keep); the old values go
        into the 'relabelled' event."""
        if category is None and question is None:
            raise ValueError("relabel: pass category=... and/or question=...")
        if category is not None and (not isinstance(category, str) or not category.strip()):
            raise ValueError(f"category: {category!r} is not a category name")
        if question is not None and not isinstance(question, str):
            raise ValueError(f"question: need a str, got {type(question).__name__}")
        with self._write() as c:
            rows = c.execute("SELECT * FROM annotations WHERE id = ?", (int(annotation_id),)).fetchall()
            if not rows:
                raise UnknownAnnotationError(annotation_id, self.data_dir)
            old = rows[0]
            new_cat = old["category"] if category is None else category
            new_q = old["question"] if question is None else question
            if not new_q.strip() and new_cat is None:
                raise ValueError("question: an annotation needs a question or a category")
            c.execute("UPDATE annotations SET category = ?, question = ? WHERE id = ?",
                      (new_cat, new_q, int(annotation_id)))
            self._event(c, "relabelled", old["page_id"], int(annotation_id),
                        old_category=old["category"], category=new_cat, old_question=old["question"],
                        question=new_q)

    def history(self, page_id: str | None = None) -> list[dict]:
        """Append-only events in order: {id, time (unix s), timestamp (ISO UTC), event, page_id,
        annotation_id, **detail}. Events: page_added, saved, undone, relabelled, split_set,
        checkpoint, round."""
        if page_id is None:
            rows = self._query("SELECT * FROM history ORDER BY id")
        else:
            rows = self._query("SELECT * FROM history WHERE page_id = ? ORDER BY id", (str(page_id),))
        out = []
        for r in rows:
            d = json.loads(r["detail"])
            d.update(id=r["id"], time=r["time"], timestamp=_iso(r["time"]), event=r["event"],
                     page_id=r["page_id"], annotation_id=r["annotation_id"])
            out.append(d)
        return out

    # -- progress, rounds, checkpoint ----------------------------------------------------------
    def progress(self) -> dict:
        """Counts for the UI and the retrain loop. mean_clicks_per_accepted is None before the
        first accepted annotation."""
        row = self._query(
            "SELECT (SELECT COUNT(*) FROM pages) AS pages, "
            "(SELECT COUNT(DISTINCT page_id) FROM annotations WHERE status = 'accepted' AND undone = 0) "
            "AS pages_with_accepted, "
            "(SELECT COUNT(*) FROM annotations WHERE status = 'accepted' AND undone = 0) AS accepted, "
            "(SELECT COUNT(*) FROM annotations WHERE status = 'rejected' AND undone = 0) AS rejected, "
            "(SELECT COUNT(*) FROM annotations WHERE undone = 1) AS undone, "
            "(SELECT AVG(clicks) FROM annotations WHERE status = 'accepted' AND undone = 0) AS mean_clicks, "
            "(SELECT AVG(seconds) FROM annotations WHERE status = 'accepted' AND undone = 0) AS mean_seconds, "
            "(SELECT COUNT(*) FROM rounds) AS rounds")[0]
        splits = {r["split"]: r["n"] for r in self._query("SELECT split, COUNT(*) AS n FROM pages GROUP BY split")}
        return {"pages": row["pages"], "pages_with_accepted": row["pages_with_accepted"],
                "accepted": row["accepted"], "rejected": row["rejected"], "undone": row["undone"],
                "mean_clicks_per_accepted": row["mean_clicks"],
                "mean_seconds_per_accepted": row["mean_seconds"],
                "pages_per_split": splits, "rounds": row["rounds"],
                "checkpoint": None if self.checkpoint() is None else str(self.checkpoint())}

    def record_round(self, metrics: dict) -> int:
        """Append a retrain round's metrics (a JSON-serialisable dict); returns the round number."""
        if not isinstance(metrics, dict):
            raise ValueError(f"metrics: need a dict, got {type(metrics).__name__}")
        try:
            blob = json.dumps(metrics, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"metrics: not JSON-serialisable ({err}). Fix: pass plain numbers/strings "
                             "(float(tensor), str(path)); NaN/inf are not allowed") from err
        with self._write() as c:
            cur = c.execute("INSERT INTO rounds(created, metrics) VALUES (?, ?)", (time.time(), blob))
            self._event(c, "round", None, None, round=int(cur.lastrowid))
        return int(cur.lastrowid)

    def rounds(self) -> list[dict]:
        """[{"round": n, "created": unix s, "metrics": {...}}, ...] oldest first."""
        return [{"round": r["id"], "created": r["created"], "metrics": json.loads(r["metrics"])}
                for r in self._query("SELECT * FROM rounds ORDER BY id")]

    def set_checkpoint(self, path: str | Path) -> None:
        """Promote a checkpoint: the server predicts with it from now on (absolute path stored)."""
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist. Fix: pass the path of a saved "
                                    "checkpoint (file or folder)")
        with self._write() as c:
            c.execute("INSERT INTO settings(key, value) VALUES ('checkpoint', ?) "
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (str(path),))
            self._event(c, "checkpoint", None, None, path=str(path))

    def checkpoint(self) -> Path | None:
        value = self._setting("checkpoint")
        return None if value is None else Path(value)


def encode_png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), "RGB").save(buf, format="PNG")
    return buf.getvalue()


def image_sha256(image: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(repr(tuple(image.shape)).encode())
    h.update(np.ascontiguousarray(image, dtype=np.uint8).tobytes())
    return h.hexdigest()


def is_store(data_dir: str | Path) -> bool:
    return (Path(data_dir) / DB_NAME).is_file()


__all__ = ["EngineStore", "PageRecord", "AnnotationRecord", "UnknownPageError", "UnknownAnnotationError",
           "NotAStoreError", "encode_rle", "decode_rle", "image_sha256", "is_store", "STATUSES", "KINDS"]
