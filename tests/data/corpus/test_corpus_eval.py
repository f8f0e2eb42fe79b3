"""`dociq eval --data corpus`: held-out real pages scored like synthetic ones, with the text-free
heuristics beside the model."""
import json

import numpy as np
import pytest
import torch
from corpus_testdata import build

from dociq.data.collate import DocumentCollator
from dociq.data.schema import Page, Question, Region
from dociq.data.tokenize import QuestionTokenizer
from dociq.cli.eval import main
from dociq.training.heldout import heuristic_masks


def _page() -> Page:
    words = ["alpha", "beta", "gamma", "delta"]
    boxes = np.array([[10, 10, 60, 30], [70, 10, 120, 30], [10, 100, 90, 120], [100, 100, 200, 120]], np.float32)
    image = np.full((256, 256, 3), 255, np.uint8)

    def rect(x0, y0, x1, y1):
        m = np.zeros((256, 256), bool)
        m[y0:y1, x0:x1] = True
        return m
    regions = [Region("paragraph", np.array([10, 100, 200, 120], np.float32), rect(10, 100, 200, 120), word_ids=[2, 3])]
    questions = [Question("where is the word beta?", "reading", rect(70, 10, 120, 30)),
                 Question("segment every paragraph", "layout", rect(10, 100, 200, 120), region_ids=[0])]
    return Page(image=image, words=words, word_boxes=boxes, regions=regions, questions=questions,
                meta={"page_id": "p"})


def test_heuristics_answer_with_the_named_words_all_words_and_the_box():
    batch = DocumentCollator(256, question_tokenizer=QuestionTokenizer(32), questions=True, seed=0)([_page()])
    masks = heuristic_masks(batch, 256)
    targets = batch["masks"] > 0.5
    reading, layout = masks["heuristic_question"][0]
    iou = (reading & targets[0, 0]).sum() / (reading | targets[0, 0]).sum()
    assert iou > 0.9                                   # the named word's own box
    words_area = sum(float(w[2] - w[0]) * float(w[3] - w[1]) for w in _page().word_boxes)
    assert layout.sum() == pytest.approx(words_area, rel=0.1)   # every word, nothing else
    box = masks["heuristic_box"][0, 1]
    assert torch.equal(box, targets[0, 1])             # a rectangle's box is the rectangle


def test_eval_cli_scores_the_held_out_split_of_a_corpus(finetune_checkpoint, tmp_path, capsys):
    root = tmp_path / "corpus"
    build(root)
    out = tmp_path / "r.json"
    code = main([str(finetune_checkpoint[0]), "--data", "corpus", "--corpus", str(root), "--split", "val",
                 "--prompts", "question", "question_no_ocr", "box_region", "--task-path", "--heuristics", "--snap", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())[str(finetune_checkpoint[0])]
    assert set(result) == {"question", "question_no_ocr", "box_region", "heuristic_question", "heuristic_box",
                           "question_snap", "box_region_snap", "question_blocks", "box_region_blocks",
                           "question_words", "question_layout_by_class"}
    # The val split holds one document of two pages, two questions each (a category and a layout one).
    assert result["question"]["count_category"] == 2 and result["question"]["count_layout"] == 2
    # the layout questions again, by the class of the regions they ask for
    assert sum(v for k, v in result["question_layout_by_class"].items() if k.startswith("count_")) == 2
    assert 0.0 <= result["question"]["miou"] <= 1.0
    # the default path, the Predictor a user runs, asks the same questions of the split
    assert main([str(finetune_checkpoint[0]), "--data", "corpus", "--corpus", str(root), "--split", "val",
                 "--prompts", "question", "--json", str(out)]) == 0
    user = json.loads(out.read_text())[str(finetune_checkpoint[0])]["question"]
    assert user["count_category"] == 2 and user["count_layout"] == 2 and 0.0 <= user["miou"] <= 1.0
    assert main([str(finetune_checkpoint[0]), "--data", "corpus", "--corpus", str(tmp_path / "none")]) == 2
    assert "none" in capsys.readouterr().err
