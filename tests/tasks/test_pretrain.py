"""PretrainTask (D-JEPA + MLM + MIM): the losses fall, masking is complementary and leak-free,
loss weights switch parts off, the EMA target takes no gradient, init checkpoints load."""
import copy

import pytest
import torch

from dociq.data.collate import DocumentCollator
from dociq.data.masking import MLMMasking, MultiBlockMasking
from dociq.data.synthetic.generator import SyntheticDocuments
from dociq.data.tokenize import OcrTokenizer
from dociq.models.sizes import complete_model_config
from dociq.training.tasks.collapse import page_content
from dociq.training.tasks.pretrain import PretrainTask

# Small enough for a few optimizer steps in seconds: 128 px pages = a 4x4 grid of mask units.
MODEL = complete_model_config(dict(size="tiny", image_size=128, fusion={"depth": 1}, predictor={"depth": 1}))


def make_batch(num_pages=2, seed=0):
    masking = MultiBlockMasking((4, 4), num_targets=2, target_scale=(0.25, 0.3), min_keep=1)
    tok = OcrTokenizer(max_length=48)
    collate = DocumentCollator(128, ocr_tokenizer=tok, image_masking=masking, seed=seed,
                               text_masking=MLMMasking(tok.mask_id, tok.vocab_size, prob=0.3,
                                                       visible_only=True))
    pages = SyntheticDocuments(num_pages, image_size=128, seed=seed)
    return collate([pages[i] for i in range(num_pages)])


@pytest.fixture(scope="module")
def batch():
    return make_batch()


@pytest.fixture(scope="module")
def base_task():
    torch.manual_seed(0)
    return PretrainTask(model=MODEL, init={})


@pytest.fixture()
def task(base_task):
    return copy.deepcopy(base_task)


