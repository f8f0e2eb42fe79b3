"""stage=finetune: prompt combinations, learning, interactive rounds, metrics, init and freezing.

A small variant of model=tiny (128-px pages, one text/fusion layer) keeps every test fast."""
import math

import pytest
import torch
import torch.nn.functional as F

from dociq.data.collate import DocumentCollator
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.models.segmenter import remove_ocr_words
from dociq.models.sizes import complete_model_config
from dociq.training.tasks.finetune import PROMPT_KINDS, FinetuneTask
from dociq.training.tasks.segment_losses import select_mask_prompt
from dociq.data.scoring import SegmentationMetrics, per_prompt_iou_dice

MODEL = complete_model_config({"size": "tiny", "image_size": 128, "text_encoder": {"num_hidden_layers": 1},
                               "fusion": {"depth": 1}})


@pytest.fixture(scope="module")
def batch():
    pages = SyntheticDocuments(num_pages=2, image_size=128, seed=3)
    return DocumentCollator(128, questions=True, max_questions=3, seed=0)([pages[0], pages[1]])


def make_task(**kw) -> FinetuneTask:
    torch.manual_seed(0)
    return FinetuneTask(model=MODEL, **kw)


@pytest.fixture(scope="module")
def shared_task():
    """One task for the tests that only run forward/backward (building one takes a while)."""
    return make_task(rounds=1)


@pytest.fixture
def task(shared_task):
    shared_task.zero_grad(set_to_none=True)
    return shared_task


COMBINATIONS = [("question",), ("question", "point"), ("question", "box"), ("box",), ("point",),
                ("point", "box"), ("question", "box", "point")]


@pytest.mark.parametrize("kinds", COMBINATIONS, ids="+".join)
def test_every_prompt_combination_trains(batch, task, kinds):
    question_ids, points, ambiguous = task.sample_prompts(batch, kinds)
    n = batch["prompt_valid"].numel()
    assert (question_ids is not None) == ("question" in kinds)
    if "point" in kinds or "box" in kinds:
        coords, labels = points
        assert coords.shape == (n, 3, 2)
        assert ((labels[:, 0] == 1) == ("point" in kinds)).all()
        assert ((labels[:, 1:] >= 2).all(1) == ("box" in kinds)).all()
    else:
        assert points is None
    # a lone click is the only ambiguous prompt: it gets the 3 multimask candidates
    assert bool(ambiguous.all()) == (kinds == ("point",))

    out = task.run_rounds(batch, 1, kinds=kinds)
    assert out["masks"].shape == batch["masks"].flatten(0, 1).shape   # upsampled to the input size
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    grads = {name.split(".")[1]: p.grad for name, p in task.named_parameters() if p.grad is not None}
    assert {"image_encoder", "text_encoder", "fusion", "neck", "mask_decoder"} <= set(grads)
    # the question tower learns from questions; prompts without one use its no-question embedding
    assert ("question_encoder.text." in str([n for n, p in task.named_parameters() if p.grad is not None])) \
        == ("question" in kinds)
    assert task.model.prompt_encoder.question_encoder.no_question_embed.weight.grad is not None


@pytest.mark.parametrize("kinds", COMBINATIONS, ids="+".join)
def test_a_lone_click_is_scored_against_its_region_every_other_prompt_against_the_answer(batch, task, kinds):
    with torch.no_grad():
        out = task.run_rounds(batch, 1, kinds=kinds)
    expected = batch["region_masks"] if kinds == ("point",) else batch["masks"]
    assert torch.equal(out["targets"], expected.flatten(0, 1))


def test_the_synthetic_batch_has_plural_answers_whose_click_target_is_smaller(batch):
    valid = batch["prompt_valid"]
    union, region = batch["masks"][valid], batch["region_masks"][valid]
    assert (region <= union).all()
    assert (region.sum((1, 2)) < union.sum((1, 2))).any()   # some answer has several regions


def test_training_prompts_mix_kinds_and_never_leave_a_prompt_empty(batch, task):
    torch.manual_seed(1)
    big = {k: (v.repeat(8, *[1] * (v.dim() - 1)) if torch.is_tensor(v) else v) for k, v in batch.items()}
    question_ids, (coords, labels), _ = task.sample_prompts(
        big, probs={"question": 0.5, "box": 0.5, "point": 0.0})
    has_q = (question_ids != 0).any(1)
    has_box = (labels[:, 1] == 2)
    has_point = labels[:, 0] == 1
    assert has_q.any() and (~has_q).any() and has_box.any() and (~has_box).any()
    assert (has_q | has_box | has_point).all()           # empty prompts got a click
    assert not (has_point & (has_q | has_box)).any()      # ... and only those (point prob 0)


