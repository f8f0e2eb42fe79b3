"""Predictor.set_image once, predict many (SAM's SamPredictor, issue 13) and the predict CLI's inputs
(--words JSON, --pdf --page) and outputs (--masks-dir, --coco-json)."""
import json

import numpy as np
import pytest
from PIL import Image

from dociq.data.ocr import PdfTextLayer
from dociq.cli.predict import main
from dociq.inference.predictor import Predictor, check_device

H, W = 90, 160                      # landscape, not the model's 128 px
WORDS = ["Invoice", "Total", "42.00"]
WORD_BOXES = [[10, 5, 70, 20], [10, 60, 50, 72], [100, 60, 150, 72]]
QUESTIONS = ["the title", "the total amount"]


@pytest.fixture(scope="module")
def predictor(finetune_checkpoint):
    return Predictor.from_checkpoint(finetune_checkpoint[0])


@pytest.fixture(scope="module")
def page():
    page = np.full((H, W, 3), 245, np.uint8)
    page[5:20, 10:70] = 20
    page[60:72, 10:150] = 60
    return page


@pytest.fixture
def counted(predictor, monkeypatch):
    """predictor whose model counts its embed_page calls."""
    calls = []
    embed_page = predictor.model.embed_page

    def counting(batch):
        calls.append(1)
        return embed_page(batch)

    monkeypatch.setattr(predictor.model, "embed_page", counting)
    return predictor, calls


PROMPTS = [dict(question=QUESTIONS), dict(points=[[30, 12]]), dict(points=[[30, 12], [120, 66]], point_labels=[1, 0]),
           dict(boxes=[[5, 2, 80, 25], [5, 55, 155, 75]]), dict(question=QUESTIONS, boxes=[5, 55, 155, 75])]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["questions", "click", "clicks", "boxes", "questions+box"])
def test_set_image_then_predict_equals_the_one_call_form(predictor, page, prompt):
    one_masks, one_scores = predictor.predict(page, words=WORDS, word_boxes=WORD_BOXES, threshold=-0.5, **prompt)
    predictor.reset_image()
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    masks, scores = predictor.predict(threshold=-0.5, **prompt)
    assert masks.dtype == bool and masks.shape == one_masks.shape == (len(one_scores), H, W)
    np.testing.assert_array_equal(masks, one_masks)
    np.testing.assert_array_equal(scores, one_scores)


def test_the_page_is_embedded_once_for_many_prompts(counted, page):
    predictor, calls = counted
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    assert predictor.is_image_set and len(calls) == 1
    first, _ = predictor.predict(question="the title", threshold=-0.5)
    predictor.predict(points=[[30, 12]])
    predictor.predict(boxes=[5, 2, 80, 25], multimask_output=True)
    predictor.predict_masks(question=QUESTIONS, return_logits=True)
    again, _ = predictor.predict(question="the title", threshold=-0.5)
    assert len(calls) == 1                                   # four prompts later: still one embedding
    np.testing.assert_array_equal(again, first)              # the cache is not changed by the prompts
    predictor.predict(page, question="the title")            # the one-call form embeds the page it is given
    assert len(calls) == 2


def test_the_page_words_are_grouped_into_blocks_once_for_many_prompts(predictor, page, monkeypatch):
    import dociq.inference.snapping as module
    calls = []
    page_blocks = module.page_blocks
    monkeypatch.setattr(module, "page_blocks", lambda *a, **k: calls.append(1) or page_blocks(*a, **k))
    assert predictor.snap == "blocks"
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    first, _ = predictor.predict(question="the title", threshold=-0.5)
    predictor.predict(points=[[30, 12]])
    again, _ = predictor.predict(question="the title", threshold=-0.5)
    assert len(calls) == 1
    np.testing.assert_array_equal(again, first)
    predictor.set_image(page, words=WORDS[:1], word_boxes=WORD_BOXES[:1])    # a new page: grouped again
    predictor.predict(question="the title")
    assert len(calls) == 2


def test_the_one_call_form_leaves_its_page_set(predictor, page):
    predictor.reset_image()
    with_image, s1 = predictor.predict(page, question="the title", words=WORDS, word_boxes=WORD_BOXES)
    cached, s2 = predictor.predict(question="the title")
    np.testing.assert_array_equal(cached, with_image)
    np.testing.assert_array_equal(s1, s2)
    assert predictor.page.original_size == (H, W) and predictor.page.words == WORDS


