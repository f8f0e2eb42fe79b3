"""CorpusDocuments reads back exactly the pages the writer stored (any split, package, cap, in
DataLoader workers, while a build is still running); MixedDocuments is a fixed seeded mixture;
data=corpus / data=corpus_mixed instantiate."""
from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from corpus_testdata import DOCUMENTS, add_documents, build, document, expected_pages, page
from dociq.data.datasets.corpus.dataset import CorpusDocuments
from dociq.data.mixture import MixedDocuments
from dociq.data.datasets.corpus.record import record_to_page
from dociq.data.datasets.corpus.store import CorpusWriter
from dociq.data.errors import BadSampleError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    build(root, shard_pages=4)
    return root


def assert_same_page(got, want):
    assert (got.image == want.image).all()
    assert got.words == want.words
    np.testing.assert_array_equal(got.word_boxes, want.word_boxes)
    assert [(r.label, r.text, r.word_ids) for r in got.regions] == [(r.label, r.text, r.word_ids) for r in want.regions]
    for a, b in zip(got.regions, want.regions):
        np.testing.assert_array_equal(a.box, b.box)
        assert (a.mask == b.mask).all()
    assert [(q.text, q.kind, q.region_ids) for q in got.questions] == [
        (q.text, q.kind, q.region_ids) for q in want.questions]
    for a, b in zip(got.questions, want.questions):
        assert (a.mask == b.mask).all() and a.mask.any()


def test_pages_read_back_as_written(corpus):
    dataset = CorpusDocuments(corpus, split="train")
    want = expected_pages("train")
    assert len(dataset) == len(want) == 9
    for i in range(len(dataset)):
        page = dataset[i]
        png, record = want[page.meta["page_id"]]
        assert_same_page(page, record_to_page(png, record))
        assert {k: page.meta[k] for k in ("doc_id", "package", "split", "labeller", "page_index")} == {
            k: record[k] for k in ("doc_id", "package", "split", "labeller", "page_index")}
        assert page.meta["shard"] == dataset.page_meta(i)["shard"]
    # storage order: shard by shard, documents in the order they were added
    assert [dataset.page_meta(i)["page_id"] for i in range(3)] == [f"alpha/guide.pdf#p{i}" for i in range(3)]


def test_opening_shards_logs_no_litdata_info_but_keeps_its_warnings(corpus, caplog, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger("litdata"), "level", logging.NOTSET)   # as a fresh process has it
    caplog.set_level(logging.INFO)              # a run's logging (Hydra's, Lightning's) shows INFO
    dataset = CorpusDocuments(corpus, split="train")
    for i in range(len(dataset)):             # every shard opened
        dataset[i]
    assert len({dataset.page_meta(i)["shard"] for i in range(len(dataset))}) > 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("litdata")] == []
    logging.getLogger("litdata.streaming.dataset").warning("a litdata warning")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("litdata")] == ["a litdata warning"]


def test_splits_packages_and_max_pages_select_pages(corpus):
    val = CorpusDocuments(corpus, split="val")
    assert {val[i].meta["page_id"] for i in range(len(val))} == set(expected_pages("val"))
    assert len(CorpusDocuments(corpus, split=None)) == 11
    beta = CorpusDocuments(corpus, split="train", packages=["beta"])
    assert {beta.page_meta(i)["doc_id"] for i in range(len(beta))} == {"beta/manual.pdf"}
    with pytest.raises(ValueError, match=r"no pages of packages \['gamma'\].*alpha.*beta"):
        CorpusDocuments(corpus, packages="gamma")
    # 3 pages of 4 documents: one page from each of 3 documents, the same ones every time
    capped = CorpusDocuments(corpus, split="train", max_pages=3)
    docs = [capped.page_meta(i)["doc_id"] for i in range(len(capped))]
    assert len(docs) == 3 and len(set(docs)) == 3
    assert docs == [CorpusDocuments(corpus, max_pages=3).page_meta(i)["doc_id"] for i in range(3)]
    five = [CorpusDocuments(corpus, max_pages=5).page_meta(i)["doc_id"] for i in range(5)]
    assert set(five) == {"alpha/guide.pdf", "alpha/faq.html", "beta/manual.pdf", "alpha/intro.html"}
    assert len(CorpusDocuments(corpus, max_pages=1000)) == 9
    with pytest.raises(ValueError, match="max_pages"):
        CorpusDocuments(corpus, max_pages=0)


