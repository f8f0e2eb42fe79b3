"""stage=ijepa: EMA math, gradient flow, what the predictor sees, loss that falls, checkpoints."""
import lightning as L
import pytest
import torch
from torch import nn

from dociq.data.masking import MultiBlockMasking
from dociq.models.image_encoder import load_image_encoder_from_checkpoint
from dociq.models.jepa_predictor import JEPAPredictor
from dociq.models.sizes import complete_model_config
from dociq.training.tasks.ema import ema_update, make_ema_target, momentum_schedule
from dociq.training.tasks.ijepa import IJEPATask, select_units

SMALL = dict(embed_dim=16, num_heads=1, stages=(1, 1, 1, 1))


def small_model(image_size):
    return complete_model_config(dict(size="tiny", image_size=image_size, image_encoder=dict(SMALL),
                                      predictor=dict(dim=32, depth=1, num_heads=2)))


def adamw(lr=1e-3):
    return lambda named: torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=0.0)


def test_momentum_schedule_is_linear_and_held_at_the_end():
    assert momentum_schedule(0, 100) == pytest.approx(0.996)
    assert momentum_schedule(50, 100) == pytest.approx(0.998)
    assert momentum_schedule(100, 100) == pytest.approx(1.0)
    assert momentum_schedule(500, 100) == pytest.approx(1.0)
    assert momentum_schedule(25, 100, start=0.9, end=0.98) == pytest.approx(0.92)
    with pytest.raises(ValueError, match="max_steps"):
        momentum_schedule(0, 0)


def test_ema_update_math():
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = make_ema_target(online)
    assert not any(p.requires_grad for p in target.parameters())
    with torch.no_grad():
        for p in online.parameters():
            p.add_(torch.randn_like(p))
        online[1].running_mean.add_(1.0)
        online[1].num_batches_tracked.fill_(7)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    ema_update(target, online, momentum=0.9)
    for name, value in target.state_dict().items():
        if name.endswith("num_batches_tracked"):
            assert int(value) == 7                                 # integer buffers are copied
        else:
            expected = 0.9 * before[name] + 0.1 * online.state_dict()[name]
            torch.testing.assert_close(value, expected)
    ema_update(target, online, momentum=0.0)                       # m = 0: target = online
    for name, value in target.state_dict().items():
        torch.testing.assert_close(value, online.state_dict()[name])


