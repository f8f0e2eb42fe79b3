"""Predictor: checkpoint in, masks of the page's original size out, for every prompt kind."""
import numpy as np
import pytest
import torch

from dociq.data.schema import Page
from dociq.cli.predict import main
from dociq.inference.overlay import overlay
from dociq.inference.predictor import DEFAULT_BEST_GUESS_MARGIN, Predictor
from dociq.inference.snapping import best_guess

@pytest.fixture(scope="module")
def checkpoint(finetune_checkpoint):
    return finetune_checkpoint


@pytest.fixture(scope="module")
def predictor(checkpoint):
    return Predictor.from_checkpoint(checkpoint[0])


def test_masks_have_the_original_page_size(predictor):
    page = np.full((300, 200, 3), 255, np.uint8)   # portrait, not the model's 128x128
    page[40:60, 20:180] = 0
    masks, scores = predictor.predict(page, question=["the title", "the page footer"],
                                      words=["Title", "text"], word_boxes=[[20, 40, 120, 60], [20, 250, 60, 260]])
    assert masks.shape == (2, 300, 200) and masks.dtype == bool
    assert scores.shape == (2,) and np.isfinite(scores).all()


def test_prompt_kinds_and_sharing(predictor):
    page = np.full((90, 160, 3), 240, np.uint8)
    masks, _ = predictor.predict(page, points=[[10, 20]])                     # one click
    assert masks.shape == (1, 90, 160)
    masks, _ = predictor.predict(page, boxes=[[5, 5, 60, 40], [70, 10, 150, 80]])
    assert masks.shape == (2, 90, 160)
    masks, _ = predictor.predict(page, question=["a", "b", "c"], boxes=[5, 5, 60, 40])  # box shared
    assert masks.shape == (3, 90, 160)
    with pytest.raises(ValueError, match="needs a prompt"):
        predictor.predict(page)
    with pytest.raises(ValueError, match="prompt counts disagree"):
        predictor.predict(page, question=["a", "b"], boxes=[[0, 0, 1, 1]] * 3)
    with pytest.raises(ValueError, match="word_boxes"):
        predictor.predict(page, question="a", words=["x", "y"], word_boxes=[[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="point_labels"):
        predictor.predict(page, points=[[1, 1]], point_labels=[2])


def test_predictions_match_the_task_model(checkpoint, predictor):
    """Same weights, same page (already at the model's size): the Predictor's logits are the
    task model's, so what was validated is what is served."""
    _, task = checkpoint
    page = (np.random.default_rng(0).random((128, 128, 3)) * 255).astype(np.uint8)
    masks, scores = predictor.predict(page, question="the title", threshold=-1e9)
    assert masks.all()                                      # threshold -inf: every pixel
    batch = predictor.collator([Page(image=page, words=[], word_boxes=np.zeros((0, 4), np.float32))])
    task.eval()
    with torch.no_grad():
        emb, hr = task.model.embed_image(batch)
        q = task.model.encode_questions(predictor.question_tokenizer(["the title"]))
        _, iou = task.model.decode(emb, hr, q, None, None)
    assert scores[0] == pytest.approx(iou[0, 0].item(), abs=1e-5)


def test_bad_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="stage=finetune"):
        Predictor.from_checkpoint(tmp_path / "missing.ckpt")
    bad = tmp_path / "plain.ckpt"
    torch.save({"state_dict": {}}, bad)
    with pytest.raises(ValueError, match="not a stage=finetune"):
        Predictor.from_checkpoint(bad)


def test_cli_writes_an_overlay(checkpoint, tmp_path, capsys):
    from PIL import Image

    page = tmp_path / "page.png"
    Image.fromarray(np.full((100, 80, 3), 255, np.uint8)).save(page)
    out = tmp_path / "overlay.png"
    assert main([str(checkpoint[0]), str(page), "--question", "the title", "--box", "5", "5", "40", "30",
                 "--out", str(out)]) == 0
    assert Image.open(out).size == (80, 100)
    assert "predicted IoU" in capsys.readouterr().out
    masks = tmp_path / "masks"
    assert main([str(checkpoint[0]), str(page), "--box", "5", "5", "40", "30", "--snap", "blocks",
                 "--out", str(out), "--masks-dir", str(masks)]) == 0
    (mask_png,) = sorted(masks.glob("*.png"))
    drawn = np.asarray(Image.open(mask_png)) > 0
    drawn[5:30, 5:40] = False
    assert not drawn.any()                         # --snap blocks keeps a box prompt's mask in its box


def test_overlay_tints_only_masked_pixels():
    image = np.zeros((4, 4, 3), np.uint8)
    mask = np.zeros((1, 4, 4), bool)
    mask[0, 0, 0] = True
    out = overlay(image, mask)
    assert out[0, 0].any() and not out[1:, :].any()


def _grid_words(words):
    boxes = [[(i % 40) * 25, (i // 40) * 12, (i % 40) * 25 + 22, (i // 40) * 12 + 10] for i in range(len(words))]
    return words, boxes


def test_a_page_of_1500_words_is_read_whole(predictor, caplog):
    """A dense real page (1,500 words of running text) reaches the model without losing a word."""
    vocab = "the system file configuration user manual page command option default value network".split()
    words, boxes = _grid_words([vocab[i % len(vocab)] for i in range(1500)])
    page = np.full((500, 1000, 3), 255, np.uint8)
    with caplog.at_level("WARNING", logger="dociq.inference.predictor"):
        masks, _ = predictor.predict(page, question="where is the network option?", words=words, word_boxes=boxes)
    assert masks.shape == (1, 500, 1000)
    assert not any("OCR budget" in r.message for r in caplog.records)
    encoded = predictor.collator.ocr_tokenizer(words, np.zeros((1500, 4), np.int64))
    assert encoded.truncated_words == 0 and int(encoded.word_index.max()) == 1499


def test_words_past_the_ocr_budget_are_reported(predictor, caplog):
    words, boxes = _grid_words([f"word{i}" for i in range(1600)])   # ~3 WordPiece tokens each: > 3,072
    page = np.full((500, 1000, 3), 255, np.uint8)
    with caplog.at_level("WARNING", logger="dociq.inference.predictor"):
        masks, _ = predictor.predict(page, question="where is word1599?", words=words, word_boxes=boxes)
    assert masks.shape == (1, 500, 1000)
    assert any("did not fit the model's OCR budget" in r.message and "of 1600 OCR words" in r.message
               for r in caplog.records)


def test_snap_to_words_snaps_every_returned_mask(predictor):
    from dociq.models.word_snap import snap_to_words

    vocab = "install the package then run the command".split()
    words, boxes = _grid_words([vocab[i % len(vocab)] for i in range(120)])
    page = np.full((500, 1000, 3), 255, np.uint8)
    predictor.set_image(page, words=words, word_boxes=boxes)
    with predictor.snapping(None):
        raw, _ = predictor.predict(question=["all paragraphs", "where is the command?"])
    with predictor.snapping("words"):
        assert predictor.snap == "words"
        snapped, _ = predictor.predict(question=["all paragraphs", "where is the command?"])
    assert predictor.snap == "blocks"                  # the default, back after the block
    for r, s in zip(raw, snapped):
        assert np.array_equal(s, snap_to_words(r, np.asarray(boxes, float)))


def test_snap_blocks_completes_each_prompts_masks_with_its_own_click_and_box(predictor):
    from dociq.models.word_snap import snap_to_blocks

    vocab = "install the package then run the command".split()
    words, boxes = _grid_words([vocab[i % len(vocab)] for i in range(120)])
    boxes = np.asarray(boxes, float)
    page = np.full((500, 1000, 3), 255, np.uint8)
    predictor.set_image(page, words=words, word_boxes=boxes)
    points = np.array([[[30.0, 20.0]], [[400.0, 200.0]]])
    box = np.array([[0.0, 0.0, 300.0, 120.0], [200.0, 100.0, 900.0, 400.0]])
    with predictor.snapping(None):
        raw, _, _ = predictor.predict(points=points, boxes=box, multimask_output=True)   # [2, 3, H, W]
    completed, _, _ = predictor.predict(points=points, boxes=box, multimask_output=True)  # the default: blocks
    assert completed.shape == raw.shape
    for q in range(2):
        for c in range(3):
            expect = snap_to_blocks(raw[q, c], boxes, words, points[q], np.ones(1), box[q])
            assert np.array_equal(completed[q, c], expect)
        x0, y0, x1, y1 = box[q].astype(int)
        outside = np.ones(completed.shape[-2:], bool)
        outside[y0:y1, x0:x1] = False
        assert not completed[q][:, outside].any()         # a box prompt's mask stays in its box
    with pytest.raises(ValueError, match="snap='lines'"):
        predictor.snap = "lines"


def test_best_guess_fills_only_the_masks_the_threshold_leaves_empty():
    logits = np.full((2, 1, 4, 5), -3.0, np.float32)
    logits[0, 0, 1, 1] = 2.0                                   # a confident answer: kept as it is
    logits[1, 0, 2, 3], logits[1, 0, 0, 0] = -0.5, -1.2        # an unsure one: nothing above 0
    masks = best_guess(logits, logits > 0, margin=1.0)
    assert masks[0, 0].sum() == 1 and masks[0, 0, 1, 1]
    assert np.argwhere(masks[1, 0]).tolist() == [[0, 0], [2, 3]]   # within 1.0 of its best logit, -0.5
    assert np.argwhere(best_guess(torch.from_numpy(logits), logits > 0, margin=0.0)[1, 0]).tolist() == [[2, 3]]


def test_a_predictor_with_a_best_guess_never_answers_empty(predictor):
    page = np.full((120, 100, 3), 255, np.uint8)
    page[10:20, 10:90] = 0
    prompt = dict(question=["the title", "the page number"], words=["Title", "7"],
                  word_boxes=[[10, 10, 90, 20], [45, 100, 55, 110]])
    with predictor.snapping(None):
        logits = predictor.predict(page, return_logits=True, **prompt)[0]
        predictor.best_guess_margin = None
        assert not predictor.predict(page, threshold=1e9, **prompt)[0].any()        # nothing passes
        predictor.best_guess_margin = 0.0
        try:
            masks = predictor.predict(page, threshold=1e9, **prompt)[0]
        finally:
            predictor.best_guess_margin = DEFAULT_BEST_GUESS_MARGIN
    for mask, logit in zip(masks, logits):
        assert mask.any() and np.array_equal(mask, logit >= logit.max())


def test_a_lone_click_gets_the_innermost_of_its_snapped_candidates(predictor):
    vocab = "install the package then run the command".split()
    words, boxes = _grid_words([vocab[i % len(vocab)] for i in range(120)])
    page = np.full((500, 1000, 3), 255, np.uint8)
    predictor.set_image(page, words=words, word_boxes=boxes)
    clicks = np.array([[[30.0, 20.0]], [[400.0, 200.0]], [[700.0, 420.0]]])
    candidates, scores, low_res = predictor.predict(points=clicks, multimask_output=True)     # snapped to blocks
    masks, chosen_scores, chosen_low_res = predictor.predict_masks(points=clicks)             # one mask each
    for q in range(len(clicks)):
        areas = [c.sum() if c.any() else np.inf for c in candidates[q]]
        k = int(np.argmin(areas)) if np.isfinite(areas).any() else int(np.argmax(scores[q]))
        assert np.array_equal(masks[q], candidates[q, k])
        assert chosen_scores[q] == pytest.approx(scores[q, k])
        assert np.allclose(chosen_low_res[q, 0], low_res[q, k])
    with predictor.snapping(None):                       # raw masks: the IoU head's choice, as SAM's
        raw, raw_scores, _ = predictor.predict(points=clicks, multimask_output=True)
        masks, chosen_scores = predictor.predict(points=clicks)
    best = raw_scores.argmax(1)
    assert np.array_equal(masks, raw[np.arange(len(clicks)), best])
    assert np.allclose(chosen_scores, raw_scores.max(1))


def test_innermost_candidate_skips_empty_candidates_and_falls_back_to_the_score():
    from dociq.inference.snapping import innermost_candidate

    snapped = np.zeros((2, 3, 6, 6), bool)
    snapped[0, 0, :4, :4] = True                 # 16 px
    snapped[0, 2, :2, :3] = True                 # 6 px: the innermost; candidate 1 is empty
    scores = np.array([[0.9, 0.8, 0.1], [0.2, 0.7, 0.3]])      # prompt 1: every candidate empty
    low_res = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    masks, chosen, logits = innermost_candidate(snapped, scores, low_res)
    assert np.array_equal(masks[0], snapped[0, 2]) and chosen[0] == 0.1
    assert not masks[1].any() and chosen[1] == 0.7 and np.array_equal(logits[1, 0], low_res[1, 1])
    assert masks.shape == (2, 6, 6) and logits.shape == (2, 1, 2, 2)
