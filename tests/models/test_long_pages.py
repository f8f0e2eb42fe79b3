"""Long pages: windowed attention in the text encoder, the fusion trunk and the word grounding."""
import torch

from dociq.models.fusion import FusionAttention, FusionTrunk, windowed_self_attention
from dociq.models.sizes import size_config
from dociq.models.text_encoder import TextEncoder


def _boxes(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 900, (b, t, 2), generator=g)
    return torch.cat([xy, xy + torch.randint(5, 90, (b, t, 2), generator=g)], dim=-1)


def test_windowed_attention_is_attention_within_each_window():
    torch.manual_seed(0)
    attn = FusionAttention(16, 2).eval()
    x = torch.randn(2, 10, 16)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    out = windowed_self_attention(attn, x, mask, window=4)
    for b in range(2):
        for start in (0, 4, 8):
            part = slice(start, min(start + 4, 10))
            expect = attn(x[b:b + 1, part], x[b:b + 1, part], mask[b:b + 1, part])
            keep = mask[b, part]
            torch.testing.assert_close(out[b:b + 1, part][:, keep], expect[:, keep])
    # Shifted: the first window is half a window long, and a page no longer than a window is global.
    shifted = windowed_self_attention(attn, x, mask, window=4, shift=True)
    torch.testing.assert_close(shifted[:, :2], attn(x[:, :2], x[:, :2], mask[:, :2]))
    torch.testing.assert_close(windowed_self_attention(attn, x, mask, window=16), attn(x, x, mask))
    assert torch.isfinite(windowed_self_attention(attn, x, torch.zeros_like(mask), window=4)).all()


def test_text_encoder_reads_past_its_position_table_in_windows():
    torch.manual_seed(0)
    # relative_height off: a window alone would see another median token height than the whole page
    tiny = size_config("tiny")["text_encoder"]
    enc = TextEncoder.build(**{**tiny, "num_hidden_layers": 1, "max_position_embeddings": 16,
                               "relative_height": False}).eval()
    t = 40
    ids = torch.randint(1000, 5000, (2, t))
    boxes = _boxes(2, t)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, 20:] = False                       # page 1: windows 2 (16..31, part) and 3 (padding) only
    out = enc(ids, boxes, mask)
    assert out.shape == (2, t, 128) and torch.isfinite(out).all()
    # Each window is BERT on those tokens alone, with positions from 0.
    alone = enc(ids[:, 16:32], boxes[:, 16:32], mask[:, 16:32])
    real = mask[:, 16:32]
    torch.testing.assert_close(out[:, 16:32][real], alone[real])
    changed = ids.clone()
    changed[0, 3] = 42                          # a token of the first window
    again = enc(changed, boxes, mask)
    assert (again[0, :16] - out[0, :16]).abs().max() > 1e-4
    torch.testing.assert_close(again[0, 16:], out[0, 16:])


def test_fusion_trunk_connects_windows_through_its_shifted_blocks():
    torch.manual_seed(0)
    trunk = FusionTrunk(image_dim=32, text_dim=24, dim=32, depth=2, num_heads=2, text_window=8).eval()
    img, txt = torch.randn(1, 16, 32), torch.randn(1, 30, 24)
    boxes, mask = _boxes(1, 30), torch.ones(1, 30, dtype=torch.bool)
    _, base = trunk(img, txt, boxes, (4, 4), text_mask=mask)
    changed = txt.clone()
    changed[0, 0] += torch.randn(24)
    _, moved = trunk(img, changed, boxes, (4, 4), text_mask=mask)
    # Token 0 reaches token 10 (a later window) through the shifted second block and the image.
    assert (moved[0, 10] - base[0, 10]).abs().max() > 1e-5
    assert moved.shape == (1, 30, 32) and torch.isfinite(moved).all()
