"""DocumentModel: image encoder + text encoder + fusion trunk — the document foundation model.

`encode(batch)` is what every stage past the encoders uses: pretraining calls it with the
context units of a masked page (`keep_idx`) and corrupted OCR ids; fine-tuning calls it on the
whole page and also takes the multi-scale maps for the mask decoder's high-resolution skips.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from dociq.models.common import build_part
from dociq.models.fusion import FusionTrunk
from dociq.models.image_encoder import ImageEncoder
from dociq.models.sizes import ModelConfigError, check_model_config
from dociq.models.text_encoder import TextEncoder


class DocumentModel(nn.Module):
    def __init__(self, image_encoder: ImageEncoder, text_encoder: TextEncoder,
                 fusion: FusionTrunk) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.fusion = fusion

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> "DocumentModel":
        """Build from a complete `model` config (configs/model/<size>.yaml as composed; a checkpoint's
        hyper_parameters.model); anything less is a ModelConfigError naming the missing keys."""
        image_encoder = image_encoder_from_config(model)
        text_encoder = text_encoder_from_config(model)
        fusion = build_part(FusionTrunk, "fusion", model, image_dim=image_encoder.embed_dim,
                            text_dim=text_encoder.hidden_size)
        return cls(image_encoder, text_encoder, fusion)

    @property
    def dim(self) -> int:
        return self.fusion.dim

    @property
    def unit_grid(self) -> tuple[int, int]:
        return tuple(self.image_encoder.unit_grid)  # type: ignore[return-value]

    def encode(self, batch: Mapping[str, Any], keep_idx: torch.Tensor | None = None,
               text_ids: torch.Tensor | None = None, multiscale: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """Fused tokens of a batch.

        keep_idx:   long [B,Nk] mask units the image encoder sees (None: all). Units not kept enter
                    the fusion as the mask token at their position, so the image output is always
                    the whole grid [B,N,D] in raster order.
        text_ids:   OCR ids to encode instead of batch["ocr_ids"] (e.g. MLM-corrupted ids).
        multiscale: also return the image encoder's 4 NCHW maps (strides 4..32); dense only.
        Returns (image tokens [B,N,D], text tokens [B,T,D], multiscale maps or None).
        """
        image = batch["image"]
        maps = None
        if multiscale:
            if keep_idx is not None:
                raise ValueError("multi-scale maps need the whole page: call encode with keep_idx=None")
            maps = self.image_encoder.forward_multiscale(image)
            # The last map is the unit grid; the dense forward applies Hiera's final norm on top.
            last = maps[-1].flatten(2).transpose(1, 2)
            image_tokens = self.image_encoder.hiera.head.norm(last)
        else:
            image_tokens = self.image_encoder(image, keep_idx)
        fused_image, fused_text = self.fuse(batch, image_tokens, keep_idx, text_ids)
        return fused_image, fused_text, maps

    def fuse(self, batch: Mapping[str, Any], image_tokens: torch.Tensor, keep_idx: torch.Tensor | None = None,
             text_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode the OCR words and fuse them with image tokens already computed by the image
        encoder (pretraining keeps those for its collapse regulariser). Same arguments as `encode`."""
        ids = batch["ocr_ids"] if text_ids is None else text_ids
        text_tokens = self.text_encoder(ids, batch["ocr_boxes"], batch["ocr_mask"])
        return self.fusion(image_tokens, text_tokens, batch["ocr_boxes"], self.unit_grid,
                           image_idx=keep_idx, text_mask=batch["ocr_mask"], fill_masked=True)


def image_encoder_from_config(model: Mapping[str, Any]) -> ImageEncoder:
    """The image encoder of a complete model config: Hiera at `image_size`, whose mask unit must be
    `mask_unit_px` (the configs' unit grid is image_size / mask_unit_px)."""
    check_model_config(model)
    encoder = build_part(ImageEncoder, "image_encoder", model, img_size=int(model["image_size"]))
    if int(model["mask_unit_px"]) != encoder.unit_px:
        raise ModelConfigError(f"model.mask_unit_px={model['mask_unit_px']} but the Hiera mask unit is "
                               f"{encoder.unit_px} px (patch stride x mask_unit_size)", "make them agree")
    return encoder


def text_encoder_from_config(model: Mapping[str, Any]) -> TextEncoder:
    """The layout text encoder of a complete model config."""
    check_model_config(model)
    return build_part(TextEncoder.build, "text_encoder", model)