def test_multimask_output_gives_three_candidates_per_prompt(predictor, page):
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    masks, scores, low_res = predictor.predict(question=QUESTIONS, multimask_output=True)
    h, w = predictor.low_res_size
    assert masks.shape == (2, 3, H, W) and masks.dtype == bool
    assert scores.shape == (2, 3) and low_res.shape == (2, 3, h, w) and (h, w) == (32, 32)
    # a lone click is ambiguous: its single raw mask is the best scored of its three candidates (SAM);
    # snapped to blocks it is the innermost (tests/test_predict.py)
    with predictor.snapping(None):
        multi, multi_scores, _ = predictor.predict(points=[[30, 12]], multimask_output=True)
        single, single_scores = predictor.predict(points=[[30, 12]])
    best = int(multi_scores[0].argmax())
    np.testing.assert_array_equal(single[0], multi[0, best])
    assert single_scores[0] == multi_scores[0, best]


def test_return_logits_gives_the_thresholded_masks_logits(predictor, page):
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    logits, scores, low_res = predictor.predict(question=QUESTIONS, return_logits=True)
    assert logits.dtype == np.float32 and logits.shape == (2, H, W) and low_res.shape == (2, 1, 32, 32)
    threshold = float(np.median(logits))                 # masks of about half the page: not all/none
    with predictor.snapping(None):                       # the decoder's masks, not completed to blocks
        masks, same_scores = predictor.predict(question=QUESTIONS, threshold=threshold)
        m3, s3, low3 = predictor.predict_masks(question=QUESTIONS, threshold=threshold)  # SAM's triple, always
    assert 0 < masks.sum() < masks.size
    np.testing.assert_array_equal(logits > threshold, masks)
    np.testing.assert_array_equal(scores, same_scores)
    np.testing.assert_array_equal(m3, masks)
    np.testing.assert_array_equal(low3, low_res)


def test_mask_input_round_trip(predictor, page):
    """The low-res logits of one call are the next call's mask prompt, in SAM's shapes."""
    predictor.set_image(page, words=WORDS, word_boxes=WORD_BOXES)
    logits, scores, low_res = predictor.predict(points=[[30, 12]], return_logits=True)
    refined, refined_scores, refined_low = predictor.predict(points=[[30, 12], [120, 66]], point_labels=[1, 0],
                                                             mask_input=low_res, return_logits=True)
    plain, plain_scores, _ = predictor.predict(points=[[30, 12], [120, 66]], point_labels=[1, 0],
                                               return_logits=True)
    assert refined.shape == plain.shape == (1, H, W) and refined_low.shape == (1, 1, 32, 32)
    assert np.abs(refined - plain).max() > 1e-4 and refined_scores[0] != plain_scores[0]
    sam_shape, _ = predictor.predict(points=[[30, 12], [120, 66]], point_labels=[1, 0], mask_input=low_res[0],
                                     threshold=-1e9)                       # SamPredictor's [1, h, w]
    assert sam_shape.all()
    # the best multimask candidate of each prompt, as SAM's notebooks pick it; one mask shared by 2 questions
    _, multi_scores, multi_low = predictor.predict(points=[[30, 12]], multimask_output=True)
    best = multi_low[np.arange(1), multi_scores.argmax(1)][:, None]
    masks, _ = predictor.predict(question=QUESTIONS, mask_input=best)
    assert masks.shape == (2, H, W)
    masks, _ = predictor.predict(mask_input=low_res)                        # a mask prompt alone
    assert masks.shape == (1, H, W)
    with pytest.raises(ValueError, match=r"mask_input must be \[Q, 1, 32, 32\].*got shape \[1, 3, 32, 32\]"):
        predictor.predict(points=[[30, 12]], mask_input=multi_low)
    with pytest.raises(ValueError, match="prompt counts disagree: 2 questions, 0 point sets, 0 boxes, 3 mask"):
        predictor.predict(question=QUESTIONS, mask_input=np.zeros((3, 1, 32, 32)))
    with pytest.raises(ValueError, match="non-finite"):
        predictor.predict(mask_input=np.full((1, 1, 32, 32), np.nan))


