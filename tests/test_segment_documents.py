"""`dociq segment` on PDFs the tests write, with the fine-tune fixture's model: every output format
read back by its own library (pycocotools, the engine's Label Studio reader, docling-core),
overlays, resumption, a folder with a broken PDF and a non-UTF-8 name, page ranges and errors."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from dociq.cli.segment import main, parse_pages, select_pages
from dociq.data.ocr import PdfTextLayer
from dociq.inference.document_formats import nested_regions
from dociq.inference.documents import ANSWER, PageRegion
from dociq.io.rle import decode_rle

# (font size, x, baseline y, text) per page, PDF points on a 300 x 200 pt page
PAGES = [
    [(16, 20, 170, "Annual Report"), (9, 20, 140, "Revenue grew in every region this year."),
     (9, 20, 128, "Costs fell after the new plant opened."), (7, 130, 12, "page 1")],
    [(12, 20, 170, "Results by region"), (9, 20, 140, "North sold more than south."), (7, 130, 12, "page 2")],
    [(9, 20, 170, "Outlook for the coming year is stable."), (7, 130, 12, "page 3")],
]
QUESTION = "the page footer"


@pytest.fixture(scope="module")
def run_all(tmp_path_factory, finetune_checkpoint, text_pdf):
    """One run with every format, a question and overlays on a 3-page PDF."""
    root = tmp_path_factory.mktemp("segment")
    pdf = root / "report.pdf"
    pdf.write_bytes(text_pdf(PAGES, width=300, height=200))
    out, overlay = root / "out", root / "overlay"
    argv = [str(finetune_checkpoint[0]), str(pdf), "--out", str(out), "--format", "json", "coco", "labelstudio",
            "docling", "--question", QUESTION, "--overlay", str(overlay), "--threads", "1"]
    code = main(argv)
    return {"code": code, "pdf": pdf, "out": out, "overlay": overlay, "argv": argv,
            "json": json.loads((out / "report.json").read_text())}


def _page_sizes(pdf: Path) -> list[tuple[int, int]]:
    return [PdfTextLayer().render(pdf, i).shape[:2] for i in range(len(PAGES))]


def test_json_has_every_page_and_regions_inside_it(run_all):
    assert run_all["code"] == 0
    data = run_all["json"]
    assert data["source"] == str(run_all["pdf"])
    assert [p["page"] for p in data["pages"]] == [1, 2, 3]
    layer = PdfTextLayer()
    for page, (h, w) in zip(data["pages"], _page_sizes(run_all["pdf"])):
        assert (page["height"], page["width"]) == (h, w) and page["dpi"] == 144.0 and page["words"] == "pdf"
        found = layer.words(run_all["pdf"], page["page"] - 1, (h, w))
        centres = ((found.boxes[:, :2] + found.boxes[:, 2:]) / 2).astype(int)
        assert page["regions"], "every page has text, so word-block regions"
        for region in page["regions"]:
            mask = decode_rle(region["rle"])
            assert mask.shape == (h, w) and mask.any()
            x0, y0, x1, y1 = region["box"]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
            ys, xs = np.nonzero(mask)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == pytest.approx((x0, y0, x1, y1), abs=1)
            assert 0 <= region["score"] <= 1
            assert region["question"] in (None, QUESTION)
            assert (region["class"] == ANSWER) == (region["question"] is not None)
            # the words whose centre the mask holds, in the text layer's (reading) order
            inside = [word for word, (cx, cy) in zip(found.words, centres) if mask[cy, cx]]
            assert region["text"] == " ".join(inside)
        assert any(r["text"] for r in page["regions"] if r["question"] is None)


def test_coco_file_loads_with_pycocotools(run_all):
    from pycocotools.coco import COCO

    coco = COCO(str(run_all["out"] / "report.coco.json"))
    assert sorted(coco.getImgIds()) == [1, 2, 3]
    assert coco.imgs[2]["file_name"] == "report.pdf#page=2"
    names = {c["name"] for c in coco.loadCats(coco.getCatIds())}
    assert {"paragraph", "title", "region", ANSWER} <= names
    pages = run_all["json"]["pages"]
    assert len(coco.getAnnIds()) == sum(len(p["regions"]) for p in pages)
    for page in pages:
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[page["page"]]))
        assert [coco.cats[a["category_id"]]["name"] for a in anns] == [r["class"] for r in page["regions"]]
        for ann, region in zip(anns, page["regions"]):
            assert np.array_equal(coco.annToMask(ann).astype(bool), decode_rle(region["rle"]))


def test_label_studio_tasks_load_with_the_engine_reader(run_all):
    from dociq.engine.label_studio import LabelConfig, annotation_masks, local_path

    out = run_all["out"]
    tasks = json.loads((out / "report.labelstudio.json").read_text())
    assert [t["data"]["page"] for t in tasks] == [1, 2, 3]
    config = LabelConfig.parse((out / "label_config.xml").read_text())
    assert {"paragraph", "region", QUESTION} <= set(config.labels)
    from dociq.data.image_io import load_page_image

    for task, page in zip(tasks, run_all["json"]["pages"]):
        image = load_page_image(local_path(task["data"]["image"], out))      # Label Studio's local-files path
        assert image.shape[:2] == (page["height"], page["width"])
        found = annotation_masks(task["predictions"][0], (page["height"], page["width"]))
        assert [label for _, label in found] == [r["question"] or r["class"] for r in page["regions"]]
        for (mask, _), region in zip(found, page["regions"]):
            assert np.array_equal(mask, decode_rle(region["rle"]))


def test_docling_document_loads_back_with_pages_and_items(run_all):
    from docling_core.types.doc import ContentLayer, DoclingDocument

    doc = DoclingDocument.load_from_json(run_all["out"] / "report.docling.json")
    assert sorted(doc.pages) == [1, 2, 3]
    assert (doc.pages[1].size.width, doc.pages[1].size.height) == pytest.approx((300, 200), abs=1)
    items = [item for item, _ in doc.iterate_items(included_content_layers={ContentLayer.BODY,
                                                                            ContentLayer.FURNITURE})
             if hasattr(item, "prov") and item.prov]
    regions = [r for p in run_all["json"]["pages"] for r in p["regions"] if r["question"] is None]
    nested = 0
    for page, (h, w) in zip(run_all["json"]["pages"], _page_sizes(run_all["pdf"])):
        found = PdfTextLayer().words(run_all["pdf"], page["page"] - 1, (h, w))
        centres = ((found.boxes[:, :2] + found.boxes[:, 2:]) / 2).astype(int)
        page_regions = []
        for r in page["regions"]:
            mask = decode_rle(r["rle"])
            page_regions.append(PageRegion(mask, np.array(r["box"]), r["class"], r["score"], r["text"], r["question"],
                                           np.flatnonzero(mask[centres[:, 1], centres[:, 0]])))
        nested += len(nested_regions(page_regions))
    assert len(items) == len(regions) - nested
    texts = {r["text"] for r in regions if r["text"]}
    assert texts & {getattr(item, "text", None) for item in items}
    for item in items:
        prov = item.prov[0]
        assert prov.page_no in (1, 2, 3)
        assert 0 <= prov.bbox.l < prov.bbox.r <= 301 and 0 <= prov.bbox.b < prov.bbox.t <= 201


def test_overlays_have_a_legend_strip(run_all):
    from PIL import Image

    files = sorted(run_all["overlay"].glob("*.png"))
    assert [f.name for f in files] == ["report-p001.png", "report-p002.png", "report-p003.png"]
    for f, (h, w) in zip(files, _page_sizes(run_all["pdf"])):
        with Image.open(f) as picture:
            assert picture.width == w and picture.height > h + 16      # the legend below the page


def test_second_run_skips_the_document_and_leaves_its_files(run_all, capsys):
    files = sorted(p for p in run_all["out"].rglob("*") if p.is_file())
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files if p.name != "label_config.xml"}
    capsys.readouterr()
    assert main(run_all["argv"]) == 0
    summary = capsys.readouterr().out
    assert "0 documents done, 1 skipped" in summary and "0 failed" in summary
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before


def test_page_range_and_questions_only(run_all, tmp_path, finetune_checkpoint):
    out = tmp_path / "out"
    assert main([str(finetune_checkpoint[0]), str(run_all["pdf"]), "--out", str(out), "--pages", "2-",
                 "--no-regions", "--question", QUESTION, "--question", "the title", "--threads", "1"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert [p["page"] for p in data["pages"]] == [2, 3]
    for page in data["pages"]:
        assert all(r["class"] == ANSWER and r["question"] in (QUESTION, "the title") for r in page["regions"])


def test_a_broken_pdf_and_a_non_utf8_name_do_not_stop_the_run(tmp_path, finetune_checkpoint, text_pdf, capsys):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "good.pdf").write_bytes(text_pdf(PAGES[:1], width=300, height=200))
    (src / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really a PDF\n")
    (src / "notes.txt").write_text("not a document")
    with open(os.path.join(os.fsencode(src), b"caf\xe9.pdf"), "wb") as f:
        f.write(text_pdf(PAGES[:1], width=300, height=200))
    out = tmp_path / "out"
    assert main([str(finetune_checkpoint[0]), str(src), "--out", str(out), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert f"failed {src / 'broken.pdf'}: not a readable PDF" in captured.err
    assert "caf\\xe9.pdf: name is not valid UTF-8" in captured.err
    assert "notes.txt: not a document type" in captured.err
    assert "1 documents done, 0 skipped (already done), 1 failed; 1 pages" in captured.out
    assert (out / "sub" / "good.json").is_file() and not (out / "broken.json").exists()


def test_every_document_failing_is_exit_status_1(tmp_path, finetune_checkpoint, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.pdf").write_bytes(b"not a PDF at all")
    assert main([str(finetune_checkpoint[0]), str(src), "--out", str(tmp_path / "out")]) == 1
    assert "0 documents done, 0 skipped (already done), 1 failed" in capsys.readouterr().out


def test_clashing_stems_keep_their_suffix(tmp_path, finetune_checkpoint, text_pdf):
    from PIL import Image

    pdf = tmp_path / "page.pdf"
    pdf.write_bytes(text_pdf(PAGES[:1], width=300, height=200))
    Image.fromarray(PdfTextLayer(dpi=72).render(pdf, 0)).save(tmp_path / "page.png")
    out = tmp_path / "out"
    assert main([str(finetune_checkpoint[0]), str(pdf), str(tmp_path / "page.png"), "--out", str(out),
                 "--ocr", "none"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["page.pdf.json", "page.png.json"]
    assert json.loads((out / "page.png.json").read_text())["pages"][0]["words"] == "none"


def test_page_ranges_parse_and_select():
    assert parse_pages("1-3,5, 9-") == [(1, 3), (5, 5), (9, None)]
    assert select_pages(parse_pages("2-3,5,9-"), 10) == [2, 3, 5, 9, 10]
    assert select_pages(parse_pages("2-30"), 4) == [2, 3, 4]
    assert select_pages(None, 3) == [1, 2, 3]
    for spec, says in [("0", "numbered from 1"), ("3-1", "runs backwards"), ("a", "'a' is not a page"),
                       ("1,,2", "'' is not a page"), ("-2", "'-2' is not a page")]:
        with pytest.raises(ValueError, match=says):
            parse_pages(spec)


@pytest.mark.parametrize("argv, says", [
    (["--pages", "2-1"], "the range 2-1 runs backwards"),
    (["--no-regions"], "--no-regions without --question"),
    (["--threads", "0"], "--threads 0: give 1 or more"),
    (["--dpi", "nan"], "--dpi nan: give a resolution from 36 to 1200"),
])
def test_usage_errors_are_one_line_and_status_2(tmp_path, text_pdf, argv, says, capsys):
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(text_pdf(PAGES[:1], width=300, height=200))
    code = main([str(tmp_path / "never-read.ckpt"), str(pdf), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err and err.startswith("dociq segment: error: ")


def test_missing_input_and_empty_folder_are_usage_errors(tmp_path, capsys):
    assert main(["x.ckpt", str(tmp_path / "nope.pdf"), "--out", str(tmp_path / "out")]) == 2
    assert "nope.pdf: no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["x.ckpt", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no PDF or image files in" in capsys.readouterr().err


def test_docling_without_docling_core_names_the_extra(tmp_path, text_pdf, monkeypatch, capsys):
    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(text_pdf(PAGES[:1], width=300, height=200))
    monkeypatch.setitem(sys.modules, "docling_core", None)        # import docling_core now fails
    monkeypatch.setitem(sys.modules, "docling_core.types.doc", None)
    code = main(["x.ckpt", str(pdf), "--out", str(tmp_path / "out"), "--format", "docling"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'dociq[segment]'" in err and err.count("\n") == 1


def test_a_crash_while_writing_leaves_no_half_file_and_the_rerun_finishes(tmp_path, finetune_checkpoint, text_pdf,
                                                                          monkeypatch, capsys):
    import dociq.cli.segment_outputs as outputs

    pdf = tmp_path / "a.pdf"
    pdf.write_bytes(text_pdf(PAGES[:1], width=300, height=200))
    out = tmp_path / "out"
    argv = [str(finetune_checkpoint[0]), str(pdf), "--out", str(out), "--format", "coco", "--threads", "1"]

    def broken(source, pages):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "json_document", broken)      # the JSON is written last: its write fails
    assert main(argv) == 1
    assert "failed " + str(pdf) + ": [Errno 28] No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["a.coco.json"]          # no a.json, no temp file
    monkeypatch.undo()
    assert main(argv) == 0                                                  # not skipped: a.json is missing
    assert "1 documents done, 0 skipped" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["a.coco.json", "a.json"]


def test_an_image_is_read_by_tesseract(tmp_path, finetune_checkpoint, text_pdf):
    from PIL import Image

    if shutil.which("tesseract") is None:
        pytest.skip("tesseract is not installed on this machine (.ci/run installs it)")
    pdf = tmp_path / "scan.pdf"
    pdf.write_bytes(text_pdf([[(28, 20, 60, "Hello Tesseract")]], width=300, height=100))
    Image.fromarray(PdfTextLayer(dpi=150).render(pdf, 0)).save(tmp_path / "scan.png")
    out = tmp_path / "out"
    assert main([str(finetune_checkpoint[0]), str(tmp_path / "scan.png"), "--out", str(out), "--threads", "1"]) == 0
    page = json.loads((out / "scan.json").read_text())["pages"][0]
    assert page["words"] == "tesseract" and page["dpi"] is None
    assert "Hello" in " ".join(r["text"] for r in page["regions"])


def test_tesseracts_confidences_reach_the_predictor(tmp_path, finetune_checkpoint, monkeypatch):
    """A page read by tesseract reaches the Predictor with each word's confidence, so the words it
    doubts are told apart there (they hide no signature, name no class)."""
    from PIL import Image

    from dociq.data.ocr import OcrWords
    from dociq.inference.documents import DocumentSegmenter
    from dociq.inference.predictor import Predictor

    class Reader:
        def recognise(self, image):
            return OcrWords(["Total:", "scribble"], np.array([[10, 10, 60, 24], [70, 10, 140, 24]]),
                            image.shape[:2], np.array([96.0, 12.0]))

    Image.fromarray(np.full((100, 200, 3), 255, np.uint8)).save(tmp_path / "page.png")
    segmenter = DocumentSegmenter(Predictor.from_checkpoint(finetune_checkpoint[0]), questions=["the title"],
                                  regions=False, ocr="tesseract")
    monkeypatch.setattr(segmenter, "tesseract", Reader)
    result = segmenter.segment_page(tmp_path / "page.png", 1)
    assert result.words == ["Total:", "scribble"] and result.word_source == "tesseract"
    np.testing.assert_array_equal(segmenter.predictor.page.word_confidences, [96.0, 12.0])


def test_images_without_tesseract_name_the_fix(tmp_path, monkeypatch, capsys):
    import dociq.data.ocr as ocr
    from PIL import Image

    Image.new("RGB", (40, 30), "white").save(tmp_path / "scan.png")
    monkeypatch.setattr(ocr.shutil, "which", lambda cmd: None)
    assert main(["x.ckpt", str(tmp_path / "scan.png"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 image(s) need OCR" in err
    assert "apt-get install -y tesseract-ocr" in err and "--ocr none" in err


def test_two_inputs_that_would_share_an_output_are_a_usage_error(tmp_path, capsys):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.pdf").write_bytes(b"%PDF-1.4\n")
    assert main(["x.ckpt", str(tmp_path / "a" / "x.pdf"), str(tmp_path / "b" / "x.pdf"), "--out", "o"]) == 2
    assert "would both write x.pdf.json under --out" in capsys.readouterr().err


def test_results_are_readable_as_open_would_create_them(run_all):
    umask = os.umask(0o022)
    os.umask(umask)
    for path in (run_all["out"] / "report.json", run_all["overlay"] / "report-p001.png"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_nested_regions_are_those_whose_words_a_larger_region_holds():
    def region(words, area, question=None):
        mask = np.zeros((10, 10), bool)
        mask.flat[:area] = True
        return PageRegion(mask, np.zeros(4), "paragraph", 1.0, question=question, word_index=np.array(words))

    regions = [region([0, 1, 2, 3], 40), region([1, 2], 10), region([3, 4], 20), region([], 5),
               region([5], 6), region([5], 6), region([0, 1, 2, 3, 4, 5], 90, question="q")]
    # a line inside its paragraph goes; one that spills out, a region without words and the first of
    # two equal regions stay; an answer holds no region
    assert nested_regions(regions) == {1, 5}
