"""Clicks on words: a click tags the OCR word it lands on and takes the questions' grounding path."""
import numpy as np
import pytest
import torch

from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.collate import DocumentCollator
from dociq.models.grounding import WordGrounding, clicked_words
from dociq.models.prompt_encoder import BOX_TOP_LEFT, NEGATIVE_POINT, POSITIVE_POINT
from dociq.models.segmenter import PageEmbedding, SegmentationModel
from dociq.models.sizes import complete_model_config

# model=tiny on 128-px pages with clicked words alone (no text blocks, box words or word classes)
MODEL = complete_model_config({"size": "tiny", "image_size": 128, "text_encoder": {"num_hidden_layers": 1},
                               "fusion": {"depth": 1}, "word_classes": False,
                               "grounding": {"click_words": True, "text_blocks": False, "box_words": False}})


def _pixel(layout_x: float, layout_y: float, size: int = 256) -> list[float]:
    """The pixel index (of a `size`-px frame) whose centre lies at these layout units."""
    return [layout_x / 1000 * size - 0.5, layout_y / 1000 * size - 0.5]


def test_a_click_takes_the_nearest_word_within_the_margin_and_all_its_sub_tokens():
    # token 0: a special token whose box is the whole page; word 0 = tokens 1, 2 (two sub-tokens);
    # word 1 = token 3; token 4: padding
    boxes = torch.tensor([[[0, 0, 1000, 1000], [100, 100, 200, 120], [100, 100, 200, 120],
                           [300, 100, 400, 120], [0, 0, 0, 0]]])
    word_index = torch.tensor([[-1, 0, 0, 1, -1]])
    coords = torch.tensor([[_pixel(150, 110)],     # inside word 0
                           [_pixel(215, 110)],     # 15 units right of word 0, 85 left of word 1
                           [_pixel(250, 110)],     # 50 units from both: beyond the margin
                           [_pixel(350, 110)],     # inside word 1, a negative click
                           [_pixel(350, 110)]])    # a box corner there: not a click
    labels = torch.tensor([[POSITIVE_POINT], [POSITIVE_POINT], [POSITIVE_POINT], [NEGATIVE_POINT], [BOX_TOP_LEFT]])
    out = clicked_words(coords, labels, boxes.expand(5, -1, -1), word_index.expand(5, -1), 256, margin=20.0)
    assert out.shape == (5, 2, 5)
    assert out[0].tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert out[1].tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert out[2].sum() == 0 and out[4].sum() == 0
    assert out[3].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 1, 0]]


def _line_page():
    """One page, six words: 0-2 on a line at y 100..160, 3-5 on a line at y 600..660, each
    column of the first line above one of the second."""
    boxes = torch.tensor([[[x, y, x + 120, y + 60] for y in (100, 600) for x in (0, 300, 600)]])
    return torch.randn(1, 6, 16), boxes, torch.ones(1, 6, dtype=torch.bool), torch.arange(6)[None]


def test_a_click_alone_gets_word_maps_and_reaches_its_line_and_column():
    torch.manual_seed(0)
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, depth=0, click_words=True, text_blocks=False,
                      box_words=False).eval()
    text, boxes, mask, word_index = _line_page()
    question = torch.randn(1, 9, 32)
    match, word_pos = torch.zeros(1, 1, 6, dtype=torch.uint8), torch.full((1, 1), -1)
    no_question = torch.zeros(1, dtype=torch.bool)
    clicked = torch.zeros(1, 2, 6)
    clicked[0, 0, 1] = 1                                 # a positive click on word 1 (first line, middle)
    with torch.no_grad():
        none = g(text, boxes, mask, word_index, question, match, word_pos, no_question, (4, 4), torch.zeros(1, 2, 6))
        out = g(text, boxes, mask, word_index, question, match, word_pos, no_question, (4, 4), clicked)
    assert not none.active.item() and none.dense.abs().sum() == 0 and none.high_res.abs().sum() == 0
    assert out.active.item() and out.dense.abs().sum() > 0 and out.high_res.abs().sum() > 0
    changed = (out.relevance - none.relevance).abs()[0] > 1e-6
    # the clicked word, the words on its line, the word in its column; not word 3 or word 5
    assert changed.tolist() == [True, True, True, False, True, False]


def test_grounding_built_without_click_words_refuses_clicks_and_has_no_click_parameters():
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, click_words=False, text_blocks=False, box_words=False)
    assert not any("click" in name for name, _ in g.named_parameters())
    text, boxes, mask, word_index = _line_page()
    with pytest.raises(ValueError, match="click_words=False"):
        g(text, boxes, mask, word_index, torch.randn(1, 9, 32), torch.zeros(1, 1, 6, dtype=torch.uint8),
          torch.full((1, 1), -1), torch.zeros(1, dtype=torch.bool), (4, 4), torch.ones(1, 2, 6))


