"""ImageEncoder: dense / sparse / multi-scale forward of timm's Hiera, checkpoint loading."""
import logging

import pytest
import torch
import torch.nn.functional as F
from timm.models.hiera import Hiera

from dociq.models.document_model import image_encoder_from_config
from dociq.models.image_encoder import ImageEncoder, load_image_encoder_from_checkpoint
from dociq.models.pos_embed import sincos_2d
from dociq.models.sizes import ModelConfigError, complete_model_config, size_config

SMALL = dict(embed_dim=16, num_heads=1, stages=(1, 1, 1, 1))  # keeps the tests fast


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return ImageEncoder(img_size=128, **SMALL).eval()


def test_sizes_and_model_config_keys():
    tiny = image_encoder_from_config(size_config("tiny"))
    assert tiny.image_size == (256, 256) and tiny.unit_grid == (8, 8) and tiny.num_units == 64
    assert tiny.stage_dims == [32, 64, 128, 256] and tiny.embed_dim == 256
    with pytest.raises(ValueError, match="model.image_encoder"):
        image_encoder_from_config(complete_model_config({"size": "tiny", "image_encoder": {"depth": 3}}))
    with pytest.raises(ModelConfigError, match="model.image_encoder.img_size is set, but it follows"):
        image_encoder_from_config(complete_model_config({"size": "tiny", "image_encoder": {"img_size": 128}}))
    with pytest.raises(ModelConfigError, match="model.mask_unit_px=16 but the Hiera mask unit is 32 px"):
        image_encoder_from_config(complete_model_config({"size": "tiny", "mask_unit_px": 16}))


def test_dense_sparse_multiscale_shapes(encoder):
    x = torch.randn(2, 3, 128, 128)
    assert encoder.unit_grid == (4, 4) and encoder.stage_dims == [16, 32, 64, 128]
    with torch.no_grad():
        dense = encoder(x)
        sparse = encoder(x, torch.tensor([[0, 5, 9], [15, 2, 3]]))
        maps = encoder.forward_multiscale(x)
    assert dense.shape == (2, 16, 128) and sparse.shape == (2, 3, 128)
    assert [tuple(m.shape) for m in maps] == [(2, 16, 32, 32), (2, 32, 16, 16), (2, 64, 8, 8), (2, 128, 4, 4)]
    # dense tokens are the stride-32 map in raster order (plus the final norm)
    raster = encoder.hiera.head.norm(maps[-1].flatten(2).transpose(1, 2))
    torch.testing.assert_close(dense, raster)
    with pytest.raises(ValueError, match="model.image_size"):
        encoder(torch.randn(1, 3, 96, 96))
    with pytest.raises(ValueError, match="repeats"):
        encoder(x, torch.tensor([[1, 1], [2, 3]]))


