"""MaskDecoder: parity with segment-anything, prompt batching, SAM 2 high-res skips, loading, errors."""
import pytest
import torch
from segment_anything.modeling import MaskDecoder as SamMaskDecoder
from segment_anything.modeling import TwoWayTransformer as SamTwoWayTransformer

from dociq.models.common import build_part
from dociq.models.mask_decoder import MaskDecoder, load_sam_decoder_state_dict
from dociq.models.sizes import ModelConfigError, size_config

TINY = size_config("tiny")["mask_decoder"]
BASE = size_config("base")["mask_decoder"]


def _sam_decoder(dim, heads, mlp_dim, iou_hidden, seed=0):
    torch.manual_seed(seed)
    sam = SamMaskDecoder(
        transformer_dim=dim,
        transformer=SamTwoWayTransformer(depth=2, embedding_dim=dim, num_heads=heads, mlp_dim=mlp_dim),
        iou_head_hidden_dim=iou_hidden,
    ).eval()
    # Randomise every weight (LayerNorms included) so a wrong key mapping cannot hide behind equal inits.
    with torch.no_grad():
        for p in sam.parameters():
            p.normal_(0.0, 0.2)
    return sam


def _inputs(dim, n_prompts, h=8, w=8, n_images=1, n_sparse=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dict(
        image_embeddings=torch.randn(n_images, dim, h, w, generator=g),
        image_pe=torch.randn(1, dim, h, w, generator=g),
        sparse_prompt_embeddings=torch.randn(n_prompts, n_sparse, dim, generator=g),
        dense_prompt_embeddings=torch.randn(n_prompts, dim, h, w, generator=g),
    )


@pytest.mark.parametrize("multimask_output", [True, False])
def test_parity_with_segment_anything_tiny(multimask_output):
    cfg = TINY
    sam = _sam_decoder(cfg["transformer_dim"], cfg["num_heads"], cfg["mlp_dim"], cfg["iou_head_hidden_dim"])
    ours = MaskDecoder(**TINY).eval()
    load_sam_decoder_state_dict(ours, sam.state_dict())
    x = _inputs(cfg["transformer_dim"], n_prompts=3)
    with torch.no_grad():
        sam_masks, sam_iou = sam(**x, multimask_output=multimask_output)
        masks, iou = ours(**x, multimask_output=multimask_output)
    k = 3 if multimask_output else 1
    assert masks.shape == (3, k, 32, 32) and iou.shape == (3, k)
    assert sam_masks.abs().max() > 0.1  # the comparison is not between near-zero tensors
    torch.testing.assert_close(masks, sam_masks, atol=1e-5, rtol=0)
    torch.testing.assert_close(iou, sam_iou, atol=1e-5, rtol=0)


@pytest.mark.parametrize("multimask_output", [True, False])
def test_base_size_is_sams_decoder(multimask_output):
    """`base` takes a real SAM decoder state dict strictly and reproduces it (256-d, 8 heads, MLP 2048)."""
    sam = _sam_decoder(256, 8, 2048, 256, seed=3)
    ours = MaskDecoder(**BASE).eval()
    load_sam_decoder_state_dict(ours, {f"mask_decoder.{k}": v for k, v in sam.state_dict().items()})
    x = _inputs(256, n_prompts=2, h=4, w=4)
    with torch.no_grad():
        ref = sam(**x, multimask_output=multimask_output)
        out = ours(**x, multimask_output=multimask_output)
    torch.testing.assert_close(out[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], ref[1], atol=1e-5, rtol=0)


def test_prompts_of_several_images_are_matched_image_major():
    """Per-image embeddings [B] with B*Q prompts equal running each image's prompts separately."""
    torch.manual_seed(0)
    dec = MaskDecoder(**TINY).eval()
    x = _inputs(64, n_prompts=4, n_images=2)
    with torch.no_grad():
        masks, iou = dec(**x, multimask_output=True)
        for img in range(2):
            rows = slice(2 * img, 2 * img + 2)
            m, i = dec(
                x["image_embeddings"][img : img + 1], x["image_pe"],
                x["sparse_prompt_embeddings"][rows], x["dense_prompt_embeddings"][rows], multimask_output=True,
            )
            torch.testing.assert_close(masks[rows], m, atol=1e-5, rtol=0)
            torch.testing.assert_close(iou[rows], i, atol=1e-5, rtol=0)
        # Already-repeated per-prompt embeddings give the same result.
        rep = dict(x, image_embeddings=x["image_embeddings"].repeat_interleave(2, dim=0))
        torch.testing.assert_close(dec(**rep, multimask_output=True)[0], masks)


def test_prompt_count_not_multiple_of_images_is_rejected():
    dec = MaskDecoder(**TINY)
    x = _inputs(64, n_prompts=3, n_images=2)
    with pytest.raises(ValueError, match="multiple of the image count"):
        dec(**x, multimask_output=True)


def test_high_res_skips_take_raw_backbone_features():
    torch.manual_seed(0)
    dec = MaskDecoder(**TINY, use_high_res_features=True, high_res_channels=(24, 48))
    x = _inputs(64, n_prompts=4, n_images=2)
    feats = [torch.randn(2, 24, 32, 32), torch.randn(2, 48, 16, 16)]
    masks, iou = dec(**x, multimask_output=True, high_res_features=feats)
    assert masks.shape == (4, 3, 32, 32) and iou.shape == (4, 3)
    # The skips change the masks and train their 1x1 projections.
    masks_zero, _ = dec(**x, multimask_output=True, high_res_features=[torch.zeros_like(f) for f in feats])
    assert (masks - masks_zero).abs().max() > 1e-3
    masks.square().mean().backward()
    assert dec.high_res_proj_s4.weight.grad.abs().sum() > 0
    assert dec.high_res_proj_s8.weight.grad.abs().sum() > 0


def test_high_res_errors_name_the_fix():
    dec = MaskDecoder(**TINY, use_high_res_features=True, high_res_channels=(24, 48))
    x = _inputs(64, n_prompts=2)
    with pytest.raises(ValueError, match=r"stride-8: expected \[\*, 48, 16, 16\]"):
        dec(**x, multimask_output=True, high_res_features=[torch.randn(1, 24, 32, 32), torch.randn(1, 32, 16, 16)])
    with pytest.raises(ValueError, match="needs high_res_features"):
        dec(**x, multimask_output=True)
    plain = MaskDecoder(**TINY)
    with pytest.raises(ValueError, match="use_high_res_features=True"):
        plain(**x, multimask_output=True, high_res_features=[torch.randn(1, 64, 32, 32), torch.randn(1, 64, 16, 16)])
    with pytest.raises(ValueError, match="project the image tokens"):
        plain(**dict(x, image_embeddings=torch.randn(1, 32, 8, 8)), multimask_output=True)


def test_sizes_and_model_config_keys():
    assert 64 <= MaskDecoder(**TINY).transformer_dim <= 128
    assert MaskDecoder(**BASE).transformer_dim == 256
    model = {"mask_decoder": dict(TINY, num_multimask_outputs=2)}
    assert build_part(MaskDecoder, "mask_decoder", model).mask_tokens.weight.shape[0] == 3
    with pytest.raises(ModelConfigError, match=r"unknown model.mask_decoder key\(s\) \['transformer_width'\].*"
                                               r"Fix: use .*transformer_dim"):
        build_part(MaskDecoder, "mask_decoder", {"mask_decoder": dict(TINY, transformer_width=32)})
    with pytest.raises(ModelConfigError, match="model.mask_decoder.use_high_res_features is set, but it follows"):
        build_part(MaskDecoder, "mask_decoder", {"mask_decoder": dict(TINY, use_high_res_features=False)},
                   use_high_res_features=True)


def test_loading_sam_checkpoint_file_and_strictness(tmp_path):
    cfg = TINY
    sam = _sam_decoder(cfg["transformer_dim"], cfg["num_heads"], cfg["mlp_dim"], cfg["iou_head_hidden_dim"])
    full = {f"mask_decoder.{k}": v for k, v in sam.state_dict().items()}
    full["image_encoder.patch_embed.proj.weight"] = torch.zeros(1)
    path = tmp_path / "sam_tiny.pth"
    torch.save(full, path)
    dec = MaskDecoder(**TINY)
    load_sam_decoder_state_dict(dec, path)
    torch.testing.assert_close(dec.iou_head.layers[0].weight, sam.iou_prediction_head.layers[0].weight)

    with pytest.raises(FileNotFoundError, match="missing.pth"):
        load_sam_decoder_state_dict(dec, tmp_path / "missing.pth")
    extra = dict(sam.state_dict(), **{"obj_score_token.weight": torch.zeros(1, 64)})
    with pytest.raises(KeyError, match="obj_score_token"):
        load_sam_decoder_state_dict(dec, extra)
    with pytest.raises(ValueError, match="shape mismatch"):
        load_sam_decoder_state_dict(MaskDecoder(**BASE), sam.state_dict())
