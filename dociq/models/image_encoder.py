"""The image encoder: timm's Hiera (its arguments are the model config's `image_encoder`), a sparse
(mask-unit) forward for I-JEPA contexts, multi-scale maps for the mask decoder, and checkpoint
loading across resolutions.

Geometry: 4-px patches, 8x8-patch mask units (32 px), three 2x2 q-poolings, so each last-stage
token is exactly one mask unit and `unit_grid` = (H/32, W/32). Unit index = row * grid_w + col.
"""
from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.hiera import Hiera, checkpoint_filter_fn
from torch import nn

from dociq.io.checkpoint import model_state_dict, read_checkpoint

log = logging.getLogger(__name__)

_HIERA_ARGS = set(inspect.signature(Hiera.__init__).parameters) - {"self", "num_classes", "device", "dtype"}
_PREFIX = "hiera."
_PART = "image_encoder."


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


class ImageEncoder(nn.Module):
    """Hiera trunk. `forward` -> last-stage tokens (final LayerNorm applied), one per mask unit in
    raster order, or only the units in `keep_idx` (sparse forward: masked units are dropped before
    the first block and their pixels zeroed, so kept tokens never see them).
    `forward_multiscale` -> the four stage outputs as NCHW maps at strides 4/8/16/32 (no norm)."""

    def __init__(self, **hiera_kwargs: Any) -> None:
        super().__init__()
        unknown = sorted(set(hiera_kwargs) - _HIERA_ARGS)
        if unknown:
            raise ValueError(f"unknown key(s) model.image_encoder.{unknown}: ImageEncoder takes timm Hiera "
                             f"arguments, one of {sorted(_HIERA_ARGS)}")
        hiera_kwargs["img_size"] = _pair(hiera_kwargs.get("img_size", 224))
        self.hiera = Hiera(num_classes=0, **hiera_kwargs)
        h = self.hiera
        if len(h.stage_ends) != 4 or h.q_pool != 3 or \
                tuple(h.mask_unit_size) != tuple(s ** h.q_pool for s in h.q_stride):
            raise ValueError("model.image_encoder: need 4 stages, q_pool=3 and mask_unit_size = q_stride**3 "
                             "so that one last-stage token is one mask unit; got stages="
                             f"{len(h.stage_ends)}, q_pool={h.q_pool}, mask_unit_size={h.mask_unit_size}")
        self.image_size: tuple[int, int] = hiera_kwargs["img_size"]
        self.unit_px = int(h.patch_stride[0] * h.mask_unit_size[0])
        if any(s % self.unit_px for s in self.image_size):
            raise ValueError(f"model.image_size={self.image_size} must be a multiple of the {self.unit_px}-px "
                             "mask unit")
        self.unit_grid: tuple[int, int] = tuple(int(s) for s in h.mask_spatial_shape)  # type: ignore[assignment]
        self.num_units = math.prod(self.unit_grid)
        self.stage_dims: list[int] = [int(f["num_chs"]) for f in h.feature_info]
        self.embed_dim = int(h.num_features)

    def _check_image(self, image: torch.Tensor) -> None:
        if image.dim() != 4 or image.shape[1] != 3 or tuple(image.shape[2:]) != self.image_size:
            raise ValueError(f"ImageEncoder expects images [B,3,{self.image_size[0]},{self.image_size[1]}], got "
                             f"{tuple(image.shape)}: resize the pages or set model.image_size")

    def keep_mask(self, keep_idx: torch.Tensor) -> torch.Tensor:
        """Long [B, Nk] unit indices -> bool [B, num_units] (True = keep, Hiera's convention)."""
        if keep_idx.dim() != 2 or keep_idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"keep_idx must be an integer tensor [B, Nk], got {keep_idx.dtype} {tuple(keep_idx.shape)}")
        if keep_idx.numel() and (int(keep_idx.min()) < 0 or int(keep_idx.max()) >= self.num_units):
            raise ValueError(f"keep_idx holds unit indices outside [0, {self.num_units}) for the "
                             f"{self.unit_grid} unit grid")
        mask = torch.zeros(keep_idx.shape[0], self.num_units, dtype=torch.bool, device=keep_idx.device)
        mask.scatter_(1, keep_idx.long(), True)
        if (mask.sum(1) != keep_idx.shape[1]).any():
            raise ValueError("keep_idx repeats a unit within a row; every row needs Nk distinct units")
        return mask

    def forward(self, image: torch.Tensor, keep_idx: torch.Tensor | None = None) -> torch.Tensor:
        """[B,3,H,W] -> [B, num_units, embed_dim], or [B, Nk, embed_dim] with out[:, j] the token of
        unit keep_idx[:, j] when `keep_idx` is given."""
        self._check_image(image)
        if keep_idx is None:
            return self.hiera.head.norm(self.hiera.forward_features(image))
        tokens = self.hiera.forward_features(image, mask=self.keep_mask(keep_idx))  # ascending unit order
        rank = keep_idx.argsort(1).argsort(1)  # where each requested unit sits in ascending order
        tokens = tokens.gather(1, rank.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))
        return self.hiera.head.norm(tokens)

    def forward_multiscale(self, image: torch.Tensor) -> list[torch.Tensor]:
        """Four NCHW maps [B, stage_dims[i], H/s, W/s] for s = 4, 8, 16, 32."""
        self._check_image(image)
        return self.hiera.forward_intermediates(image, intermediates_only=True, output_fmt="NCHW")

    # ---- checkpoints -------------------------------------------------------------------------

    def load_checkpoint(self, path: str | Path) -> None:
        """Load a timm/original Hiera checkpoint, an encoder state dict, or any dociq Lightning
        checkpoint with `image_encoder.*` weights; position embeddings are resized to this
        encoder's resolution. Missing keys raise; unexpected keys are logged."""
        self.load_encoder_state_dict(load_image_encoder_from_checkpoint(path), source=str(path))

    def resize_pos_embeds(self, state_dict: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
        """`state_dict` with this encoder's position embeddings (keys under `prefix`) resampled to
        its resolution: a checkpoint trained at another `model.image_size` then loads here.
        Other widths are left alone, for the caller's shape-mismatch error."""
        state_dict = dict(state_dict)
        own = self.state_dict()
        for key, value in list(state_dict.items()):
            local = key[len(prefix):] if key.startswith(prefix) else None
            if local in own and local.startswith(_PREFIX + "pos_embed") and value.shape != own[local].shape \
                    and value.dim() == own[local].dim() and _channels(value) == _channels(own[local]):
                state_dict[key] = resize_pos_embed(value, own[local].shape, self.hiera.tokens_spatial_shape, key)
        return state_dict

    def load_encoder_state_dict(self, state_dict: dict[str, torch.Tensor], source: str = "state dict") -> None:
        state_dict = dict(state_dict)
        own = self.state_dict()
        for key in [k for k in state_dict if k.startswith(_PREFIX + "head.fc.")]:
            log.info("%s: dropping classifier weight %s (the encoder has no classifier)", source, key)
            del state_dict[key]
        state_dict = self.resize_pos_embeds(state_dict)
        mismatched = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                      for k, v in state_dict.items() if k in own and v.shape != own[k].shape]
        if mismatched:
            raise ValueError(f"{source}: shapes differ from model.image_encoder (size/overrides wrong?): "
                             + "; ".join(mismatched[:5]))
        missing = [k for k in own if k not in state_dict]
        if missing:  # checked before loading, so a failed load leaves the encoder untouched
            raise KeyError(f"{source}: missing image-encoder keys {missing[:10]} ({len(missing)} in all): "
                           "the checkpoint is not a Hiera of this size; pick the matching model.size / "
                           "model.image_encoder overrides")
        result = self.load_state_dict(state_dict, strict=False)
        if result.unexpected_keys:
            log.warning("%s: %d unexpected image-encoder keys ignored: %s", source,
                        len(result.unexpected_keys), result.unexpected_keys[:10])
        log.info("loaded image encoder from %s (%d tensors)", source, len(state_dict))