def test_loss_falls_when_overfitting_two_pages(batch):
    # focal 1 : dice 1 here: with SAM's 20 : 1 the first steps only learn "background everywhere",
    # and the test would need many more steps to see the masks appear.
    task = make_task(rounds=1, prompts={"question": 1.0, "box": 1.0, "point": 0.0}, loss_size=32,
                     box_noise=0.0, loss={"focal": 1.0})
    opt = torch.optim.AdamW(task.parameters(), lr=3e-3)
    torch.manual_seed(0)
    losses, ious = [], []
    for _ in range(12):
        out = task.run_rounds(batch, 1)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
        ious.append(out["rounds"][0].actual_iou[out["valid"]].mean().item())
    assert sum(losses[-3:]) / 3 < 0.92 * losses[0], losses
    assert max(ious[-3:]) > 0.05, ious       # masks of the prompted regions start to appear


def test_loss_targets_reach_the_loss_and_bad_values_are_named(batch):
    with pytest.raises(ValueError, match=r"task.loss_targets='max'; allowed: area, peaked"):
        make_task(loss_targets="max")
    torch.manual_seed(0)
    area = make_task(rounds=1, loss_size=8, box_noise=0.0).run_rounds(batch, 1, kinds=("question",))
    torch.manual_seed(0)
    peaked = make_task(rounds=1, loss_size=8, box_noise=0.0, loss_targets="peaked").run_rounds(
        batch, 1, kinds=("question",))
    # same weights (seeded), same prompts: on an 8 x 8 grid some targets are smaller than a cell
    assert torch.equal(area["targets"], peaked["targets"])
    assert not torch.allclose(area["loss"], peaked["loss"])


def test_rounds_click_in_error_region_and_feed_mask_prompt(batch, task, monkeypatch):
    calls = []
    decode = task.model.decode

    def spy(embedding, high_res, question_tokens, points, mask_prompt, grounding=None):
        out = decode(embedding, high_res, question_tokens, points, mask_prompt, grounding)
        calls.append({"points": points, "mask_prompt": mask_prompt, "out": out})
        return out

    monkeypatch.setattr(task.model, "decode", spy)
    torch.manual_seed(0)
    out = task.run_rounds(batch, 2, kinds=("question",))
    assert len(calls) == 2 and len(out["rounds"]) == 2
    first, second = calls
    assert first["mask_prompt"] is None and first["points"] is None
    # round 2's mask prompt = round 1's chosen candidate (single-mask output: not ambiguous)
    masks, iou = first["out"]
    chosen = select_mask_prompt(masks[:, :1], iou[:, :1])
    torch.testing.assert_close(second["mask_prompt"], chosen)
    # the new click lies in round 1's error region on the loss grid (task.loss_size), labelled by
    # which error it corrects, and is given in pixel indices of the input frame (cell centres)
    coords, labels = second["points"]
    assert coords.shape[1] == 1 and labels.shape[1] == 1
    side = task.loss_size or batch["masks"].shape[-1]
    cell = batch["masks"].shape[-1] / side
    pred = F.interpolate(chosen, size=(side, side), mode="bilinear", align_corners=False)[:, 0] > 0
    target = F.interpolate(batch["masks"].flatten(0, 1)[:, None], size=(side, side), mode="area")[:, 0] > 0.5
    for i in range(coords.shape[0]):
        gx, gy = ((coords[i, 0] + 0.5) / cell - 0.5).round().long().tolist()
        assert pred[i, gy, gx] != target[i, gy, gx], f"prompt {i}: click ({gx}, {gy}) is not on an error"
        assert labels[i, 0].item() == int(target[i, gy, gx])   # positive on a miss, negative on a false alarm
    word = out["word"].loss if out["word"] is not None else 0.0
    word_class = out["word_class"].loss if out["word_class"] is not None else 0.0
    assert torch.isclose(out["loss"], out["rounds"][0].loss + out["rounds"][1].loss
                         + task.loss_weights["word"] * word + task.loss_weights["word_class"] * word_class)


