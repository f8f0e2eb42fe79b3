"""FusionTrunk: text tokens and image tokens attend to themselves and to each other.

Each block is pre-norm and two-stream (one set of weights per modality, as in SAM's two-way
transformer): image self-attention, text self-attention, image->text cross-attention (image
queries read the words), text->image cross-attention (words read the page), then an MLP per
stream. Image tokens carry the 2-D sin-cos position of their mask unit; text tokens carry the
same sin-cos table sampled at their box centre, so a word and the unit it lies in start close
in position space and cross-attention does not have to learn the layout from scratch.

Sparse input (only the context units of a masked page, with their indices) is supported: with
`fill_masked=True` every missing unit gets a shared learned mask token at its position, so the
output is the whole unit grid and masked units can be filled from the text (what the MIM head
and the D-JEPA predictor read); with `fill_masked=False` only the given units come back.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dociq.data.schema import LAYOUT_SCALE
from dociq.models.common import exporting
from dociq.models.pos_embed import sincos_2d


class FusionAttention(nn.Module):
    """Multi-head attention, queries from one sequence, keys/values from another (or the same)."""

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"fusion dim {dim} is not divisible by num_heads {num_heads}; "
                             "set model.fusion.dim / model.fusion.num_heads so it divides")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, context: torch.Tensor,
                key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B,Nq,D] attends to context [B,Nk,D]; key_mask bool [B,Nk] (or [B,Nq,Nk] per query),
        True = attend."""
        B, Nq, D = x.shape
        h = self.num_heads
        q = self.q(x).view(B, Nq, h, D // h).transpose(1, 2)
        k, v = self.kv(context).view(B, -1, 2, h, D // h).permute(2, 0, 3, 1, 4)
        attn_mask = None if key_mask is None else (key_mask[:, None] if key_mask.dim() == 3
                                                   else key_mask[:, None, None, :])
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(B, Nq, D))


def windowed_self_attention(attn: FusionAttention, x: torch.Tensor, key_mask: torch.Tensor | None,
                            window: int | None, shift: bool = False) -> torch.Tensor:
    """`attn(x, x, key_mask)` restricted to consecutive windows of `window` tokens.

    x [B,T,D], key_mask bool [B,T] (True = attend). With `shift` the windows start half a window
    later, so alternating blocks let information cross every window boundary. Sequences no
    longer than one window take the global path unchanged."""
    b, t, d = x.shape
    if window is None:
        return attn(x, x, key_mask)
    if exporting():     # the token count is symbolic: no branch on it, no padding by it
        return attn(x, x, same_window_mask(key_mask, t, window, shift, x.device))
    if t <= window:
        return attn(x, x, key_mask)
    offset = window // 2 if shift else 0
    mask = torch.ones(b, t, dtype=torch.bool, device=x.device) if key_mask is None else key_mask.bool()
    n_win = -(-(t + offset) // window)
    pad_after = n_win * window - t - offset
    xw = F.pad(x, (0, 0, offset, pad_after)).view(b * n_win, window, d)
    mw = F.pad(mask, (offset, pad_after), value=False).view(b * n_win, window)
    # A window of padding alone would give all -inf rows (NaN): let it attend to its first slot;
    # its outputs are padding and are cut off below.
    mw[:, 0] |= ~mw.any(dim=1)
    out = attn(xw, xw, mw).view(b, n_win * window, d)
    return out[:, offset:offset + t]


def same_window_mask(key_mask: torch.Tensor | None, t, window: int, shift: bool,
                     device: torch.device) -> torch.Tensor:
    """bool [B or 1, T, T]: query i may attend key j when both lie in one window of
    `windowed_self_attention` (all tokens in one when T <= window) and j is a real token. Global
    attention under this mask computes what the windows compute, as one traceable graph."""
    pos = torch.arange(t, device=device)
    offset = window // 2 if shift else 0
    windowed = (pos >= window).any()   # T > window, as a tensor: a Python comparison would be traced as a constant
    win = torch.where(windowed, torch.div(pos + offset, window, rounding_mode="floor"), torch.zeros_like(pos))
    same = win[:, None] == win[None, :]
    return same[None] if key_mask is None else same[None] & key_mask.bool()[:, None, :]


class FusionMLP(nn.Sequential):
    def __init__(self, dim: int, ratio: float, dropout: float = 0.0) -> None:
        hidden = int(dim * ratio)
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(hidden, dim), nn.Dropout(dropout))


class FusionBlock(nn.Module):
    """Pre-norm: self-attention per stream, cross-attention both ways, MLP per stream."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float = 0.0,
                 text_window: int | None = None, shift: bool = False) -> None:
        super().__init__()
        self.text_window, self.shift = text_window, shift
        self.norm_img_self, self.norm_txt_self = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.img_self = FusionAttention(dim, num_heads, dropout)
        self.txt_self = FusionAttention(dim, num_heads, dropout)
        self.norm_img_q, self.norm_img_kv = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.norm_txt_q, self.norm_txt_kv = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.img_to_txt = FusionAttention(dim, num_heads, dropout)   # image queries, text keys
        self.txt_to_img = FusionAttention(dim, num_heads, dropout)   # text queries, image keys
        self.norm_img_mlp, self.norm_txt_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.img_mlp = FusionMLP(dim, mlp_ratio, dropout)
        self.txt_mlp = FusionMLP(dim, mlp_ratio, dropout)

    def forward(self, img: torch.Tensor, txt: torch.Tensor, txt_mask: torch.Tensor,
                img_pos: torch.Tensor, txt_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Positions are re-added to queries/keys in every block (SAM/DETR style) so they survive depth.
        x = self.norm_img_self(img)
        img = img + self.img_self(x + img_pos, x + img_pos)
        t = self.norm_txt_self(txt)
        txt = txt + windowed_self_attention(self.txt_self, t + txt_pos, txt_mask, self.text_window, self.shift)
        # Both cross-attentions read the streams as they are after self-attention.
        qi, kt = self.norm_img_q(img) + img_pos, self.norm_txt_kv(txt) + txt_pos
        qt, ki = self.norm_txt_q(txt) + txt_pos, self.norm_img_kv(img) + img_pos
        img, txt = img + self.img_to_txt(qi, kt, txt_mask), txt + self.txt_to_img(qt, ki)
        img = img + self.img_mlp(self.norm_img_mlp(img))
        txt = txt + self.txt_mlp(self.norm_txt_mlp(txt))
        return img, txt


class FusionTrunk(nn.Module):
    def __init__(self, image_dim: int, text_dim: int, dim: int = 128, depth: int = 2,
                 num_heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0,
                 text_window: int | None = 512) -> None:
        """image_dim, text_dim: widths of the encoders' tokens; dim: width of the fused tokens;
        depth: number of two-stream blocks. Text self-attention runs in windows of `text_window`
        tokens of reading order, shifted by half a window in every other block (Swin), so a
        3,000-token page costs linear, not quadratic, time; None = global attention.
        Cross-attention to the image is always global."""
        super().__init__()
        self.dim = dim
        self.image_in = nn.Sequential(nn.LayerNorm(image_dim), nn.Linear(image_dim, dim))
        self.text_in = nn.Sequential(nn.LayerNorm(text_dim), nn.Linear(text_dim, dim))
        self.mask_token = nn.Parameter(torch.zeros(dim))
        nn.init.normal_(self.mask_token, std=0.02)
        self.blocks = nn.ModuleList(
            FusionBlock(dim, num_heads, mlp_ratio, dropout, text_window, shift=i % 2 == 1)
            for i in range(depth))
        self.norm_img, self.norm_txt = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self._pos_cache: dict[tuple[int, int], torch.Tensor] = {}

    def grid_pos(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """Sin-cos table of the unit grid, [h*w, D] in raster order (cached per grid)."""
        key = (int(grid[0]), int(grid[1]))
        if key not in self._pos_cache:
            table = torch.as_tensor(sincos_2d(key[0], key[1], self.dim), dtype=torch.float32)
            self._pos_cache[key] = table.reshape(key[0] * key[1], self.dim)
        return self._pos_cache[key].to(device)

    def text_pos(self, boxes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The grid's sin-cos table sampled (bilinearly) at each token's box centre: [B,T,D]."""
        h, w = grid
        table = self.grid_pos(grid, boxes.device).T.reshape(1, self.dim, h, w)
        centre = (boxes[..., :2] + boxes[..., 2:]).float() / (2 * LAYOUT_SCALE)  # x, y in 0..1
        coords = centre * 2 - 1                                                  # grid_sample's -1..1
        B, T = boxes.shape[:2]
        sampled = F.grid_sample(table.expand(B, -1, -1, -1), coords.view(B, T, 1, 2),
                                mode="bilinear", padding_mode="border", align_corners=False)
        return sampled.view(B, self.dim, T).transpose(1, 2)

    def forward(self, image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                text_boxes: torch.Tensor, grid: tuple[int, int],
                image_idx: torch.Tensor | None = None, text_mask: torch.Tensor | None = None,
                fill_masked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Fuse a page's image and text tokens.

        image_tokens: [B,N,image_dim] for all units of `grid` in raster order, or [B,Nk,image_dim]
                      for the units `image_idx` [B,Nk] only (sparse, e.g. the JEPA context).
        text_tokens:  [B,T,text_dim]; text_boxes long [B,T,4] in 0..1000; text_mask bool [B,T]
                      True where a real token (padding is never attended to).
        Returns (image [B,N,D] — or [B,Nk,D] if sparse and not fill_masked —, text [B,T,D]).
        """
        B, n_in, _ = image_tokens.shape
        N = int(grid[0]) * int(grid[1])
        pos = self.grid_pos(grid, image_tokens.device)
        img = self.image_in(image_tokens)
        if image_idx is None:
            if n_in != N:
                raise ValueError(f"got {n_in} image tokens for a {grid[0]}x{grid[1]} unit grid; "
                                 "pass image_idx for sparse tokens")
            img_pos = pos.expand(B, N, self.dim)
        elif fill_masked:
            full = self.mask_token.to(img.dtype).expand(B, N, self.dim).clone()
            img = full.scatter(1, image_idx[..., None].expand(-1, -1, self.dim), img)
            img_pos = pos.expand(B, N, self.dim)
        else:
            img_pos = pos[image_idx]
        txt = self.text_in(text_tokens)
        txt_pos = self.text_pos(text_boxes, grid).to(txt.dtype)
        if text_mask is not None:
            text_mask = text_mask.bool()
            # A page without any real token would give all -inf attention rows (NaN); let such
            # rows attend to their first slot instead (its content is the [CLS]/pad embedding).
            empty = ~text_mask.any(dim=1, keepdim=True)
            first = torch.arange(text_mask.shape[1], device=text_mask.device) == 0
            text_mask = text_mask | (empty & first)   # branch-free, so it traces
        # Positions go into the tokens once (so identical mask tokens differ from the start) and
        # into every block's queries/keys.
        img, txt = img + img_pos, txt + txt_pos
        for block in self.blocks:
            img, txt = block(img, txt, text_mask, img_pos, txt_pos)
        return self.norm_img(img), self.norm_txt(txt)
