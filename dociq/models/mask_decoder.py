"""SAM-style mask decoder with SAM 2's high-resolution skips.

Design (SAM, Kirillov et al. 2023; SAM 2, Ravi et al. 2024):
- output tokens = 1 IoU token + 4 mask tokens (token 0: single-mask output, tokens 1..3: the
  three multimask outputs), concatenated in front of the sparse prompt tokens;
- a two-way transformer (depth 2, cross-attention downsampled 2x) updates tokens and image;
- the image tokens are upscaled x4 by two transposed convs; with `use_high_res_features` the
  stride-8 and stride-4 backbone features are added after each one (SAM 2), which matters
  for documents whose regions are thin text lines;
- each mask token goes through its own hypernetwork MLP into a [C/8] vector whose dot product
  with the upscaled map is that mask's logits; the IoU token's MLP predicts each mask's IoU.

Batching several prompts per image: prompts are flattened image-major, i.e. prompt n belongs
to image n // Q (the B*Q flattening of `prompt_ids` [B, Q, L]). `image_embeddings` may hold
one entry per image (B) or one per prompt (B*Q); per-image inputs (the embedding and the
high-res features) are projected once and then repeated per prompt with `repeat_interleave`,
as SAM does, because the two-way transformer updates the image tokens per prompt.
"""
from __future__ import annotations

import os
import re
from typing import Mapping

import torch
from torch import Tensor, nn

from dociq.io.checkpoint import load_state_dict_like, strip_prefix
from dociq.models.common import MLP, LayerNorm2d
from dociq.models.two_way_transformer import TwoWayTransformer



