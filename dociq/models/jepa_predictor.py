"""I-JEPA's predictor: a narrow transformer that, from the context tokens and their positions,
predicts the encoder's features at target positions.

Input = projected context tokens + sin-cos positions, followed by one shared learned mask token
(+ position) per target unit; the blocks see nothing else, so a prediction can only use the
context. Positions are computed for the given unit grid, so any image size works.
Reused by D-JEPA pretraining, where the context tokens are fused image-text tokens.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from timm.layers import trunc_normal_
from timm.models.vision_transformer import Block
from torch import nn

from dociq.models.pos_embed import sincos_2d


class JEPAPredictor(nn.Module):
    def __init__(self, in_dim: int, dim: int = 64, depth: int = 2, num_heads: int = 4,
                 mlp_ratio: float = 4.0, drop_path_rate: float = 0.0, init_std: float = 0.02) -> None:
        super().__init__()
        if dim % 4 or dim % num_heads:
            raise ValueError(f"model.predictor.dim={dim} must be divisible by 4 (2-D sin-cos) and by "
                             f"num_heads={num_heads}")
        self.in_dim, self.dim = in_dim, dim
        self.embed = nn.Linear(in_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
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
        pos = sincos_2d(int(grid[0]), int(grid[1]), self.dim).to(ctx_tokens)
        x = self.embed(ctx_tokens) + pos[ctx_idx]
        queries = self.mask_token.expand(B, tgt_idx.shape[1], -1) + pos[tgt_idx]
        x = torch.cat([x, queries], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.proj(self.norm(x[:, Nc:]))