def test_sparse_forward_sees_only_kept_units(encoder):
    """Kept-unit tokens depend only on the kept units' pixels; they follow keep_idx's order;
    keeping every unit equals the dense forward."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 128, 128)
    keep = torch.tensor([[0, 1, 5, 10, 15], [3, 6, 9, 12, 2]])
    with torch.no_grad():
        base = encoder(x, keep)
        changed = x.clone()
        # masked units next to kept ones (the 7x7 patch conv would reach across the border)
        changed[0, :, 64:96, 32:64] = 5.0          # unit 9 of page 0, between kept 5 and 10
        changed[1, :, 0:32, 32:64] = -5.0          # unit 1 of page 1, next to kept 2
        torch.testing.assert_close(encoder(changed, keep), base)
        changed[0, :, 32:64, 32:64] = 5.0          # unit 5 of page 0: kept
        assert not torch.allclose(encoder(changed, keep)[0], base[0])
        perm = torch.tensor([4, 2, 0, 1, 3])
        torch.testing.assert_close(encoder(x, keep[:, perm]), base[:, perm])
        torch.testing.assert_close(encoder(x, torch.arange(16).expand(2, 16)), encoder(x))


def _timm_hiera(img_size, seed):
    torch.manual_seed(seed)
    model = Hiera(img_size=(img_size, img_size), num_classes=10, **SMALL)
    # a smooth position table, so that resampling it is checkable
    grid = img_size // 4
    model.pos_embed.data = sincos_2d(grid, grid, 16)[None] * 0.1
    return model


def test_timm_checkpoint_at_another_resolution_is_interpolated(tmp_path, caplog):
    source = _timm_hiera(128, seed=0)
    path = tmp_path / "hiera_128.pth"
    torch.save(source.state_dict(), path)                      # a plain timm state dict, with classifier
    encoder = ImageEncoder(img_size=256, **SMALL)
    encoder.load_checkpoint(path)
    pos = encoder.hiera.pos_embed                              # [1, 64*64, 16] from [1, 32*32, 16]
    assert pos.shape == (1, 64 * 64, 16)
    # upsampled table averaged back to the source grid ~ the source table
    back = F.avg_pool2d(pos.reshape(1, 64, 64, 16).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1).reshape(1, -1, 16)
    assert (back - source.pos_embed).abs().max() < 0.01
    assert not torch.allclose(pos[:, : 32 * 32], source.pos_embed)   # not merely copied
    for name, value in source.state_dict().items():
        if name != "pos_embed" and not name.startswith("head.fc"):
            torch.testing.assert_close(encoder.state_dict()["hiera." + name], value)
    with torch.no_grad():
        assert encoder(torch.randn(1, 3, 256, 256)).shape == (1, 64, 128)


def test_original_hiera_key_names_and_nested_state(tmp_path):
    source = _timm_hiera(128, seed=1)
    state = {("norm." + k[len("head.norm."):] if k.startswith("head.norm.") else k): v
             for k, v in source.state_dict().items()}           # facebookresearch/hiera names
    path = tmp_path / "orig.pth"
    torch.save({"model_state": state}, path)
    encoder = ImageEncoder(img_size=128, **SMALL)
    encoder.load_checkpoint(path)
    torch.testing.assert_close(encoder.hiera.head.norm.weight, source.head.norm.weight)


def test_missing_keys_raise_and_unexpected_keys_are_logged(tmp_path, caplog):
    state = _timm_hiera(128, seed=0).state_dict()
    del state["blocks.1.mlp.fc1.weight"]
    state["extra.weight"] = torch.zeros(3)
    path = tmp_path / "broken.pth"
    torch.save(state, path)
    encoder = ImageEncoder(img_size=128, **SMALL)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    with pytest.raises(KeyError, match=r"broken\.pth.*blocks\.1\.mlp\.fc1\.weight"):
        encoder.load_checkpoint(path)
    assert all(torch.equal(v, before[k]) for k, v in encoder.state_dict().items())  # nothing half-loaded
    state["blocks.1.mlp.fc1.weight"] = torch.zeros(32 * 4, 32)
    torch.save(state, path)
    with caplog.at_level(logging.WARNING):
        encoder.load_checkpoint(path)
    assert "extra.weight" in caplog.text
    with pytest.raises(ValueError, match="shapes differ"):
        ImageEncoder(img_size=128, embed_dim=24, num_heads=1, stages=(1, 1, 1, 1)).load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="init.image_encoder"):
        encoder.load_checkpoint(tmp_path / "nope.ckpt")


def test_encoder_from_lightning_checkpoints_of_any_stage(tmp_path):
    encoder = ImageEncoder(img_size=128, **SMALL)
    weights = encoder.state_dict()
    for prefix in ("image_encoder.", "model.image_encoder."):
        state = {prefix + k: v for k, v in weights.items()}
        state["target_encoder.hiera.pos_embed"] = torch.zeros(1)   # other parts are ignored
        state["predictor.embed.weight"] = torch.zeros(1)
        path = tmp_path / "stage.ckpt"
        torch.save({"state_dict": state, "global_step": 3}, path)
        loaded = load_image_encoder_from_checkpoint(path)
        assert loaded.keys() == weights.keys()
    torch.save({"state_dict": {"text_encoder.w": torch.zeros(1)}}, path)
    with pytest.raises(KeyError, match="text_encoder"):
        load_image_encoder_from_checkpoint(path)


@pytest.mark.slow
def test_base_is_hiera_b_plus_at_1024():
    encoder = image_encoder_from_config(size_config("base")).eval()
    assert encoder.image_size == (1024, 1024) and encoder.unit_grid == (32, 32)
    assert encoder.stage_dims == [112, 224, 448, 896] and encoder.embed_dim == 896
    assert [len([b for b in encoder.hiera.blocks if b.dim_out == d]) for d in encoder.stage_dims] == [2, 3, 16, 3]
    with torch.no_grad():
        tokens = encoder(torch.randn(1, 3, 1024, 1024), torch.arange(0, 1024, 128)[None])
    assert tokens.shape == (1, 8, 896)


def test_model_checkpoint_starts_a_run_at_another_image_size():
    """init.from of a 128-px run into a 256-px model: the nested encoder's position table is
    resampled, every other tensor copied (load_part is what stage=finetune's init.from calls)."""
    from torch import nn
    from dociq.training.tasks.init_weights import load_part

    torch.manual_seed(0)
    small = nn.ModuleDict({"image_encoder": ImageEncoder(img_size=128, **SMALL),
                           "head": nn.Linear(4, 2)})
    grid = 128 // 4
    small["image_encoder"].hiera.pos_embed.data = sincos_2d(grid, grid, 16)[None] * 0.1
    large = nn.ModuleDict({"image_encoder": ImageEncoder(img_size=256, **SMALL),
                           "head": nn.Linear(4, 2)})
    report = load_part(large, small.state_dict(), "model", "small.ckpt")
    assert report == {"missing": [], "unexpected": []}
    pos = large["image_encoder"].hiera.pos_embed
    back = F.avg_pool2d(pos.reshape(1, 64, 64, 16).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1).reshape(1, -1, 16)
    assert (back - small["image_encoder"].hiera.pos_embed).abs().max() < 0.01
    torch.testing.assert_close(large["head"].weight, small["head"].weight)
    # another width is still an error that names the fix
    wide = nn.ModuleDict({"image_encoder": ImageEncoder(img_size=256, embed_dim=24, num_heads=1, stages=(1, 1, 1, 1))})
    with pytest.raises(ValueError, match="another model size"):
        load_part(wide, small.state_dict(), "model", "small.ckpt")