class MaskDecoder(nn.Module):
    """Predicts masks and their IoU from image embeddings and prompt embeddings."""

    def __init__(
        self,
        transformer_dim: int = 256,
        num_heads: int = 8,
        mlp_dim: int = 2048,
        depth: int = 2,
        attention_downsample_rate: int = 2,
        num_multimask_outputs: int = 3,
        iou_head_depth: int = 3,
        iou_head_hidden_dim: int = 256,
        iou_prediction_use_sigmoid: bool = False,
        use_high_res_features: bool = False,
        high_res_channels: tuple[int, int] | None = None,
        activation: type[nn.Module] = nn.GELU,
    ) -> None:
        """
        transformer_dim: channels of the image embedding and of every prompt token.
        num_heads, mlp_dim, depth, attention_downsample_rate: the two-way transformer.
        num_multimask_outputs: masks returned with multimask_output=True (SAM: 3).
        iou_head_depth, iou_head_hidden_dim: the IoU-prediction MLP.
        iou_prediction_use_sigmoid: squash IoU predictions into (0, 1) (SAM 2) or not (SAM).
        use_high_res_features: add stride-4/stride-8 features during upscaling (SAM 2).
        high_res_channels: channels of the raw (stride-4, stride-8) features the caller passes,
            e.g. Hiera's first two stage widths; 1x1 convs inside the decoder project them.
            None means both already have `transformer_dim` channels (SAM 2's convention).
        """
        super().__init__()
        if transformer_dim % 8 != 0:
            raise ValueError(f"MaskDecoder transformer_dim must be divisible by 8, got {transformer_dim}")
        self.transformer_dim = transformer_dim
        self.num_multimask_outputs = num_multimask_outputs
        self.num_mask_tokens = num_multimask_outputs + 1
        self.transformer = TwoWayTransformer(
            depth=depth,
            embedding_dim=transformer_dim,
            num_heads=num_heads,
            mlp_dim=mlp_dim,
            attention_downsample_rate=attention_downsample_rate,
        )
        self.iou_token = nn.Embedding(1, transformer_dim)
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, transformer_dim)

        # x4 upscaling: stride 16 -> 8 -> 4 (for a stride-16 image embedding).
        self.upscale_conv1 = nn.ConvTranspose2d(transformer_dim, transformer_dim // 4, kernel_size=2, stride=2)
        self.upscale_norm = LayerNorm2d(transformer_dim // 4)
        self.upscale_conv2 = nn.ConvTranspose2d(transformer_dim // 4, transformer_dim // 8, kernel_size=2, stride=2)
        self.upscale_act = activation()

        self.use_high_res_features = use_high_res_features
        if use_high_res_features:
            ch_s4, ch_s8 = high_res_channels if high_res_channels is not None else (transformer_dim,) * 2
            self.high_res_channels = (int(ch_s4), int(ch_s8))
            self.high_res_proj_s4 = nn.Conv2d(ch_s4, transformer_dim // 8, kernel_size=1)
            self.high_res_proj_s8 = nn.Conv2d(ch_s8, transformer_dim // 4, kernel_size=1)
        elif high_res_channels is not None:
            raise ValueError(
                "MaskDecoder got high_res_channels but use_high_res_features=False; "
                "set use_high_res_features=True or drop high_res_channels"
            )

        self.mask_hypernetworks = nn.ModuleList(
            MLP(transformer_dim, transformer_dim, transformer_dim // 8, 3) for _ in range(self.num_mask_tokens)
        )
        self.iou_head = MLP(
            transformer_dim, iou_head_hidden_dim, self.num_mask_tokens, iou_head_depth,
            sigmoid_output=iou_prediction_use_sigmoid,
        )

    def forward(
        self,
        image_embeddings: Tensor,
        image_pe: Tensor,
        sparse_prompt_embeddings: Tensor,
        dense_prompt_embeddings: Tensor,
        multimask_output: bool,
        high_res_features: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """
        image_embeddings: [B or N, C, h, w]; N = number of prompts, image-major (see module doc).
        image_pe: [1 or B or N, C, h, w], e.g. `PromptEncoder.get_dense_pe()`.
        sparse_prompt_embeddings: [N, S, C] (S may be 0).
        dense_prompt_embeddings: [N or 1, C, h, w].
        multimask_output: return the 3 multimask outputs (True) or the single-mask output.
        high_res_features: [stride-4 [B or N, c4, 4h, 4w], stride-8 [B or N, c8, 2h, 2w]] raw
            backbone features, required iff the decoder was built with use_high_res_features.

        Returns masks [N, K, 4h, 4w] (logits) and iou_pred [N, K], K = 3 or 1.
        """
        masks, iou_pred = self.predict_masks(
            image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings, high_res_features
        )
        keep = slice(1, None) if multimask_output else slice(0, 1)
        return masks[:, keep], iou_pred[:, keep]

    def predict_masks(
        self,
        image_embeddings: Tensor,
        image_pe: Tensor,
        sparse_prompt_embeddings: Tensor,
        dense_prompt_embeddings: Tensor,
        high_res_features: list[Tensor] | None = None,
        high_res_prompt: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """All num_mask_tokens masks [N, 1+M, 4h, 4w] and IoU predictions [N, 1+M] (token 0 first).

        high_res_prompt: optional per-prompt map [N, C/8, 4h, 4w] added to the upscaled image
        features before the hypernetwork product (dociq's word-grounding map; not in SAM)."""
        n = sparse_prompt_embeddings.shape[0]
        src = self._per_prompt(image_embeddings, n, "image_embeddings")
        if src.shape[1] != self.transformer_dim:
            raise ValueError(
                f"MaskDecoder: image_embeddings have {src.shape[1]} channels but transformer_dim is "
                f"{self.transformer_dim}; project the image tokens to the decoder width first"
            )
        b, c, h, w = src.shape
        src = src + dense_prompt_embeddings
        pos_src = self._per_prompt(image_pe, n, "image_pe")

        output_tokens = torch.cat([self.iou_token.weight, self.mask_tokens.weight], dim=0)
        tokens = torch.cat([output_tokens.unsqueeze(0).expand(n, -1, -1), sparse_prompt_embeddings], dim=1)

        hs, src = self.transformer(src, pos_src, tokens)
        iou_token_out = hs[:, 0]
        mask_tokens_out = hs[:, 1 : 1 + self.num_mask_tokens]

        upscaled = self._upscale(src.transpose(1, 2).reshape(b, c, h, w), high_res_features, n)
        if high_res_prompt is not None:
            if high_res_prompt.shape != upscaled.shape:
                raise ValueError(f"MaskDecoder: high_res_prompt must be {list(upscaled.shape)}, "
                                 f"got {list(high_res_prompt.shape)}")
            upscaled = upscaled + high_res_prompt
        hyper_in = torch.stack(
            [mlp(mask_tokens_out[:, i]) for i, mlp in enumerate(self.mask_hypernetworks)], dim=1
        )
        b, c, h4, w4 = upscaled.shape
        masks = (hyper_in @ upscaled.flatten(2)).view(b, -1, h4, w4)
        return masks, self.iou_head(iou_token_out)

    def _upscale(self, src: Tensor, high_res_features: list[Tensor] | None, n: int) -> Tensor:
        if not self.use_high_res_features:
            if high_res_features is not None:
                raise ValueError(
                    "MaskDecoder got high_res_features but was built with use_high_res_features=False; "
                    "rebuild it with use_high_res_features=True and high_res_channels=(c_stride4, c_stride8)"
                )
            x = self.upscale_act(self.upscale_norm(self.upscale_conv1(src)))
            return self.upscale_act(self.upscale_conv2(x))
        if high_res_features is None or len(high_res_features) != 2:
            raise ValueError(
                "MaskDecoder(use_high_res_features=True) needs high_res_features=[stride-4 map, stride-8 map]"
            )
        feat_s4, feat_s8 = high_res_features
        h, w = src.shape[-2:]
        for name, feat, scale, ch in (("stride-4", feat_s4, 4, self.high_res_channels[0]),
                                      ("stride-8", feat_s8, 2, self.high_res_channels[1])):
            if feat.dim() != 4 or feat.shape[1] != ch or tuple(feat.shape[-2:]) != (scale * h, scale * w):
                raise ValueError(
                    f"MaskDecoder high_res_features {name}: expected [*, {ch}, {scale * h}, {scale * w}] "
                    f"for a {h}x{w} image embedding, got {list(feat.shape)}"
                )
        # Project per image before repeating per prompt: the 1x1 convs do not depend on the prompt.
        feat_s4 = self._per_prompt(self.high_res_proj_s4(feat_s4), n, "high_res_features[0]")
        feat_s8 = self._per_prompt(self.high_res_proj_s8(feat_s8), n, "high_res_features[1]")
        x = self.upscale_act(self.upscale_norm(self.upscale_conv1(src) + feat_s8))
        return self.upscale_act(self.upscale_conv2(x) + feat_s4)

    @staticmethod
    def _per_prompt(x: Tensor, n: int, name: str) -> Tensor:
        """Per-image [B, ...] -> per-prompt [N, ...], image-major; [N, ...] passes through."""
        b = x.shape[0]
        if b == n:
            return x
        if b == 1:
            return x.expand(n, *x.shape[1:])  # a view: no copy for the single-image case
        if b == 0 or n % b != 0:
            raise ValueError(
                f"MaskDecoder: {name} has batch {b} but there are {n} prompts; the prompt count "
                f"must be a multiple of the image count (prompts flattened image-major, B*Q)"
            )
        return torch.repeat_interleave(x, n // b, dim=0)


# --- loading segment-anything / SAM 2 decoder weights ------------------------------------------

# (pattern, replacement) applied in order to each SAM key (after the module prefix is stripped).
_SAM_DECODER_RENAMES: tuple[tuple[str, str], ...] = (
    (r"^transformer\.layers\.", "transformer.blocks."),
    (r"\.self_attn\.", ".token_self_attn."),
    (r"\.cross_attn_token_to_image\.", ".token_to_image_attn."),
    (r"\.cross_attn_image_to_token\.", ".image_to_token_attn."),
    (r"\.norm1\.", ".norm_self_attn."),
    (r"\.norm2\.", ".norm_token_to_image."),
    (r"\.norm3\.", ".norm_mlp."),
    (r"\.norm4\.", ".norm_image_to_token."),
    (r"\.mlp\.lin1\.", ".mlp.fc1."),
    (r"\.mlp\.lin2\.", ".mlp.fc2."),
    (r"^transformer\.final_attn_token_to_image\.", "transformer.final_token_to_image_attn."),
    (r"^transformer\.norm_final_attn\.", "transformer.norm_final."),
    (r"^output_upscaling\.0\.", "upscale_conv1."),
    (r"^output_upscaling\.1\.", "upscale_norm."),
    (r"^output_upscaling\.3\.", "upscale_conv2."),
    (r"^output_hypernetworks_mlps\.", "mask_hypernetworks."),
    (r"^iou_prediction_head\.", "iou_head."),
    (r"^conv_s0\.", "high_res_proj_s4."),  # SAM 2
    (r"^conv_s1\.", "high_res_proj_s8."),  # SAM 2
)
# Prefixes of the decoder inside full SAM / SAM 2 checkpoints.
_SAM_DECODER_PREFIXES = ("mask_decoder.", "sam_mask_decoder.")


def sam_decoder_state_dict_to_dociq(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename the keys of a segment-anything (or SAM 2) MaskDecoder state dict to this module's names.

    Accepts the decoder's own state dict or a full SAM/SAM 2 checkpoint (keys under `mask_decoder.`
    / `sam_mask_decoder.`, SAM 2's `{"model": ...}` wrapper).
    """
    state = strip_prefix(load_state_dict_like(state_dict, "sam_decoder_state_dict_to_dociq"), _SAM_DECODER_PREFIXES)
    out = {}
    for key, value in state.items():
        for pattern, repl in _SAM_DECODER_RENAMES:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


def load_sam_decoder_state_dict(
    decoder: MaskDecoder, state_dict_or_path: Mapping[str, Tensor] | str | os.PathLike, strict: bool = True
) -> nn.modules.module._IncompatibleKeys:
    """Load segment-anything / SAM 2 decoder weights (a state dict or a checkpoint path) into `decoder`.

    With strict=True any key the decoder lacks (e.g. SAM 2's object-score head) or any decoder
    weight the checkpoint lacks raises an error that lists them.
    """
    mapped = sam_decoder_state_dict_to_dociq(load_state_dict_like(state_dict_or_path, "load_sam_decoder_state_dict"))
    own = decoder.state_dict()
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs decoder {tuple(own[k].shape)}"
                  for k, v in mapped.items() if k in own and own[k].shape != v.shape]
    if bad_shapes:
        raise ValueError(
            "load_sam_decoder_state_dict: shape mismatch (build the decoder with the checkpoint's size, "
            "e.g. the mask_decoder of configs/model/base.yaml): " + "; ".join(bad_shapes)
        )
    result = decoder.load_state_dict(mapped, strict=False)
    if strict and (result.missing_keys or result.unexpected_keys):
        raise KeyError(
            f"load_sam_decoder_state_dict: missing {result.missing_keys}, unexpected {result.unexpected_keys}; "
            "check the checkpoint is a SAM mask decoder and the decoder options match it (strict=False to skip)"
        )
    return result
