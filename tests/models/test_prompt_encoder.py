"""PromptEncoder: parity with segment-anything's points/boxes/mask paths, question tower, loading, errors."""
import open_clip
import pytest
import torch
from open_clip.model import CLIP
from segment_anything.modeling import PromptEncoder as SamPromptEncoder

from dociq.models.common import build_part
from dociq.models.prompt_encoder import (
    QUESTION_TOWER_CONFIGS,
    PromptEncoder,
    QuestionEncoder,
    load_sam_prompt_encoder_state_dict,
)
from dociq.models.sizes import ModelConfigError, size_config

# model=tiny's prompt encoder with the grids SegmentationModel derives for its 256-px page
TINY = dict(size_config("tiny")["prompt_encoder"], image_embedding_size=(16, 16), input_image_size=(256, 256))


@pytest.fixture(scope="module")
def sam_and_ours():
    torch.manual_seed(0)
    sam = SamPromptEncoder(
        embed_dim=TINY["embed_dim"], image_embedding_size=TINY["image_embedding_size"],
        input_image_size=TINY["input_image_size"], mask_in_chans=TINY["mask_in_chans"],
    ).eval()
    with torch.no_grad():  # randomise everything so a wrong key mapping shows
        for p in sam.parameters():
            p.normal_(0.0, 0.5)
    ours = PromptEncoder(**TINY).eval()
    load_sam_prompt_encoder_state_dict(ours, {f"prompt_encoder.{k}": v for k, v in sam.state_dict().items()})
    return sam, ours


def _prompts(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    coords = torch.rand(n, 4, 2, generator=g) * 255
    labels = torch.tensor([[1, 0, -1, 1], [0, 0, 1, -1], [1, -1, -1, -1]])[:n]
    boxes = torch.tensor([[10.0, 20, 100, 120], [0, 0, 255, 255], [50, 60, 70, 80]])[:n]
    masks = torch.randn(n, 1, 64, 64, generator=g)
    return coords, labels, boxes, masks


@pytest.mark.parametrize("kinds", ["points", "boxes", "points+boxes", "mask", "points+boxes+mask"])
def test_parity_with_segment_anything(sam_and_ours, kinds):
    sam, ours = sam_and_ours
    coords, labels, boxes, masks = _prompts()
    kw = dict(
        points=(coords, labels) if "points" in kinds else None,
        boxes=boxes if "boxes" in kinds else None,
        masks=masks if "mask" in kinds else None,
    )
    with torch.no_grad():
        sam_sparse, sam_dense = sam(**kw)
        sparse, dense = ours(**kw)
    assert sparse.shape == sam_sparse.shape and dense.shape == sam_dense.shape == (3, 64, 16, 16)
    if sparse.numel():
        torch.testing.assert_close(sparse, sam_sparse, atol=1e-5, rtol=0)
    torch.testing.assert_close(dense, sam_dense, atol=1e-5, rtol=0)


def test_dense_pe_matches_segment_anything(sam_and_ours):
    sam, ours = sam_and_ours
    torch.testing.assert_close(ours.get_dense_pe(), sam.get_dense_pe(), atol=1e-5, rtol=0)
    assert ours.get_dense_pe().shape == (1, 64, 16, 16)


def test_not_a_point_padding_ignores_coordinates(sam_and_ours):
    _, enc = sam_and_ours
    coords = torch.tensor([[[10.0, 10.0], [200.0, 30.0]], [[99.0, 5.0], [0.0, 0.0]]])
    labels = torch.tensor([[1, -1], [1, -1]])
    sparse, _ = enc(points=(coords, labels), boxes=torch.zeros(2, 4))
    torch.testing.assert_close(sparse[0, 1], enc.not_a_point_embed.weight[0])
    torch.testing.assert_close(sparse[1, 1], enc.not_a_point_embed.weight[0])
    assert (sparse[0, 0] - sparse[1, 0]).abs().max() > 1e-3  # real points do depend on where they are


def test_box_corners_as_points_equal_the_box_path(sam_and_ours):
    """SAM 2's labels 2/3 let a box ride in the point list (prompts with and without boxes in one batch)."""
    _, enc = sam_and_ours
    boxes = torch.tensor([[12.0, 30.0, 140.0, 90.0]])
    via_box, _ = enc(boxes=boxes)
    via_points, _ = enc(points=(boxes.view(1, 2, 2), torch.tensor([[2, 3]])))  # + SAM's pad point
    torch.testing.assert_close(via_points[:, :2], via_box, atol=1e-6, rtol=0)


def test_question_tokens_and_any_combination(sam_and_ours):
    _, enc = sam_and_ours
    qe = enc.question_encoder
    ids = qe.tokenize(["where is the invoice total?", "the signature", "x"])
    assert ids.shape == (3, 32) and ids[0, 0] == 49406  # CLIP BPE offline, SOT first
    ids[2] = 0  # a padding question, as the collator writes it (prompt_valid False)
    tokens = qe(ids)
    assert tokens.shape == (3, 1 + 32, 64) == (3, qe.num_tokens, 64)
    no_q = qe.no_question_embed.weight[0]
    # An empty question (all padding) is the no-question embedding everywhere.
    torch.testing.assert_close(tokens[2], no_q.expand(33, -1))
    # Pad positions of a real question are the no-question embedding; real words are not.
    n_real = int((ids[1] != 0).sum())
    torch.testing.assert_close(tokens[1, 1 + n_real :], no_q.expand(32 - n_real, -1))
    assert (tokens[1, 1 : 1 + n_real] - no_q).abs().amax(-1).min() > 1e-3
    assert (tokens[0, 0] - tokens[1, 0]).abs().max() > 1e-3  # different questions, different pooled token

    coords, labels, boxes, masks = _prompts()
    sparse, dense = enc(points=(coords, labels), boxes=boxes, masks=masks, question_ids=ids)
    assert sparse.shape == (3, 4 + 2 + 33, 64) and dense.shape == (3, 64, 16, 16)
    torch.testing.assert_close(sparse[:, 6:], tokens)  # order: points, box corners, question
    only_q, dense_q = enc(question_ids=ids)
    assert only_q.shape == (3, 33, 64)
    torch.testing.assert_close(dense_q, enc.no_mask_embed.weight.view(1, 64, 1, 1).expand(3, 64, 16, 16))


def test_question_gradients_and_pooled_only_mode():
    enc = QuestionEncoder("tiny", output_dim=32, word_tokens=False)
    assert enc.num_tokens == 1
    ids = enc.tokenize(["total amount", "date"])[:, :10]  # shorter than the context: padded inside
    out = enc(ids)
    assert out.shape == (2, 1, 32)
    out.sum().backward()
    assert enc.pooled_proj.weight.grad.abs().sum() > 0
    assert enc.text.token_embedding.weight.grad.abs().sum() > 0


def _tiny_clip(context_length):
    cfg = QUESTION_TOWER_CONFIGS["tiny"]
    text_cfg = dict(cfg["text_cfg"], context_length=context_length)
    vision_cfg = dict(image_size=32, patch_size=16, width=64, layers=1, head_width=32)
    return CLIP(embed_dim=cfg["embed_dim"], vision_cfg=vision_cfg, text_cfg=text_cfg).eval()


def test_loads_open_clip_checkpoint_saved_by_training(tmp_path):
    """A DDP-style open_clip training checkpoint ({'state_dict': {'module.*'}}) loads into the tower."""
    torch.manual_seed(1)
    clip = _tiny_clip(32)
    path = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in clip.state_dict().items()}}, path)
    enc = QuestionEncoder("tiny", output_dim=64, checkpoint_path=path).eval()
    ids = open_clip.tokenize(["where is the date?", "total"], context_length=32)
    with torch.no_grad():
        pooled, _ = enc.encode_text(ids)
        torch.testing.assert_close(pooled, clip.encode_text(ids), atol=1e-5, rtol=0)
    assert (pooled - QuestionEncoder("tiny", output_dim=64).encode_text(ids)[0]).abs().max() > 1e-3