def test_all_three_losses_fall_on_a_batch(task, batch):
    opt = torch.optim.AdamW(dict(task.trainable_named_parameters()).values(), lr=2e-3)
    history = []
    for _ in range(8):
        out = task.compute_losses(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        history.append({k: float(v.detach()) for k, v in out.items()})
    first, last = history[0], history[-1]
    for name in ("djepa", "mlm", "mim", "loss"):
        assert last[name] < 0.9 * first[name], (name, first[name], last[name])
    assert {"target_std", "pred_std", "mlm_acc"} <= set(first)
    assert first["target_std"] > 0


def test_no_target_pixels_reach_the_predictions(task, batch):
    """Pixels of masked units never reach the fused tokens (so neither the D-JEPA prediction, the
    MIM reconstruction, nor the MLM logits can copy them); visible pixels and words do."""
    task.eval()
    ctx = batch["ctx_idx"]
    visible = torch.zeros(2, 16, dtype=torch.bool).scatter_(1, ctx, True)
    changed = dict(batch)
    image = batch["image"].clone().view(2, 3, 4, 32, 4, 32)
    unit_mask = (~visible).view(2, 1, 4, 1, 4, 1).expand_as(image)
    image[unit_mask] = torch.randn(int(unit_mask.sum()))
    changed["image"] = image.view(2, 3, 128, 128)
    with torch.no_grad():
        a_img, a_txt, _ = task.model.encode(batch, keep_idx=ctx, text_ids=batch["mlm_ids"])
        b_img, b_txt, _ = task.model.encode(changed, keep_idx=ctx, text_ids=batch["mlm_ids"])
        torch.testing.assert_close(a_img, b_img)
        torch.testing.assert_close(a_txt, b_txt)
        # whereas the context pixels and the words do matter
        ctx_changed = dict(batch)
        ctx_changed["image"] = batch["image"] + 0.5 * torch.randn_like(batch["image"])
        c_img, _, _ = task.model.encode(ctx_changed, keep_idx=ctx, text_ids=batch["mlm_ids"])
        d_img, _, _ = task.model.encode(batch, keep_idx=ctx, text_ids=batch["ocr_ids"])
    assert (c_img - a_img).abs().max() > 1e-3
    assert (d_img - a_img).abs().max() > 1e-4, "masked units do not read the words"


def test_mlm_words_lie_in_visible_units(batch):
    labels, boxes, ctx = batch["mlm_labels"], batch["ocr_boxes"], batch["ctx_idx"]
    chosen = labels != -100
    assert chosen.any()
    centre = (boxes[..., :2] + boxes[..., 2:]).float() / 2000          # x, y in 0..1
    unit = (centre[..., 1] * 4).long().clamp(max=3) * 4 + (centre[..., 0] * 4).long().clamp(max=3)
    for b in range(labels.shape[0]):
        assert set(unit[b][chosen[b]].tolist()) <= set(ctx[b].tolist())


def test_zero_weight_turns_a_loss_and_its_compute_off(batch):
    torch.manual_seed(0)
    task = PretrainTask(model=MODEL, init={}, loss={"djepa": 0.0, "mlm": 1.0, "mim": 1.0})

    def fail(*args, **kwargs):
        raise AssertionError("target encoder ran although loss.djepa=0")

    task.target_encoder.forward = fail
    out = task.compute_losses(batch)
    assert "djepa" not in out and {"mlm", "mim"} <= set(out)
    out["loss"].backward()
    assert all(p.grad is None for p in task.predictor.parameters())
    torch.testing.assert_close(out["loss"], out["mlm"] + out["mim"])


def test_target_encoder_is_frozen_and_outside_the_optimizer(task, batch):
    names = [n for n, _ in task.trainable_named_parameters()]
    assert names and not any(n.startswith("target_encoder.") for n in names)
    task.train()
    assert not task.target_encoder.training
    task.compute_losses(batch)["loss"].backward()
    assert all(p.grad is None for p in task.target_encoder.parameters())
    assert task.model.image_encoder.hiera.patch_embed.proj.weight.grad is not None


def test_missing_masks_are_named(task, batch):
    no_mask = {k: v for k, v in batch.items() if k not in ("ctx_idx", "tgt_idx")}
    with pytest.raises(KeyError, match="ctx_idx.*data.image_masking"):
        task.compute_losses(no_mask)
    with pytest.raises(KeyError, match=r"mpl.*allowed: djepa"):
        PretrainTask(model=MODEL, loss={"mpl": 1.0})


def test_init_loads_earlier_stages_and_reports_keys(base_task, tmp_path, caplog):
    """init.image_encoder from an I-JEPA-style Lightning checkpoint (encoder at the top) and
    init.text_encoder from a pretrain checkpoint (model.text_encoder.*) with a stray key."""
    torch.manual_seed(1)
    donor = copy.deepcopy(base_task)
    for p in donor.parameters():
        p.data.normal_()
    image_ckpt = tmp_path / "ijepa.ckpt"
    torch.save({"state_dict": {f"image_encoder.{k}": v for k, v in
                               donor.model.image_encoder.state_dict().items()}}, image_ckpt)
    text_state = {f"model.text_encoder.{k}": v for k, v in donor.model.text_encoder.state_dict().items()}
    text_state["model.text_encoder.leftover.weight"] = torch.zeros(3)
    text_ckpt = tmp_path / "pretrain.ckpt"
    torch.save({"state_dict": text_state}, text_ckpt)

    task = PretrainTask(model=MODEL, init={"image_encoder": str(image_ckpt), "text_encoder": str(text_ckpt)})
    for mine, theirs in ((task.model.image_encoder, donor.model.image_encoder),
                         (task.target_encoder, donor.model.image_encoder),
                         (task.model.text_encoder, donor.model.text_encoder)):
        for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values()):
            torch.testing.assert_close(a, b, msg=name)
    assert task.init_report["text encoder"]["unexpected"] == ["leftover.weight"]
    assert task.init_report["image encoder"] == {"missing": [], "unexpected": []}
    # a pretrain checkpoint (DocumentModel keys) also gives its image encoder
    model_ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in donor.model.state_dict().items()}}, model_ckpt)
    again = PretrainTask(model=MODEL, init={"image_encoder": str(model_ckpt)})
    torch.testing.assert_close(again.model.image_encoder.hiera.patch_embed.proj.weight,
                               donor.model.image_encoder.hiera.patch_embed.proj.weight)
    with pytest.raises(FileNotFoundError, match="nowhere.ckpt"):
        PretrainTask(model=MODEL, init={"text_encoder": str(tmp_path / "nowhere.ckpt")})


def test_each_optimizer_step_moves_the_ema_target(task, batch):
    """After an optimizer step the target is momentum * old target + (1 - momentum) * new online."""
    opt = torch.optim.SGD(dict(task.trainable_named_parameters()).values(), lr=0.5)
    before = {k: v.clone() for k, v in task.target_encoder.state_dict().items()}

    def closure():
        opt.zero_grad()
        loss = task.compute_losses(batch)["loss"]
        loss.backward()
        return loss

    task.optimizer_step(0, 0, opt, closure)
    m = task.ema_start   # step 0 of the schedule
    online = task.model.image_encoder.state_dict()
    moved = 0
    for name, old in before.items():
        if old.is_floating_point():
            expected = m * old + (1 - m) * online[name]
            torch.testing.assert_close(task.target_encoder.state_dict()[name], expected)
            moved += int(not torch.equal(task.target_encoder.state_dict()[name], old))
    assert moved > 0


