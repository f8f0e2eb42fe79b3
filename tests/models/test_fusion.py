"""FusionTrunk: shapes, sparse image tokens, text padding, and that information crosses modalities."""
import pytest
import torch

from dociq.models.fusion import FusionTrunk

GRID = (4, 4)
IMAGE_DIM, TEXT_DIM = 24, 20


@pytest.fixture()
def trunk():
    torch.manual_seed(0)
    return FusionTrunk(image_dim=IMAGE_DIM, text_dim=TEXT_DIM, dim=32, depth=2, num_heads=4).eval()


def _inputs(B=2, T=7):
    g = torch.Generator().manual_seed(1)
    img = torch.randn(B, GRID[0] * GRID[1], IMAGE_DIM, generator=g)
    txt = torch.randn(B, T, TEXT_DIM, generator=g)
    xy = torch.randint(0, 900, (B, T, 2), generator=g)
    boxes = torch.cat([xy, xy + 50], dim=-1)
    mask = torch.ones(B, T, dtype=torch.bool)
    if B > 1:
        mask[1, 4:] = False   # second page has 4 real tokens, 3 padding
    return img, txt, boxes, mask


def test_dense_shapes(trunk):
    img, txt, boxes, mask = _inputs()
    out_img, out_txt = trunk(img, txt, boxes, GRID, text_mask=mask)
    assert out_img.shape == (2, 16, 32) and out_txt.shape == (2, 7, 32)
    assert torch.isfinite(out_img).all() and torch.isfinite(out_txt).all()


def test_sparse_fill_gives_whole_grid_and_no_fill_gives_kept_units(trunk):
    img, txt, boxes, mask = _inputs()
    keep = torch.tensor([[0, 3, 5, 9, 10], [1, 2, 7, 14, 15]])
    sparse = img.gather(1, keep[..., None].expand(-1, -1, IMAGE_DIM))
    full, _ = trunk(sparse, txt, boxes, GRID, image_idx=keep, text_mask=mask, fill_masked=True)
    kept, _ = trunk(sparse, txt, boxes, GRID, image_idx=keep, text_mask=mask, fill_masked=False)
    assert full.shape == (2, 16, 32) and kept.shape == (2, 5, 32)
    # dropped units all start as the same mask token, but their positions make them differ
    dropped = full[0, [1, 2, 4]]
    assert not torch.allclose(dropped[0], dropped[1], atol=1e-4)


def test_sparse_tokens_are_placed_by_their_indices(trunk):
    """Shuffling sparse tokens together with their indices changes nothing: positions come from
    the indices, not from the order of the sequence."""
    img, txt, boxes, mask = _inputs()
    keep = torch.tensor([[0, 3, 5, 9, 10], [1, 2, 7, 14, 15]])
    sparse = img.gather(1, keep[..., None].expand(-1, -1, IMAGE_DIM))
    perm = torch.tensor([3, 0, 4, 1, 2])
    a, ta = trunk(sparse, txt, boxes, GRID, image_idx=keep, text_mask=mask)
    b, tb = trunk(sparse[:, perm], txt, boxes, GRID, image_idx=keep[:, perm], text_mask=mask)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ta, tb, atol=1e-5, rtol=1e-5)
    # ...whereas giving the same tokens other indices does change the result
    c, _ = trunk(sparse, txt, boxes, GRID, image_idx=keep.flip(1), text_mask=mask)
    assert not torch.allclose(a, c, atol=1e-4)


