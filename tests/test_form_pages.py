"""scripts/make_form_pages.py: office forms printed by Chromium, stored as a corpus folder whose
form regions hold exactly the words written into them and whose link questions point at the values."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ocr_cache_files import page_readings
from script_module import load_script

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None,
                                reason="no Chromium on PATH (apt-get install chromium) to print the forms with")

REPO = Path(__file__).resolve().parents[1]
SEED = 5


@pytest.fixture(scope="module")
def script():
    return load_script("make_form_pages")


@pytest.fixture(scope="module")
def built(script, tmp_path_factory):
    pytest.importorskip("playwright")
    out = tmp_path_factory.mktemp("forms") / "forms_html"
    assert script.main(["--out", str(out), "--pages", "2", "--seed", str(SEED)]) == 0
    from dociq.data.datasets.corpus.dataset import CorpusDocuments

    return out, [CorpusDocuments(out, split=None)[i] for i in range(2)]


def _centre_inside(boxes, box):
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    return set(np.flatnonzero((cx >= box[0]) & (cx <= box[2]) & (cy >= box[1]) & (cy <= box[3])).tolist())


def test_the_folder_reads_back_as_a_corpus_split(built, script):
    from dociq.data.datasets.corpus.dataset import CorpusDocuments

    out, pages = built
    assert json.loads((out / "corpus.json").read_text())["pages"] == 2
    assert len(CorpusDocuments(out, split="all")) == 2  # `dociq eval --split all` reads every split
    for page in pages:
        template = page.meta["doc_id"].rsplit("-", 1)[1]
        assert page.meta["package"] == f"forms-html-{template}" and page.meta["split"] == "all"
        assert page.meta["labeller"] == "html-forms" and page.meta["text_layer"] == "pdf"
        assert page.image.shape[:2] == page.meta["original_size"] and max(page.image.shape[:2]) == 1024
        assert {"form_key", "form_value"} <= {r.label for r in page.regions}
    # a rerun with the same folder and seed finds the forms done and adds none
    assert script.main(["--out", str(out), "--pages", "2", "--seed", str(SEED)]) == 0
    assert len(CorpusDocuments(out, split=None)) == 2


def test_templates_take_turns_and_name_their_package(tmp_path, script):
    pytest.importorskip("playwright")
    from dociq.data.datasets.corpus.dataset import CorpusDocuments

    out = tmp_path / "forms"
    assert script.main(["--out", str(out), "--pages", "2", "--seed", str(SEED), "--templates", "memo", "table"]) == 0
    assert [p.meta["package"] for p in CorpusDocuments(out, split=None)] == ["forms-html-memo", "forms-html-table"]
    held_out = CorpusDocuments(out, split=None, packages="forms-html-table")
    assert len(held_out) == 1 and held_out[0].meta["doc_id"] == "form-0001-table"


def test_form_regions_hold_exactly_the_words_written_into_them(built, script):
    _, pages = built
    for page in pages:
        index = int(page.meta["doc_id"].split("-")[1])
        _, form, _ = script.make_form(index, SEED)  # the same seed draws the same form
        assert [r.label for r in page.regions] == [label for label, _ in form.regions]
        boxes = np.asarray(page.word_boxes, dtype=np.float64)
        for region, (label, text) in zip(page.regions, form.regions):
            # the written text, word for word in reading order (a token too long for its box may wrap in two)
            assert "".join(page.words[i] for i in region.word_ids) == "".join(text.split()), (label, text)
            if label in ("form_key", "form_value"):
                ids = region.word_ids
                union = [boxes[ids, 0].min(), boxes[ids, 1].min(), boxes[ids, 2].max(), boxes[ids, 3].max()]
                np.testing.assert_allclose(region.box, union, atol=0.01)  # the union of its words' boxes
                assert _centre_inside(boxes, region.box) == set(ids), (label, text)  # and no other word


def test_link_questions_point_at_the_value_of_a_unique_key(built):
    _, pages = built
    for page in pages:
        assert page.links and all(page.regions[k].label == "form_key" and page.regions[v].label == "form_value"
                                  for k, v in page.links)
        key_texts = [page.regions[k].text for k, _ in page.links]
        links = [q for q in page.questions if q.kind == "link"]
        assert len(links) == sum(key_texts.count(t) == 1 for t in key_texts) > 0
        value_of = {page.regions[k].text.rstrip(":"): v for k, v in page.links}
        for q in links:
            key = q.text.split("\u2018")[1].split("\u2019")[0]
            assert q.region_ids == [value_of[key]]
            assert np.array_equal(q.mask, page.regions[value_of[key]].mask)
        layout = {q.text: set(q.region_ids) for q in page.questions if q.kind == "layout"}
        assert {i for i, r in enumerate(page.regions) if r.label == "form_key"} in layout.values()
        assert {i for i, r in enumerate(page.regions) if r.label == "form_value"} in layout.values()


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="no tesseract (apt-get install tesseract-ocr)")
def test_the_ocr_bench_reads_the_forms_words_back(built):
    import subprocess

    out, _ = built
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_ocr.py"), "--corpus", str(out), "--split", "all",
                          "--pages", "2"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")]
                                             for line in run.stdout.splitlines() if line.startswith("| ")
                                             and not line.startswith("| tesseract"))}
    assert set(rows) == {"otsu", "otsu + rules erased", "sauvola", "sauvola + rules erased"}, run.stdout
    _, recall, precision, under_20, _ = rows["sauvola + rules erased"]
    assert float(recall) >= 0.8 and float(precision) >= 0.8 and under_20 == "0", run.stdout  # the printed words read back


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="no tesseract (apt-get install tesseract-ocr)")
def test_the_sharpening_study_reads_each_scan_both_ways(built, tmp_path):
    import subprocess

    out, _ = built
    rows_file = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "sharpen_readings.py"), "--corpus", str(out),
                          "--split", "all", "--cache", str(tmp_path / "ocr"), "--workers", "1", "--out", str(rows_file)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(rows_file.read_text())
    assert len(rows) == 2 and all(0 <= r[way]["recall"] <= 1 for r in rows for way in ("plain", "sharpened"))
    # two readings of each scan, cached (besides the crops of short words read again alone, far smaller)
    assert len(page_readings((tmp_path / "ocr").rglob("*.json"))) == 4
    recall = {cells[0]: float(cells[2]) for cells in ([c.strip() for c in line.strip("|").split("|")]
                                                      for line in run.stdout.splitlines() if line.startswith("| ")
                                                      and not line.startswith("| keep"))}
    ceiling = recall.pop("the better reading (a ceiling: reads the text layer)")
    assert len(recall) == 6 and max(recall.values()) <= ceiling, run.stdout
    assert recall['more sure words (the default, `sharpen="surer"`)'] >= 0.8, run.stdout   # the printed words read back