def test_metrics_per_kind_on_hand_made_masks():
    target = torch.zeros(4, 8, 8, dtype=torch.bool)
    pred = torch.zeros_like(target)
    target[0, :4] = True; pred[0, :2] = True           # IoU 0.5, Dice 2*16/(16+32) = 2/3
    target[1, :, :4] = True; pred[1, :, :4] = True     # IoU 1
    target[2, :2] = True; pred[2, 4:] = True           # IoU 0
    target[3, 0, 0] = True; pred[3, 0, :2] = True      # IoU 0.5
    iou, dice = per_prompt_iou_dice(pred, target)
    torch.testing.assert_close(iou, torch.tensor([0.5, 1.0, 0.0, 0.5]))
    torch.testing.assert_close(dice, torch.tensor([2 / 3, 1.0, 0.0, 2 / 3]))

    metrics = SegmentationMetrics()
    metrics.update(pred[:2], target[:2], ["layout", "reading"])
    metrics.update(pred[2:], target[2:], ["reading", "layout"])
    got = {k: v.item() for k, v in metrics.compute().items()}
    assert got["miou"] == pytest.approx(0.5)
    assert got["miou_layout"] == pytest.approx(0.5)      # (0.5 + 0.5) / 2
    assert got["miou_reading"] == pytest.approx(0.5)     # (1 + 0) / 2
    assert got["dice_layout"] == pytest.approx(2 / 3)
    assert "miou_cell" not in got                        # kinds never seen are not reported
    metrics.reset()
    assert metrics.compute() == {}
    with pytest.raises(KeyError, match="QUESTION_KINDS"):
        metrics.update(pred[:1], target[:1], ["poem"])


def test_per_prompt_scores_are_torchmetrics_scores():
    import warnings

    from torchmetrics.functional.segmentation import dice_score, mean_iou

    g = torch.Generator().manual_seed(0)
    pred = torch.rand(16, 32, 32, generator=g) > torch.rand(16, 1, 1, generator=g)
    target = torch.rand(16, 32, 32, generator=g) > torch.rand(16, 1, 1, generator=g)
    pred[0], target[0] = False, True                  # nothing found
    iou, dice = per_prompt_iou_dice(pred, target)
    p, t = pred.long()[:, None], target.long()[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_iou = mean_iou(p, t, num_classes=1, include_background=True, input_format="one-hot").reshape(-1)
        ref_dice = dice_score(p, t, num_classes=1, include_background=True, average="micro",
                              input_format="one-hot", aggregation_level="samplewise").reshape(-1)
    torch.testing.assert_close(iou, ref_iou.float())
    torch.testing.assert_close(dice, ref_dice.float())


def test_empty_prediction_of_empty_target_scores_one():
    empty = torch.zeros(1, 4, 4, dtype=torch.bool)
    iou, dice = per_prompt_iou_dice(empty, empty)
    assert iou.item() == 1.0 and dice.item() == 1.0


@pytest.fixture(scope="module")
def source_model():
    """A model with weights no fresh init would have."""
    model = make_task().model
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def test_init_from_checkpoint_loads_weights_and_reports_keys(tmp_path, capsys, source_model):
    source = source_model
    # a pretrain-like checkpoint: DocumentModel weights under `model.`, plus a head the
    # finetune model does not have, plus an EMA copy outside `model.`
    state = {f"model.{k}": v for k, v in source.state_dict().items()
             if k.split(".")[0] in ("image_encoder", "text_encoder", "fusion")}
    state["model.mlm_head.bias"] = torch.zeros(3)
    state["target_encoder.hiera.pos_embed"] = torch.zeros(1)
    path = tmp_path / "pretrain.ckpt"
    torch.save({"state_dict": state}, path)

    task = make_task(init={"from": str(path)})
    for name, value in task.model.state_dict().items():
        if name.split(".")[0] in ("image_encoder", "text_encoder", "fusion"):
            torch.testing.assert_close(value, source.state_dict()[name], msg=name)
    report = task.init_report["model"]
    assert report["unexpected"] == ["mlm_head.bias"]
    assert report["missing"] == []
    assert {k.split(".")[0] for k in report["new"]} == {"neck", "prompt_encoder", "mask_decoder", "grounding", "box_maps",
                                                       "click_maps", "word_class_head"}
    assert "1 unexpected" in capsys.readouterr().out

    # a finetune checkpoint restores everything, heads included
    full = tmp_path / "finetune.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in source.state_dict().items()}}, full)
    again = make_task(init={"from": str(full)})
    torch.testing.assert_close(again.model.mask_decoder.iou_token.weight, source.mask_decoder.iou_token.weight)
    assert again.init_report["model"] == {"missing": [], "unexpected": [], "new": []}


def test_init_errors_name_the_key_and_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="init.from"):
        make_task(init={"from": str(tmp_path / "nope.ckpt")})
    bad = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"model.unrelated.weight": torch.zeros(2)}}, bad)
    with pytest.raises(KeyError, match="nothing in .* fits"):
        make_task(init={"from": str(bad)})
    with pytest.raises(KeyError, match="allowed: image_encoder, text_encoder, from"):
        make_task(init={"weights": "x"})