def _masked_batch(image_size=128, batch=2, seed=0):
    masking = MultiBlockMasking(image_size // 32, num_targets=2, target_scale=(0.2, 0.3), min_keep=2)
    g = torch.Generator().manual_seed(seed)
    ctx, tgt = masking(batch, g)
    return dict(image=torch.randn(batch, 3, image_size, image_size, generator=g), ctx_idx=ctx, tgt_idx=tgt)


def test_target_encoder_gets_no_gradient():
    torch.manual_seed(0)
    task = IJEPATask(small_model(128))
    out = task.compute_losses(_masked_batch())
    out["loss"].backward()
    assert all(p.grad is None and not p.requires_grad for p in task.target_encoder.parameters())
    assert all(p.grad is not None for p in task.predictor.parameters())
    assert task.image_encoder.hiera.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
    names = [n for n, _ in task.trainable_named_parameters()]
    assert names and not any(n.startswith("target_encoder.") for n in names)
    assert {"loss", "target_std", "pred_std"} <= set(out) and out["target_std"] > 0


def test_predictions_depend_only_on_context_units():
    torch.manual_seed(0)
    task = IJEPATask(small_model(128)).eval()
    batch = _masked_batch()
    image, ctx, tgt = batch["image"], batch["ctx_idx"], batch["tgt_idx"]
    with torch.no_grad():
        base = task.predict_targets(image, ctx, tgt)
        hidden = image.clone()
        for b in range(2):
            for unit in set(range(16)) - set(ctx[b].tolist()):       # targets and other masked units
                r, c = divmod(unit, 4)
                hidden[b, :, 32 * r:32 * r + 32, 32 * c:32 * c + 32] = torch.randn(3, 32, 32)
        torch.testing.assert_close(task.predict_targets(hidden, ctx, tgt), base)
        r, c = divmod(int(ctx[0, 0]), 4)
        seen = image.clone()
        seen[0, :, 32 * r:32 * r + 32, 32 * c:32 * c + 32] += 1.0  # a context unit
        assert not torch.allclose(task.predict_targets(seen, ctx, tgt)[:2], base[:2])


@pytest.mark.parametrize("positions", ["sincos", "rope"])
def test_predictor_uses_positions_not_token_order(positions):
    torch.manual_seed(0)
    predictor = JEPAPredictor(in_dim=24, dim=32, depth=2, num_heads=2, positions=positions).eval()
    tokens, ctx = torch.randn(1, 5, 24), torch.tensor([[0, 3, 7, 9, 12]])
    tgt = torch.tensor([[5, 6]])
    with torch.no_grad():
        out = predictor(tokens, ctx, tgt, (4, 4))
        perm = torch.tensor([3, 0, 4, 1, 2])
        torch.testing.assert_close(predictor(tokens[:, perm], ctx[:, perm], tgt, (4, 4)), out)
        assert not torch.allclose(predictor(tokens, ctx, torch.tensor([[10, 11]]), (4, 4)), out)
        swapped = predictor(tokens, ctx, torch.tensor([[6, 5]]), (4, 4))
        torch.testing.assert_close(swapped, out.flip(1))           # a prediction belongs to its position


def test_rotary_predictor_sees_offsets_so_a_shifted_page_gives_the_same_predictions():
    """With rotary positions an attention weight depends on the offset between two units only: the
    same context and targets moved one unit right and one down predict the same, which absolute
    sin-cos positions do not."""
    torch.manual_seed(0)
    tokens, ctx, tgt = torch.randn(2, 5, 24), torch.tensor([[0, 1, 6, 8, 12]] * 2), torch.tensor([[4, 7]] * 2)
    shift = lambda units: units + 6 + 1                                # on a 6 x 6 grid: one down, one right
    for positions, same in (("rope", True), ("sincos", False)):
        predictor = JEPAPredictor(in_dim=24, dim=32, depth=2, num_heads=2, positions=positions).eval()
        with torch.no_grad():
            out, moved = predictor(tokens, ctx, tgt, (6, 6)), predictor(tokens, shift(ctx), shift(tgt), (6, 6))
        assert torch.allclose(moved, out, atol=1e-5) == same, positions


def test_predictor_names_a_bad_positions_setting():
    with pytest.raises(ValueError, match="model.predictor.positions='learned'"):
        JEPAPredictor(in_dim=24, dim=32, positions="learned")
    with pytest.raises(ValueError, match="head width 6"):
        JEPAPredictor(in_dim=24, dim=24, num_heads=4, positions="rope")


def test_bad_batches_fail_with_the_fix():
    task = IJEPATask(small_model(128))
    batch = _masked_batch()
    with pytest.raises(KeyError, match="data.image_masking"):
        task.compute_losses({"image": batch["image"]})
    batch["tgt_idx"][0, 0, 0] = batch["ctx_idx"][0, 0]
    with pytest.raises(ValueError, match="allow_overlap"):
        task.compute_losses(batch)
    with pytest.raises(ValueError, match="mask_unit_px"):
        IJEPATask(dict(small_model(128), mask_unit_px=16))


def test_loss_falls_on_synthetic_pages():
    from dociq.data.collate import DocumentCollator
    from dociq.data.synthetic.generator import SyntheticDocuments

    torch.manual_seed(0)
    pages = SyntheticDocuments(8, image_size=128, seed=0)
    collate = DocumentCollator(128, image_masking=MultiBlockMasking(4, num_targets=2, target_scale=(0.2, 0.3),
                                                                     min_keep=2), seed=0)
    batches = [collate([pages[i] for i in range(j, j + 4)]) for j in (0, 4)]
    task = IJEPATask(small_model(128))
    optimizer = adamw(2e-3)(task.trainable_named_parameters())
    losses = []
    for step in range(12):
        out = task.compute_losses(batches[step % 2])
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        ema_update(task.target_encoder, task.image_encoder, momentum_schedule(step, 12))
        losses.append(out["loss"].item())
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:2]) / 2, losses


