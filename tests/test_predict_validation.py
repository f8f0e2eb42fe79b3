"""Predictor prompts are checked like the data loader checks annotations (issue 11, item 8), and the
predict CLI answers a user mistake with one line and exit code 2 (item 10)."""
import logging
import re

import numpy as np
import pytest

from dociq.data.errors import BOX_OVERSHOOT_TOLERANCE
from dociq.cli.predict import main
from dociq.inference.predictor import Predictor
from dociq.io.checkpoint import CheckpointError

H, W = 90, 160      # the page below: landscape, not the model's 128 px


@pytest.fixture(scope="module")
def predictor(finetune_checkpoint):
    return Predictor.from_checkpoint(finetune_checkpoint[0])


@pytest.fixture(scope="module")
def page():
    page = np.full((H, W, 3), 240, np.uint8)
    page[20:40, 10:120] = 0
    return page


# ---- points ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_non_finite_points_are_refused(predictor, page, bad, shown):
    with pytest.raises(ValueError, match=re.escape(f"points[2] = ({shown}, 4.0) is not finite")):
        predictor.predict(page, points=[[10, 20], [30, 40], [bad, 4.0]])


def test_points_outside_the_page_are_refused(predictor, page):
    with pytest.raises(ValueError, match=r"points\[1\] = \(500.0, 4.0\) lies outside the 160x90 page"):
        predictor.predict(page, points=[[10, 20], [500, 4]])
    with pytest.raises(ValueError, match=r"points\[0\] = \(10.0, -5.0\) lies outside"):
        predictor.predict(page, points=[[10, -5]])


def test_points_just_outside_the_page_are_clipped(predictor, page):
    inside, _ = predictor.predict(page, points=[[W, 0]], threshold=-1.0)
    over = BOX_OVERSHOOT_TOLERANCE * W * 0.9
    clipped, _ = predictor.predict(page, points=[[W + over, -BOX_OVERSHOOT_TOLERANCE * H * 0.9]], threshold=-1.0)
    np.testing.assert_array_equal(clipped, inside)