def test_longer_context_checkpoint_is_truncated_exactly(tmp_path):
    """CLIP's causal mask makes the first 32 positions of a 77-token tower an exact 32-token tower."""
    torch.manual_seed(2)
    clip77 = _tiny_clip(77)
    path = tmp_path / "clip77.pt"
    torch.save(clip77.state_dict(), path)
    enc = PromptEncoder(**TINY, question_checkpoint=str(path)).question_encoder.eval()
    texts = ["which cell holds the amount due?"]
    with torch.no_grad():
        ours, _ = enc.encode_text(open_clip.tokenize(texts, context_length=32))
        ref = clip77.encode_text(open_clip.tokenize(texts, context_length=77))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_checkpoint_errors_name_file_and_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        QuestionEncoder("tiny", checkpoint_path=tmp_path / "nope.pt")
    wide = CLIP(embed_dim=128, vision_cfg=dict(image_size=32, patch_size=16, width=64, layers=1, head_width=32),
                text_cfg=dict(context_length=32, width=64, heads=2, layers=2))
    path = tmp_path / "wide.pt"
    torch.save(wide.state_dict(), path)
    with pytest.raises(ValueError, match="wide.pt.*model name/config the checkpoint was trained with"):
        QuestionEncoder("tiny", checkpoint_path=path)
    with pytest.raises(KeyError, match="unknown model 'not-a-clip'"):
        QuestionEncoder("not-a-clip")


def test_bad_prompt_inputs_raise_clear_errors(sam_and_ours):
    _, enc = sam_and_ours
    coords, labels, boxes, masks = _prompts()
    with pytest.raises(ValueError, match="disagree on the number of prompts"):
        enc(points=(coords, labels), boxes=boxes[:2])
    with pytest.raises(ValueError, match="point labels must be"):
        enc(points=(coords, labels + 5))
    with pytest.raises(ValueError, match=r"masks must be \[N, 1, 64, 64\]"):
        enc(masks=torch.zeros(3, 1, 32, 32))
    with pytest.raises(ValueError, match="flatten boxes"):
        enc(boxes=boxes.view(3, 1, 4))
    with pytest.raises(ValueError, match="context_length 32"):
        enc(question_ids=torch.ones(3, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="built without a question tower"):
        PromptEncoder(**{**TINY, "question_model": None})(question_ids=torch.ones(1, 8, dtype=torch.long))


def test_sizes_and_model_config_keys():
    base = build_part(PromptEncoder, "prompt_encoder", size_config("base"), image_embedding_size=(64, 64),
                      input_image_size=(1024, 1024))
    assert base.embed_dim == 256 and base.mask_input_size == (256, 256)
    assert size_config("base")["prompt_encoder"]["question_model"] == "ViT-B-16"
    with pytest.raises(ModelConfigError, match="unknown model size 'large'.*choose one of"):
        size_config("large")
    with pytest.raises(ModelConfigError, match=r"unknown model.prompt_encoder key\(s\) \['question_tower'\]"):
        build_part(PromptEncoder, "prompt_encoder", {"prompt_encoder": {"question_tower": "tiny"}})
    with pytest.raises(ModelConfigError, match="prompt_encoder.input_image_size is set, but it follows"):
        build_part(PromptEncoder, "prompt_encoder", {"prompt_encoder": {"input_image_size": [64, 64]}},
                   image_embedding_size=(4, 4), input_image_size=(64, 64))