def test_init_encoders_from_stage_checkpoints(tmp_path, source_model, shared_task):
    source = source_model
    ijepa = tmp_path / "ijepa.ckpt"   # ijepa keeps the encoder at the top level
    torch.save({"state_dict": {f"image_encoder.{k}": v
                               for k, v in source.image_encoder.state_dict().items()}}, ijepa)
    mlm = tmp_path / "mlm.ckpt"
    torch.save({"state_dict": {f"text_encoder.{k}": v
                               for k, v in source.text_encoder.state_dict().items()}}, mlm)
    task = make_task(init={"image_encoder": str(ijepa), "text_encoder": str(mlm)})
    for part in ("image_encoder", "text_encoder"):
        for name, value in getattr(task.model, part).state_dict().items():
            torch.testing.assert_close(value, getattr(source, part).state_dict()[name])
    # parts without a checkpoint keep their fresh init (same seed as the shared task)
    for name, value in task.model.fusion.state_dict().items():
        torch.testing.assert_close(value, shared_task.model.fusion.state_dict()[name])


def test_freeze_keeps_parts_fixed_and_out_of_the_optimizer(batch):
    task = make_task(freeze={"image_encoder": True, "fusion": True}, rounds=1)
    names = [n for n, _ in task.trainable_named_parameters()]
    assert not any(n.startswith(("model.image_encoder.", "model.fusion.")) for n in names)
    assert any(n.startswith("model.text_encoder.") for n in names)
    task.train()
    assert not task.model.image_encoder.training and task.model.text_encoder.training
    with pytest.raises(KeyError, match="task.freeze"):
        make_task(freeze={"decoder": True})


def test_layout_only_batch_keeps_just_the_special_tokens(batch):
    blank = remove_ocr_words(batch)
    assert blank["ocr_ids"].shape[1] == 2
    assert blank["ocr_ids"].tolist() == [[101, 102]] * 2
    assert blank["ocr_mask"].all() and (blank["ocr_word_index"] == -1).all()
    assert (batch["ocr_block_index"] >= 0).any() and (blank["ocr_block_index"] == -1).all()   # no words, no blocks
    assert blank["ocr_block_index"].shape == blank["ocr_ids"].shape
    assert batch["ocr_ids"].shape[1] > 2   # the original batch is untouched


def test_bad_config_is_named():
    with pytest.raises(KeyError, match="task.prompts"):
        make_task(prompts={"scribble": 0.5})
    with pytest.raises(ValueError, match="task.rounds"):
        make_task(rounds=0)
    with pytest.raises(KeyError, match="task.val_prompts"):
        make_task(val_prompts=["mask"])
    assert set(PROMPT_KINDS) == {"question", "box", "point"}


def test_batch_without_questions_names_the_fix(batch, task):
    with pytest.raises(KeyError, match="data.questions=true"):
        task.run_rounds({k: v for k, v in batch.items() if k != "prompt_ids"}, 1)


def test_stage_config_monitors_val_miou():
    from dociq.training.config import compose
    from dociq.training.tasks.registry import resolve_stage

    cfg = compose(["stage=finetune"])
    assert resolve_stage(cfg.stage.name) is FinetuneTask
    assert (cfg.stage.monitor, cfg.stage.mode, cfg.optimized_metric) == ("val/miou", "max", "val/miou")
    assert cfg.data.questions is True and cfg.task.rounds >= 1
    # focal 1 : dice 1 (SAM's 20 : 1 learns "background everywhere" at CPU budgets) + word BCE
    assert math.isclose(cfg.task.loss.focal / cfg.task.loss.dice, 1.0) and cfg.task.loss.word > 0
    assert list(cfg.task.val_prompts) == ["question", "box", "point"]


def test_init_from_an_encoder_stage_checkpoint_fails_naming_the_right_option(tmp_path, source_model):
    mlm = tmp_path / "mlm.ckpt"      # an mlm checkpoint keeps only the text encoder
    torch.save({"state_dict": {f"text_encoder.{k}": v for k, v in source_model.text_encoder.state_dict().items()}}, mlm)
    with pytest.raises(ValueError, match=r"no image_encoder, fusion.*init\.text_encoder="):
        make_task(init={"from": str(mlm)})
    ijepa = tmp_path / "ijepa.ckpt"
    torch.save({"state_dict": {f"model.image_encoder.{k}": v
                               for k, v in source_model.image_encoder.state_dict().items()}}, ijepa)
    with pytest.raises(ValueError, match=r"init\.image_encoder="):
        make_task(init={"from": str(ijepa)})