@pytest.mark.parametrize("points, labels, message", [
    ([[1, 2, 3]], None, "points must be [N, 2]"),
    ([], None, "points must be [N, 2]"),
    ([[1, 2], [3, 4]], [1, 0, 1], "point_labels has 3 values for 2 points"),
    ([[1, 2], [3, 4]], [1, 2], "point_labels[1] = 2 is not 0 or 1"),
    ([[1, 2]], [0.5], "point_labels[0] = 0.5 is not 0 or 1"),
    (None, [1], "point_labels given without points"),
])
def test_point_shapes_and_labels(predictor, page, points, labels, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        predictor.predict(page, question="the title" if points is None else None, points=points,
                          point_labels=labels)


# ---- boxes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("box, message", [
    ([60, 40, 5, 5], "boxes[0] (x0,y0,x1,y1)=(60.0, 40.0, 5.0, 5.0) has zero or negative size"),
    ([5, 5, 5, 40], "boxes[0] (x0,y0,x1,y1)=(5.0, 5.0, 5.0, 40.0) has zero or negative size"),
    ([5, 5, 60, float("nan")], "boxes[0] (x0,y0,x1,y1)=(5.0, 5.0, 60.0, nan) is not finite"),
    ([5, 5, 400, 40], "boxes[0] (x0,y0,x1,y1)=(5.0, 5.0, 400.0, 40.0) lies outside the 160x90 page"),
    ([W + 0.5, 5, W + 1, 40], "lies outside the 160x90 page"),      # within the margin but not on the page
    ([1, 2, 3, 4, 5], "boxes must be [4] or [M, 4]"),
])
def test_bad_boxes_are_refused(predictor, page, box, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        predictor.predict(page, boxes=box)


def test_the_second_box_is_named(predictor, page):
    with pytest.raises(ValueError, match=re.escape("boxes[1]")):
        predictor.predict(page, boxes=[[5, 5, 60, 40], [70, 80, 60, 85]])


def test_boxes_just_outside_the_page_are_clipped(predictor, page):
    inside, s_in = predictor.predict(page, boxes=[0, 0, W, 40], threshold=-1.0)
    clipped, s_clip = predictor.predict(page, boxes=[-1, -0.5, W + 1, 40], threshold=-1.0)
    np.testing.assert_array_equal(clipped, inside)
    assert s_clip == pytest.approx(s_in)


# ---- OCR words -------------------------------------------------------------------------------

@pytest.mark.parametrize("words, boxes, message", [
    (["Title", "text"], [[20, 40, 120, 60], [20, 250, 60, 260]],
     "word_boxes[1] (word 'text') (x0,y0,x1,y1)=(20.0, 250.0, 60.0, 260.0) lies outside the 160x90 page"),
    (["Title"], [[120, 40, 20, 60]], "word_boxes[0] (word 'Title') (x0,y0,x1,y1)=(120.0, 40.0, 20.0, 60.0) has negative size"),
    (["Title"], [[20, 40, float("inf"), 60]], "word_boxes[0] (word 'Title') (x0,y0,x1,y1)=(20.0, 40.0, inf, 60.0) is not finite"),
    (["Title"], [[20, 40, 60]], "word_boxes must be [N, 4]"),
    ("Title", [[20, 40, 60, 60]], "words must be a list of strings"),
    ([3], [[20, 40, 60, 60]], "words[0] is not a string (got int 3)"),
    (None, [[20, 40, 60, 60]], "word_boxes given without words"),
])
def test_bad_words_are_refused(predictor, page, words, boxes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        predictor.predict(page, question="the title", words=words, word_boxes=boxes)


def test_word_boxes_just_outside_the_page_are_accepted(predictor, page):
    masks, scores = predictor.predict(page, question="the title", words=["Title"],
                                      word_boxes=[[10, 20, W + 1, H + 0.5]])
    assert masks.shape == (1, H, W) and np.isfinite(scores).all()


# ---- questions -------------------------------------------------------------------------------

@pytest.mark.parametrize("question, message", [
    ("", "question is empty"),
    ("   ", "question is empty (only whitespace)"),
    (["the title", ""], "question[1] is empty"),
    (["the title", 7], "question[1] is not a string (got int 7)"),
])
def test_empty_questions_are_refused(predictor, page, question, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        predictor.predict(page, question=question)


def test_a_question_cut_to_the_context_length_is_reported(predictor, page, caplog):
    long_question = "where is the " + " ".join(f"field{i}" for i in range(40)) + " value?"
    limit = predictor.question_tokenizer.context_length
    with caplog.at_level(logging.WARNING, logger="dociq.inference.predictor"):
        predictor.predict(page, question=["the title", long_question])
    cut = [r.getMessage() for r in caplog.records if "cut" in r.getMessage()]
    assert len(cut) == 1 and long_question[:30] in cut[0] and f"context length {limit}" in cut[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dociq.inference.predictor"):
        predictor.predict(page, question="the title")
    assert not [r for r in caplog.records if "cut" in r.getMessage()]


# ---- the mask threshold ----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_threshold_is_refused(predictor, page, bad):
    with pytest.raises(ValueError, match=re.escape(f"threshold {bad} is not finite")):
        predictor.predict(page, question="the title", threshold=bad)
    predictor.set_image(page)
    with pytest.raises(ValueError, match=re.escape(f"threshold {bad} is not finite")):
        predictor.predict_masks(question="the title", threshold=bad)


# ---- the CLI ---------------------------------------------------------------------------------

@pytest.fixture
def page_png(tmp_path, page):
    from PIL import Image

    path = tmp_path / "page.png"
    Image.fromarray(page).save(path)
    return path


def _cli_error(argv, capsys) -> str:
    assert main(argv) == 2        # returned, not raised: `dociq predict` (dociq/cli/__init__.py) calls main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("dociq predict: error: ")
    return err


def test_cli_missing_checkpoint_is_one_line(tmp_path, page_png, capsys):
    err = _cli_error([str(tmp_path / "missing.ckpt"), str(page_png), "--question", "x"], capsys)
    assert "missing.ckpt" in err and "does not exist" in err


def test_cli_truncated_checkpoint_is_one_line(finetune_checkpoint, tmp_path, page_png, capsys):
    data = finetune_checkpoint[0].read_bytes()
    half = tmp_path / "half.ckpt"
    half.write_bytes(data[: len(data) // 2])
    err = _cli_error([str(half), str(page_png), "--question", "x"], capsys)
    assert "half.ckpt" in err and "truncated" in err


def test_cli_missing_image_is_one_line(finetune_checkpoint, tmp_path, capsys):
    err = _cli_error([str(finetune_checkpoint[0]), str(tmp_path / "nope.png"), "--question", "x"], capsys)
    assert "nope.png" in err


def test_cli_bad_prompt_is_one_line(finetune_checkpoint, page_png, capsys):
    err = _cli_error([str(finetune_checkpoint[0]), str(page_png), "--box", "60", "40", "5", "5"], capsys)
    assert "has zero or negative size" in err


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_cli_non_finite_threshold_is_one_line_naming_the_flag(finetune_checkpoint, page_png, capsys, value):
    out = page_png.with_name("out.png")
    err = _cli_error([str(finetune_checkpoint[0]), str(page_png), "--question", "x", "--threshold", value,
                      "--out", str(out)], capsys)
    assert f"--threshold {value} is not finite" in err and not out.exists()


@pytest.mark.parametrize("command", ["predict", "segment-page"])
@pytest.mark.parametrize("dpi", ["0", "nan", "-72", "1e6"])
def test_cli_bad_dpi_is_one_line_naming_the_flag_and_its_range(finetune_checkpoint, tmp_path, text_pdf, capsys,
                                                                command, dpi):
    """`dociq predict` and `dociq segment-page` render --pdf at --dpi alike, and refuse it alike."""
    from dociq.cli import predict, segment_page

    pdf = tmp_path / "page.pdf"
    pdf.write_bytes(text_pdf([[(12, 72, 700, "Hello world")]], 612, 792))
    run = {"predict": predict.main, "segment-page": segment_page.main}[command]
    prompt = ["--question", "the title"] if command == "predict" else []
    assert run([str(finetune_checkpoint[0]), "--pdf", str(pdf), "--dpi", dpi, *prompt,
                "--out", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dociq {command}: error: --dpi {float(dpi):g}: "), err
    assert "from 36 to 1200 dots per inch" in err
    assert not (tmp_path / "out.png").exists()


def test_cli_reads_a_words_file_of_odd_text(finetune_checkpoint, tmp_path, page_png, capsys):
    """A --words file with a NUL, a lone surrogate, right-to-left and zero-width marks and a
    2,000-character word: the page is segmented and its mask written."""
    import json

    texts = ["to\x00tal", "\ud800", "\u05e1\u05db\u05d5\u05dd", "zero\u200bwidth", "\u200f", "x" * 2000, "Title"]
    words = tmp_path / "words.json"
    words.write_text(json.dumps([{"text": t, "box": [5 + 20 * i, 20, 20 + 20 * i, 40]} for i, t in enumerate(texts)]))
    assert "\\ud800" in words.read_text()              # JSON's escape, as another program writes it
    masks = tmp_path / "masks"
    assert main([str(finetune_checkpoint[0]), str(page_png), "--words", str(words), "--question", "the total",
                 "--out", str(tmp_path / "out.png"), "--masks-dir", str(masks)]) == 0, capsys.readouterr().err
    assert [m.name for m in masks.glob("*.png")] == ["page_00.png"] and (tmp_path / "out.png").is_file()


@pytest.mark.parametrize("command", ["predict", "segment-page"])
@pytest.mark.parametrize("content, message", [
    ([{"text": "Title", "box": [1, 2, 30, 10]}, {"text": 42, "box": [1, 12, 30, 20]}],
     "words[1] is not a string (got int 42)"),
    ({"words": ["Title", None], "boxes": [[1, 2, 30, 10], [1, 12, 30, 20]]}, "words[1] is not a string (got NoneType"),
])
def test_cli_words_that_are_not_strings_name_their_item(finetune_checkpoint, tmp_path, page_png, capsys,
                                                        command, content, message):
    import json

    from dociq.cli import predict, segment_page

    words = tmp_path / "words.json"
    words.write_text(json.dumps(content))
    run = {"predict": predict.main, "segment-page": segment_page.main}[command]
    prompt = ["--question", "the title"] if command == "predict" else []
    assert run([str(finetune_checkpoint[0]), str(page_png), "--words", str(words), *prompt,
                "--out", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dociq {command}: error: --words {words}: {message}"), err


def test_cli_debug_shows_the_traceback(tmp_path, page_png):
    with pytest.raises(CheckpointError):
        main([str(tmp_path / "missing.ckpt"), str(page_png), "--question", "x", "--debug"])


def test_a_valid_prompt_after_the_checks_still_predicts(predictor, page):
    masks, scores = predictor.predict(page, question="the title", points=[[10, 20], [30, 40]],
                                      point_labels=[1, 0], boxes=[5, 5, 60, 40],
                                      words=["Title"], word_boxes=[[10, 20, 120, 40]])
    assert masks.shape == (1, H, W) and np.isfinite(scores).all()