def test_predict_without_a_page_is_refused(predictor, page):
    predictor.set_image(page)
    predictor.reset_image()
    assert not predictor.is_image_set
    with pytest.raises(RuntimeError, match=r"no page is set: call predictor.set_image\(image"):
        predictor.predict(question="the title")
    with pytest.raises(RuntimeError, match="no page is set"):
        predictor.predict_masks(points=[[1, 1]])
    predictor.set_image(page)
    with pytest.raises(ValueError, match="words / word_boxes / ocr belong to the page: pass them to set_image"):
        predictor.predict(question="the title", words=WORDS, word_boxes=WORD_BOXES)
    with pytest.raises(ValueError, match="first argument; a question goes in question="):
        predictor.predict("the title")
    with pytest.raises(ValueError, match="ocr='pdf' reads a PDF's text layer"):
        predictor.set_image(page, ocr="pdf")
    assert not predictor.is_image_set                       # a failed set_image leaves no stale page


def test_devices_are_checked():
    import torch

    with pytest.raises(ValueError, match="device='gpu0' is not a torch device"):
        check_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device on this machine: use device='cpu'"):
            check_device("cuda")
    assert check_device("cpu") == torch.device("cpu")


def test_from_pretrained_reads_an_exported_folder(finetune_checkpoint, predictor, page, tmp_path):
    from dociq.inference.model_folder import export_checkpoint

    folder = export_checkpoint(finetune_checkpoint[0], tmp_path / "model")
    loaded = Predictor.from_pretrained(folder)
    want = predictor.predict(page, question=QUESTIONS, words=WORDS, word_boxes=WORD_BOXES, return_logits=True)
    got = loaded.predict(page, question=QUESTIONS, words=WORDS, word_boxes=WORD_BOXES, return_logits=True)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    # the CLI takes the folder in place of a .ckpt
    png = tmp_path / "page.png"
    Image.fromarray(page).save(png)
    assert main([str(folder), str(png), "--question", "the title", "--out", str(tmp_path / "o.png")]) == 0


# ---- the CLI ---------------------------------------------------------------------------------

@pytest.fixture
def page_png(tmp_path, page):
    path = tmp_path / "page.png"
    Image.fromarray(page).save(path)
    return path


@pytest.mark.parametrize("form", ["list", "object"])
def test_cli_words_json_and_coco_results(finetune_checkpoint, predictor, page, page_png, tmp_path, form, capsys):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    words = tmp_path / "words.json"
    data = ([{"text": t, "box": b} for t, b in zip(WORDS, WORD_BOXES)] if form == "list"
            else {"words": WORDS, "boxes": WORD_BOXES})
    words.write_text(json.dumps(data))
    coco_json = tmp_path / "results.json"
    argv = [str(finetune_checkpoint[0]), str(page_png), "--words", str(words), "--question", QUESTIONS[0],
            "--question", QUESTIONS[1], "--threshold", "-0.5", "--coco-json", str(coco_json), "--image-id", "7",
            "--out", str(tmp_path / "overlay.png")]
    assert main(argv) == 0
    want, want_scores = predictor.predict(page, question=QUESTIONS, words=WORDS, word_boxes=WORD_BOXES,
                                          threshold=-0.5)
    gt = COCO()
    gt.dataset = {"images": [{"id": 7, "height": H, "width": W, "file_name": "page.png"}],
                  "categories": [{"id": 1, "name": "answer"}], "annotations": []}
    gt.createIndex()
    results = gt.loadRes(str(coco_json))
    anns = [results.anns[i] for i in sorted(results.anns)]
    assert [a["question"] for a in anns] == QUESTIONS and [a["prompt"] for a in anns] == [0, 1]
    for ann, mask, score in zip(anns, want, want_scores):
        np.testing.assert_array_equal(mask_utils.decode(ann["segmentation"]).astype(bool), mask)
        assert ann["score"] == pytest.approx(float(score)) and ann["image_id"] == 7
    assert "overlay written to" in capsys.readouterr().out


