"""SAM's two-way transformer: prompt tokens and image tokens update each other.

Each block runs (1) self-attention over the tokens (output tokens + prompt tokens), (2) tokens
attend to the image, (3) an MLP on the tokens, (4) the image attends to the tokens. A final
token-to-image attention and LayerNorm close the stack. Positional encodings are re-added to
queries and keys at every attention (the first block's self-attention skips them, as in SAM).
Cross-attentions project to `dim // attention_downsample_rate` channels, which keeps
attention over 4096 image tokens cheap.
"""
from __future__ import annotations

import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn


class Attention(nn.Module):
    """Multi-head attention with an internal width of `embedding_dim // downsample_rate`."""

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        internal_dim = embedding_dim // downsample_rate
        if internal_dim % num_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must divide embedding_dim // attention_downsample_rate "
                f"= {embedding_dim} // {downsample_rate} = {internal_dim}; pick a divisor"
            )
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embedding_dim, internal_dim)
        self.k_proj = nn.Linear(embedding_dim, internal_dim)
        self.v_proj = nn.Linear(embedding_dim, internal_dim)
        self.out_proj = nn.Linear(internal_dim, embedding_dim)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q = self._split_heads(self.q_proj(q))
        k = self._split_heads(self.k_proj(k))
        v = self._split_heads(self.v_proj(v))
        out = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim), as SAM
        b, h, n, c = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, h * c))


class TwoWayAttentionBlock(nn.Module):
    """One block of the two-way transformer (token self-attn, token→image, MLP, image→token)."""

    def __init__(
        self,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        activation: type[nn.Module] = nn.ReLU,
        attention_downsample_rate: int = 2,
        skip_first_layer_pe: bool = False,
    ) -> None:
        super().__init__()
        self.token_self_attn = Attention(embedding_dim, num_heads)
        self.norm_self_attn = nn.LayerNorm(embedding_dim)
        self.token_to_image_attn = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm_token_to_image = nn.LayerNorm(embedding_dim)
        self.mlp = Mlp(embedding_dim, mlp_dim, act_layer=activation)
        self.norm_mlp = nn.LayerNorm(embedding_dim)
        self.image_to_token_attn = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm_image_to_token = nn.LayerNorm(embedding_dim)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(self, queries: Tensor, keys: Tensor, query_pe: Tensor, key_pe: Tensor) -> tuple[Tensor, Tensor]:
        if self.skip_first_layer_pe:
            # SAM replaces (not adds to) the queries here: the first block starts from the raw tokens.
            queries = self.token_self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.token_self_attn(q, q, queries)
        queries = self.norm_self_attn(queries)

        q, k = queries + query_pe, keys + key_pe
        queries = self.norm_token_to_image(queries + self.token_to_image_attn(q, k, keys))

        queries = self.norm_mlp(queries + self.mlp(queries))

        q, k = queries + query_pe, keys + key_pe
        keys = self.norm_image_to_token(keys + self.image_to_token_attn(k, q, queries))
        return queries, keys


class TwoWayTransformer(nn.Module):
    """Stack of `depth` two-way blocks plus a final token→image attention (SAM: depth 2)."""

    def __init__(
        self,
        depth: int,
        embedding_dim: int,
        num_heads: int,
        mlp_dim: int,
        activation: type[nn.Module] = nn.ReLU,
        attention_downsample_rate: int = 2,
    ) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.blocks = nn.ModuleList(
            TwoWayAttentionBlock(
                embedding_dim, num_heads, mlp_dim, activation, attention_downsample_rate,
                skip_first_layer_pe=(i == 0),
            )
            for i in range(depth)
        )
        self.final_token_to_image_attn = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm_final = nn.LayerNorm(embedding_dim)

    def forward(self, image_embedding: Tensor, image_pe: Tensor, point_embedding: Tensor) -> tuple[Tensor, Tensor]:
        """image_embedding, image_pe: [B, C, h, w]; point_embedding: [B, N, C].

        Returns (tokens [B, N, C], image tokens [B, h*w, C]).
        """
        keys = image_embedding.flatten(2).transpose(1, 2)
        key_pe = image_pe.flatten(2).transpose(1, 2)
        queries = point_embedding
        for block in self.blocks:
            queries, keys = block(queries, keys, query_pe=point_embedding, key_pe=key_pe)
        q, k = queries + point_embedding, keys + key_pe
        queries = self.norm_final(queries + self.final_token_to_image_attn(q, k, keys))
        return queries, keys
