"""Held-out pages as a scanner and OCR hand them over (dociq.data.scanned): degraded the same
way for every answerer, words read back from the pixels, targets still on the page."""

import numpy as np
import pytest

from dociq.cli.eval import main
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.scanned import ScannedPages
from ocr_cache_files import page_readings


@pytest.fixture(scope="module")
def pages():
    return SyntheticDocuments(num_pages=2, image_size=768, seed=5, degrade=0.0)


def _normalised(words):
    return {w.strip(".,:;()").lower() for w in words if len(w.strip(".,:;()")) > 3}


def test_words_are_read_from_the_scanned_pixels_and_targets_move_with_them(pages, tmp_path):
    scanned = ScannedPages(pages, seed=0, cache_dir=tmp_path)
    assert len(scanned) == len(pages)
    for i in range(len(pages)):
        page, scan = pages[i], scanned[i]
        assert scan.meta["words_from"] == "tesseract" and scan.meta["page_id"] == page.meta["page_id"]
        assert scan.image.shape == page.image.shape and not np.array_equal(scan.image, page.image)
        assert scan.word_boxes.shape == (len(scan.words), 4)
        # tesseract's confidence in each word, for the answerer to tell the words it doubts
        assert scan.word_confidences.shape == (len(scan.words),) and (scan.word_confidences <= 100).all()
        # tesseract reads most of the page's longer words back from the degraded image
        truth, read = _normalised(page.words), _normalised(scan.words)
        assert len(truth & read) >= 0.5 * len(truth), (sorted(truth - read)[:20], sorted(read)[:20])
        # word boxes lie on the page; every question keeps a target of the page's size
        h, w = scan.size
        assert (scan.word_boxes[:, 2] <= w + 1).all() and (scan.word_boxes[:, 3] <= h + 1).all()
        assert [q.text for q in scan.questions] == [q.text for q in page.questions]
        assert all(q.mask.shape == (h, w) and q.mask.any() for q in scan.questions)
    # the same seed scans a page the same way (every answerer sees the same scan); another does not
    again, other = ScannedPages(pages, seed=0, cache_dir=tmp_path)[0], ScannedPages(pages, seed=1, cache_dir=tmp_path)[0]
    assert np.array_equal(again.image, scanned[0].image) and again.words == scanned[0].words
    assert not np.array_equal(other.image, scanned[0].image)


def test_scan_is_for_the_predictors_path(capsys):
    with pytest.raises(SystemExit):
        main(["--baseline", "detector", "--task-path", "--scan"])
    with pytest.raises(SystemExit):
        main(["x.ckpt", "--task-path", "--scan"])
    assert "--scan" in capsys.readouterr().err


def test_regions_own_the_words_read_from_the_scan(pages, tmp_path):
    """The word-class targets follow the words the model reads: each region's word_ids index the
    OCR words whose centre it holds, and its text is theirs."""
    scan = ScannedPages(pages, seed=0, cache_dir=tmp_path)[0]
    centres = (scan.word_boxes[:, :2] + scan.word_boxes[:, 2:]) / 2
    owned = 0
    for region in scan.regions:
        assert all(0 <= k < len(scan.words) for k in region.word_ids)
        for k in region.word_ids:
            x, y = centres[k].astype(int)
            assert region.mask[y, x]
        assert region.text == " ".join(scan.words[k] for k in region.word_ids)
        owned += len(region.word_ids)
    assert owned >= 0.5 * len(scan.words)      # most words read back lie in some region


def _cached(cache) -> dict:
    """{file: mtime} of an OCR cache's entries."""
    return {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


def test_a_kept_ocr_cache_is_read_by_the_next_run(tmp_path):
    """`dociq eval --scan --ocr-cache DIR` keeps each scanned page's OCR words, so a second run on
    the same pages (another checkpoint, another code version) reads them instead of tesseract."""
    cache = tmp_path / "ocr"
    args = ["--baseline", "detector", "--pages", "1", "--prompts", "question", "--scan", "--ocr-cache", str(cache)]
    assert main(args + ["--json", str(tmp_path / "first.json")]) == 0
    kept = _cached(cache)
    assert kept
    assert main(args + ["--json", str(tmp_path / "second.json")]) == 0
    assert _cached(cache) == kept
    assert (tmp_path / "first.json").read_text() == (tmp_path / "second.json").read_text()
    # another confidence threshold reads the same cache: the cache keeps every word read
    assert main(args + ["--ocr-min-conf", "90"]) == 0
    assert _cached(cache) == kept
    # by default the page is read as given and sharpened, the surer reading kept: both readings are
    # cached, so reading it only one way reads the cache (and rewrites nothing it holds)
    assert len(page_readings(kept)) == 2
    for way in ("never", "always"):
        assert main(args + ["--ocr-sharpen", way]) == 0
        now = _cached(cache)
        assert {p: now[p] for p in kept} == kept and page_readings(now) == page_readings(kept)


@pytest.mark.parametrize("option", [["--ocr-cache", "ocr/"], ["--ocr-min-conf", "50"], ["--ocr-sharpen", "always"]])
def test_ocr_options_are_for_scanned_pages(capsys, option):
    with pytest.raises(SystemExit):
        main(["--baseline", "detector", *option])
    assert option[0] in capsys.readouterr().err
