"""CorpusWriter: whole documents in atomically committed shards, corpus.json, and a build that is
killed at any point of a shard's commit resumes without redoing or corrupting committed work."""
from __future__ import annotations

import json

import pytest

from corpus_testdata import DOCUMENTS, add_documents, bad_document, build, document, page_key
from dociq.data.datasets.corpus import store
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.datasets.corpus.store import CorpusWriter, committed_shards


def _names(root) -> list[str]:
    return sorted(p.name for p in (root / "shards").iterdir())


def test_documents_are_committed_whole_in_shards_with_manifests(tmp_path):
    summary = build(tmp_path, shard_pages=4)
    # train: guide(3) + faq(2) reach 4 pages -> shard 0; manual(3) + broken(0) + intro(1) -> shard 1
    assert _names(tmp_path) == ["train-00000", "train-00001", "val-00000"]
    shards = committed_shards(tmp_path, "train")
    assert [[d["doc_id"] for d in s.manifest["documents"]] for s in shards] == [
        ["alpha/guide.pdf", "alpha/faq.html"], ["beta/manual.pdf", "beta/broken.pdf", "alpha/intro.html"]]
    first = shards[0].manifest["pages"]
    assert [p["page_id"] for p in first] == ["alpha/guide.pdf#p0", "alpha/guide.pdf#p1", "alpha/guide.pdf#p2",
                                             "alpha/faq.html#p0", "alpha/faq.html#p1"]
    assert first[0] == {"key": page_key("alpha/guide.pdf#p0"), "doc_id": "alpha/guide.pdf",
                        "page_id": "alpha/guide.pdf#p0", "package": "alpha"}
    assert (shards[0].path / "index.json").is_file() and list(shards[0].path.glob("chunk-*.bin"))
    assert not list((tmp_path / "shards").glob("*.tmp"))
    assert summary == json.loads((tmp_path / "corpus.json").read_text())
    assert summary["pages"] == 11 and summary["documents"] == 6
    assert summary["splits"]["train"] == {"pages": 9, "documents": 5, "shards": ["train-00000", "train-00001"]}
    assert summary["splits"]["val"] == {"pages": 2, "documents": 1, "shards": ["val-00000"]}
    assert summary["packages"] == {"alpha": {"pages": 6, "documents": 3}, "beta": {"pages": 5, "documents": 3}}


def test_bad_and_empty_documents_are_counted_and_may_make_a_shard_without_pages(tmp_path):
    with CorpusWriter(tmp_path, shard_pages=100) as writer:
        writer.add_document("a.pdf", "train", *document("a.pdf", 2, dropped={"low_coverage": 3}))
        writer.add_document("b.pdf", "val", *bad_document(reason="unreadable_source"))
        writer.add_document("c.pdf", "val", *bad_document(reason="print_failed"))
        writer.add_document("d.pdf", "val", *document("d.pdf", 0, "val", dropped={"near_duplicate": 2}))
    summary = json.loads((tmp_path / "corpus.json").read_text())
    assert summary["bad_documents"] == {"print_failed": 1, "unreadable_source": 1}
    assert summary["dropped_pages"] == {"low_coverage": 3, "near_duplicate": 2}
    assert summary["statuses"] == {"bad": 2, "empty": 1, "ok": 1}
    assert summary["splits"]["val"] == {"pages": 0, "documents": 3, "shards": ["val-00000"]}
    val = tmp_path / "shards" / "val-00000"
    assert sorted(p.name for p in val.iterdir()) == ["manifest.json"]  # no pages: no litdata files
    reopened = CorpusWriter(tmp_path)
    assert set(reopened.done_documents) == {"a.pdf", "b.pdf", "c.pdf", "d.pdf"}
    assert reopened.done_documents["b.pdf"]["reason"] == "unreadable_source"
    reopened.abandon()


def test_done_documents_and_seen_hashes_come_from_committed_shards_only(tmp_path):
    writer = CorpusWriter(tmp_path, shard_pages=4)
    add_documents(writer, DOCUMENTS[:3])  # guide + faq committed (5 pages); manual buffered
    assert set(writer.done_documents) == {"alpha/guide.pdf", "alpha/faq.html"}
    writer.abandon()  # as a kill: the buffered manual is lost
    resumed = CorpusWriter(tmp_path, shard_pages=4)
    assert set(resumed.done_documents) == {"alpha/guide.pdf", "alpha/faq.html"}
    key = page_key("alpha/faq.html#p1")
    assert resumed.seen_hashes["t:" + key[::-1]] == "alpha/faq.html#p1"
    assert len(resumed.seen_hashes) == 5
    with pytest.raises(ValueError, match="added already"):
        resumed.add_document("alpha/guide.pdf", "train", *document("alpha/guide.pdf", 1))
    resumed.abandon()