def _page_id(page):
    return page.meta["page_id"]


def _files(root) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def test_picklable_and_reads_in_a_dataloader_worker(corpus):
    before = _files(corpus)
    dataset = CorpusDocuments(corpus, split="train")
    first = dataset[0]  # opens a shard in this process: it must not travel with the pickle
    clone = pickle.loads(pickle.dumps(dataset))
    assert_same_page(clone[0], first)
    order = [8, 0, 5, 3]
    loader = DataLoader(dataset, batch_size=None, sampler=order, num_workers=1, collate_fn=_page_id)
    assert list(loader) == [dataset.page_meta(i)["page_id"] for i in order]
    assert _files(corpus) == before  # litdata reads local shards in place: no cache, locks or deletions


def test_missing_corpus_and_empty_split_say_what_to_do(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match=r"no corpus here.*dociq corpus build SRC OUT.*make corpus"):
        CorpusDocuments(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=rf"{corpus}.*no pages in split 'test'.*\['train', 'val'\]"):
        CorpusDocuments(corpus, split="test")


def test_a_corpus_being_built_reads_its_committed_shards(tmp_path):
    writer = CorpusWriter(tmp_path, shard_pages=4)
    add_documents(writer, DOCUMENTS[:3])  # guide + faq committed, manual still buffered
    dataset = CorpusDocuments(tmp_path, split="train")
    assert len(dataset) == 5 and not (tmp_path / "corpus.json").exists()
    assert dataset[4].meta["page_id"] == "alpha/faq.html#p1"
    writer.close()
    assert len(CorpusDocuments(tmp_path, split="train")) == 8


def test_a_bad_record_raises_or_is_skipped(tmp_path):
    pages, report = document("doc.pdf", 2)
    pages[1][2]["questions"][0]["region_ids"] = [7]  # a question about a region the page lacks
    with CorpusWriter(tmp_path) as writer:
        writer.add_document("doc.pdf", "train", pages, report)
    with pytest.raises(BadSampleError, match=r"train-00000.*does not read as a page.*Fix: delete"):
        CorpusDocuments(tmp_path)[1]
    skipping = CorpusDocuments(tmp_path, on_bad_sample="skip")
    assert skipping[0] is not None and skipping[1] is None
    assert [b.index for b in skipping.bad_samples] == [1]


def test_a_shard_whose_litdata_index_disagrees_with_its_manifest_is_a_bad_sample(tmp_path):
    with CorpusWriter(tmp_path) as writer:
        writer.add_document("doc.pdf", "train", *document("doc.pdf", 2))
    manifest_path = tmp_path / "shards" / "train-00000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["pages"].append(dict(manifest["pages"][0], key="extra"))
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(BadSampleError, match="lists 2 items but the manifest 3 pages"):
        CorpusDocuments(tmp_path)[0]


# -- MixedDocuments ------------------------------------------------------------------------------

def test_mixture_follows_the_weights_and_is_a_function_of_the_seed():
    small, large = [f"s{i}" for i in range(10)], [f"l{i}" for i in range(30)]
    mixed = MixedDocuments([small, large], weights=[0.5, 0.5], seed=3)
    assert len(mixed) == 60  # every page of the larger set once, at half the mixture
    items = [mixed[i] for i in range(len(mixed))]
    assert Counter(x[0] for x in items) == {"s": 30, "l": 30}
    assert set(items) == set(small) | set(large)  # small repeats 3 times, large appears once each
    assert Counter(items)["s0"] == 3
    again = MixedDocuments([small, large], weights=[0.5, 0.5], seed=3)
    assert [again[i] for i in range(60)] == items
    assert [pickle.loads(pickle.dumps(mixed))[i] for i in range(60)] == items
    assert [MixedDocuments([small, large], weights=[0.5, 0.5], seed=4)[i] for i in range(60)] != items
    assert items[:12] != sorted(items[:12])  # interleaved, not one set after the other


