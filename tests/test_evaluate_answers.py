"""Held-out scores on the user's path (dociq.evaluation.answers): the Predictor, or any answerer with
its interface, asked every page's prompts and scored at the page's size."""
import json

import numpy as np
import pytest

from dociq.cli.eval import main
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.evaluation.answers import ANSWER_SETS, evaluate_answers
from dociq.inference.predictor import Predictor


@pytest.fixture(scope="module")
def checkpoint(finetune_checkpoint):
    return finetune_checkpoint[0]


@pytest.fixture(scope="module")
def pages():
    return SyntheticDocuments(num_pages=3, image_size=160, seed=21, degrade=0.3)


class BoxAnswerer:
    """Answers a box with the box itself, a question with the whole page, a click with nothing; keeps
    every prompt it was asked."""

    def __init__(self):
        self.asked, self.size = [], None

    def set_image(self, image, words=None, word_boxes=None):
        self.size = image.shape[:2]
        self.asked.append(("page", len(words)))

    def predict(self, question=None, points=None, point_labels=None, boxes=None):
        h, w = self.size
        if question is not None:
            self.asked.append(("question", tuple(question)))
            return np.ones((len(question), h, w), bool), np.ones(len(question))
        if boxes is not None:
            self.asked.append(("boxes", np.asarray(boxes).tolist()))
            masks = np.zeros((len(boxes), h, w), bool)
            for m, (x0, y0, x1, y1) in zip(masks, np.asarray(boxes, int)):
                m[y0:y1, x0:x1] = True
            return masks, np.ones(len(boxes))
        self.asked.append(("points", np.asarray(points).tolist()))
        return np.zeros((len(points), h, w), bool), np.zeros(len(points))


def _tight_box_iou(mask):
    ys, xs = np.nonzero(mask)
    return mask.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))


def test_masks_are_scored_against_the_targets_at_the_page_size(pages):
    answerer = BoxAnswerer()
    results = evaluate_answers(answerer, pages, max_questions=4)
    assert set(results) == set(ANSWER_SETS) | {"question_layout_by_class"}
    # the same prompts on a second run: drawn from the pages alone
    again = BoxAnswerer()
    evaluate_answers(again, pages, max_questions=4)
    assert again.asked == answerer.asked
    # a box answered by itself scores the target's share of its tight box; the whole page the
    # target's share of the page; an empty mask 0
    with_words, words = [], 0
    for kind, value in answerer.asked:
        words = value if kind == "page" else words
        if kind == "question" and words:
            with_words.append(value)
    assert len(with_words) == len(pages)
    chosen = [next(q for q in pages[i].questions if q.text == t) for i, texts in enumerate(with_words) for t in texts]
    expected_box = np.mean([_tight_box_iou(q.mask) for q in chosen])
    expected_page = np.mean([q.mask.mean() for q in chosen])
    assert results["box"]["miou"] == pytest.approx(expected_box, abs=1e-6)
    assert results["question"]["miou"] == pytest.approx(expected_page, abs=1e-6)
    assert results["point_region"]["miou"] == 0.0
    assert sum(v for k, v in results["box"].items() if k.startswith("count_")) == len(chosen)
    # without the words the page is set again with none, and the questions are asked again
    assert ("page", 0) in answerer.asked


def test_the_predictor_is_scored_with_its_own_setting_and_each_snap_mode(checkpoint, pages):
    predictor = Predictor.from_checkpoint(checkpoint)
    predictor.snap = "words"
    results = evaluate_answers(predictor, pages, max_pages=2, max_questions=3,
                               prompt_sets=("question", "point_region"), compare_snap=True)
    assert predictor.snap == "words"                                  # restored
    expected = {"question", "point_region", "point_region_oracle", "question_layout_by_class"}
    expected |= {f"{s}_{m}" for s in ("question", "point_region") for m in ("raw", "snap", "blocks")}
    assert set(results) == expected
    assert results["question"] == results["question_snap"]            # its own mode, asked once
    counts = {k: v for k, v in results["point_region"].items() if k.startswith("count_")}
    for mode in ("raw", "blocks"):
        assert {k: v for k, v in results[f"point_region_{mode}"].items() if k.startswith("count_")} == counts
    # the oracle picks the best of the three candidates the choice picks from
    assert results["point_region_oracle"]["miou"] >= results["point_region_raw"]["miou"] - 1e-6
    with pytest.raises(ValueError, match="compare_snap"):
        evaluate_answers(BoxAnswerer(), pages, compare_snap=True)


def test_cli_scores_the_predictor_and_names_task_only_options(checkpoint, tmp_path, capsys):
    out = tmp_path / "results" / "r.json"                     # a folder not made yet: made, not an error
    assert main([str(checkpoint), "--pages", "2", "--prompts", "box_region", "--snap", "--json", str(out)]) == 0
    data = json.loads(out.read_text())[str(checkpoint)]
    assert set(data) == {"box_region", "box_region_raw", "box_region_snap", "box_region_blocks"}
    with pytest.raises(SystemExit):
        main([str(checkpoint), "--heuristics"])
    assert "--task-path" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--data", "corpus"])
    assert "--baseline detector" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--baseline", "detector", "--task-path"])
    assert "drop --task-path" in capsys.readouterr().err


def test_a_pretraining_checkpoint_is_one_line(finetune_checkpoint, tmp_path, capsys):
    import torch

    # a stage=pretrain checkpoint holds the encoders only: no prompt encoder, no mask decoder
    path = tmp_path / "pretrain.ckpt"
    model = dict(finetune_checkpoint[1].hparams["model"])
    torch.save({"state_dict": {"model.image_encoder.x": torch.zeros(1)},
                "hyper_parameters": {"model": model, "ema": {}}}, path)
    assert main([str(path), "--pages", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stage=finetune" in err


def test_box_prompts_can_be_drawn_loose_by_a_margin_within_the_page(pages):
    from dociq.evaluation.answers import loose_boxes, tight_boxes

    tight, loose = BoxAnswerer(), BoxAnswerer()
    evaluate_answers(tight, pages, max_questions=4, prompt_sets=("box_region",))
    results = evaluate_answers(loose, pages, max_questions=4, prompt_sets=("box_region",), box_margin=3)
    asked = [np.array(v) for k, v in tight.asked if k == "boxes"]
    grown = [np.array(v) for k, v in loose.asked if k == "boxes"]
    h, w = pages[0].image.shape[:2]
    for a, b in zip(asked, grown):
        assert np.array_equal(b, np.clip(a + [-3, -3, 3, 3], 0, [w, h, w, h]))
    assert results["box_region"]["miou"] < 1.0                       # the box itself now holds paper too
    mask = np.zeros((20, 30), bool)
    mask[5:8, 10:20] = True
    assert loose_boxes([mask], 0).tolist() == tight_boxes([mask]).tolist() == [[10, 5, 20, 8]]
    assert loose_boxes([mask], 6).tolist() == [[4, 0, 26, 14]]
