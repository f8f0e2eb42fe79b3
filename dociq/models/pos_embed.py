"""Fixed 2-D sine-cosine position embeddings (MAE / I-JEPA style) for a grid of tokens.

Fixed (not learned) positions let a module work at any grid size: the I-JEPA predictor and the
fusion trunk compute them on the fly for the mask-unit grid of the current image size.
"""
from __future__ import annotations

import torch


def sincos_1d(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[N] positions -> [N, dim]: sin of dim/2 frequencies, then cos of the same frequencies."""
    if dim % 2:
        raise ValueError(f"sincos_1d needs an even dim, got {dim}")
    omega = torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0)
    omega = 1.0 / 10000 ** omega
    angles = positions.to(torch.float64)[:, None] * omega[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


def sincos_2d(grid_h: int, grid_w: int, dim: int) -> torch.Tensor:
    """Positions of a grid_h x grid_w grid in row-major order -> [grid_h * grid_w, dim].

    The first dim/2 channels encode the row, the last dim/2 the column, so that token
    `r * grid_w + c` (raster order, as the image encoder emits units) gets position (r, c).
    """
    if dim % 4:
        raise ValueError(f"sincos_2d needs dim divisible by 4 (sin+cos for rows and columns), got {dim}")
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"sincos_2d needs a non-empty grid, got {grid_h}x{grid_w}")
    rows = torch.arange(grid_h).repeat_interleave(grid_w)
    cols = torch.arange(grid_w).repeat(grid_h)
    return torch.cat([sincos_1d(rows, dim // 2), sincos_1d(cols, dim // 2)], dim=1)