def test_mixture_length_defaults_and_checks():
    a, b = list(range(6)), list(range(100, 104))
    assert sorted(MixedDocuments([a, b])[i] for i in range(10)) == a + b  # sizes as weights: a shuffle
    capped = MixedDocuments([a, b], weights=[3, 1], length=8, seed=1)
    assert Counter(capped.source_of(i)[0] for i in range(8)) == {0: 6, 1: 2}
    assert len({capped[i] for i in range(8) if capped.source_of(i)[0] == 1}) == 2  # a subset, no repeat
    assert MixedDocuments([a, []], weights=[1, 0]).source_of(5)[0] == 0
    with pytest.raises(ValueError, match="empty but has weight"):
        MixedDocuments([a, []], weights=[1, 1])
    with pytest.raises(ValueError, match="2 data sets"):
        MixedDocuments([a, b], weights=[1])
    with pytest.raises(ValueError, match="non-negative"):
        MixedDocuments([a, b], weights=[1, -1])
    with pytest.raises(IndexError):
        MixedDocuments([a])[6]


# -- configs -------------------------------------------------------------------------------------

def test_data_configs_instantiate_on_a_built_corpus(corpus):
    from hydra.utils import instantiate

    from dociq.training.config import compose

    data_dir = corpus.parent / "data"
    if not (data_dir / "corpus").exists():
        data_dir.mkdir(exist_ok=True)
        (data_dir / "corpus").symlink_to(corpus)
    cfg = compose(["stage=finetune", "data=corpus", f"paths.data_dir={data_dir}"])
    train, val = instantiate(cfg.data.train_set, _convert_="all"), instantiate(cfg.data.val_set, _convert_="all")
    assert (len(train), len(val)) == (9, 2)
    cfg = compose(["stage=finetune", "data=corpus_mixed", f"paths.data_dir={data_dir}",
                   "data.train_set.datasets.1.num_pages=6"])
    mixed = instantiate(cfg.data.train_set, _convert_="all")
    assert isinstance(mixed.datasets[0], CorpusDocuments) and len(mixed) == 18
    assert Counter(mixed.source_of(i)[0] for i in range(len(mixed))) == {0: 9, 1: 9}
    page = mixed[next(i for i in range(len(mixed)) if mixed.source_of(i)[0] == 1)]
    assert page.image.ndim == 3


def test_wide_mixture_reads_both_corpora_page_for_page(corpus, tmp_path):
    from hydra.utils import instantiate

    from dociq.training.config import compose

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "corpus").symlink_to(corpus)
    (data_dir / "corpus_wide").symlink_to(corpus)  # a second corpus of the same 9 training pages
    cfg = compose(["stage=finetune", "data=corpus_wide_mixed", f"paths.data_dir={data_dir}",
                   "data.train_set.datasets.1.num_pages=6"])
    mixed = instantiate(cfg.data.train_set, _convert_="all")
    real = mixed.datasets[0]
    assert [Path(d.root).name for d in real.datasets] == ["corpus", "corpus_wide"]
    # every real page once, as likely as any other; then as many synthetic slots
    assert len(real) == 18 and Counter(real.source_of(i)[0] for i in range(18)) == {0: 9, 1: 9}
    assert Counter(mixed.source_of(i)[0] for i in range(len(mixed))) == {0: 18, 1: 18}
    assert instantiate(cfg.data.val_set, _convert_="all").root == data_dir / "corpus"


def test_word_boxes_overhanging_the_page_are_cut_to_it():
    # a text layer's glyph box can reach past the page's crop box (a formula at the top edge): the
    # Predictor refuses such boxes, and the page shows only their part inside it
    _, png, record = page("pkg/formula.pdf", 0)
    h, w = record["size"]
    record["word_boxes"][0] = [-3.5, -2.0, 20, 11.5]
    record["word_boxes"][3] = [20, 22, w + 9.0, h + 4.0]
    boxes = record_to_page(png, record).word_boxes
    assert boxes[0].tolist() == [0, 0, 20, 11.5] and boxes[3].tolist() == [20, 22, w, h]
    assert boxes[1].tolist() == record["word_boxes"][1]


def test_audit_sheet_per_package_takes_pages_of_different_documents(corpus, tmp_path):
    from dociq.corpus.audit import draw_audit

    out = draw_audit(corpus, tmp_path / "sheet.png", per_package=2, thumb=64)
    index = json.loads((tmp_path / "sheet_pages" / "index.json").read_text())
    packages = [e["page_id"].split("/")[0] for e in index]
    docs = [e["page_id"].split("#")[0] for e in index]
    # train split: alpha has three documents, beta one good one: two rows, package by package
    assert packages == ["alpha", "alpha", "beta"] and len(set(docs)) == 3
    assert all((tmp_path / "sheet_pages" / e["file"]).is_file() for e in index)
    from PIL import Image
    assert Image.open(out).size == (2 * 64, 2 * 64 + 24)
