"""EngineStore: round trip, validation, crash safety under SIGKILL, concurrent writers."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dociq.data.schema import QUESTION_KINDS
from dociq.engine.store import (
    KINDS, EngineStore, NotAStoreError, UnknownAnnotationError, UnknownPageError,
)

H, W = 48, 64


def _page(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (H, W, 3), dtype=np.uint8)


def _mask(y0, x0, y1, x1):
    m = np.zeros((H, W), bool)
    m[y0:y1, x0:x1] = True
    return m


@pytest.fixture
def store(tmp_path):
    return EngineStore(tmp_path / "data", create=True)


def test_kinds_follow_the_schema():
    assert KINDS == QUESTION_KINDS


def test_opening_a_folder_that_is_no_store_names_it_and_the_import_command(tmp_path):
    with pytest.raises(NotAStoreError) as err:
        EngineStore(tmp_path / "nothing")
    assert str(tmp_path / "nothing") in str(err.value) and "dociq engine import" in str(err.value)
    assert not (tmp_path / "nothing").exists()


def test_pages_words_and_images_round_trip(store, tmp_path):
    image = _page(1)
    boxes = np.array([[1, 2, 10, 8], [20, 5, 40, 12.5]], np.float32)
    pid = store.add_page(image, ["Total", "42"], boxes, source="scan.png")
    pid2 = store.add_page(_page(2), [], np.zeros((0, 4)), source="blank.png", split="heldout")
    assert (pid, pid2) == ("p000001", "p000002")
    np.testing.assert_array_equal(store.page_image(pid), image)
    words, got_boxes = store.page_words(pid)
    assert words == ["Total", "42"]
    np.testing.assert_allclose(got_boxes, boxes)
    assert store.page_path(pid).is_file()
    rec = store.page(pid)
    assert (rec.width, rec.height, rec.source, rec.split, rec.num_words, rec.num_accepted) == (W, H, "scan.png",
                                                                                               "train", 2, 0)
    assert [p.id for p in store.pages()] == [pid, pid2]
    assert [p.id for p in store.pages(split="heldout")] == [pid2]
    # a second handle on the same folder (another process would do the same) sees it all
    again = EngineStore(tmp_path / "data")
    assert [p.id for p in again.pages()] == [pid, pid2]
    with pytest.raises(UnknownPageError, match="p000099"):
        store.page("p000099")
    with pytest.raises(KeyError):
        store.page_words("p000099")


def test_add_page_checks_words_and_image(store):
    # a box just over the edge (rounding) is clipped; one far outside or inverted names the word
    pid = store.add_page(_page(), ["edge"], np.array([[50, 40, W + 0.5, H + 0.3]]), source="scan.png")
    np.testing.assert_allclose(store.page_words(pid)[1], [[50, 40, W, H]])
    with pytest.raises(ValueError, match=r"scan2.png.*word_boxes\[1\] \('far'\)"):
        store.add_page(_page(), ["ok", "far"], np.array([[0, 0, 5, 5], [0, 0, 5 * W, 5]]), source="scan2.png")
    with pytest.raises(ValueError, match="word_boxes: 1 boxes for 2 words"):
        store.add_page(_page(), ["a", "b"], np.array([[0, 0, 5, 5]]), source="x")
    with pytest.raises(ValueError, match="image: need uint8"):
        store.add_page(_page().astype(np.float32), [], np.zeros((0, 4)), source="x")
    assert len(store.pages()) == 1


def test_annotations_round_trip_undo_relabel_and_history(store):
    pid = store.add_page(_page(), ["a"], np.array([[0, 0, 5, 5]]), source="x")
    m1, m2, m3 = _mask(2, 3, 20, 30), _mask(30, 10, 40, 60), _mask(0, 0, 5, 5)
    a1 = store.save_annotation(pid, m1, "where is the total?", category="answer", clicks=3, kind="layout",
                               author="ann", seconds=4.5)
    a2 = store.save_annotation(pid, m2, "", category="table", clicks=1)
    a3 = store.save_annotation(pid, m3, "the logo", status="rejected", clicks=2)
    accepted = store.annotations(pid)
    assert [a.id for a in accepted] == [a1, a2]
    np.testing.assert_array_equal(accepted[0].mask, m1)
    np.testing.assert_array_equal(accepted[1].mask, m2)
    assert accepted[0].bbox == [3.0, 2.0, 27.0, 18.0] and accepted[0].area == int(m1.sum())
    assert (accepted[0].question, accepted[0].category, accepted[0].clicks, accepted[0].author) == (
        "where is the total?", "answer", 3, "ann")
    assert [a.id for a in store.annotations(status="rejected")] == [a3]
    assert [a.id for a in store.annotations(status=None)] == [a1, a2, a3]
    assert store.page(pid).num_accepted == 2
    json.dumps(accepted[0].to_json())

    store.relabel(a2, category="figure", question="the chart")
    assert (store.annotation(a2).category, store.annotation(a2).question) == ("figure", "the chart")
    store.undo(a1)
    assert [a.id for a in store.annotations(pid)] == [a2]
    assert store.annotation(a1).id == a1  # still stored, only withdrawn
    assert [a.id for a in store.annotations(include_undone=True)] == [a1, a2]
    with pytest.raises(ValueError, match="already undone"):
        store.undo(a1)
    with pytest.raises(UnknownAnnotationError):
        store.undo(999)

    events = [(e["event"], e["annotation_id"]) for e in store.history(pid)]
    assert events == [("page_added", None), ("saved", a1), ("saved", a2), ("saved", a3), ("relabelled", a2),
                      ("undone", a1)]
    relabel = store.history(pid)[4]
    assert (relabel["old_category"], relabel["category"], relabel["old_question"]) == ("table", "figure", "")
    assert all(e["timestamp"].endswith("+00:00") and e["time"] > 0 for e in store.history())
    # history is append-only, even for someone with a raw connection
    conn = sqlite3.connect(store.db_path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM history")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE history SET event = 'x'")
    conn.close()

    prog = store.progress()
    assert (prog["pages"], prog["pages_with_accepted"], prog["accepted"], prog["rejected"], prog["undone"]) == (
        1, 1, 1, 1, 1)
    assert prog["mean_clicks_per_accepted"] == 1.0


@pytest.mark.parametrize("kwargs, field", [
    ({"mask": np.zeros((H, W + 1), bool)}, "mask"),
    ({"mask": np.zeros((H, W), bool)}, "mask"),  # empty accepted
    ({"mask": np.full((H, W), 2, np.uint8)}, "mask"),
    ({"status": "maybe"}, "status"),
    ({"kind": "vibes"}, "kind"),
    ({"clicks": -1}, "clicks"),
    ({"seconds": float("nan")}, "seconds"),
    ({"question": "", "category": None}, "question"),
    ({"category": "  "}, "category"),
])
def test_save_annotation_refuses_bad_fields_by_name(store, kwargs, field):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    args = {"mask": _mask(1, 1, 4, 4), "question": "q", "category": None}
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"^{field}"):
        store.save_annotation(pid, **args)
    assert store.annotations(status=None) == []
    with pytest.raises(UnknownPageError):
        store.save_annotation("p000042", _mask(1, 1, 4, 4), "q")


def test_empty_mask_is_fine_when_rejected(store):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    aid = store.save_annotation(pid, np.zeros((H, W), bool), "nothing here", status="rejected")
    assert not store.annotation(aid).mask.any()


def test_rounds_and_checkpoint(store, tmp_path):
    assert store.checkpoint() is None and store.rounds() == []
    r1 = store.record_round({"miou": 0.5, "pages": 3})
    r2 = store.record_round({"miou": 0.6})
    assert [r["round"] for r in store.rounds()] == [r1, r2] and store.rounds()[1]["metrics"] == {"miou": 0.6}
    with pytest.raises(ValueError, match="metrics"):
        store.record_round({"miou": float("nan")})
    ckpt = tmp_path / "round1.ckpt"
    with pytest.raises(FileNotFoundError, match="round1.ckpt"):
        store.set_checkpoint(ckpt)
    ckpt.write_bytes(b"x")
    store.set_checkpoint(ckpt)
    assert store.checkpoint() == ckpt.resolve()
    assert store.progress()["rounds"] == 2 and store.progress()["checkpoint"] == str(ckpt.resolve())


def test_set_split(store):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    store.set_split([pid], "heldout")
    assert store.page(pid).split == "heldout"
    with pytest.raises(UnknownPageError):
        store.set_split(["p000077"], "heldout")


# ---------------------------------------------------------------------------------------------
# crash safety: SIGKILL a writer mid-loop; every save that returned must be there


_WRITER = r"""
import sys, numpy as np
from dociq.engine.store import EngineStore
store = EngineStore(sys.argv[1])
pid = sys.argv[2]
rng = np.random.default_rng(int(sys.argv[3]))
print("ready", flush=True)
while True:
    m = np.zeros((48, 64), bool)
    y, x = rng.integers(0, 40), rng.integers(0, 56)
    m[y:y + 8, x:x + 8] = True
    aid = store.save_annotation(pid, m, "q", category="c", clicks=1)
    print(aid, flush=True)