def _page_embedding(model: SegmentationModel) -> PageEmbedding:
    torch.manual_seed(1)
    text, boxes, mask, word_index = _line_page()
    return PageEmbedding(torch.randn(1, 64, 8, 8), [], torch.randn(1, 6, model.dim), boxes, mask, word_index)


def test_the_model_grounds_clicks_and_a_dropped_question_leaves_no_trace():
    torch.manual_seed(0)
    model = SegmentationModel.from_config(MODEL).eval()
    page = _page_embedding(model)
    # two prompts of one page: a click on word 4 (pixel frame of 128 px), then nothing
    coords = torch.tensor([[_pixel(360, 630, 128)], [[0.0, 0.0]]])
    labels = torch.tensor([[POSITIVE_POINT], [-1]])
    no_question = torch.zeros(2, dtype=torch.bool)
    leftover = torch.zeros(2, 1, 6, dtype=torch.uint8)
    leftover[:, 0, 2] = 1                                # the match of a question the sampler dropped
    with torch.no_grad():
        assert model.ground(page, None, None, None, no_question) is None   # no question, no click
        clean = model.ground(page, None, None, None, no_question, (coords, labels))
        dropped = model.ground(page, None, leftover, torch.zeros(2, 1, dtype=torch.long), no_question,
                               (coords, labels))
    assert clean.active.tolist() == [True, False]
    assert clean.dense[0].abs().sum() > 0 and clean.dense[1].abs().sum() == 0
    torch.testing.assert_close(dropped.relevance, clean.relevance)
    torch.testing.assert_close(dropped.dense, clean.dense)


def test_click_words_off_builds_no_click_parameters():
    off = SegmentationModel.from_config(MODEL | {"grounding": MODEL["grounding"] | {"click_words": False}})
    assert not off.grounding.click_words
    assert not any(".click_" in k for k in off.state_dict())
    newer = SegmentationModel.from_config(MODEL)
    assert {k for k in newer.state_dict() if ".click_" in k} == {
        "grounding.click_embed", "grounding.click_row", "grounding.click_column"}


def test_training_scores_the_words_of_click_prompts_and_grounds_correction_clicks(monkeypatch):
    from dociq.training.tasks.finetune import FinetuneTask

    pages = SyntheticDocuments(num_pages=2, image_size=128, seed=3)
    batch = DocumentCollator(128, questions=True, max_questions=3, seed=0)([pages[0], pages[1]])
    torch.manual_seed(0)
    task = FinetuneTask(model=MODEL, rounds=2)
    calls = []
    ground = task.model.ground
    monkeypatch.setattr(task.model, "ground", lambda *a, **kw: calls.append(a[-1]) or ground(*a, **kw))
    out = task.run_rounds(batch, 2, kinds=("point",))
    assert out["word"] is not None and out["word"].loss.item() > 0   # click-only prompts: word loss
    assert len(calls) == 2                                           # round 2 grounds the correction clicks
    first, second = calls
    assert first[1].shape[1] < second[1].shape[1]                    # one more click per prompt
    out["loss"].backward()
    assert task.model.grounding.click_embed.grad.abs().sum() > 0


def test_the_predictor_grounds_a_lone_click_on_a_word(grounded_predictor):
    predictor, grounded = grounded_predictor(MODEL)
    masks, scores = predictor.predict(points=[[60, 60]], point_labels=[1])
    assert masks.shape == (1, 200, 300) and grounded[-1] is not None and grounded[-1].active.tolist() == [True]
    predictor.predict(points=[[250, 180]], point_labels=[1])       # far from any word: no word path
    assert grounded[-1] is None


# ---- the word-class head -------------------------------------------------------------------------

def test_the_word_class_head_trains_on_the_regions_words_and_the_predictor_reads_it():
    from dociq.data.schema import REGION_CLASSES
    from dociq.inference.predictor import Predictor
    from dociq.training.tasks.finetune import FinetuneTask

    pages = SyntheticDocuments(num_pages=2, image_size=128, seed=3)
    batch = DocumentCollator(128, questions=True, max_questions=3, seed=0)([pages[0], pages[1]])
    assert (batch["ocr_word_class"] >= 0).any()
    torch.manual_seed(0)
    task = FinetuneTask(model=MODEL | {"word_classes": True}, rounds=1)
    out = task.run_rounds(batch, 1, kinds=("question",))
    assert out["word_class"].loss.item() == pytest.approx(np.log(len(REGION_CLASSES)), rel=0.3)
    out["loss"].backward()
    assert task.model.word_class_head[1].weight.grad.abs().sum() > 0
    # without OCR words there is nothing to classify
    assert FinetuneTask(model=MODEL | {"word_classes": True}, rounds=1, ocr=False).run_rounds(
        batch, 1, kinds=("question",))["word_class"] is None

    predictor = Predictor(task.model, 128)
    page = pages[0]
    predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
    probs = predictor.word_class_probabilities()
    assert probs.shape == (len(page.words), len(REGION_CLASSES))
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    assert Predictor(SegmentationModel.from_config(MODEL), 128).model.word_class_head is None