def test_collapse_regulariser_is_weighted_into_the_total(batch):
    torch.manual_seed(0)
    task = PretrainTask(model=MODEL, init={}, reg={"variance": 2.0, "covariance": 0.1})
    out = task.compute_losses(batch)
    parts = out["djepa"] + out["mlm"] + out["mim"]
    torch.testing.assert_close(out["loss"], parts + 2.0 * out["reg_var"] + 0.1 * out["reg_cov"])
    out["reg_var"].backward()
    encoder_grads = [p.grad for p in task.model.image_encoder.parameters() if p.grad is not None]
    assert encoder_grads and any(g.abs().sum() > 0 for g in encoder_grads)
    assert all(p.grad is None for p in task.model.text_encoder.parameters())


def test_page_content_keeps_only_what_varies_across_pages():
    torch.manual_seed(0)
    position = torch.randn(1, 16, 8, dtype=torch.float64) * 5.0     # the same on every page
    content = torch.randn(6, 16, 8, dtype=torch.float64) * 0.1
    out = page_content(position + content)
    torch.testing.assert_close(out.mean(dim=0), torch.zeros(16, 8, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(out.var(dim=0).mean(), torch.tensor(1.0, dtype=torch.float64))
    expected = content - content.mean(dim=0, keepdim=True)
    torch.testing.assert_close(out, expected / expected.var(dim=0).mean().sqrt())
    assert torch.count_nonzero(page_content(position)) == 0    # one page: nothing varies


def test_page_norm_targets_make_a_constant_prediction_unexplained():
    """With target_norm=page the D-JEPA target at each unit averages to zero over the pages, so a
    predictor that ignores the page (all zeros) explains none of it: `unexplained` is the share of
    the across-page variance a mean over B pages leaves, (B - 1) / B, give or take which units are
    targets. With layer-normed targets the same predictor leaves each unit's position unexplained."""
    batch = make_batch(num_pages=6, seed=3)
    torch.manual_seed(0)
    task = PretrainTask(model=MODEL, init={}, target_norm="page")
    torch.nn.init.zeros_(task.feature_head.proj.weight)
    torch.nn.init.zeros_(task.feature_head.proj.bias)
    task.eval()
    with torch.no_grad():
        image_tokens = task.model.image_encoder(batch["image"], batch["ctx_idx"])
        fused, _ = task.model.fuse(batch, image_tokens, keep_idx=batch["ctx_idx"])
        out = task._djepa(batch, fused)
    assert abs(float(out["unexplained"]) - 5 / 6) < 0.15, float(out["unexplained"])
    layer = PretrainTask(model=MODEL, init={})
    layer.load_state_dict(task.state_dict())
    layer.eval()
    with torch.no_grad():
        assert float(layer._djepa(batch, fused)["unexplained"]) > 5.0   # the position part is unexplained too
    with pytest.raises(ValueError, match="task.target_norm='batch'; allowed: layer, page"):
        PretrainTask(model=MODEL, target_norm="batch")


@pytest.mark.parametrize("context, masked_slots_matter", [("grid", True), ("visible", False)])
def test_predictor_context_decides_whether_masked_slots_reach_the_prediction(batch, context, masked_slots_matter):
    torch.manual_seed(0)
    task = PretrainTask(model=MODEL, init={}, predictor_context=context)
    task.eval()
    with torch.no_grad():
        image_tokens = task.model.image_encoder(batch["image"], batch["ctx_idx"])
        fused, _ = task.model.fuse(batch, image_tokens, keep_idx=batch["ctx_idx"])
        visible = torch.zeros(fused.shape[:2], dtype=torch.bool).scatter_(1, batch["ctx_idx"], True)
        changed = torch.where(visible[..., None], fused, fused + torch.randn_like(fused))
        a, b = task._djepa(batch, fused)["djepa"], task._djepa(batch, changed)["djepa"]
    assert (not torch.equal(a, b)) == masked_slots_matter
    with pytest.raises(ValueError, match="task.predictor_context='all'; allowed: grid, visible"):
        PretrainTask(model=MODEL, predictor_context="all")
