"""Held-out evaluation on the task path (dociq.training.heldout) and what scoring shares (dociq.data.scoring): prompt sets, per-kind counts, OCR removal, CLI errors."""
import json

import pytest
import torch

from dociq.cli.eval import main
from dociq.training.heldout import PROMPT_SETS, evaluate, load_task

@pytest.fixture(scope="module")
def checkpoint(finetune_checkpoint):
    return finetune_checkpoint[0]


def test_loaded_task_has_the_checkpoint_weights(checkpoint):
    task = load_task(checkpoint)
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    for name, value in task.state_dict().items():
        torch.testing.assert_close(value, saved[name], msg=name)
    assert not task.training


def test_every_prompt_set_scores_every_question(checkpoint, monkeypatch):
    task = load_task(checkpoint)
    seen_ocr = []
    run_rounds = task.run_rounds

    def oracle(batch, rounds, kinds=None):
        # record whether the words reach the model, then answer with the targets themselves
        seen_ocr.append((tuple(kinds), task.use_ocr))
        out = run_rounds(batch, rounds, kinds)
        out["masks"] = out["targets"] * 2 - 1          # logits > 0 exactly on the target
        out["candidates"] = out["masks"][:, None].expand(-1, 3, -1, -1)
        return out

    monkeypatch.setattr(task, "run_rounds", oracle)
    results = evaluate(task, pages=4, batch_size=2, max_questions=3)
    assert set(results) == set(PROMPT_SETS) | {"point_region_oracle", "question_layout_by_class"}
    for r in results.values():
        assert r["miou"] == pytest.approx(1.0)
        assert sum(v for k, v in r.items() if k.startswith("count_")) >= 4
    # every layout question is counted once under the class of the regions it asks for
    by_class = results["question_layout_by_class"]
    assert sum(v for k, v in by_class.items() if k.startswith("count_")) == results["question"]["count_layout"]
    assert (("question",), False) in seen_ocr and (("question",), True) in seen_ocr
    assert task.use_ocr                                  # restored after the no-OCR pass

    # --snap: every set that reads the words is scored again, snapped and completed to blocks
    snapped = evaluate(task, pages=4, batch_size=2, max_questions=3, prompt_sets=("box_region", "question_no_ocr"),
                       snap=True)
    assert set(snapped) == {"box_region", "question_no_ocr", "box_region_snap", "box_region_blocks"}
    counts = {k: v for k, v in snapped["box_region"].items() if k.startswith("count_")}
    assert {k: v for k, v in snapped["box_region_blocks"].items() if k.startswith("count_")} == counts
    # the oracle's masks stay inside their boxes: completing text blocks never costs more than a little
    assert snapped["box_region_blocks"]["miou"] > 0.8

    # --eval-size: the same prompts scored in a frame twice the input's, against the question masks
    # drawn at that size (not the input-size targets upsampled): the oracle's upsampled masks are
    # within a pixel of them, every prompt is counted, and every set is scored in the same frame
    size = int(task.hparams["model"]["image_size"])
    large = evaluate(task, pages=4, batch_size=2, max_questions=3, prompt_sets=("question", "box_region"),
                     snap=True, heuristics=True, eval_size=2 * size)
    assert {k: v for k, v in large["box_region"].items() if k.startswith("count_")} == counts
    assert large["box_region"]["miou"] > 0.8 and large["question"]["miou"] > 0.8
    assert large["heuristic_box"]["miou"] > 0.8
    with pytest.raises(ValueError, match="eval_size"):
        evaluate(task, pages=2, batch_size=2, prompt_sets=("box",), eval_size=0)

    # page_size: synthetic pages drawn at another size than the model's input, resized into its frame
    import dociq.training.heldout as heldout
    drawn = []

    class Recording(heldout.SyntheticDocuments):
        def __init__(self, *args, **kwargs):
            drawn.append(kwargs["image_size"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(heldout, "SyntheticDocuments", Recording)
    other = evaluate(task, pages=2, batch_size=2, max_questions=2, prompt_sets=("box",), page_size=2 * size)
    assert drawn == [2 * size] and other["box"]["miou"] == pytest.approx(1.0)


def test_the_click_oracle_scores_the_candidate_closest_to_the_region(checkpoint, monkeypatch):
    task = load_task(checkpoint)
    run_rounds = task.run_rounds

    def second_candidate_right(batch, rounds, kinds=None):
        # the IoU head's choice is the target's complement; of the three candidates only the
        # second is the target
        out = run_rounds(batch, rounds, kinds)
        right = out["targets"] * 2 - 1
        out["masks"] = -right
        out["candidates"] = torch.stack([-right, right, torch.full_like(right, -1.0)], dim=1)
        return out

    monkeypatch.setattr(task, "run_rounds", second_candidate_right)
    size = int(task.hparams["model"]["image_size"])
    for frame in (None, 2 * size):
        results = evaluate(task, pages=4, batch_size=2, max_questions=3, prompt_sets=("point_region",),
                           eval_size=frame)
        chosen, oracle = results["point_region"], results["point_region_oracle"]
        assert chosen["miou"] < 0.05 and oracle["miou"] > 0.95
        assert {k: v for k, v in oracle.items() if k.startswith("count_")} == \
            {k: v for k, v in chosen.items() if k.startswith("count_")}


def test_layout_questions_are_split_by_the_class_they_ask_for():
    from dociq.data.collate import DocumentCollator
    from dociq.data.synthetic.generator import SyntheticDocuments
    from dociq.data.scoring import MeanByName, question_classes

    pages = [SyntheticDocuments(num_pages=3, image_size=128, seed=5)[i] for i in range(3)]
    batch = DocumentCollator(128, questions=True, max_questions=6, seed=0)(pages)
    names = question_classes(batch, pages)
    kinds = [k for page in batch["prompt_kind"] for k in page]
    assert len(names) == len(kinds) == int(batch["prompt_valid"].sum())
    for (page, index) in zip(pages, batch["prompt_question_index"]):
        for k in index:
            q = page.questions[k]
            if q.kind == "layout":
                assert {page.regions[r].label for r in q.region_ids} <= {n for n in names if n}
    assert [n is None for n in names] == [k != "layout" for k in kinds] and any(names)

    mean = MeanByName()
    mean.add(torch.tensor([1.0, 0.0, 0.5, 0.25]), ["title", "table", "title", None])
    out = mean.compute()
    assert out == {"miou": pytest.approx(0.5), "miou_title": 0.75, "miou_table": 0.0,
                   "count_title": 2, "count_table": 1}


def test_frame_targets_are_the_question_masks_at_any_size():
    from dociq.data.collate import DocumentCollator
    from dociq.data.synthetic.generator import SyntheticDocuments
    from dociq.training.heldout import frame_targets

    pages = [SyntheticDocuments(num_pages=2, image_size=128, seed=5)[i] for i in range(2)]
    batch = DocumentCollator(128, questions=True, max_questions=3, seed=0)(pages)
    valid = batch["prompt_valid"].reshape(-1)
    same = frame_targets(batch, pages, 128)
    assert torch.equal(same[valid], batch["masks"].flatten(0, 1)[valid] > 0.5)
    assert not same[~valid].any()
    large = frame_targets(batch, pages, 512)
    assert large.shape == (valid.numel(), 512, 512)
    shrunk = torch.nn.functional.interpolate(large[:, None].float(), size=(128, 128), mode="area")[:, 0] > 0.5
    agree = (shrunk[valid] == same[valid]).float().mean()
    assert agree > 0.99        # the same masks, drawn 4x finer


def test_cli_writes_json_and_names_a_missing_checkpoint(checkpoint, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([str(checkpoint), "--pages", "2", "--batch-size", "2", "--prompts", "box", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data[str(checkpoint)]) == {"box"} and 0.0 <= data[str(checkpoint)]["box"]["miou"] <= 1.0
    assert "| checkpoint | prompt | mIoU" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "missing.ckpt" in err and "does not exist" in err


# ---- --data coco: the automatic segmenter scored with COCO mAP ---------------------------------

@pytest.fixture(scope="module")
def coco_set(tmp_path_factory):
    """A 2-page COCO folder as scripts/make_synthetic.py writes it (write_coco of synthetic pages)."""
    from dociq.data.datasets.coco import write_coco
    from dociq.data.synthetic.generator import SyntheticDocuments

    pages = SyntheticDocuments(2, image_size=160, seed=11)
    return write_coco((pages[i] for i in range(2)), tmp_path_factory.mktemp("coco"))


def test_coco_cli_prints_map_and_writes_json(checkpoint, coco_set, tmp_path, capsys):
    out = tmp_path / "coco.json"
    args = [str(checkpoint), "--data", "coco", "--annotations", str(coco_set), "--points-per-side", "3",
            "--pred-iou-thresh", "0", "--stability-score-thresh", "0", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| checkpoint | type | AP | AP50 | AP75 |" in printed and "question mIoU" in printed
    r = json.loads(out.read_text())[str(checkpoint)]
    for t in ("bbox", "segm"):
        assert {"AP", "AP50", "AP75", "per_class"} <= set(r[t]) and 0.0 <= r[t]["AP"] <= 1.0
    assert r["pages"] == 2 and r["skipped_pages"] == 0 and r["regions"] >= 1
    assert r["results"] + sum(r["dropped_regions"].values()) == r["regions"]
    assert r["questions"]["count_layout"] >= 2 and 0.0 <= r["questions"]["miou"] <= 1.0
    with pytest.raises(SystemExit):
        main([str(checkpoint), "--data", "coco"])                           # no --annotations
    assert "--data coco needs --annotations" in capsys.readouterr().err


def test_coco_evaluation_scores_the_ground_truth_regions_perfectly(checkpoint, coco_set, monkeypatch):
    """With a segmenter that returns the annotated regions (and one unnamed region), the whole chain -
    image ids, class names -> category ids, RLE results, COCOeval - must give AP 1 and count the drop."""
    import numpy as np

    from dociq.inference.automatic import PageSegmenter, SegmentedRegion
    from dociq.data.datasets.coco import CocoDocuments
    from dociq.evaluation.coco_eval import evaluate_coco
    from dociq.inference.predictor import Predictor

    pages = [CocoDocuments(coco_set)[i] for i in range(2)]

    def oracle(self, image, words=None, word_boxes=None, ocr=None):
        self.predictor.set_image(image, words=words, word_boxes=word_boxes)
        page = next(p for p in pages if np.array_equal(p.image, image))
        regions = [SegmentedRegion(mask=r.mask, box=r.box, score=1.0, stability=1.0, category=r.label, category_score=1.0)
                   for r in page.regions]
        return regions + [SegmentedRegion(mask=page.regions[0].mask, box=page.regions[0].box, score=0.5, stability=1.0)]

    monkeypatch.setattr(PageSegmenter, "segment", oracle)
    r = evaluate_coco(Predictor.from_checkpoint(checkpoint), coco_set)
    assert r["bbox"]["AP"] == pytest.approx(1.0) and r["segm"]["AP"] == pytest.approx(1.0)
    assert all(c["AP"] == pytest.approx(1.0) for c in r["segm"]["per_class"].values() if c["AP"] is not None)
    assert r["dropped_regions"] == {"region": 2} and r["unmatched_categories"] == []
    assert r["results"] == sum(len(p.regions) for p in pages)
    with pytest.raises(ValueError, match="'Picture' is not a category"):
        evaluate_coco(Predictor.from_checkpoint(checkpoint), coco_set, category_map={"figure": "Picture"})


def test_coco_pages_without_words_name_the_ocr_option(checkpoint, coco_set, tmp_path):
    from dociq.evaluation.coco_eval import evaluate_coco
    from dociq.inference.predictor import Predictor

    data = json.loads(coco_set.read_text())
    for image in data["images"]:
        del image["words"]                                   # DocLayNet / PubLayNet ship no words
    bare = tmp_path / "no_words.json"
    bare.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no page could be read.*no 'words'.*--ocr tesseract"):
        evaluate_coco(Predictor.from_checkpoint(checkpoint), bare, image_dir=coco_set.parent / "images")


def test_region_prompts_are_reported_by_size():
    import numpy as np

    from dociq.data.scoring import region_size

    mask = np.zeros((100, 100), dtype=bool)
    mask[:5, :10] = True                      # 0.5 % of the page
    assert region_size(mask) == "small"
    mask[:20, :20] = True                     # 4 %
    assert region_size(mask) == "medium"
    mask[:50, :50] = True                     # 25 %
    assert region_size(mask) == "large"


def test_the_click_heuristic_answers_a_click_with_the_text_block_under_it():
    import numpy as np

    from dociq.data.collate import DocumentCollator
    from dociq.data.schema import Page, Region
    from dociq.data.scoring import regions_as_prompts
    from dociq.training.heldout import clicked_block_masks

    # two paragraphs of three lines, 256 x 256 page (the input frame: no resizing)
    words, boxes = [], []
    for top in (40, 150):
        for line in range(3):
            for x in (20, 88, 156):                     # spaces of 0.4 line heights, as in prose
                words.append("text")
                boxes.append([x, top + 14 * line, x + 64, top + 14 * line + 10])
    boxes = np.asarray(boxes, np.float32)
    regions = []
    for top in (40, 150):
        mask = np.zeros((256, 256), bool)
        mask[top:top + 38, 20:220] = True
        regions.append(Region(label="paragraph", box=np.array([20, top, 220, top + 38], np.float32), mask=mask))
    page = Page(image=np.full((256, 256, 3), 255, np.uint8), words=words, word_boxes=boxes, regions=regions,
                meta={"page_id": "p"})
    batch = DocumentCollator(256, questions=True, max_questions=8, seed=0)([regions_as_prompts(page, 8, 0)])
    got = clicked_block_masks(batch, [page], 256)
    assert got.shape[:2] == batch["prompt_valid"].shape
    for k in range(2):
        x, y = (batch["points"][0, k, 0] - 0.5).tolist()
        target = batch["masks"][0, k] > 0.5
        assert target[int(y), int(x)]                       # the click is on its region
        assert torch.equal(got[0, k], target)               # and the block under it is that region
    # scored in a 1024 frame, the same clicks (in the 256 input frame) give the same blocks, 4x finer
    from dociq.training.heldout import frame_targets
    finer = clicked_block_masks(batch, [page], 1024, input_size=256)
    targets = frame_targets(batch, [regions_as_prompts(page, 8, 0)], 1024).view(1, -1, 1024, 1024)
    for k in range(2):
        assert torch.equal(finer[0, k], targets[0, k])