@pytest.mark.parametrize("kill_in", ["_write_litdata", "_fsync_tree", "_commit"])
def test_a_build_killed_while_committing_a_shard_resumes_to_the_same_corpus(tmp_path, monkeypatch, kill_in):
    reference = build(tmp_path / "reference", shard_pages=4)
    out = tmp_path / "killed"
    real = getattr(store, kill_in)
    calls = []

    def killed(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second shard, after the first was committed
            if kill_in != "_commit":
                real(*args, **kwargs)  # this step's files are on disk, the next step never runs
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, kill_in, killed)
    with pytest.raises(KeyboardInterrupt):
        with CorpusWriter(out, shard_pages=4) as writer:
            add_documents(writer)
    monkeypatch.undo()
    assert _names(out) == ["train-00000", "train-00001.tmp"]  # half a shard, never committed
    assert not (out / "corpus.json").exists()

    resumed = CorpusWriter(out, shard_pages=4)
    assert _names(out) == ["train-00000"]  # the leftover is gone
    done = resumed.done_documents
    assert set(done) == {"alpha/guide.pdf", "alpha/faq.html"}
    add_documents(resumed, skip=set(done))
    summary = resumed.close()
    assert _names(out) == ["train-00000", "train-00001", "val-00000"]  # numbering goes on
    assert summary == reference
    for split in ("train", "val"):
        got, want = CorpusDocuments(out, split), CorpusDocuments(tmp_path / "reference", split)
        assert [got.page_meta(i)["key"] for i in range(len(got))] == [want.page_meta(i)["key"] for i in range(len(want))]
        for i in range(len(got)):
            assert (got[i].image == want[i].image).all() and got[i].words == want[i].words


def test_a_resumed_build_with_other_settings_is_refused_naming_the_keys(tmp_path):
    settings = {"seed": 0, "shard_pages": 4, "label": {"page_size": 1024, "min_words": 15}}
    CorpusWriter(tmp_path, settings=settings).close()
    assert json.loads((tmp_path / "build.json").read_text()) == settings
    CorpusWriter(tmp_path, settings=dict(settings)).close()  # the same flags resume
    changed = {**settings, "label": {"page_size": 768, "min_words": 15}}
    with pytest.raises(ValueError, match=r"label\.page_size.*1024.*768.*new OUT_DIR.*same flags"):
        CorpusWriter(tmp_path, settings=changed)
    with pytest.raises(ValueError, match="val_fraction"):
        CorpusWriter(tmp_path, settings={**settings, "val_fraction": 0.2})
    CorpusWriter(tmp_path, settings=settings).close()  # the refusals left the folder usable


def test_close_inside_the_with_block_as_the_build_does(tmp_path):
    with CorpusWriter(tmp_path, shard_pages=100) as writer:
        writer.add_document("a.pdf", "train", *document("a.pdf", 2))
        summary = writer.close()
    assert summary["pages"] == 2 and writer.close() == summary
    with pytest.raises(KeyboardInterrupt):
        with CorpusWriter(tmp_path, shard_pages=100) as writer:
            writer.add_document("b.pdf", "train", *document("b.pdf", 1))
            raise KeyboardInterrupt
    assert set(CorpusWriter(tmp_path).done_documents) == {"a.pdf"}  # b.pdf was only buffered


def test_one_writer_per_folder_and_bad_input_is_refused(tmp_path):
    writer = CorpusWriter(tmp_path)
    with pytest.raises(RuntimeError, match="another corpus build"):
        CorpusWriter(tmp_path)
    with pytest.raises(ValueError, match="split"):
        writer.add_document("x.pdf", "train-2", [], {})
    with pytest.raises(ValueError, match="not JSON"):
        writer.add_document("x.pdf", "train", [], {"when": object()})
    with pytest.raises(ValueError, match="record of page 'k' .* not JSON"):
        writer.add_document("x.pdf", "train", [("k", b"png", {"size": {1, 2}})], {})
    with pytest.raises(ValueError, match="repeated page keys"):
        pages, report = document("y.pdf", 1)
        writer.add_document("y.pdf", "train", pages * 2, report)
    writer.close()
    CorpusWriter(tmp_path).close()  # the lock went with the writer
    with pytest.raises(ValueError, match="shard_pages"):
        CorpusWriter(tmp_path, shard_pages=0)