def test_lightning_fit_updates_target_and_checkpoint_feeds_later_stages(tmp_path):
    torch.manual_seed(0)
    batch = dict(image=torch.randn(2, 3, 64, 64), ctx_idx=torch.tensor([[0, 1], [1, 2]]),
                 tgt_idx=torch.tensor([[[2], [3]], [[0], [3]]]))
    loader = torch.utils.data.DataLoader([batch] * 3, batch_size=None)
    task = IJEPATask(small_model(64), ema=[0.5, 1.0], optimizer=adamw())
    initial = {k: v.clone() for k, v in task.target_encoder.state_dict().items()}
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, train_dataloaders=loader)
    assert trainer.global_step == 3
    assert trainer.callback_metrics["train/ema_momentum"] == pytest.approx(0.5 + 0.5 * 2 / 3)
    target, online = task.target_encoder.state_dict(), task.image_encoder.state_dict()
    name = "hiera.blocks.0.mlp.fc1.weight"
    assert not torch.equal(target[name], initial[name])            # the EMA moved the target ...
    assert not torch.equal(target[name], online[name])             # ... part of the way
    metrics = trainer.validate(task, dataloaders=loader, verbose=False)[0]
    assert {"val/loss", "val/target_std"} <= set(metrics)

    path = tmp_path / "ijepa.ckpt"
    trainer.save_checkpoint(path)
    loaded = load_image_encoder_from_checkpoint(path)
    assert loaded.keys() == online.keys()
    assert all(torch.equal(loaded[k], online[k]) for k in online)
    later = IJEPATask(small_model(64), init={"image_encoder": str(path)})
    assert all(torch.equal(later.image_encoder.state_dict()[k], online[k]) for k in online)
    assert all(torch.equal(later.target_encoder.state_dict()[k], online[k]) for k in online)


def test_collapse_regulariser_joins_the_loss_and_reaches_the_encoder():
    torch.manual_seed(0)
    reg = dict(variance=1.0, covariance=0.04, gamma=1.0)  # noise pages: content std ~0.8 < gamma
    task = IJEPATask(small_model(128), reg=reg)
    batch = _masked_batch(batch=4)
    out = task.compute_losses(batch)
    expected = out["jepa"] + reg["variance"] * out["reg_var"] + reg["covariance"] * out["reg_cov"]
    torch.testing.assert_close(out["loss"], expected)
    assert out["reg_var"] > 0 and 0 <= out["content_std"] < reg["gamma"]
    out["reg_var"].backward()          # the term alone moves the online encoder, not the target
    assert task.image_encoder.hiera.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in task.target_encoder.parameters())
    plain = IJEPATask(small_model(128)).compute_losses(batch)
    assert "reg_var" not in plain and torch.equal(plain["loss"], plain["jepa"])


