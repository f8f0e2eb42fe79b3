"""Import (folders, PDFs, zips, COCO, FUNSD), held-out split, COCO export read back by data=coco."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest
from PIL import Image

from dociq.data.datasets.coco import CocoDocuments
from dociq.cli.engine import main as engine_main
from dociq.engine.coco_export import export_coco
from dociq.engine.importer import import_coco, import_folder, import_funsd, split_heldout
from dociq.engine.store import EngineStore

PDF_PAGES = [[(14, 20, 120, "Invoice number 1234"), (10, 20, 90, "Total due today")],
             [(14, 20, 120, "Second page heading")]]


@pytest.fixture
def store(tmp_path):
    return EngineStore(tmp_path / "data", create=True)


@pytest.fixture
def folder(tmp_path, text_pdf):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    Image.fromarray(np.full((60, 80, 3), 250, np.uint8)).save(src / "scan.png")
    (src / "sub" / "doc.pdf").write_bytes(text_pdf(PDF_PAGES, width=200, height=150))
    (src / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    return src


def test_import_folder_png_and_two_page_pdf_with_text_layer(store, folder):
    result = import_folder(store, folder, ocr="none", dpi=72)
    assert len(result) == 3
    assert [s.name for s in result.skipped] == ["broken.jpg"]
    assert "broken.jpg" in result.skipped[0].reason
    pages = {p.source.split("/src/")[-1]: p for p in store.pages()}
    assert set(pages) == {"scan.png", "sub/doc.pdf#page=1", "sub/doc.pdf#page=2"}
    assert (pages["scan.png"].height, pages["scan.png"].width) == (60, 80)
    assert (pages["sub/doc.pdf#page=1"].height, pages["sub/doc.pdf#page=1"].width) == (150, 200)  # 72 dpi
    words1, boxes1 = store.page_words(pages["sub/doc.pdf#page=1"].id)
    assert words1 == ["Invoice", "number", "1234", "Total", "due", "today"]
    # "Invoice" sits at x=20 pt, baseline 120 pt from the bottom of a 150 pt page (1 px = 1 pt here)
    x0, y0, x1, y1 = boxes1[0]
    assert 18 <= x0 <= 22 and 14 <= y0 < y1 <= 31 and x1 > x0
    assert store.page_words(pages["sub/doc.pdf#page=2"].id)[0] == ["Second", "page", "heading"]
    assert store.page_words(pages["scan.png"].id)[0] == []  # ocr="none"

    again = import_folder(store, folder, ocr="none", dpi=72)  # re-running adds nothing
    assert list(again) == [] and sorted(again.existing) == sorted(p.id for p in store.pages())
    assert len(store.pages()) == 3


def test_import_folder_ocr_auto_reads_a_png_with_tesseract(store, tmp_path, text_pdf):
    pytest.importorskip("pytesseract")
    from dociq.data.ocr import PdfTextLayer

    pdf = tmp_path / "page.pdf"
    pdf.write_bytes(text_pdf([[(28, 20, 60, "Hello Tesseract")]], width=300, height=100))
    src = tmp_path / "pngs"
    src.mkdir()
    Image.fromarray(PdfTextLayer(dpi=150).render(pdf, 0)).save(src / "page.png")
    try:
        result = import_folder(store, src, ocr="auto")
    except RuntimeError as err:  # no tesseract binary on this machine
        pytest.skip(str(err))
    words, _ = store.page_words(result[0])
    if not words:
        pytest.skip("tesseract is not installed: ocr='auto' gives pages without words")
    assert "Hello" in words


def test_import_folder_refuses_bad_arguments(store, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="ocr='ocr-please'"):
        import_folder(store, tmp_path, ocr="ocr-please")
    with pytest.raises(FileNotFoundError, match="missing"):
        import_folder(store, tmp_path / "missing")
    import dociq.engine.importer as importer

    monkeypatch.setattr(importer, "MAX_ZIP_MEMBER_BYTES", 10)
    with zipfile.ZipFile(tmp_path / "big.zip", "w") as z:
        z.writestr("page.png", b"x" * 11)
    result = import_folder(store, tmp_path / "big.zip")
    assert not result and "over the 10-byte limit" in result.skipped[0].reason


def test_unsafe_names_are_refused_in_zips_links_and_coco(store, tmp_path, text_pdf):
    src = tmp_path / "zipsrc"
    src.mkdir()
    png = tmp_path / "p.png"
    Image.fromarray(np.full((30, 40, 3), 100, np.uint8)).save(png)
    with zipfile.ZipFile(src / "pages.zip", "w") as z:
        z.write(png, "ok/page.png")
        z.writestr("../../evil.png", png.read_bytes())
        z.writestr("/abs/evil2.png", png.read_bytes())
        z.writestr("two.pdf", text_pdf(PDF_PAGES, width=200, height=150))
    outside = tmp_path / "outside.png"
    Image.fromarray(np.full((30, 40, 3), 7, np.uint8)).save(outside)
    os.symlink(outside, src / "link.png")
    result = import_folder(store, src, ocr="none", dpi=72)
    assert len(result) == 3  # ok/page.png + the PDF's two pages
    reasons = {s.name.split("!")[-1]: s.reason for s in result.skipped}
    assert "'..'" in reasons["../../evil.png"] and "refused" in reasons["../../evil.png"]
    assert "absolute" in reasons["/abs/evil2.png"]
    assert "outside the folder" in reasons["link.png"]
    assert not (tmp_path.parent / "evil.png").exists()

    images = tmp_path / "coco" / "images"
    images.mkdir(parents=True)
    Image.fromarray(np.full((30, 40, 3), 200, np.uint8)).save(images / "good.png")
    ann = tmp_path / "coco" / "ann.json"
    ann.write_text(json.dumps({"images": [
        {"id": 1, "file_name": "good.png", "width": 40, "height": 30},
        {"id": 2, "file_name": "../../p.png", "width": 40, "height": 30},
        {"id": 3, "file_name": str(png), "width": 40, "height": 30}],
        "annotations": [], "categories": []}))
    coco_result = import_coco(store, ann)
    assert len(coco_result) == 1 and len(coco_result.skipped) == 2
    assert all("refused" in s.reason for s in coco_result.skipped)
    assert "'../../p.png'" in coco_result.skipped[0].reason


def _annotate(store):
    """Two categorised regions with questions, one free question, one rejected, one undone."""
    saved = {}
    for k, page in enumerate(store.pages()):
        h, w = page.height, page.width
        m1 = np.zeros((h, w), bool)
        m1[5:20, 10:60] = True
        m2 = np.zeros((h, w), bool)
        m2[25 + k:40, 5:30] = True
        m3 = np.zeros((h, w), bool)
        m3[2:8, 2:70] = True
        a1 = store.save_annotation(page.id, m1, "where is the heading?", category="title", clicks=2)
        a2 = store.save_annotation(page.id, m2, "", category="paragraph", clicks=1)
        a3 = store.save_annotation(page.id, m3, "what is the total?", kind="reading", clicks=4)
        store.save_annotation(page.id, m2, "bad guess", category="title", status="rejected")
        gone = store.save_annotation(page.id, m3, "undone one", category="figure")
        store.undo(gone)
        saved[page.id] = {a1: m1, a2: m2, a3: m3}
    return saved


def test_export_reads_back_unchanged_with_data_coco(store, folder, tmp_path):
    import_folder(store, folder, ocr="none", dpi=72)
    saved = _annotate(store)
    out = export_coco(store, tmp_path / "export" / "annotations.json")
    assert (tmp_path / "export" / "images").is_dir()

    data = CocoDocuments(annotation_file=out, require_words=False)
    assert len(data) == len(store.pages()) == 3
    for i in range(len(data)):
        page = data[i]
        pid = page.meta["page_id"]
        np.testing.assert_array_equal(page.image, store.page_image(pid))
        words, boxes = store.page_words(pid)
        assert page.words == words
        np.testing.assert_allclose(page.word_boxes, boxes, atol=1e-3)
        masks = saved[pid]
        a1, a2, a3 = masks
        # categorised annotations are regions; the undone and rejected ones are not exported
        assert sorted(r.label for r in page.regions) == ["paragraph", "title"]
        by_label = {r.label: r for r in page.regions}
        np.testing.assert_array_equal(by_label["title"].mask, masks[a1])
        np.testing.assert_array_equal(by_label["paragraph"].mask, masks[a2])
        questions = {q.text: q for q in page.questions}
        assert set(questions) == {"where is the heading?", "what is the total?", "segment every title",
                                  "segment every paragraph"}
        np.testing.assert_array_equal(questions["where is the heading?"].mask, masks[a1])
        assert questions["where is the heading?"].region_ids == [page.regions.index(by_label["title"])]
        np.testing.assert_array_equal(questions["what is the total?"].mask, masks[a3])  # question-only
        assert questions["what is the total?"].kind == "reading"
        assert questions["segment every paragraph"].kind == "category"
    # the PDF pages carry their text-layer words into the export: the default data=coco reads them
    with_words = CocoDocuments(annotation_file=out, on_bad_sample="skip")
    assert sum(with_words[i] is not None for i in range(len(with_words))) == 2

    # an export imports back into a fresh store with the same annotations
    other = EngineStore(tmp_path / "other", create=True)
    back = import_coco(other, out)
    assert len(back) == 3 and not back.skipped
    for page in other.pages():
        anns = other.annotations(page.id)
        original = store.page_image(page.id)
        np.testing.assert_array_equal(other.page_image(page.id), original)
        assert sorted((a.category or "", a.question) for a in anns) == sorted(
            [("title", "where is the heading?"), ("paragraph", ""), ("", "what is the total?")])

    heldout_only = export_coco(store, tmp_path / "export2" / "ann.json", split="heldout")
    assert json.loads(heldout_only.read_text())["images"] == []


def test_export_refuses_a_non_json_path(store, tmp_path):
    with pytest.raises(ValueError, match="out_path"):
        export_coco(store, tmp_path / "out")


def test_import_funsd_entities_and_link_questions(store, tmp_path):
    root = tmp_path / "funsd"
    for d in ("annotations", "images"):
        (root / "training_data" / d).mkdir(parents=True)
    Image.fromarray(np.full((50, 100, 3), 255, np.uint8)).save(root / "training_data" / "images" / "f1.png")
    form = [{"id": 0, "text": "Date:", "box": [5, 5, 30, 15], "label": "question",
             "words": [{"text": "Date:", "box": [5, 5, 30, 15]}], "linking": [[0, 1]]},
            {"id": 1, "text": "May 4", "box": [35, 5, 70, 15], "label": "answer",
             "words": [{"text": "May", "box": [35, 5, 50, 15]}, {"text": "4", "box": [55, 5, 70, 15]}],
             "linking": [[0, 1]]},
            {"id": 2, "text": "FORM", "box": [5, 30, 50, 45], "label": "header",
             "words": [{"text": "FORM", "box": [5, 30, 50, 45]}], "linking": []}]
    (root / "training_data" / "annotations" / "f1.json").write_text(json.dumps({"form": form}))
    result = import_funsd(store, root, "training_data")
    assert len(result) == 1
    pid = result[0]
    assert store.page_words(pid)[0] == ["Date:", "May", "4", "FORM"]
    anns = {a.category: a for a in store.annotations(pid)}
    assert set(anns) == {"question", "answer", "header"}
    assert anns["answer"].question == "what is the answer to 'Date:'?" and anns["answer"].kind == "link"
    assert anns["answer"].mask[5:15, 35:70].all() and anns["answer"].mask.sum() == 35 * 10


def test_split_heldout_is_stable_and_grows(store):
    for k in range(10):
        store.add_page(np.full((8, 8, 3), k, np.uint8), [], np.zeros((0, 4)), source=f"{k}")
    held = split_heldout(store, 0.2, seed=3)
    assert len(held) == 2 and held == split_heldout(store, 0.2, seed=99)  # kept, not redrawn
    assert {p.id for p in store.pages(split="heldout")} == set(held)
    for k in range(10, 15):
        store.add_page(np.full((8, 8, 3), k, np.uint8), [], np.zeros((0, 4)), source=f"{k}")
    grown = split_heldout(store, 0.2, seed=3)
    assert len(grown) == 3 and set(held) <= set(grown)
    with pytest.raises(ValueError, match="fraction"):
        split_heldout(store, 1.0)


def test_cli_import_progress_split_export(tmp_path, folder, capsys):
    data = tmp_path / "cli"
    with pytest.raises(FileNotFoundError, match="dociq engine import"):
        engine_main(["progress", "--data", str(data)])
    assert engine_main(["import", "--data", str(data), str(folder), "--ocr", "none", "--dpi", "72"]) == 0
    out = capsys.readouterr()
    assert "3 pages added" in out.out and "1 skipped" in out.out and "broken.jpg" in out.err
    store = EngineStore(data)
    m = np.zeros((150, 200), bool)
    m[10:20, 10:20] = True
    store.save_annotation(store.pages()[1].id, m, "q", category="c", clicks=3)
    assert engine_main(["split", "--data", str(data), "--fraction", "0.34"]) == 0
    assert engine_main(["progress", "--data", str(data), "--json"]) == 0
    progress = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert (progress["pages"], progress["accepted"], progress["mean_clicks_per_accepted"]) == (3, 1, 3.0)
    assert progress["pages_per_split"] == {"train": 2, "heldout": 1}
    out_file = tmp_path / "exp" / "a.json"
    assert engine_main(["export", "--data", str(data), "--out", str(out_file)]) == 0
    assert "1 pages, 1 regions" in capsys.readouterr().out
    assert len(CocoDocuments(out_file)) == 1


def _page_both_writers_agree_on():
    """A Page as the engine stores it: tight boxes, each region's words those whose centre it holds,
    questions in the engine's order (annotators' on regions, free ones, then one per category)."""
    from dociq.data.masks import mask_box
    from dociq.data.schema import Page, Question, Region
    from dociq.data.text_blocks import words_in_masks

    h, w = 48, 64
    image = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    words = ["Invoice", "No.", "4711", "Total:", "12.50"]
    boxes = np.array([[2, 3, 20, 9], [22, 3, 30, 9], [32, 3, 44, 9], [2, 30, 18, 36], [40, 30, 55, 36]], np.float32)
    masks = [np.zeros((h, w), bool) for _ in range(3)]
    masks[0][2:10, 1:46] = True
    masks[1][29:37, 1:19] = True
    masks[2][29:37, 39:57] = True
    masks[2][37, 45] = True  # not a rectangle
    labels = ["title", "field", "field"]
    regions = []
    for label, mask, ids in zip(labels, masks, words_in_masks(boxes, masks)):
        regions.append(Region(label, mask_box(mask), mask, " ".join(words[j] for j in ids), list(ids)))
    cell = np.zeros((h, w), bool)
    cell[30:34, 41:50] = True
    questions = [Question("where is the heading?", "layout", masks[0].copy(), [0]),
                 Question("what is the total?", "reading", masks[2].copy(), [2]),
                 Question("which cell holds the amount?", "cell", cell, []),
                 Question("segment every title", "category", masks[0].copy(), [0]),
                 Question("segment every field", "category", masks[1] | masks[2], [1, 2])]
    return Page(image, words, boxes, regions, questions, meta={"page_id": "p"})


def test_engine_export_and_write_coco_read_back_as_the_same_page(store, tmp_path):
    from pycocotools.coco import COCO

    from dociq.data.datasets.coco import write_coco
    from dociq.engine.importer import add_annotated_page

    page = _page_both_writers_agree_on()
    add_annotated_page(store, page, source="hand", split="train", author="test")
    engine_json = export_coco(store, tmp_path / "engine" / "annotations.json")
    dataset_json = write_coco([page], tmp_path / "dataset")
    a, b = CocoDocuments(engine_json)[0], CocoDocuments(dataset_json)[0]
    for got in (a, b):
        np.testing.assert_array_equal(got.image, page.image)
        assert got.words == page.words
        np.testing.assert_allclose(got.word_boxes, page.word_boxes)
        assert [(r.label, r.text, r.word_ids) for r in got.regions] == [
            (r.label, r.text, r.word_ids) for r in page.regions]
        for r, want in zip(got.regions, page.regions):
            np.testing.assert_allclose(r.box, want.box)
            np.testing.assert_array_equal(r.mask, want.mask)
        assert [(q.text, q.kind, q.region_ids) for q in got.questions] == [
            (q.text, q.kind, q.region_ids) for q in page.questions]
        for q, want in zip(got.questions, page.questions):
            np.testing.assert_array_equal(q.mask, want.mask)
    for path in (engine_json, dataset_json):  # one field name for a question's targets; pycocotools reads both
        data = json.loads(path.read_text())
        assert all("annotation_ids" in q and "region_ids" not in q for q in data["images"][0]["questions"])
        coco = COCO(str(path))
        masks = [coco.annToMask(ann).astype(bool) for ann in coco.loadAnns(coco.getAnnIds(imgIds=[1]))]
        assert len(masks) == 3 and all((m == r.mask).all() for m, r in zip(masks, page.regions))


def test_engine_export_with_region_ids_of_an_older_dociq_still_loads(store, folder, tmp_path):
    import_folder(store, folder, ocr="none", dpi=72)
    _annotate(store)
    out = export_coco(store, tmp_path / "export" / "annotations.json")
    new = CocoDocuments(out, require_words=False)
    data = json.loads(out.read_text())
    for img in data["images"]:
        order = [a["id"] for a in data["annotations"] if a["image_id"] == img["id"]]
        for q in img["questions"]:
            q["region_ids"] = [order.index(i) for i in q.pop("annotation_ids")]
    old_file = tmp_path / "export" / "old.json"
    old_file.write_text(json.dumps(data))
    old = CocoDocuments(old_file, require_words=False)
    for i in range(len(new)):
        assert [(q.text, q.kind, q.region_ids) for q in old[i].questions] == [
            (q.text, q.kind, q.region_ids) for q in new[i].questions]
        assert all((p.mask == q.mask).all() for p, q in zip(old[i].questions, new[i].questions))
