"""I-JEPA's predictor: a narrow transformer that, from the context tokens and their positions,
predicts the encoder's features at target positions.

Input = projected context tokens, followed by one shared learned mask token per target unit; the
blocks see nothing else, so a prediction can only use the context. Positions are computed for the
given unit grid, so any image size works, in one of two ways (`positions`):
- "sincos": I-JEPA's, absolute 2-D sin-cos vectors added to every token;
- "rope": 2-D rotary embeddings in every attention (timm's axial RoPE, as EVA-02 and DINOv3 use),
  so that an attention weight depends on the offset between two units: a unit's neighbours, which
  carry most of what predicts it, are the same keys wherever the unit is.
Reused by D-JEPA pretraining, where the context tokens are fused image-text tokens.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from timm.layers import RotaryEmbeddingCat, trunc_normal_
from timm.models.eva import EvaBlock
from timm.models.vision_transformer import Block
from torch import nn

from dociq.models.pos_embed import sincos_2d


class JEPAPredictor(nn.Module):
    def __init__(self, in_dim: int, dim: int = 64, depth: int = 2, num_heads: int = 4,
                 mlp_ratio: float = 4.0, drop_path_rate: float = 0.0, init_std: float = 0.02,
                 positions: str = "sincos") -> None:
        super().__init__()
        if positions not in ("sincos", "rope"):
            raise ValueError(f"model.predictor.positions={positions!r}: use 'sincos' or 'rope'")
        per_axis = dim if positions == "sincos" else dim // num_heads
        if dim % num_heads or per_axis % 4:
            raise ValueError(f"model.predictor.dim={dim} must be divisible by num_heads={num_heads}, and its "
                             f"{'width' if positions == 'sincos' else 'head width'} {per_axis} by 4 (2-D {positions})")
        self.in_dim, self.dim, self.positions = in_dim, dim, positions
        self.embed = nn.Linear(in_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        if positions == "rope":
            # offsets of 1-8 units must be told apart, so the bands start at 1 rad per unit and end near 0.03
            self.rope = RotaryEmbeddingCat(dim // num_heads, in_pixels=False, temperature=100.0)
            self.blocks = nn.ModuleList(EvaBlock(dim, num_heads, qkv_fused=True, mlp_ratio=mlp_ratio, attn_type="rope",
                                                 num_prefix_tokens=0, drop_path=r) for r in rates)
        else:
            self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, qkv_bias=True, drop_path=r) for r in rates)
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, in_dim)
        self._init_weights(init_std)

    def _init_weights(self, std: float) -> None:
        trunc_normal_(self.mask_token, std=std)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=std)
                nn.init.zeros_(m.bias)
        # I-JEPA / timm: scale residual branches down with depth.
        for i, block in enumerate(self.blocks, start=1):
            block.attn.proj.weight.data.div_(math.sqrt(2.0 * i))
            block.mlp.fc2.weight.data.div_(math.sqrt(2.0 * i))

    def forward(self, ctx_tokens: torch.Tensor, ctx_idx: torch.Tensor, tgt_idx: torch.Tensor,
                grid: Sequence[int]) -> torch.Tensor:
        """ctx_tokens [B,Nc,in_dim] at units ctx_idx [B,Nc]; tgt_idx [B,Nt] -> predictions [B,Nt,in_dim].
        Several target blocks per sample: flatten them into the batch (repeat the context)."""
        B, Nc, _ = ctx_tokens.shape
        if ctx_idx.shape != (B, Nc) or tgt_idx.dim() != 2 or tgt_idx.shape[0] != B:
            raise ValueError(f"JEPAPredictor: ctx_tokens {tuple(ctx_tokens.shape)}, ctx_idx {tuple(ctx_idx.shape)}, "
                             f"tgt_idx {tuple(tgt_idx.shape)} do not fit [B,Nc,D], [B,Nc], [B,Nt]")
        x = torch.cat([self.embed(ctx_tokens), self.mask_token.expand(B, tgt_idx.shape[1], -1)], dim=1)
        units = torch.cat([ctx_idx, tgt_idx], dim=1)
        if self.positions == "sincos":
            x = x + sincos_2d(int(grid[0]), int(grid[1]), self.dim).to(x)[units]
            for block in self.blocks:
                x = block(x)
        else:
            rope = self.rope.get_embed((int(grid[0]), int(grid[1])))[units][:, None]    # [B, 1, N, 2 * head_dim]
            for block in self.blocks:
                x = block(x, rope=rope)
        return self.proj(self.norm(x[:, Nc:]))