def _channels(pos_embed: torch.Tensor) -> int:
    return int(pos_embed.shape[1] if pos_embed.dim() == 4 else pos_embed.shape[-1])


def resize_pos_embed(value: torch.Tensor, shape: torch.Size, token_grid: list[int], key: str) -> torch.Tensor:
    """Resize a Hiera position embedding to `shape`: flat [1, N, C] tables (standard Hiera) are
    reshaped to their square source grid and resampled bicubically; NCHW tables (abs-win Hiera)
    are interpolated directly."""
    if value.dim() == 4:
        return F.interpolate(value, size=tuple(shape[-2:]), mode="bicubic", align_corners=False)
    side = math.isqrt(value.shape[1])
    if value.dim() != 3 or side * side != value.shape[1] or value.shape[2] != shape[2]:
        raise ValueError(f"cannot resize {key} {tuple(value.shape)} to {tuple(shape)}: only square source grids "
                         "with the same channel count can be interpolated")
    log.info("resizing %s from a %dx%d to a %dx%d token grid", key, side, side, *token_grid)
    return resample_abs_pos_embed(value, new_size=list(token_grid), old_size=[side, side], num_prefix_tokens=0)


def load_image_encoder_from_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The image-encoder state dict (keys `hiera.*`, as `ImageEncoder.state_dict()`) from:
    a Lightning checkpoint of any dociq stage (keys `image_encoder.*` under `state_dict`),
    an `ImageEncoder.state_dict()`, or a timm / original Hiera state dict (optionally under
    `model_state` or `model`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image encoder checkpoint {path} does not exist: set init.image_encoder "
                                "to a .ckpt/.pth file (or null)")
    checkpoint = read_checkpoint(path)  # a dict, or a CheckpointError (a ValueError) naming the file
    if "state_dict" in checkpoint:  # Lightning: `image_encoder.*` (ijepa) or `model.image_encoder.*` (pretrain, ...)
        state = checkpoint["state_dict"]
        prefixes = sorted({k[:k.index(_PART) + len(_PART)] for k in state
                           if _PART in k and (k.startswith(_PART) or f".{_PART}" in k)}, key=len)
        if not prefixes:
            modules = sorted({k.split(".")[0] for k in state})
            raise KeyError(f"{path}: Lightning checkpoint has no '{_PART}*' weights (top-level modules: "
                           f"{modules}); pass a checkpoint of a stage that trains the image encoder")
        prefix = prefixes[0]  # the outermost encoder (not one nested inside another part)
        return model_state_dict(state, prefix)
    for nested in ("model_state", "model"):
        if isinstance(checkpoint.get(nested), dict):
            checkpoint = checkpoint[nested]
            break
    tensors = {k: v for k, v in checkpoint.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{path}: no tensors found; expected a Hiera/ImageEncoder state dict")
    if all(k.startswith(_PREFIX) for k in tensors):
        return tensors
    return {_PREFIX + k: v for k, v in checkpoint_filter_fn(tensors).items()}
