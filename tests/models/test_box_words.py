"""Boxes around words: the words inside a box prompt are tagged and take the questions' grounding path."""
import pytest
import torch

from dociq.data.collate import DocumentCollator
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.models.grounding import WordGrounding, boxed_words
from dociq.models.prompt_encoder import BOX_BOTTOM_RIGHT, BOX_TOP_LEFT, POSITIVE_POINT
from dociq.models.segmenter import SegmentationModel
from dociq.models.sizes import complete_model_config

# model=tiny on 128-px pages: clicked words, text blocks and box words on
MODEL = complete_model_config({"size": "tiny", "image_size": 128, "text_encoder": {"num_hidden_layers": 1},
                               "fusion": {"depth": 1}})


def _pixel(layout_x: float, layout_y: float, size: int = 256) -> list[float]:
    return [layout_x / 1000 * size - 0.5, layout_y / 1000 * size - 0.5]


def test_a_box_takes_the_words_mostly_inside_it_and_all_their_sub_tokens():
    # token 0: a special token over the whole page; word 0 = tokens 1, 2; word 1 = token 3 (half
    # outside the first box); word 2 = token 4; token 5: padding
    boxes = torch.tensor([[[0, 0, 1000, 1000], [100, 100, 200, 120], [100, 100, 200, 120],
                           [280, 100, 400, 120], [600, 600, 700, 620], [0, 0, 0, 0]]])
    word_index = torch.tensor([[-1, 0, 0, 1, 2, -1]])
    box = [_pixel(90, 90), _pixel(345, 130)]          # word 0 whole, 65 of word 1's 120 units
    coords = torch.tensor([box, [_pixel(90, 90), _pixel(330, 130)], box, [_pixel(150, 110), [0.0, 0.0]]])
    corners = [BOX_TOP_LEFT, BOX_BOTTOM_RIGHT]
    labels = torch.tensor([corners, corners, [POSITIVE_POINT, POSITIVE_POINT], [POSITIVE_POINT, -1]])
    out = boxed_words(coords, labels, boxes.expand(4, -1, -1), word_index.expand(4, -1), 256)
    assert out.shape == (4, 1, 6)
    assert out[0, 0].tolist() == [0, 1, 1, 1, 0, 0]
    assert out[1, 0].tolist() == [0, 1, 1, 0, 0, 0]    # 50 of 120 units inside: under half
    assert out[2].sum() == 0 and out[3].sum() == 0      # clicks, not a box


def _two_block_page():
    """Tokens 1-2 in block 0 on two lines; tokens 3-4 in block 1, far below; 0 and 5 are specials."""
    boxes = torch.tensor([[[0, 0, 0, 0], [100, 100, 200, 130], [300, 160, 400, 190],
                           [500, 600, 600, 630], [700, 700, 800, 730], [1000, 1000, 1000, 1000]]])
    return boxes, torch.tensor([[-1, 0, 1, 2, 3, -1]]), torch.tensor([[-1, 0, 0, 1, 1, -1]])


def test_a_box_around_a_word_reaches_its_block_and_nothing_else():
    torch.manual_seed(0)
    boxes, word_index, block_index = _two_block_page()
    text, mask = torch.randn(1, 6, 16), torch.ones(1, 6, dtype=torch.bool)
    question, no_question = torch.randn(1, 9, 32), torch.zeros(1, dtype=torch.bool)
    match, word_pos = torch.zeros(1, 1, 6, dtype=torch.uint8), torch.full((1, 1), -1)
    boxed = torch.zeros(1, 1, 6)
    boxed[0, 0, 1] = 1                                               # the box holds token 1's word
    g = WordGrounding(text_dim=16, dim=32, high_res_dim=4, depth=0, alignment=False, text_blocks=True,
                      box_words=True, click_words=False).eval()
    args = (text, boxes, mask, word_index, question, match, word_pos, no_question, (4, 4))
    with torch.no_grad():
        none = g(*args, block_index=block_index, boxed=torch.zeros_like(boxed))
        out = g(*args, block_index=block_index, boxed=boxed)
    assert not none.active.item() and none.dense.abs().sum() == 0
    assert out.active.item() and out.dense.abs().sum() > 0 and out.high_res.abs().sum() > 0
    changed = (out.relevance - none.relevance).abs()[0] > 1e-6
    assert changed[1] and changed[2]                                 # the boxed word and its block's other line
    assert not changed[3] and not changed[4]                         # the other block
    with pytest.raises(ValueError, match="box_words=False"):
        WordGrounding(text_dim=16, dim=32, high_res_dim=4, text_blocks=True, click_words=False, box_words=False)(
            *args, block_index=block_index, boxed=boxed)


def test_box_words_off_builds_no_box_parameters():
    off = SegmentationModel.from_config(MODEL | {"grounding": MODEL["grounding"] | {"box_words": False}})
    assert not off.grounding.box_words and not any(".box_" in k for k in off.state_dict())
    newer = SegmentationModel.from_config(MODEL)
    assert {k for k in newer.state_dict() if "grounding.box_" in k} == {"grounding.box_embed", "grounding.box_block"}


def test_training_scores_the_words_of_box_prompts():
    from dociq.training.tasks.finetune import FinetuneTask

    pages = SyntheticDocuments(num_pages=2, image_size=128, seed=3)
    batch = DocumentCollator(128, questions=True, max_questions=3, seed=0)([pages[0], pages[1]])
    torch.manual_seed(0)
    task = FinetuneTask(model=MODEL, rounds=1)
    out = task.run_rounds(batch, 1, kinds=("box",))
    assert out["word"] is not None and out["word"].loss.item() > 0   # box-only prompts: word loss
    out["loss"].backward()
    assert task.model.grounding.box_embed.grad.abs().sum() > 0
    assert task.model.grounding.box_block.grad.abs().sum() > 0


def test_the_predictor_grounds_a_box_around_words_and_not_an_empty_one(grounded_predictor):
    predictor, grounded = grounded_predictor(MODEL)
    masks, _ = predictor.predict(boxes=[[30, 40, 160, 80]])
    assert masks.shape[-2:] == (200, 300) and grounded[-1] is not None and grounded[-1].active.tolist() == [True]
    predictor.predict(boxes=[[200, 120, 290, 190]])                     # no word inside: no word path
    assert grounded[-1] is None