"""


def _env():
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_sigkill_mid_save_loses_at_most_the_save_in_flight(store):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    rng = random.Random(0)
    acknowledged: set[int] = set()
    seen_in_db: set[int] = set()
    for kill in range(5):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(store.data_dir), pid, str(kill)],
                                 stdout=subprocess.PIPE, env=_env(), text=True)
        assert child.stdout.readline().strip() == "ready"
        # kill after a random number of acknowledged saves plus a random slice of the next one
        got = []
        for _ in range(rng.randint(3, 25)):
            got.append(int(child.stdout.readline()))
        time.sleep(rng.uniform(0, 0.01))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        got += [int(line) for line in child.stdout.read().split()]  # acknowledged before the kill
        child.stdout.close()
        acknowledged |= set(got)

        after = EngineStore(store.data_dir)
        assert after.integrity_check() == "ok"
        ids = {a.id for a in after.annotations(pid)}
        assert acknowledged <= ids, f"kill {kill}: acknowledged saves lost: {sorted(acknowledged - ids)}"
        new = ids - seen_in_db
        assert len(new - set(got)) <= 1, f"kill {kill}: more than the in-flight save appeared: {new - set(got)}"
        for a in after.annotations(pid):
            assert a.mask.sum() == 64  # each stored mask decodes whole
        saved_events = {e["annotation_id"] for e in after.history(pid) if e["event"] == "saved"}
        assert saved_events == ids  # annotation and its history event commit together
        seen_in_db = ids
        after.close()
    assert len(acknowledged) >= 5 * 3


# ---------------------------------------------------------------------------------------------
# concurrency: several processes and threads write at once


def _save_many(data_dir: str, pid: str, worker: int, count: int, out) -> None:
    store = EngineStore(data_dir)
    ids = []
    for k in range(count):
        m = np.zeros((H, W), bool)
        m[k % 40:k % 40 + 4, worker:worker + 4] = True
        ids.append(store.save_annotation(pid, m, f"w{worker} k{k}", category=f"c{worker}", author=f"w{worker}"))
    out.put(ids)


def test_concurrent_processes_each_save_all_and_ids_are_unique(store):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    store.annotations()  # the parent holds an open connection across fork: children must not use it
    n, m = 4, 15
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_save_many, args=(str(store.data_dir), pid, w, m, out)) for w in range(n)]
    for p in procs:
        p.start()
    returned = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    flat = [i for ids in returned for i in ids]
    assert len(flat) == len(set(flat)) == n * m
    stored = store.annotations(pid)
    assert sorted(a.id for a in stored) == sorted(flat)
    for w in range(n):
        assert sum(a.author == f"w{w}" for a in stored) == m
    assert store.integrity_check() == "ok"


def test_concurrent_threads_share_one_store_object(store):
    pid = store.add_page(_page(), [], np.zeros((0, 4)), source="x")
    results: dict[int, list[int]] = {}
    errors = []

    def work(t):
        try:
            results[t] = [store.save_annotation(pid, _mask(t, t, t + 5, t + 5), f"t{t}", category="c")
                          for _ in range(10)]
            store.pages()
        except Exception as err:  # surfaced below: a thread's exception is otherwise lost
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    flat = [i for ids in results.values() for i in ids]
    assert len(set(flat)) == 40 == len(store.annotations(pid))
