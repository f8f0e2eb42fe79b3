"""Light pretraining heads on fused tokens: pixels of a mask unit (MIM), features of the target
encoder (D-JEPA). The MLM head is the text encoder's (`dociq.models.text_encoder.MLMHead`).
"""
from __future__ import annotations

import torch
from torch import nn


def patchify(image: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[B,C,H,W] -> [B, h*w, p_h*p_w*C]: the pixels of each mask unit, units in raster order."""
    B, C, H, W = image.shape
    h, w = int(grid[0]), int(grid[1])
    if H % h or W % w:
        raise ValueError(f"image {H}x{W} does not split into a {h}x{w} unit grid: "
                         "model.image_size must be a multiple of model.mask_unit_px")
    ph, pw = H // h, W // w
    x = image.reshape(B, C, h, ph, w, pw).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, h * w, ph * pw * C)


def normalise_units(units: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-unit mean/variance normalisation of pixel targets (MAE's norm_pix_loss)."""
    mean = units.mean(dim=-1, keepdim=True)
    var = units.var(dim=-1, keepdim=True, unbiased=False)
    return (units - mean) / (var + eps).sqrt()


class PixelHead(nn.Module):
    """Fused token -> the pixels of its mask unit: one LayerNorm + Linear (MAE's light decoder
    output layer; the fusion trunk already did the spatial reasoning)."""

    def __init__(self, dim: int, unit_px: int, channels: int = 3) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, unit_px * unit_px * channels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(tokens))


class FeatureHead(nn.Module):
    """Predictor output (fusion width) -> target-encoder feature width, for the D-JEPA loss."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(in_dim)
        self.proj = nn.Linear(in_dim, out_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(tokens))
