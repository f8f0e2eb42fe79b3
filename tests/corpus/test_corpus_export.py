"""export_coco writes a corpus as COCO that CocoDocuments reads back as the same pages (words,
regions, questions, provenance), as annotations.json or as named files sharing one folder."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dociq.data.datasets.coco import CocoDocuments
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.corpus.export import export_coco

# the reader's test corpus (tests/data/corpus/corpus_testdata.py) is this test's input too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "corpus"))
from corpus_testdata import build  # noqa: E402
sys.path.pop(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    build(root, shard_pages=4)
    return root


def assert_same_pages(coco: CocoDocuments, corpus: CorpusDocuments):
    assert len(coco) == len(corpus)
    for i in range(len(coco)):
        got, want = coco[i], corpus[i]
        assert (got.image == want.image).all()
        assert got.words == want.words
        np.testing.assert_allclose(got.word_boxes, want.word_boxes, atol=1e-4)
        assert [(r.label, r.text, r.word_ids) for r in got.regions] == [
            (r.label, r.text, r.word_ids) for r in want.regions]
        for a, b in zip(got.regions, want.regions):
            np.testing.assert_allclose(a.box, b.box, atol=1e-4)
            assert (a.mask == b.mask).all()
        assert [(q.text, q.kind, q.region_ids) for q in got.questions] == [
            (q.text, q.kind, q.region_ids) for q in want.questions]
        for a, b in zip(got.questions, want.questions):
            assert (a.mask == b.mask).all()
        for key in ("page_id", "doc_id", "package", "split", "labeller", "shard"):
            assert got.meta[key] == want.meta[key], key


def test_export_reads_back_as_the_same_pages(corpus, tmp_path):
    path = export_coco(corpus, tmp_path / "out" / "annotations.json", split="train")
    assert path == tmp_path / "out" / "annotations.json"
    assert (tmp_path / "out" / "images" / "1.png").is_file()
    entry = json.loads(path.read_text())["images"][0]
    assert {k: entry["meta"][k] for k in ("doc_id", "package", "split", "labeller")} == {
        "doc_id": "alpha/guide.pdf", "package": "alpha", "split": "train", "labeller": "structure"}
    assert_same_pages(CocoDocuments(path), CorpusDocuments(corpus, split="train"))


def test_named_exports_share_a_folder_without_overwriting_images(corpus, tmp_path):
    train = export_coco(corpus, tmp_path / "train.json", split="train")
    val = export_coco(corpus, tmp_path / "val.json", split="val")
    assert (train, val) == (tmp_path / "train.json", tmp_path / "val.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "train.json", "val.json"]
    assert json.loads(val.read_text())["images"][0]["file_name"] == "val/1.png"
    assert_same_pages(CocoDocuments(train), CorpusDocuments(corpus, split="train"))
    assert_same_pages(CocoDocuments(val), CorpusDocuments(corpus, split="val"))
    again = export_coco(corpus, tmp_path / "train.json", split="train", max_pages=2)  # replaces its own
    assert len(CocoDocuments(again)) == 2 and len(list((tmp_path / "images" / "train").iterdir())) == 2


def test_export_of_every_split_with_a_cap(corpus, tmp_path):
    path = export_coco(corpus, tmp_path / "all.json", max_pages=4)
    pages = CocoDocuments(path)
    assert len(pages) == 4
    assert len({pages[i].meta["doc_id"] for i in range(4)}) == 4  # spread over documents
    with pytest.raises(ValueError, match="is a folder"):
        export_coco(corpus, tmp_path)
