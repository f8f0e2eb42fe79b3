"""`dociq corpus shrink`: a smaller copy of a built corpus that reads back as the same pages, scaled."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dociq.cli.corpus import main as corpus_main
from dociq.data.datasets.corpus.dataset import CorpusDocuments

# the reader's test corpus (tests/data/corpus/corpus_testdata.py) is this test's input too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "corpus"))
from corpus_testdata import SIZE, build  # noqa: E402
sys.path.pop(0)


def test_shrunk_corpus_keeps_pages_in_order_with_boxes_scaled(tmp_path):
    src, out = tmp_path / "corpus", tmp_path / "small"
    build(src)
    side = max(SIZE) // 2
    assert corpus_main(["shrink", str(src), str(out), "--max-side", str(side), "--quality", "90"]) == 0
    for split in ("train", "val"):
        before, after = CorpusDocuments(src, split=split), CorpusDocuments(out, split=split)
        assert [before.page_meta(i)["page_id"] for i in range(len(before))] == \
            [after.page_meta(i)["page_id"] for i in range(len(after))]
        for i in range(len(before)):
            a, b = before[i], after[i]
            scale = b.image.shape[1] / a.image.shape[1]
            assert max(b.image.shape[:2]) == side and scale == pytest.approx(0.5, abs=0.02)
            assert b.words == a.words and [q.text for q in b.questions] == [q.text for q in a.questions]
            np.testing.assert_allclose(b.word_boxes, a.word_boxes * scale, atol=0.01)
            for ra, rb in zip(a.regions, b.regions):
                assert rb.label == ra.label and rb.word_ids == ra.word_ids
                np.testing.assert_allclose(rb.box, ra.box * scale, atol=0.01)
                assert rb.mask.shape == b.image.shape[:2]
            # the ink is where it was: a JPEG of the half-size page, not another page
            small = a.image[::2, ::2].astype(float)
            assert np.abs(b.image.astype(float)[:small.shape[0], :small.shape[1]] - small).mean() < 40
    summary = json.loads((out / "corpus.json").read_text())
    assert summary["pages"] == json.loads((src / "corpus.json").read_text())["pages"]


def test_shrink_keeps_a_split_share_and_refuses_bad_arguments(tmp_path):
    src = tmp_path / "corpus"
    build(src)
    out = tmp_path / "two"
    corpus_main(["shrink", str(src), str(out), "--max-pages", "train=2"])
    assert len(CorpusDocuments(out, split="train")) == 2
    assert len(CorpusDocuments(out, split="val")) == len(CorpusDocuments(src, split="val"))
    with pytest.raises(ValueError, match="SPLIT=N"):
        corpus_main(["shrink", str(src), str(tmp_path / "x"), "--max-pages", "train"])
    with pytest.raises(ValueError, match="test"):
        corpus_main(["shrink", str(src), str(tmp_path / "y"), "--max-pages", "test=3"])
    with pytest.raises(ValueError, match="source corpus"):
        corpus_main(["shrink", str(src), str(src)])
    with pytest.raises(FileNotFoundError, match="corpus.json"):
        corpus_main(["shrink", str(tmp_path / "none"), str(tmp_path / "z")])
