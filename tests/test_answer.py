"""`SegmentationModel.answer`: the one prompt path of the Predictor and of the training task, so
what validation scores is what the Predictor serves."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.inference.predictor import Predictor


@pytest.fixture(scope="module")
def page():
    return SyntheticDocuments(num_pages=1, image_size=128, seed=3)[0]   # 128 px: the model's input frame


def test_the_predictor_serves_the_masks_the_training_path_validates(finetune_checkpoint, page):
    """A click + box on one page, one prompt: run_rounds(batch, 1) and the Predictor give the same
    decoder logits. A box alone would not compare: training keeps an unused click slot (a
    not-a-point token) before the corners, the Predictor sends the corners only; with a click
    both send [click, top-left, bottom-right]."""
    _, task = finetune_checkpoint
    predictor = Predictor(task.model, 128)          # the task's model, in eval mode
    task.eval()
    batch = DocumentCollator(128, questions=True, max_questions=1, seed=0)([page])
    assert batch["prompt_valid"].all()
    with torch.no_grad():
        out = task.run_rounds(batch, 1, kinds=("point", "box"))
    coords, labels = out["points"]
    assert labels.tolist() == [[1, 2, 3]]          # the click, then the box corners
    click, box = coords[0, :1], coords[0, 1:].reshape(4)
    assert page.image.shape[:2] == (128, 128)       # page pixels are input pixels (scale 1)
    predictor.set_image(page.image, words=page.words, word_boxes=page.word_boxes)
    _, scores, low_res = predictor.predict_masks(points=click.tolist(), boxes=box.tolist(), return_logits=True)
    low_res = torch.from_numpy(low_res)             # [1, 1, h, w], before the Predictor's resizing
    # not ambiguous: the 3 candidates are the single-mask output, the chosen one among them
    assert torch.equal(out["candidates"][:, :1], low_res)
    # run_rounds' masks: the chosen logits at the input size
    assert torch.equal(out["masks"], F.interpolate(low_res, size=(128, 128), mode="bilinear",
                                                   align_corners=False)[:, 0])
    assert np.isfinite(scores).all()


def test_a_later_round_reuses_the_encoded_questions_and_their_grounding(finetune_checkpoint, page, monkeypatch):
    _, task = finetune_checkpoint
    model = task.model.eval()
    assert not model.grounding.click_words          # clicks are not grounded: nothing to ground again
    batch = DocumentCollator(128, questions=True, max_questions=2, seed=0)([page])
    calls = {"encode_questions": 0, "ground": 0}
    for name in calls:
        method = getattr(model, name)
        monkeypatch.setattr(model, name, lambda *a, _m=method, _n=name, **kw: calls.__setitem__(_n, calls[_n] + 1)
                            or _m(*a, **kw))
    ids = batch["prompt_ids"].flatten(0, 1)
    n = ids.shape[0]
    match, word_pos = batch["prompt_match"].flatten(0, 1), batch["prompt_word_pos"].flatten(0, 1)
    ambiguous = torch.tensor([True, False])[:n]
    with torch.no_grad():
        embedded = model.embed_page(batch)
        first = model.answer(embedded, ids, match, word_pos, None, None, ambiguous)
        second = model.answer(embedded, ids, match, word_pos, None, first.chosen, torch.zeros_like(ambiguous),
                              previous=first)
    assert calls == {"encode_questions": 1, "ground": 1}
    assert first.grounding is not None and second.grounding is first.grounding
    assert second.question_tokens is first.question_tokens
    assert torch.equal(first.has_question, (ids != 0).any(1))
    h, w = model.prompt_encoder.mask_input_size
    assert first.masks.shape == (n, 4, h, w) and first.iou.shape == (n, 4)
    # an ambiguous prompt chooses among the 3 multimask outputs, the others take the single-mask one
    assert torch.equal(first.candidates[0], first.masks[0, 1:])
    assert torch.equal(first.candidates[1:], first.masks[1:, :1].expand(-1, 3, -1, -1))
    best = first.candidate_iou.argmax(1)
    assert torch.equal(first.chosen[:, 0], first.candidates[torch.arange(n), best])
    assert torch.equal(first.chosen_iou, first.candidate_iou.max(1).values)