def test_unexplained_fraction_is_one_for_the_average_page_and_zero_for_the_truth():
    from dociq.training.tasks.collapse import unexplained_fraction

    torch.manual_seed(0)
    B, N, E = 8, 16, 32
    # position part + page content, which varies only on the units 8..15 (the margins 0..7 are blank)
    content = torch.randn(B, N, E) * (torch.arange(N) >= 8).float()[None, :, None]
    features = torch.randn(1, N, E) + content
    idx = torch.randint(8, N, (B, 5))                              # targets where the content is
    target = select_units(features, idx)
    average_page = select_units(features.mean(0, keepdim=True).expand(B, N, E), idx)
    # MSE of the per-unit mean over the unbiased variance at those units: (B-1)/B in expectation,
    # not twice that (the whole page's variance would be half the targets')
    assert unexplained_fraction(average_page, target, features, idx) == pytest.approx((B - 1) / B, rel=0.15)
    assert unexplained_fraction(target, target, features, idx) == 0
    # A collapsed target (same for every page) makes the ratio blow up instead of falling.
    collapsed = features[:1].expand(B, N, E) + 1e-3 * torch.randn(B, N, E)
    assert unexplained_fraction(average_page, select_units(collapsed, idx), collapsed, idx) > 100


def _target_std_after(steps: int, reg: dict) -> tuple[float, float]:
    """(first, last) target_std of a short I-JEPA run of a small Hiera on 32 synthetic pages."""
    from dociq.data.collate import DocumentCollator
    from dociq.data.synthetic.generator import SyntheticDocuments

    pages = SyntheticDocuments(32, image_size=256, seed=0)
    collate = DocumentCollator(256, image_masking=MultiBlockMasking(8, num_targets=4, target_scale=(0.15, 0.2),
                                                                     min_keep=4), seed=0)
    batches = [collate([pages[i] for i in range(j, j + 8)]) for j in range(0, 32, 8)]
    torch.manual_seed(0)
    task = IJEPATask(small_model(256), reg=reg)
    optimizer = torch.optim.AdamW([p for _, p in task.trainable_named_parameters()], lr=1e-3, weight_decay=0.01)
    stds = []
    for step in range(steps):
        out = task.compute_losses(batches[step % len(batches)])
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        ema_update(task.target_encoder, task.image_encoder, momentum_schedule(step, steps))
        stds.append(float(out["target_std"]))
    return sum(stds[:3]) / 3, sum(stds[-5:]) / 5


def test_anti_collapse_term_keeps_the_target_from_collapsing():
    # Without the term the EMA target drifts to position-only features (target_std falls: it went
    # 0.18 -> 0.004 in the default 300-step run); with it the target keeps page content.
    first, last_plain = _target_std_after(60, {})
    _, last_reg = _target_std_after(60, dict(variance=1.0, covariance=0.04, gamma=0.25))
    assert last_plain < 0.7 * first, (first, last_plain)
    assert last_reg > first and last_reg > 2 * last_plain, (first, last_reg, last_plain)


def test_page_normed_targets_hold_only_what_varies_across_pages():
    """target_norm="page": the targets are the batch's page content at each unit (zero mean across
    pages, unit variance), target_std is still the layer-normed tokens'; an unknown norm names the choices."""
    torch.manual_seed(0)
    batch = _masked_batch()
    layer, page = IJEPATask(small_model(128)), IJEPATask(small_model(128), target_norm="page")
    page.load_state_dict(layer.state_dict())
    with torch.no_grad():
        features = page.target_encoder(batch["image"])
        normed = torch.nn.functional.layer_norm(features, features.shape[-1:])
        content = normed - normed.mean(0, keepdim=True)
        content = content / content.var(0).mean().sqrt()
        out_layer, out_page = layer.compute_losses(batch), page.compute_losses(batch)
    torch.testing.assert_close(out_page["target_std"], out_layer["target_std"])
    B, M, Nt = batch["tgt_idx"].shape
    pred = page.predict_targets(batch["image"], batch["ctx_idx"], batch["tgt_idx"])
    target = select_units(content, batch["tgt_idx"].reshape(B, M * Nt)).reshape(B * M, Nt, -1)
    torch.testing.assert_close(out_page["jepa"], torch.nn.functional.smooth_l1_loss(pred, target))
    with pytest.raises(ValueError, match="layer, page"):
        IJEPATask(small_model(128), target_norm="batch")