def test_cli_masks_dir_and_multimask(finetune_checkpoint, predictor, page, page_png, tmp_path):
    masks_dir = tmp_path / "masks"
    argv = [str(finetune_checkpoint[0]), str(page_png), "--point", "30", "12", "--multimask",
            "--masks-dir", str(masks_dir), "--out", str(tmp_path / "overlay.png")]
    assert main(argv) == 0
    want, _, _ = predictor.predict(page, points=[[30, 12]], multimask_output=True)
    files = sorted(p.name for p in masks_dir.iterdir())
    assert files == ["page_00_0.png", "page_00_1.png", "page_00_2.png"]
    for k, name in enumerate(files):
        np.testing.assert_array_equal(np.array(Image.open(masks_dir / name)) > 127, want[0, k])
    assert Image.open(tmp_path / "overlay.png").size == (W, H)


def test_cli_default_overlay_goes_to_the_current_folder(finetune_checkpoint, page_png, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main([str(finetune_checkpoint[0]), str(page_png), "--box", "5", "2", "80", "25"]) == 0
    assert [p.name for p in work.iterdir()] == ["page_prediction.png"]


def test_cli_reads_a_pdf_page_and_its_text_layer(finetune_checkpoint, predictor, text_pdf, tmp_path):
    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(text_pdf([[(12, 20, 120, "First page")], [(14, 20, 130, "Total due 42"),
                                                               (10, 20, 40, "footer text")]], 200, 150))
    image, words = PdfTextLayer(dpi=72).read(pdf, 1)                          # page 2, numbered from 1
    assert image.shape == (150, 200, 3) and list(words.words) == ["Total", "due", "42", "footer", "text"]
    logits, _, _ = predictor.predict(image, question="the total", words=words, return_logits=True)
    threshold = float(np.median(logits))                                      # a mask of about half the page
    masks_dir = tmp_path / "masks"
    argv = [str(finetune_checkpoint[0]), "--pdf", str(pdf), "--page", "2", "--dpi", "72", "--question",
            "the total", "--threshold", repr(threshold), "--snap", "none", "--masks-dir", str(masks_dir),
            "--out", str(tmp_path / "o.png")]
    assert main(argv) == 0
    got = np.array(Image.open(masks_dir / "doc_p2_00.png")) > 127
    np.testing.assert_array_equal(got, logits[0] > threshold)
    assert 0 < got.sum() < got.size


@pytest.mark.parametrize("extra, message", [
    (["--ocr", "pdf"], "--ocr pdf reads a PDF's text layer and an image has none: give --pdf FILE --page N"),
    (["--page", "2"], "--page 2 needs --pdf FILE"),
    (["--words", "{words}", "--ocr", "tesseract"], "not both"),
])
def test_cli_page_option_mistakes(finetune_checkpoint, page_png, tmp_path, capsys, extra, message):
    extra = [a.replace("{words}", str(tmp_path / "w.json")) for a in extra]
    assert main([str(finetune_checkpoint[0]), str(page_png), "--question", "x", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_cli_pdf_and_words_mistakes_name_the_file(finetune_checkpoint, page_png, text_pdf, tmp_path, capsys):
    pdf = tmp_path / "one.pdf"
    pdf.write_bytes(text_pdf([[(12, 20, 120, "Only page")]], 200, 150))
    ckpt = str(finetune_checkpoint[0])
    assert main([ckpt, "--pdf", str(pdf), "--page", "3", "--question", "x"]) == 2
    assert "--page 3 but the PDF has 1 page(s)" in capsys.readouterr().err
    bad = tmp_path / "bad_words.json"
    bad.write_text(json.dumps([{"text": "Total", "bbox": [1, 2, 3, 4]}]))
    assert main([ckpt, str(page_png), "--words", str(bad), "--question", "x"]) == 2
    err = capsys.readouterr().err
    assert "bad_words.json" in err and "item [0]" in err and "lacks 'text' or 'box'" in err
    bad.write_text(json.dumps({"words": ["Total"], "boxes": [[1, 2, 300, 4]]}))
    assert main([ckpt, str(page_png), "--words", str(bad), "--question", "x"]) == 2
    err = capsys.readouterr().err
    assert "bad_words.json" in err and "word_boxes[0] (word 'Total')" in err and "lies outside" in err