def test_padding_is_never_attended(trunk):
    img, txt, boxes, mask = _inputs()
    out_img, out_txt = trunk(img, txt, boxes, GRID, text_mask=mask)
    noisy = txt.clone()
    noisy[1, 4:] = 100 * torch.randn(3, TEXT_DIM)
    noisy_boxes = boxes.clone()
    noisy_boxes[1, 4:] = 0
    img2, txt2 = trunk(img, noisy, noisy_boxes, GRID, text_mask=mask)
    torch.testing.assert_close(img2, out_img, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(txt2[:, :4], out_txt[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(txt2[0], out_txt[0], atol=1e-5, rtol=1e-5)


def test_information_crosses_both_ways(trunk):
    img, txt, boxes, mask = _inputs()
    out_img, out_txt = trunk(img, txt, boxes, GRID, text_mask=mask)
    img_b, txt_b = img.clone(), txt.clone()
    img_b[0, 5] = torch.randn(IMAGE_DIM)  # change one image unit of page 0
    txt_b[1, 2] = torch.randn(TEXT_DIM)    # change one real word of page 1
    i1, t1 = trunk(img_b, txt, boxes, GRID, text_mask=mask)
    i2, t2 = trunk(img, txt_b, boxes, GRID, text_mask=mask)
    assert (t1[0] - out_txt[0]).abs().max() > 1e-3, "text does not see the image"
    assert (i2[1] - out_img[1]).abs().max() > 1e-3, "image does not see the text"
    # pages of a batch never mix
    torch.testing.assert_close(t1[1], out_txt[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(i2[0], out_img[0], atol=1e-5, rtol=1e-5)


def test_masked_slot_learns_from_the_text_at_its_position(trunk):
    """The D-JEPA premise: a masked unit's fused slot depends on the words lying on it."""
    img, txt, boxes, mask = _inputs(B=1, T=3)
    mask[:] = True
    keep = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])       # top half visible, bottom half masked
    sparse = img.gather(1, keep[..., None].expand(-1, -1, IMAGE_DIM))
    out, _ = trunk(sparse, txt, boxes, GRID, image_idx=keep, text_mask=mask)
    txt2 = txt.clone()
    txt2[0, 1] = torch.randn(TEXT_DIM)
    out2, _ = trunk(sparse, txt2, boxes, GRID, image_idx=keep, text_mask=mask)
    assert (out2[0, 8:] - out[0, 8:]).abs().max() > 1e-3


def test_gradients_reach_mask_token_and_both_inputs():
    trunk = FusionTrunk(image_dim=IMAGE_DIM, text_dim=TEXT_DIM, dim=32, depth=1)
    img, txt, boxes, mask = _inputs()
    img.requires_grad_(True)
    txt.requires_grad_(True)
    keep = torch.tensor([[0, 3, 5], [1, 2, 7]])
    sparse = img.gather(1, keep[..., None].expand(-1, -1, IMAGE_DIM))
    out_img, out_txt = trunk(sparse, txt, boxes, GRID, image_idx=keep, text_mask=mask)
    (out_img.sum() + out_txt.sum()).backward()
    assert trunk.mask_token.grad is not None and trunk.mask_token.grad.abs().sum() > 0
    assert img.grad.abs().sum() > 0 and txt.grad.abs().sum() > 0


def test_bad_config_names_the_key():
    from dociq.models.common import build_part
    from dociq.models.sizes import ModelConfigError

    with pytest.raises(ModelConfigError, match=r"unknown model.fusion key\(s\) \['widht'\].*use .*depth, dim"):
        build_part(FusionTrunk, "fusion", {"fusion": {"widht": 3}}, image_dim=8, text_dim=8)
    with pytest.raises(ModelConfigError, match="model.fusion.text_dim is set, but it follows"):
        build_part(FusionTrunk, "fusion", {"fusion": {"text_dim": 3}}, image_dim=8, text_dim=8)
    with pytest.raises(ValueError, match="num_heads"):
        FusionTrunk(image_dim=8, text_dim=8, dim=30, num_heads=4)


def test_wrong_dense_token_count_is_explained(trunk):
    img, txt, boxes, mask = _inputs()
    with pytest.raises(ValueError, match="image_idx"):
        trunk(img[:, :10], txt, boxes, GRID, text_mask=mask)


def test_document_model_dense_encode_matches_multiscale_path():
    """`encode(multiscale=True)` (finetune) gives the same fused tokens as the plain dense path,
    plus the four stage maps; with keep_idx the image output is still the whole grid."""
    from dociq.models.document_model import DocumentModel
    from dociq.models.sizes import complete_model_config

    torch.manual_seed(0)
    model = DocumentModel.from_config(complete_model_config(dict(size="tiny", image_size=64,
                                                                 fusion={"depth": 1}))).eval()
    B, T = 2, 5
    batch = {"image": torch.randn(B, 3, 64, 64), "ocr_ids": torch.randint(1000, 2000, (B, T)),
             "ocr_boxes": torch.tensor([[0, 0, 500, 500]]).repeat(B, T, 1),
             "ocr_mask": torch.ones(B, T, dtype=torch.bool)}
    with torch.no_grad():
        img, txt, maps = model.encode(batch)
        img_ms, txt_ms, maps_ms = model.encode(batch, multiscale=True)
        sparse_img, _, _ = model.encode(batch, keep_idx=torch.tensor([[0, 3], [1, 2]]))
    assert maps is None and len(maps_ms) == 4
    assert img.shape == (B, 4, model.dim) and txt.shape == (B, T, model.dim)
    torch.testing.assert_close(img_ms, img, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(txt_ms, txt, atol=1e-5, rtol=1e-4)
    assert sparse_img.shape == (B, 4, model.dim)
    with pytest.raises(ValueError, match="keep_idx=None"):
        model.encode(batch, keep_idx=torch.tensor([[0, 3], [1, 2]]), multiscale=True)
